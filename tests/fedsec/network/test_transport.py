"""gRPC + mutual TLS between real servers on 127.0.0.1 and clients in this process."""

from __future__ import annotations

import hashlib
import threading

import numpy as np
import pytest
from fedsec.protocols.errors import MalformedMessage

from fedsec.network.errors import PeerRejected
from fedsec.network.transport import TransportClient, TransportError, TransportServer

RELEASE = threading.Event()


def _echo(peer, topic, payload):
    if topic == "slow":
        RELEASE.wait(timeout=3)
    if topic == "whoami":
        return f"{peer.name}/{peer.role}".encode()
    if topic == "bad":
        raise MalformedMessage("bad")
    if topic == "grow":
        return np.random.default_rng(int(payload)).bytes(int(payload))
    return payload


@pytest.fixture(scope="module")
def server(study):
    coordinator = study.parties["coordinator"]
    srv = TransportServer(trust=study.trust(), cert_pem=coordinator.cert_pem, key_pem=coordinator.key_pem,
                          handler=_echo, roster={"hosp-a", "hosp-b", "hosp-revoked", "rogue-server"},
                          roles=("site",))
    srv.start()
    yield srv
    srv.stop(0)


def _client(study, server, party, *, server_name="coordinator", server_role="server", trust=None):
    return TransportClient(address=f"127.0.0.1:{server.port}", trust=trust or study.trust(),
                           cert_path=party.cert, key_path=party.key, server_name=server_name,
                           server_role=server_role, deadline=5.0)


def test_enrolled_site_on_the_roster_is_served_under_its_certificate_name(study, server):
    with _client(study, server, study.parties["hosp-a"]) as client:
        assert client.call("whoami", b"I am hosp-b, trust me") == b"hosp-a/site"
        assert client.call("echo", b"\x00\x01" * 5) == b"\x00\x01" * 5
        assert client.call("echo", b"") == b""


def test_forty_megabytes_round_trip_beyond_grpcs_default_limit(study, server):
    params = np.random.default_rng(0).standard_normal(10_000_000).astype(np.float32)
    with _client(study, server, study.parties["hosp-b"]) as client:
        reply = client.call("echo", params.tobytes(), )
    assert len(reply) == 40_000_000
    assert hashlib.sha256(reply).digest() == hashlib.sha256(params.tobytes()).digest()


@pytest.mark.parametrize("who, code", [("hosp-x", "PERMISSION_DENIED"),        # not on the roster
                                       ("hosp-revoked", "UNAUTHENTICATED"),    # revoked by the CA
                                       ("rogue-server", "PERMISSION_DENIED"),  # a server posing as a site
                                       ("auditor", "PERMISSION_DENIED")])      # a role not admitted
def test_server_refuses_valid_certificates_it_must_not_admit(study, server, who, code):
    with _client(study, server, study.parties[who]) as client:
        with pytest.raises(TransportError) as caught:
            client.call("whoami", b"")
    assert caught.value.code == code


def test_certificate_from_another_ca_fails_the_handshake(study, server):
    with _client(study, server, study.foreign) as client:
        with pytest.raises(TransportError) as caught:
            client.call("whoami", b"")
    assert caught.value.code == "UNAVAILABLE"


def test_client_refuses_a_server_that_is_not_the_expected_party(study, server):
    # the coordinator's certificate says coordinator/server: expecting another name or role fails TLS
    for name, role in [("other-coordinator", "server"), ("coordinator", "keyholder")]:
        with _client(study, server, study.parties["hosp-a"], server_name=name, server_role=role) as client:
            with pytest.raises(TransportError):
                client.call("whoami", b"")


def test_client_refuses_a_revoked_server(study):
    rogue = study.parties["old-coordinator"]
    # a server still running on its revoked certificate: TLS alone would accept it
    srv = TransportServer(trust=study.trust(), cert_pem=rogue.cert_pem, key_pem=rogue.key_pem, handler=_echo,
                          roster=None, roles=("site",))
    srv.start()
    try:
        with _client(study, srv, study.parties["hosp-a"], server_name="old-coordinator") as client:
            with pytest.raises(PeerRejected) as caught:
                client.call("whoami", b"")
        assert caught.value.reason == "revoked"
    finally:
        srv.stop(0)


def test_handler_errors_map_to_status_codes_without_detail(study, server):
    with _client(study, server, study.parties["hosp-a"]) as client:
        with pytest.raises(TransportError) as caught:
            client.call("bad", b"x")
    assert caught.value.code == "INVALID_ARGUMENT"


def test_a_site_certificate_cannot_serve_as_the_coordinator(study):
    """Vice versa of a site presenting a server role: a site's certificate listening as a server."""
    site = study.parties["hosp-b"]
    srv = TransportServer(trust=study.trust(), cert_pem=site.cert_pem, key_pem=site.key_pem, handler=_echo,
                          roster=None, roles=("site",))
    srv.start()
    try:
        with _client(study, srv, study.parties["hosp-a"], server_name="hosp-b",
                     server_role="server") as client:
            with pytest.raises(TransportError) as caught:
                client.call("whoami", b"")
        assert caught.value.code == "UNAVAILABLE"
    finally:
        srv.stop(0)


def test_deadline_and_payload_limit_are_enforced_over_the_wire(study, server):
    with _client(study, server, study.parties["hosp-a"]) as client:
        try:
            with pytest.raises(TransportError) as caught:
                client.call("slow", b"", deadline=0.2)
            assert caught.value.code == "DEADLINE_EXCEEDED"
        finally:
            RELEASE.set()
    coordinator = study.parties["coordinator"]
    small = TransportServer(trust=study.trust(), cert_pem=coordinator.cert_pem, key_pem=coordinator.key_pem,
                            handler=_echo, roster=None, roles=("site",), max_payload=1000)
    small.start()
    try:
        with _client(study, small, study.parties["hosp-a"]) as client:
            assert client.call("echo", b"x" * 1000) == b"x" * 1000
            with pytest.raises(TransportError) as caught:
                client.call("echo", b"x" * 1001)
        assert caught.value.code == "INVALID_ARGUMENT"
    finally:
        small.stop(0)


def _raw_channel(study, server, party):
    import grpc

    from fedsec.network.pki import dns_name

    return grpc.secure_channel(f"127.0.0.1:{server.port}", grpc.ssl_channel_credentials(
        root_certificates=study.trust().ca_pem, private_key=party.key_pem, certificate_chain=party.cert_pem),
        options=[("grpc.ssl_target_name_override", dns_name("coordinator", "server"))])


def test_a_small_request_with_a_reply_larger_than_one_message_is_spilled_and_fetched(study, server):
    from fedsec.network.framing import CHUNK_BYTES

    size = 3 * CHUNK_BYTES + 5
    with _client(study, server, study.parties["hosp-a"]) as client:
        # a one-message request, its reply spilled and fetched by one streaming call
        assert client.call("grow", str(size).encode()) == np.random.default_rng(size).bytes(size)
        assert client.call("whoami", b"") == b"hosp-a/site"  # one message each way
    assert not server._spilled.get("hosp-a")


def test_a_spilled_reply_is_handed_once_and_only_to_its_peer(study):
    """Adversary: an enrolled site that learns (or guesses) another site's spill ticket, and the
    owner fetching the same ticket twice. The server is the project's unmodified TransportServer."""
    from fedsec.network import framing
    from fedsec.network.transport import CALL, METHOD, SPILL

    big = np.random.default_rng(2).bytes(2 * framing.CHUNK_BYTES)
    coordinator = study.parties["coordinator"]
    srv = TransportServer(trust=study.trust(), cert_pem=coordinator.cert_pem, key_pem=coordinator.key_pem,
                          handler=lambda peer, topic, payload: big, roster={"hosp-a", "hosp-b"})
    srv.start()
    owner, thief = (_raw_channel(study, srv, study.parties[n]) for n in ("hosp-a", "hosp-b"))
    try:
        reply = owner.unary_unary(CALL)(framing.single("job", b""), timeout=5)
        topic, ticket = framing.unpack([reply])
        assert topic == SPILL and len(ticket) == 16
        import grpc

        with pytest.raises(grpc.RpcError) as stolen:
            list(thief.stream_stream(METHOD)(framing.frames(SPILL, ticket), timeout=5))
        assert stolen.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        fetched = framing.reassemble(owner.stream_stream(METHOD)(framing.frames(SPILL, ticket), timeout=5))
        assert fetched == ("job", big)
        with pytest.raises(grpc.RpcError) as again:
            list(owner.stream_stream(METHOD)(framing.frames(SPILL, ticket), timeout=5))
        assert again.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        # a peer that never fetches keeps at most max_calls_per_peer replies on the server
        for _ in range(3 * srv.max_calls_per_peer):
            owner.unary_unary(CALL)(framing.single("job", b""), timeout=5)
        assert len(srv._spilled["hosp-a"]) == srv.max_calls_per_peer
    finally:
        owner.close()
        thief.close()
        srv.stop(0)


def test_a_site_admitted_before_is_refused_once_revoked_or_off_the_roster(study, tmp_path):
    """The server admits a peer from its certificate's exact PEM bytes (verify_peer's cache: the
    second call of a peer parses and verifies nothing again): a site whose certificate is cached is
    still refused on its next call once the CA revokes it, and a server whose roster omits it
    refuses it although its certificate is cached."""
    from fedsec.network import pki

    from .conftest import enrol

    late = enrol(study.ca_dir, tmp_path / "late", "hosp-cached", "site")
    coordinator = study.parties["coordinator"]
    servers = [TransportServer(trust=study.trust(), cert_pem=coordinator.cert_pem,
                               key_pem=coordinator.key_pem, handler=_echo, roster=roster, roles=("site",))
               for roster in ({"hosp-cached"}, {"hosp-a"})]
    for srv in servers:
        srv.start()
    try:
        with _client(study, servers[0], late) as client:
            assert client.call("whoami", b"") == b"hosp-cached/site"
            assert client.call("whoami", b"") == b"hosp-cached/site"  # admitted from the cache
            with _client(study, servers[1], late) as other, pytest.raises(TransportError) as caught:
                other.call("whoami", b"")
            assert caught.value.code == "PERMISSION_DENIED"
            pki.revoke(study.ca_dir, late.cert_pem)
            with pytest.raises(TransportError) as caught:
                client.call("whoami", b"")
            assert caught.value.code == "UNAUTHENTICATED"
    finally:
        for srv in servers:
            srv.stop(0)
