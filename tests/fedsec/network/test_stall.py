"""Adversary: one enrolled site (valid certificate, on the roster) that tries to stall the
coordinator (review finding R6) by holding calls open: any number of calls, each sending nothing,
only a frame header, or a header and part of the announced payload. The coordinator is the
project's unmodified :class:`Hub`; the honest site is the project's :class:`TransportClient`.

Claims: an honest site's call is served while the attack goes on; calls beyond
``max_calls_per_peer`` are refused with ``RESOURCE_EXHAUSTED``; every held call is dropped after
the read deadline and the attacker is recorded as a dropout (and skipped by the next exchange).
"""

from __future__ import annotations

import threading
import time
import tracemalloc

import grpc
import numpy as np
import pytest

from fedsec.audit.log import read_events
from fedsec.config import loads_config
from fedsec.network import demo, framing, pki
from fedsec.network.coordinator import Hub
from fedsec.network.errors import MalformedFrame
from fedsec.network.party_audit import LOG, PartyAudit
from fedsec.network.pki import dns_name
from fedsec.network.site import load_identity
from fedsec.network.transport import DEFAULT_CALLS_PER_PEER, METHOD, TransportClient, TransportError

N = 3
READ_DEADLINE = 1.0


def _held(kind: str, release: threading.Event):
    """The attacker's request stream: it never completes before ``release``."""
    header = next(framing.frames("poll", b"x" * (3 * framing.CHUNK_BYTES)))

    def stream():
        if kind != "nothing":
            yield header
        if kind == "partial":
            yield b"y" * framing.CHUNK_BYTES
        release.wait(30)

    return stream()


def _until(condition, tries: int = 200) -> None:
    """Wait for ``condition`` (a server thread finishing a call the client saw end), at most ~10 s."""
    for _ in range(tries):
        if condition():
            return
        time.sleep(0.05)
    raise AssertionError("condition never held")


@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    return demo.prepare(tmp_path_factory.mktemp("stall"), N, rounds=2)


@pytest.mark.slow
def test_a_site_holding_calls_of_every_kind_and_count_stalls_nobody(deployment, tmp_path):
    d = deployment
    plan = d.plan.read_bytes()
    trust = pki.Trust.load(d.ca)
    (tmp_path / "coordinator").mkdir()
    audit = PartyAudit(tmp_path / "coordinator", actor="coordinator",
                       key=load_identity(d.coordinator.identity), run_id="stall")
    hub = Hub(config=loads_config(plan.decode()), plan_bytes=plan, trust=trust,
              cert_pem=d.coordinator.cert.read_bytes(), key_pem=d.coordinator.key.read_bytes(), audit=audit,
              listen="127.0.0.1:0", read_deadline=READ_DEADLINE)
    port = hub.start()
    attacker = d.sites[N - 1]
    channel = grpc.secure_channel(f"127.0.0.1:{port}", grpc.ssl_channel_credentials(
        root_certificates=trust.ca_pem, private_key=attacker.key.read_bytes(),
        certificate_chain=attacker.cert.read_bytes()),
        options=[("grpc.ssl_target_name_override", dns_name("coordinator", "server"))])
    honest = TransportClient(address=f"127.0.0.1:{port}", trust=trust, cert_path=d.sites[0].cert,
                             key_path=d.sites[0].key, server_name="coordinator")
    rng = np.random.default_rng(6)
    counts = [1, DEFAULT_CALLS_PER_PEER, DEFAULT_CALLS_PER_PEER + 1, 2 * N + 4,
              *rng.integers(1, 4 * N + 8, size=2).tolist()]
    kinds = ["nothing", "header", "partial"]
    try:
        for case, count in enumerate(counts):
            kind = kinds[case % len(kinds)] if case < 3 else kinds[int(rng.integers(len(kinds)))]
            release = threading.Event()
            calls = [channel.stream_stream(METHOD)(_held(kind, release), timeout=30) for _ in range(count)]
            try:
                assert plan in honest.call("plan", b"", deadline=6.0), (kind, count)
                codes = []
                for call in calls:
                    try:
                        list(call)
                        codes.append("OK")
                    except grpc.RpcError as error:
                        codes.append(error.code().name)
            finally:
                release.set()
            held = min(count, DEFAULT_CALLS_PER_PEER)
            assert codes.count("RESOURCE_EXHAUSTED") == count - held, (kind, count, codes)
            assert codes.count("CANCELLED") == held, (kind, count, codes)
            _until(lambda: hub.transport.in_flight(attacker.name) == 0)  # the client hears first
            dropouts = [e for e in read_events(tmp_path / "coordinator" / LOG) if e.action == "dropout"]
            assert sum(e.payload()["site"] == attacker.name for e in dropouts) == sum(
                min(c, DEFAULT_CALLS_PER_PEER) for c in counts[:case + 1])
            assert all(e.payload()["site"] == attacker.name and e.stage == "transport" for e in dropouts)
            assert attacker.name in hub.absent and d.sites[0].name not in hub.absent
    finally:
        honest.close()
        channel.close()
        hub.stop()
        audit.close()


def test_an_honest_call_slower_than_nothing_is_not_refused(deployment, tmp_path):
    """Control: sequential honest calls never count against the cap (slots are released)."""
    d = deployment
    plan = d.plan.read_bytes()
    trust = pki.Trust.load(d.ca)
    (tmp_path / "c").mkdir()
    audit = PartyAudit(tmp_path / "c", actor="coordinator", key=load_identity(d.coordinator.identity),
                       run_id="control")
    hub = Hub(config=loads_config(plan.decode()), plan_bytes=plan, trust=trust,
              cert_pem=d.coordinator.cert.read_bytes(), key_pem=d.coordinator.key.read_bytes(), audit=audit,
              listen="127.0.0.1:0", read_deadline=READ_DEADLINE)
    port = hub.start()
    try:
        with TransportClient(address=f"127.0.0.1:{port}", trust=trust, cert_path=d.sites[1].cert,
                             key_path=d.sites[1].key, server_name="coordinator") as client:
            for _ in range(3 * DEFAULT_CALLS_PER_PEER):
                assert plan in client.call("plan", b"", deadline=6.0)
            with pytest.raises(TransportError) as refused:
                client.call("nonsense", b"", deadline=6.0)
            assert refused.value.code == "INVALID_ARGUMENT"
        assert hub.transport.in_flight(d.sites[1].name) == 0
        assert not [e for e in read_events(tmp_path / "c" / LOG) if e.action == "dropout"]
    finally:
        hub.stop()
        audit.close()


def test_a_header_announcing_the_limit_allocates_only_what_arrives():
    """The framing's buffer grows with the chunks: 200 MiB announced, 64 KiB sent, ~nothing held."""
    header = next(framing.frames("answer", b""))
    announced = 200 << 20
    forged = header[:4] + announced.to_bytes(8, "big") + header[12:]
    tracemalloc.start()
    try:
        with pytest.raises(MalformedFrame, match="of 209715200 announced bytes"):
            framing.reassemble(iter([forged, b"z" * 65536]))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20


@pytest.mark.parametrize("kwargs, key", [({"workers": 8}, "workers"),
                                         ({"read_deadline": 0.0}, "read_deadline"),
                                         ({"max_calls_per_peer": 0}, "max_calls_per_peer"),
                                         ({"max_calls_per_peer": True}, "max_calls_per_peer")])
def test_a_server_too_small_for_its_roster_is_refused(deployment, kwargs, key):
    from fedsec.network.transport import TransportServer

    d = deployment
    with pytest.raises(ValueError, match=f"^{key}:"):
        TransportServer(trust=pki.Trust.load(d.ca), cert_pem=d.coordinator.cert.read_bytes(),
                        key_pem=d.coordinator.key.read_bytes(), handler=lambda *a: b"",
                        roster={s.name for s in d.sites}, **kwargs)


def test_calls_held_on_the_unary_method_are_capped_and_dropped_too(deployment, tmp_path):
    """The same adversary on ``Call`` (the unary fast path): the server reads it as a stream, so the
    slot is taken and the read deadline armed before any byte of the request is read."""
    from fedsec.network.transport import CALL

    d = deployment
    plan = d.plan.read_bytes()
    trust = pki.Trust.load(d.ca)
    (tmp_path / "u").mkdir()
    audit = PartyAudit(tmp_path / "u", actor="coordinator", key=load_identity(d.coordinator.identity),
                       run_id="unary")
    hub = Hub(config=loads_config(plan.decode()), plan_bytes=plan, trust=trust,
              cert_pem=d.coordinator.cert.read_bytes(), key_pem=d.coordinator.key.read_bytes(), audit=audit,
              listen="127.0.0.1:0", read_deadline=READ_DEADLINE)
    port = hub.start()
    attacker = d.sites[N - 1]
    channel = grpc.secure_channel(f"127.0.0.1:{port}", grpc.ssl_channel_credentials(
        root_certificates=trust.ca_pem, private_key=attacker.key.read_bytes(),
        certificate_chain=attacker.cert.read_bytes()),
        options=[("grpc.ssl_target_name_override", dns_name("coordinator", "server"))])
    count = DEFAULT_CALLS_PER_PEER + 2
    release = threading.Event()
    try:
        with TransportClient(address=f"127.0.0.1:{port}", trust=trust, cert_path=d.sites[0].cert,
                             key_path=d.sites[0].key, server_name="coordinator") as honest:
            calls = [channel.stream_unary(CALL).future(_held("nothing", release), timeout=30)
                     for _ in range(count)]
            try:
                assert plan in honest.call("plan", b"", deadline=6.0)
                codes = []
                for call in calls:
                    try:
                        call.result()
                        codes.append("OK")
                    except grpc.RpcError as error:
                        codes.append(error.code().name)
            finally:
                release.set()
        assert codes.count("RESOURCE_EXHAUSTED") == count - DEFAULT_CALLS_PER_PEER, codes
        assert codes.count("CANCELLED") == DEFAULT_CALLS_PER_PEER, codes
        _until(lambda: hub.transport.in_flight(attacker.name) == 0)
        dropouts = [e for e in read_events(tmp_path / "u" / LOG) if e.action == "dropout"]
        assert [e.payload()["site"] for e in dropouts] == [attacker.name] * DEFAULT_CALLS_PER_PEER
        assert attacker.name in hub.absent
    finally:
        channel.close()
        hub.stop()
        audit.close()
