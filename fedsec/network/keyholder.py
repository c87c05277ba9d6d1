"""The Paillier key holder as a network service (``fedsec keyholder``).

One process, run by the auditor, holding the only Paillier decryption key of a key-holder-custody
federation. It is a :class:`~fedsec.network.transport.TransportServer` that admits **only the
coordinator** (certificate role ``server`` and the name given with ``--coordinator``): every
message of :mod:`protocols.paillier` between the sites and the key holder (announcement,
registration, welcome) is signed or sealed end to end and was designed to be relayed by the server,
so the sites never dial the key holder. That keeps the key holder's firewall to one inbound peer,
hides the sites' addresses from it, and leaves the protocol's trust argument unchanged (the relay
can drop or replay these messages, which the protocol already handles; it can read or forge none).

Topics (each one call, answered by one reply):

* ``paillier/announce`` (empty) -> the signed :class:`~protocols.paillier.messages.Announcement`,
  signed with the key holder's certificate identity key (sites check it against the key holder's
  certificate, which the coordinator relays and each site verifies against the CA).
* ``paillier/enrol`` (:func:`encode_enrolment`: client id, a site's certificate) -> empty. The
  key holder verifies the certificate itself (the study's root, role ``site``, the revocation
  list, ``--sites`` if given) and takes the site's Ed25519 identity key from it: a coordinator
  can enrol only real, unrevoked sites, each under one id forever (:class:`KeyHolderState`).
* ``paillier/register`` (a Registration) -> the Welcome; the registration is stored, so a
  restarted key holder still knows it.
* ``paillier/decrypt`` (a signed DecryptionRequest) -> the DecryptionResult or the fixed
  ``REFUSAL`` bytes. The request's signature is checked against the identity key in the
  certificate of the coordinator on this very TLS connection, never a key sent in a message.
  The request names the roster its spec's roster digest commits to; only contributors enrolled
  under a certificate name of that roster count (review S5-1: every honest site tags its
  submission under its own plan's roster digest), so ``--sites`` is defence in depth.
* ``paillier/status`` (empty) -> JSON ``{"key_id", "epoch", "threshold", "last_sequence",
  "certificate", "head"}`` (public facts; a restarted coordinator learns the next sequence number
  from it, and relays the key holder's certificate, PEM, to the sites with its announcement).

Every call is written to the key holder's signed ``audit.db`` as the coordinator's own log
writes it (:mod:`fedsec.network.party_audit`: ``receive`` of the request and ``send`` of the reply,
topic, size and SHA-256, never contents; so ``fedsec audit reconcile`` pairs the two logs), with
the decision: ``enrol`` / ``enrol.refused`` (reason), ``register``, ``decrypt.served`` (sequence,
contributors, the roster digest) or ``decrypt.refused`` (sequence and the **reason**, which only
this log ever holds: the peer gets one opaque refusal). ``paillier/status`` carries the log's head, which the
coordinator acknowledges in its own log (tail truncation becomes detectable). Calls are served
one at a time, on one thread (:class:`OneThread`): the protocol object is not thread-safe,
SQLite connections belong to the thread that opened them, and decryptions are CPU-bound anyway.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from fedsec.audit.log import AuditLog
from fedsec.network.errors import PeerRejected
from fedsec.network.keyholder_state import EnrolmentConflict, KeyHolderState
from fedsec.network.party_audit import message
from fedsec.network.pki import Peer, Trust, verify_peer
from fedsec.protocols.errors import MalformedMessage
from fedsec.protocols.paillier.keyholder import PaillierKeyHolder
from fedsec.protocols.paillier.messages import DecryptionRequest, Registration, decode
from fedsec.protocols.paillier.spec import RoundSpec
from fedsec.protocols.wire import open_envelope, start_envelope
from fedsec.secagg.keys import SigningKey

ANNOUNCE, ENROL, REGISTER, DECRYPT, STATUS = ("paillier/announce", "paillier/enrol", "paillier/register",
                                              "paillier/decrypt", "paillier/status")
TOPICS = (ANNOUNCE, ENROL, REGISTER, DECRYPT, STATUS)
_MAGIC, _VERSION, _ENROL_KIND = b"FSKH", 1, 1
MAX_CERT_BYTES = 16 << 10


def raw_identity(key: ed25519.Ed25519PublicKey) -> bytes:
    """The raw 32 bytes of an Ed25519 public key (what the protocols verify with)."""
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def load_identity(path: str | Path) -> SigningKey:
    """A party's Ed25519 identity key from its ``NAME.identity.key`` (PKCS#8 PEM, unencrypted)."""
    try:
        key = serialization.load_pem_private_key(Path(path).read_bytes(), password=None)
    except (ValueError, TypeError):
        raise ValueError(f"identity: {path} is not an unencrypted PEM private key") from None
    if not isinstance(key, ed25519.Ed25519PrivateKey):
        raise ValueError(f"identity: {path} is not an Ed25519 key")
    private = key.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                                serialization.NoEncryption())
    return SigningKey(private, raw_identity(key.public_key()))


def encode_enrolment(client_id: int, cert_pem: bytes) -> bytes:
    """The ``paillier/enrol`` payload: enrol the site of ``cert_pem`` as ``client_id``."""
    return start_envelope(_MAGIC, _VERSION, _ENROL_KIND).u64(client_id).blob(cert_pem).getvalue()


def decode_enrolment(data: bytes) -> tuple[int, bytes]:
    """``(client_id, cert_pem)`` from a ``paillier/enrol`` payload; MalformedMessage otherwise."""
    r = open_envelope(data, _MAGIC, _VERSION, _ENROL_KIND, family="key holder", name="enrolment")
    client_id, cert = r.u64(), bytes(r.view())
    r.end()
    if len(cert) > MAX_CERT_BYTES:
        raise MalformedMessage("enrolment: certificate too large")
    return client_id, cert


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class KeyHolderService:
    """The key holder's request handler over its state directory.

    Args:
        state: the opened state directory (key, burned numbers, enrolments, registrations).
        identity: the key holder's Ed25519 identity key (its certificate's).
        name: its certificate name (the audit log's actor).
        trust: the study's root and revocation list (to verify enrolled sites' certificates).
        sites: site names it enrols (``None``: any site the root certified and did not revoke).
        certificate: its own certificate (PEM), which ``paillier/status`` hands out.
    """

    def __init__(self, *, state: KeyHolderState, identity: SigningKey, name: str, trust: Trust,
                 sites: frozenset[str] | None = None, certificate: bytes = b"") -> None:
        self.state, self.trust, self.sites, self.name = state, trust, sites, name
        self.certificate = certificate.decode()
        key = state.key
        self.holder = PaillierKeyHolder(threshold=key.threshold, server_identity=bytes(32),
                                        identity=identity, epoch=key.epoch, store=state.sequences,
                                        private_key=key.private_key, tag_secret=key.tag_secret,
                                        mac_key=key.mac_key)
        self.key_id = key.public_key.key_id
        dropped = {}
        for client_id, site, public in state.enrolled():
            problem = self._enrolment_problem(client_id, site, public)
            if problem:
                dropped[client_id] = (site, problem)  # a revoked or off-``--sites`` enrolment: not counted
                continue
            self.holder.enroll(client_id, public, name=site)
        replayed = [r for r in state.registrations(self.key_id, key.epoch)
                    if _registrant(r) not in dropped]
        for registration in replayed:
            self.holder.register(registration)
        facts = {k: v for k, v in self.status().items() if k != "certificate"}
        self.started = {**facts, "key_bits": key.public_key.key_bits, "new_key": state.created}
        """The facts at start (status, key size, whether the key is new): safe to read from any thread."""
        self.audit = AuditLog(state.audit_path, actor=name, key=identity, run_id=self.key_id.hex())
        self._lock = threading.Lock()
        self.audit.append("start", details={
            "key_id": self.key_id.hex(), "epoch": key.epoch, "threshold": key.threshold,
            "key_bits": key.public_key.key_bits, "new_key": state.created,
            "last_sequence": self.holder.last_sequence, "enrolled": len(state.enrolled()),
            "registrations": len(replayed)})
        for client_id, (site, problem) in sorted(dropped.items()):
            self._decide(("enrol.withdrawn", None, {"client_id": client_id, "site": site,
                                                    "reason": problem[:200]}))

    def _enrolment_problem(self, client_id: int, site: str, public: bytes) -> str:
        """Why the stored enrolment of ``client_id`` (as ``site`` with identity key ``public``) no
        longer counts, or '': its stored certificate must still verify now (the study's root, role
        ``site``, not revoked, valid, on ``--sites`` if given) and name that site and key. An
        enrolment stored with no certificate (an older state) does not count until re-enrolled."""
        pem = self.state.certificate(client_id)
        if pem is None:
            return "no certificate stored for this enrolment"
        try:
            peer = verify_peer(x509.load_pem_x509_certificate(pem), trust=self.trust, roles=("site",),
                               roster=self.sites)
        except PeerRejected as error:
            return error.reason
        except ValueError:
            return "the stored certificate does not parse"
        if peer.name != site or raw_identity(peer.identity_key) != public:
            return "the stored certificate names another site or key"
        return ""

    def _withdraw_invalid(self, client_ids: Any) -> list[int]:
        """Withdraw (and log) every enrolled id among ``client_ids`` whose certificate no longer
        verifies (revoked since, or off ``--sites``); returns them."""
        withdrawn = []
        enrolled = {c: (n, k) for c, n, k in self.state.enrolled()}
        for client_id in client_ids:
            if client_id not in enrolled or client_id in self.holder.withdrawn:
                continue
            problem = self._enrolment_problem(client_id, *enrolled[client_id])
            if problem:
                self.holder.withdraw(client_id)
                site = enrolled[client_id][0]
                self._decide(("enrol.withdrawn", None, {"client_id": client_id, "site": site,
                                                        "reason": problem[:200]}))
                withdrawn.append(client_id)
        return withdrawn

    def status(self) -> dict:
        key = self.state.key
        return {"key_id": self.key_id.hex(), "epoch": key.epoch, "threshold": key.threshold,
                "last_sequence": self.holder.last_sequence, "certificate": self.certificate}

    def handle(self, peer: Peer, topic: str, payload: bytes) -> bytes:
        """One admitted call (the transport admitted only the coordinator).

        The request is logged (``receive``: topic, size, SHA-256) before anything is done, the reply
        (``send``) with the decision in one transaction after; a refused call logs its reason and
        raises ``MalformedMessage`` (the peer gets ``INVALID_ARGUMENT``, or for a decryption the
        fixed refusal bytes)."""
        with self._lock:
            self.audit.append("receive", details=message("from", peer.name, topic[:64], payload))
            if topic == ANNOUNCE:
                reply, decision = self.holder.announcement(), None
            elif topic == STATUS:
                head = self.audit.head()
                ours = {"actor": head.actor, "fingerprint": head.fingerprint, "seq": head.seq,
                        "hash": head.hash}
                reply, decision = json.dumps({**self.status(), "head": ours}, sort_keys=True).encode(), None
            elif topic == ENROL:
                reply, decision = self._enrol(payload)
            elif topic == REGISTER:
                reply, decision = self._register(payload)
            elif topic == DECRYPT:
                reply, decision = self._decrypt(peer, payload)
            else:
                self._decide(("refused", None, {"reason": "unknown topic"}))
                raise MalformedMessage("unknown topic")
            items = [("send", None, None, message("to", peer.name, topic + ".reply", reply), None)]
            if decision is not None:
                action, sequence, details = decision
                items.append((action, sequence, "keyholder", details, None))
            self.audit.append_many(items)
            return reply

    def _decide(self, decision: tuple[str, int | None, dict]) -> None:
        action, sequence, details = decision
        self.audit.append(action, round=sequence, stage="keyholder", details=details)

    def _enrol(self, payload: bytes) -> tuple[bytes, tuple[str, int | None, dict]]:
        try:
            client_id, cert_pem = decode_enrolment(payload)
            site = verify_peer(x509.load_pem_x509_certificate(cert_pem), trust=self.trust, roles=("site",),
                               roster=self.sites)
            public = raw_identity(site.identity_key)
            new = self.state.enrol(client_id, site.name, public, cert_pem)
            self.holder.enroll(client_id, public, name=site.name)
        except (MalformedMessage, PeerRejected, EnrolmentConflict, ValueError) as error:
            reason = error.reason if isinstance(error, PeerRejected) else str(error)
            self._decide(("enrol.refused", None, {"reason": reason[:200]}))
            raise MalformedMessage("enrolment refused") from None
        return b"", ("enrol", None, {"client_id": client_id, "site": site.name, "new": new,
                                     "identity_sha256": _digest(public)})

    def _register(self, payload: bytes) -> tuple[bytes, tuple[str, int | None, dict]]:
        try:
            self._withdraw_invalid([_registrant(payload)])
            welcome = self.holder.register(payload)
        except MalformedMessage as error:
            self._decide(("register.refused", None, {"reason": str(error)[:200]}))
            raise MalformedMessage("registration refused") from None
        self.state.record_registration(self.key_id, self.state.key.epoch, payload)
        client_id = decode(payload, Registration).client_id
        return welcome, ("register", None, {"client_id": client_id})

    def _decrypt(self, peer: Peer, payload: bytes) -> tuple[bytes, tuple[str, int | None, dict]]:
        sequence = _claimed_sequence(payload)
        self.holder.server_identity = raw_identity(peer.identity_key)
        served = self.holder.decryptions
        try:  # a contributor revoked (or off --sites) since it enrolled no longer counts
            self._withdraw_invalid(decode(payload, DecryptionRequest).participants)
        except MalformedMessage:
            pass  # the holder refuses it below, with its reason
        reply = self.holder.respond(payload)
        if self.holder.decryptions > served:
            request = decode(payload, DecryptionRequest)
            spec = RoundSpec.from_bytes(request.spec)
            return reply, ("decrypt.served", sequence, {"contributors": list(request.participants),
                                                        "roster_sha256": spec.roster.hex()})
        refused_at, reason = self.holder.refusals[-1]
        return reply, ("decrypt.refused", sequence, {"reason": reason, "refused_sequence": refused_at})

    def close(self) -> None:
        with self._lock:
            self.audit.append("stop", details={"last_sequence": self.holder.last_sequence,
                                               "decryptions": self.holder.decryptions})
            self.audit.close()
            self.state.close()


def _registrant(payload: bytes) -> int | None:
    """The client id a registration claims (its signature is the holder's to check), or None."""
    try:
        return decode(payload, Registration).client_id
    except MalformedMessage:
        return None


def _claimed_sequence(payload: bytes) -> int | None:
    """The sequence number a request claims (for the log only; unverified), or None."""
    try:
        sequence = RoundSpec.from_bytes(decode(payload, DecryptionRequest).spec).sequence
    except (MalformedMessage, ValueError):
        return None
    return sequence if sequence < 1 << 63 else None


class OneThread:
    """Builds a :class:`KeyHolderService` on one dedicated thread and runs every call there.

    Args:
        build: makes the service (called on that thread, so its SQLite connections live there).
    """

    def __init__(self, build: Callable[[], KeyHolderService]) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="keyholder")
        try:
            self.service = self._executor.submit(build).result()
        except BaseException:
            self._executor.shutdown()
            raise

    def handle(self, peer: Peer, topic: str, payload: bytes) -> bytes:
        """:meth:`KeyHolderService.handle` on the service's thread (exceptions propagate)."""
        return self.call(self.service.handle, peer, topic, payload)

    def call(self, function: Callable[..., Any], *args: Any) -> Any:
        """``function(*args)`` on the service's thread; its result (exceptions propagate)."""
        return self._executor.submit(function, *args).result()

    def close(self) -> None:
        self._executor.submit(self.service.close).result()
        self._executor.shutdown()
