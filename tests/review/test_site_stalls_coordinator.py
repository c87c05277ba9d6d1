"""Adversary: one malicious enrolled site (a valid certificate on the roster), network only.

Claim attacked (issue 13, docs/deployment.md "Limits and deadlines"): "a site that misses a
deadline is a dropout for that round" and "a malicious site ... is dropped and recorded, and the
round completes". The coordinator's gRPC server serves calls on a fixed pool of 2 n + 4 threads
and reads a request's chunks with no deadline of its own, so a site that opens that many calls
and sends only a frame header holds every thread: no honest site can fetch the plan, poll or
answer, and no stage deadline ever fires on the attacker.

The coordinator here is the project's :class:`~fedsec.network.coordinator.Hub` (what ``fedsec
serve`` runs) and the honest site the project's :class:`TransportClient`.
"""

from __future__ import annotations

import threading
import time

import grpc
import pytest

from fedsec.config import loads_config
from fedsec.network import demo, framing, pki
from fedsec.network.coordinator import Hub
from fedsec.network.party_audit import PartyAudit
from fedsec.network.pki import dns_name
from fedsec.network.site import load_identity
from fedsec.network.transport import METHOD, TransportClient, TransportError

N = 4


@pytest.mark.slow
def test_a_site_holding_half_sent_calls_does_not_stall_the_others(tmp_path):
    d = demo.prepare(tmp_path / "d", N, rounds=2)
    plan = d.plan.read_bytes()
    trust = pki.Trust.load(d.ca)
    (tmp_path / "coordinator").mkdir()
    identity = load_identity(d.coordinator.identity)
    audit = PartyAudit(tmp_path / "coordinator", actor="coordinator", key=identity, run_id="review")
    hub = Hub(config=loads_config(plan.decode()), plan_bytes=plan, trust=trust,
              cert_pem=d.coordinator.cert.read_bytes(), key_pem=d.coordinator.key.read_bytes(), audit=audit,
              listen="127.0.0.1:0")
    port = hub.start()
    release = threading.Event()
    attacker = d.sites[N - 1]
    credentials = grpc.ssl_channel_credentials(root_certificates=trust.ca_pem,
                                               private_key=attacker.key.read_bytes(),
                                               certificate_chain=attacker.cert.read_bytes())
    channel = grpc.secure_channel(f"127.0.0.1:{port}", credentials, options=[
        ("grpc.ssl_target_name_override", dns_name("coordinator", "server"))])
    header = next(framing.frames("poll", b"x" * 64))

    def half_sent():
        yield header
        release.wait(30)

    calls = []
    honest = TransportClient(address=f"127.0.0.1:{port}", trust=trust, cert_path=d.sites[0].cert,
                             key_path=d.sites[0].key, server_name="coordinator")
    try:
        assert plan in honest.call("plan", b"", deadline=20.0)  # before the attack: served
        for _ in range(2 * N + 4):
            calls.append(channel.stream_stream(METHOD)(half_sent(), timeout=30))
        grpc.channel_ready_future(channel).result(timeout=10)
        time.sleep(1.0)  # let the server hand each half-sent call a thread (not an assertion on time)
        try:
            reply = honest.call("plan", b"", deadline=6.0)
        except TransportError as error:
            pytest.fail(f"the honest site could not fetch the plan: {error.code}")
        assert plan in reply
    finally:
        release.set()
        for call in calls:
            call.cancel()
        honest.close()
        channel.close()
        hub.stop()
        audit.close()
