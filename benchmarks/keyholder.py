"""What the deployed key holder costs over the in-process one: mTLS, framing, SQLite, the audit log.

One study (a fresh CA, a coordinator, a key holder and K sites, certificates made here), one key
holder service (``fedsec.network.keyholder`` on its state directory, behind the mTLS transport
on 127.0.0.1) and, as the reference in the same run, an in-process ``PaillierKeyHolder`` with the
same key and registrations and a memory sequence store. Each round the K sites submit M words;
the same signed request is answered by both, in alternating order, and both answers must be the
same bytes.

    python -m benchmarks.keyholder --clients 4 --params 20000 --rounds 5

Last stdout line (JSON): mean and min seconds per decryption, in process and over the network,
their ratio, and the request's size.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
from cryptography.hazmat.primitives import serialization
from fedsec.protocols.paillier import PaillierClient, PaillierKeyHolder, PaillierServer, RoundSpec
from fedsec.protocols.paillier.spec import roster_digest
from fedsec.secagg.paillier import slot_bits_for

from benchmarks._common import emit, log
from fedsec.network import pki
from fedsec.network.keyholder import KeyHolderService, OneThread, load_identity
from fedsec.network.keyholder_client import KeyHolderClient
from fedsec.network.keyholder_state import KeyHolderState
from fedsec.network.transport import TransportServer

WORD_BOUND = 2**16 - 1


def enrol(ca: Path, root: Path, name: str, role: str) -> tuple[Path, Path, Path]:
    """(certificate, TLS key, identity key) of a new party."""
    pki.init_site(root / name, name=name, role=role)
    signed = pki.sign_request(ca, (root / name / f"{name}.csr").read_bytes())
    cert = root / name / f"{name}.crt"
    cert.write_bytes(signed.certificate.public_bytes(serialization.Encoding.PEM))
    return cert, root / name / f"{name}.key", root / name / f"{name}.identity.key"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--params", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    k, m = args.clients, args.params
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        pki.init_ca(root / "ca", name="benchmark")
        trust = pki.Trust.load(root / "ca" / "ca.crt")
        coordinator = enrol(root / "ca", root, "coordinator", "server")
        auditor = enrol(root / "ca", root, "auditor", "keyholder")
        sites = [enrol(root / "ca", root, f"site-{c}", "site") for c in range(k)]
        identity = load_identity(auditor[2])
        runner = OneThread(lambda: KeyHolderService(
            state=KeyHolderState(root / "kh", threshold=2), identity=identity, name="auditor", trust=trust,
            certificate=auditor[0].read_bytes()))
        server = TransportServer(trust=trust, cert_pem=auditor[0].read_bytes(),
                                 key_pem=auditor[1].read_bytes(), handler=runner.handle,
                                 roster={"coordinator"}, roles=("server",))
        port = server.start()
        key = runner.service.state.key
        coordinator_identity = load_identity(coordinator[2])
        reference = PaillierKeyHolder(threshold=2, server_identity=coordinator_identity.public,
                                      identity=identity, private_key=key.private_key,
                                      tag_secret=key.tag_secret, mac_key=key.mac_key)
        client = KeyHolderClient(address=f"127.0.0.1:{port}", trust=trust, cert_path=coordinator[0],
                                 key_path=coordinator[1], name="auditor", deadline=600)
        announcement = client.announcement()
        parties = {}
        for c, (cert, _, identity_path) in enumerate(sites):
            client.enrol(c, cert.read_bytes())
            site_identity = load_identity(identity_path)
            reference.enroll(c, site_identity.public, name=f"site-{c}")
            parties[c] = PaillierClient(c, identity=site_identity, announcer_identity=identity.public)
            registration = parties[c].receive_announcement(announcement)
            reference.register(registration)
            parties[c].receive_welcome(client.register(registration))
        rng = np.random.default_rng(0)
        roster = tuple(f"site-{c}" for c in range(k))
        local, remote, size = [], [], 0
        for sequence in range(1, args.rounds + 1):
            spec = RoundSpec(sequence=sequence, length=m + 1, slot_bits=slot_bits_for(WORD_BOUND, k),
                             word_bound=WORD_BOUND, max_contributions=k, roster=roster_digest(roster))
            aggregator = PaillierServer(key.public_key, spec, expected=range(k), threshold=2,
                                        identities={c: p._identity.public for c, p in parties.items()},
                                        identity=coordinator_identity, roster=roster)
            for c, party in parties.items():
                words = rng.integers(0, WORD_BOUND, m, dtype=np.uint64, endpoint=True)
                aggregator.receive(c, party.submit(spec.to_bytes(), words, roster=roster))
            request = aggregator.decryption_request()
            size = len(request)
            answers = {}
            for which in (("local", "remote") if sequence % 2 else ("remote", "local")):
                start = time.perf_counter()
                answers[which] = reference.respond(request) if which == "local" else client.decrypt(request)
                (local if which == "local" else remote).append(time.perf_counter() - start)
            if answers["local"] != answers["remote"]:
                raise SystemExit("the deployed key holder answered differently")
            aggregator.finish(answers["remote"])
            log(f"round {sequence}: in process {local[-1]:.3f} s, over the network {remote[-1]:.3f} s")
        client.close()
        server.stop(0)
        runner.close()
    emit({"clients": k, "params": m, "rounds": args.rounds, "request_bytes": size,
          "in_process_mean_s": round(float(np.mean(local)), 4),
          "in_process_min_s": round(float(np.min(local)), 4),
          "network_mean_s": round(float(np.mean(remote)), 4),
          "network_min_s": round(float(np.min(remote)), 4),
          "ratio_of_means": round(float(np.mean(remote) / np.mean(local)), 3)})


if __name__ == "__main__":
    main()
