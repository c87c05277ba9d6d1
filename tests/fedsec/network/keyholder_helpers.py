"""Start ``fedsec keyholder`` as an OS process, and play the coordinator and sites against it."""

from __future__ import annotations

import subprocess
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from cryptography import x509
from fedsec.protocols.paillier import PaillierClient, PaillierServer, RoundSpec
from fedsec.protocols.paillier.spec import roster_digest
from fedsec.secagg.paillier import PaillierPublicKey, slot_bits_for

from fedsec.config import make_config
from fedsec.network.keyholder import load_identity
from fedsec.network.keyholder_client import KeyHolderClient
from fedsec.network.pki import IDENTITY_OID

ROOT = Path(__file__).resolve().parents[3]
START_TIMEOUT = 60.0


@dataclass(frozen=True)
class Caller:
    """What the transport hands the key holder's handler: the verified certificate of the peer."""

    name: str
    identity_key: object


def client_level_keyholder_plan(sites: tuple[str, ...], *, threshold: int, clip: float):
    """A client-level plan under Paillier key-holder custody over roster ``sites`` (3 rounds)."""
    return make_config({"data.clients": len(sites), "secure.aggregation": "paillier",
                        "secure.custody": "key_holder", "secure.threshold": threshold, "rounds": 3,
                        "federation.sites": list(sites), "federation.keyholder": "127.0.0.1:1",
                        "federation.min_sites": 3, "dp.mode": "client", "dp.max_grad_norm": clip,
                        "dp.reproducible": False})


def identity_path(party) -> Path:
    return party.key.with_name(f"{party.name}.identity.key")


def cert_identity(cert_path: Path) -> bytes:
    value = x509.load_pem_x509_certificate(cert_path.read_bytes()).extensions.get_extension_for_oid(
        IDENTITY_OID).value.value
    return value[2:]


@contextmanager
def keyholder_process(study, state: Path, *, threshold: int | None = 2, extra: tuple[str, ...] = ()):
    """``fedsec keyholder`` on 127.0.0.1:0 over ``state``; yields (process, port); always killed."""
    auditor = study.parties["auditor"]
    command = [sys.executable, "-m", "fedsec", "keyholder", "--ca", str(study.ca_dir / "ca.crt"),
               "--cert", str(auditor.cert), "--key", str(auditor.key), "--listen", "127.0.0.1:0",
               "--state", str(state), "--coordinator", "coordinator", *extra]
    if threshold is not None:
        command += ["--threshold", str(threshold)]
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = _first_line(process)
        assert " listening " in line, line + process.stderr.read()
        yield process, int(line.split(" listening ")[1].split()[0])
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=10)
        process.stdout.close()
        process.stderr.close()


def _first_line(process: subprocess.Popen) -> str:
    import selectors

    selector = selectors.DefaultSelector()
    selector.register(process.stdout, selectors.EVENT_READ)
    if not selector.select(timeout=START_TIMEOUT):
        raise AssertionError("the key holder did not start in time")
    return process.stdout.readline()


def coordinator_client(study, port: int, party: str = "coordinator",
                       deadline: float = 30.0) -> KeyHolderClient:
    who = study.parties[party] if isinstance(party, str) else party
    return KeyHolderClient(address=f"127.0.0.1:{port}", trust=study.trust(), cert_path=who.cert,
                           key_path=who.key, name="auditor", deadline=deadline)


@dataclass
class Federation:
    """Sites 0..n-1 (real identity keys from their enrolment) registered through the coordinator."""

    public_key: PaillierPublicKey
    clients: dict[int, PaillierClient]
    coordinator_identity: object
    rng: np.random.Generator
    names: tuple[str, ...] = ()
    """The roster: every enrolled site's certificate name."""

    def round(self, sequence: int, length: int = 40) -> tuple[RoundSpec, PaillierServer, np.ndarray]:
        """Every site submits random words for ``sequence``; returns the spec, the server (all
        submissions received) and the expected sum (count word last)."""
        bound = 1000
        n = len(self.clients)
        spec = RoundSpec(sequence=sequence, length=length, slot_bits=slot_bits_for(bound, n),
                         word_bound=bound, max_contributions=n, tagged=True, roster=roster_digest(self.names))
        server = PaillierServer(self.public_key, spec, expected=list(self.clients), threshold=2,
                                identities={c: cl._identity.public for c, cl in self.clients.items()},
                                identity=self.coordinator_identity, roster=self.names)
        total = np.zeros(length, dtype=np.uint64)
        for c, client in self.clients.items():
            words = self.rng.integers(0, bound + 1, size=length - 1).astype(np.uint64)
            total[:-1] += words
            server.receive(c, client.submit(spec.to_bytes(), words, roster=self.names))
        total[-1] = n
        return spec, server, total


def enrol_sites(study, client: KeyHolderClient, names: list[str], rng: np.random.Generator) -> Federation:
    announcement = client.announcement()
    announcer = cert_identity(study.parties["auditor"].cert)
    clients = {}
    for client_id, name in enumerate(names):
        party = study.parties[name]
        client.enrol(client_id, party.cert_pem)
        site = PaillierClient(client_id, identity=load_identity(identity_path(party)),
                              announcer_identity=announcer)
        site.receive_welcome(client.register(site.receive_announcement(announcement)))
        clients[client_id] = site
    coordinator = load_identity(identity_path(study.parties["coordinator"]))
    return Federation(clients[0].public_key, clients, coordinator, rng, tuple(names))
