"""CPU per call of the deployed transport, both ends in this process, one call at a time.

    python -m benchmarks.deploy_call [--calls N]

A TLS gRPC server and client (``fedsec.network.transport``) on 127.0.0.1 with a coordinator-like
handler and a site-like caller: each call is enveloped, framed, sent, answered and recorded in
both parties' audit logs (``PartyAudit``), as ``Site.call`` and ``Hub.handle`` do. Three kinds
of call: ``up`` (a 400 KB request, the masked input), ``down`` (a 400 KB reply, a train or
evaluate job) and ``small`` (a stage message). A site makes one call at a time: the caller pauses
2 ms between calls (its CPU, about 0.02 ms, is included). Reported: CPU milliseconds per call
(user + system of this process, both ends). The machine is shared: compare versions with runs
interleaved. The last line of output is one JSON object.
"""

from __future__ import annotations

import argparse
import resource
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks._common import emit, log

MESSAGE = 400_000
"""Bytes of a large message (100k float32 parameters)."""


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=150)
    args = parser.parse_args()

    from fedsec.network import demo, envelope, framing, pki
    from fedsec.network.party_audit import PartyAudit
    from fedsec.network.site import load_identity
    from fedsec.network.transport import TransportClient, TransportServer

    root = Path(tempfile.mkdtemp(prefix="fedsec-call-bench-"))
    try:
        d = demo.prepare(root / "d", 3, rounds=2)
        trust = pki.Trust.load(d.ca)
        coordinator, site = d.coordinator, d.sites[0]
        (root / "c").mkdir()
        (root / "s").mkdir()
        served = PartyAudit(root / "c", actor="coordinator", key=load_identity(coordinator.identity),
                            run_id="r")
        calling = PartyAudit(root / "s", actor=site.name, key=load_identity(site.identity), run_id="r")
        large = np.random.default_rng(0).bytes(MESSAGE)
        # a version before framing.Payload (FSX1) hashed each message at both layers: plain bytes
        wrap = getattr(framing, "Payload", bytes)

        def handler(peer: pki.Peer, topic: str, payload: bytes) -> bytes:
            reply = wrap(envelope.encode({"job": 1}, large if topic == "down" else b"ok" * 50))
            served.received_then_sent(peer.name, topic, payload, reply, round=1)
            return reply

        server = TransportServer(trust=trust, cert_pem=coordinator.cert.read_bytes(),
                                 key_pem=coordinator.key.read_bytes(), handler=handler,
                                 roster={s.name for s in d.sites}, roles=("site",))
        server.start()
        client = TransportClient(address=f"127.0.0.1:{server.port}", trust=trust, cert_path=site.cert,
                                 key_path=site.key, server_name="coordinator")

        def call(topic: str, body: bytes) -> None:
            payload = wrap(envelope.encode({"job": 1, "ok": True}, body))
            reply = client.call(topic, payload)
            calling.sent_then_received("coordinator", topic, payload, reply, round=1)

        for _ in range(20):
            call("small", b"x")
        result: dict[str, float] = {}
        for topic, body in (("up", large), ("down", b""), ("small", b"x" * 100)):
            start = _cpu()
            for _ in range(args.calls):
                call(topic, body)
                time.sleep(0.002)
            result[topic] = round((_cpu() - start) / args.calls * 1000, 3)
            log(f"{topic}: {result[topic]} ms CPU a call")
        served.head()
        calling.head()
        client.close()
        server.stop(0)
        served.close()
        calling.close()
        emit({"calls": args.calls, "message_bytes": MESSAGE, "frame": framing.MAGIC.decode(),
              "cpu_ms_per_call": result})
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
