"""Threshold custody's key ceremony for a deployment: ``fedsec deal``.

The **dealer is a trusted party, during set-up only**: it draws the safe-prime Paillier key,
splits the decryption key t-of-N among the roster's sites (:class:`ThresholdDealer`), writes each
site's share into its own file and forgets the key. In a deployment the **auditor** runs it, on
an offline machine, with its key holder certificate (role ``keyholder``, name
``federation.keyholder_name``): the announcement and verification keys are signed with that
certificate's identity key, which every site and the coordinator check against the study's
root. A dealer that kept the key, or gave two shares to one party, could decrypt alone; nothing
after the ceremony can detect that, which is why it is the auditor's ceremony and not the
coordinator's.

Outputs (``--out DIR``, never overwritten):

* ``NAME.share`` per site (mode 0600, JSON): the site's share, the public key, the signed
  announcement and verification keys, the dealer's certificate, and the roster's identity keys
  (taken from the site certificates the dealer verified). The auditor hands it to the hospital
  (like its certificate: by hand or an encrypted channel; it is the site's secret), which puts it
  in its state directory as ``paillier.share``.
* ``dealing.json`` (public): the key id, t, N, the roster and the announcement.

A dealing belongs to one roster and one threshold; a new plan with another roster or t needs a new
dealing. Runs of one roster may share a dealing: the sites never endorse two lists of one sequence
number (their record is durable) and report the last number they endorsed, from which a
coordinator numbers on.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509

from fedsec.network.errors import PeerRejected
from fedsec.network.keyholder import raw_identity
from fedsec.network.pki import Trust, verify_peer
from fedsec.protocols.paillier import ThresholdDealer
from fedsec.secagg.errors import InvalidArgumentError
from fedsec.secagg.keys import SigningKey
from fedsec.secagg.paillier import PaillierPublicKey
from fedsec.secagg.paillier.threshold import KeyShare

SHARE_FORMAT = "fedsec-paillier-share-1"
SHARE_FILE = "paillier.share"
"""Where a site keeps its share: ``STATE_DIR/paillier.share``."""


@dataclass(frozen=True)
class ShareFile:
    """One site's share file, parsed (not yet checked against a plan: see :func:`load_share`)."""

    name: str
    client_id: int
    share: KeyShare
    announcement: bytes
    verification_keys: bytes
    dealer_certificate: bytes
    roster: tuple[tuple[int, str, bytes], ...]


def deal(*, roster: list[str], site_certificates: dict[str, bytes], threshold: int, trust: Trust,
         identity: SigningKey, dealer_certificate: bytes, key_bits: int = 2048,
         allow_insecure: bool = False) -> tuple[dict[str, dict], dict]:
    """Deal a fresh key t-of-N over ``roster`` (site i is client i).

    Returns ``({name: share record}, public record)``; raises ValueError naming a site whose
    certificate is missing or does not verify (root, role ``site``, revocation, name)."""
    entries = []
    for client_id, name in enumerate(roster):
        pem = site_certificates.get(name)
        if pem is None:
            raise ValueError(f"sites: no certificate given for roster site {name!r}")
        try:
            peer = verify_peer(pem, trust=trust, roles=("site",), roster={name})
        except PeerRejected as error:
            raise ValueError(f"sites: the certificate of {name!r} does not verify ({error.reason})") from None
        entries.append((client_id, name, raw_identity(peer.identity_key)))
    try:
        dealer = ThresholdDealer(parties=list(range(len(roster))), threshold=threshold, key_bits=key_bits,
                                 identity=identity, allow_insecure=allow_insecure)
    except InvalidArgumentError as error:
        raise ValueError(f"threshold: {error}") from None
    announcement, keys = dealer.announcement(), dealer.verification_keys()
    common = {"format": SHARE_FORMAT, "n": format(dealer.public_key.n, "x"), "threshold": threshold,
              "parties": len(roster), "announcement": announcement.hex(), "verification_keys": keys.hex(),
              "dealer_certificate": dealer_certificate.decode(),
              "roster": [[c, n, k.hex()] for c, n, k in entries]}
    shares = {}
    for client_id, name, _ in entries:
        share = dealer.hand_out(client_id)
        shares[name] = {**common, "name": name, "client_id": client_id, "index": share.index,
                        "value": format(share.value, "x")}
    public = {"key_id": dealer.public_key.key_id.hex(), "threshold": threshold, "parties": len(roster),
              "roster": list(roster), "announcement": announcement.hex()}
    return shares, public


def write_new(path: Path, text: str, mode: int) -> None:
    """Write a new file (refusing to overwrite) with ``mode``, fsynced."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())


def load_share(path: str | Path) -> ShareFile:
    """Read a share file; ValueError (naming ``share``) if it is not one, or not the owner's only."""
    path = Path(path)
    if path.stat().st_mode & 0o077:
        raise ValueError(f"share: {path} must be readable by its owner only (chmod 600)")
    try:
        record = json.loads(path.read_text())
        if record.get("format") != SHARE_FORMAT:
            raise ValueError("format")
        public_key = PaillierPublicKey(int(record["n"], 16))
        share = KeyShare(int(record["index"]), int(record["value"], 16), int(record["parties"]),
                         int(record["threshold"]), public_key)
        roster = tuple((int(c), str(n), bytes.fromhex(k)) for c, n, k in record["roster"])
        return ShareFile(str(record["name"]), int(record["client_id"]), share,
                         bytes.fromhex(record["announcement"]), bytes.fromhex(record["verification_keys"]),
                         str(record["dealer_certificate"]).encode(), roster)
    except (ValueError, KeyError, TypeError, InvalidArgumentError) as error:
        raise ValueError(f"share: {path} is not a fedsec key share ({error})") from None


def dealer_identity(certificate: bytes, *, trust: Trust, name: str) -> bytes:
    """The dealer's identity key from its certificate (root, role ``keyholder``, ``name``);
    raises PeerRejected."""
    peer = verify_peer(x509.load_pem_x509_certificate(certificate), trust=trust, roles=("keyholder",),
                       roster={name})
    return raw_identity(peer.identity_key)
