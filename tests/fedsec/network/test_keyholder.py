"""The key holder service in one process: enrolment by certificate, persisted registrations, the
coordinator's certificate key as the only request signer, the refusal reason in the log only."""

from __future__ import annotations

import json
import os
from dataclasses import replace

import numpy as np
import pytest
from fedsec.protocols.errors import MalformedMessage
from fedsec.protocols.paillier import PaillierClient, PaillierServer, RoundSpec
from fedsec.protocols.paillier.keyholder import REFUSAL
from fedsec.protocols.paillier.messages import REQUEST_DOMAIN, DecryptionRequest, decode, encode
from fedsec.protocols.paillier.spec import roster_digest
from fedsec.secagg.paillier import slot_bits_for
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedsec.audit.log import read_events
from fedsec.cli import main as fedsec_main
from fedsec.network.keyholder import (
    ANNOUNCE,
    DECRYPT,
    ENROL,
    REGISTER,
    STATUS,
    KeyHolderService,
    encode_enrolment,
    load_identity,
)
from fedsec.network.keyholder_state import KeyHolderState
from fedsec.network.pki import verify_peer
from tests.fedsec.network.conftest import enrol
from tests.fedsec.network.keyholder_helpers import Caller, cert_identity, identity_path


@pytest.fixture(scope="module")
def key_state(tmp_path_factory):
    """One 2048-bit key made once; each test copies the key file into a fresh state directory."""
    directory = tmp_path_factory.mktemp("key")
    KeyHolderState(directory, threshold=2).close()
    return (directory / "paillier.key").read_text()


@pytest.fixture
def make_service(study, key_state, tmp_path):
    state_dir = tmp_path / "kh"
    state_dir.mkdir(mode=0o700)
    fd = os.open(state_dir / "paillier.key", os.O_WRONLY | os.O_CREAT, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(key_state)
    identity = load_identity(identity_path(study.parties["auditor"]))
    opened = []

    def make(sites=None):
        service = KeyHolderService(state=KeyHolderState(state_dir), identity=identity, name="auditor",
                                   trust=study.trust(), sites=sites,
                                   certificate=study.parties["auditor"].cert_pem)
        opened.append(service)
        return service

    yield make
    for service in opened:
        try:
            service.close()
        except Exception:
            pass


def peer(study, name: str) -> Caller:
    return Caller(name, verify_peer(study.parties[name].cert_pem, trust=study.trust(),
                                    roles=("server", "site", "keyholder")).identity_key)


def site_client(study, service, client_id: int, name: str) -> PaillierClient:
    coordinator = peer(study, "coordinator")
    client = PaillierClient(client_id, identity=load_identity(identity_path(study.parties[name])),
                            announcer_identity=cert_identity(study.parties["auditor"].cert))
    registration = client.receive_announcement(service.handle(coordinator, ANNOUNCE, b""))
    client.receive_welcome(service.handle(coordinator, REGISTER, registration))
    return client


ROSTER = ("hosp-a", "hosp-b")


def aggregation(study, clients, sequence: int, roster=ROSTER):
    spec = RoundSpec(sequence=sequence, length=8, slot_bits=slot_bits_for(100, len(clients)),
                     word_bound=100, max_contributions=len(clients), tagged=True,
                     roster=roster_digest(roster))
    server = PaillierServer(clients[0].public_key, spec, expected=[c.client_id for c in clients],
                            threshold=2, identities={c.client_id: c._identity.public for c in clients},
                            identity=load_identity(identity_path(study.parties["coordinator"])),
                            roster=roster)
    for c in clients:
        server.receive(c.client_id, c.submit(spec.to_bytes(), np.full(7, c.client_id + 1, dtype=np.uint64),
                                             roster=roster))
    return server


def test_enrolment_takes_the_identity_key_from_a_verified_site_certificate(study, make_service, tmp_path):
    service = make_service(sites=frozenset({"hosp-a", "hosp-b", "hosp-revoked"}))
    coordinator = peer(study, "coordinator")
    service.handle(coordinator, ENROL, encode_enrolment(0, study.parties["hosp-a"].cert_pem))
    service.handle(coordinator, ENROL, encode_enrolment(0, study.parties["hosp-a"].cert_pem))  # idempotent
    refused = {
        "revoked": encode_enrolment(1, study.parties["hosp-revoked"].cert_pem),
        "chain": encode_enrolment(1, study.foreign.cert_pem),
        "role": encode_enrolment(1, study.parties["rogue-server"].cert_pem),
        "roster": encode_enrolment(1, study.parties["hosp-x"].cert_pem),
        "another id for hosp-a": encode_enrolment(1, study.parties["hosp-a"].cert_pem),
        "another site for id 0": encode_enrolment(0, study.parties["hosp-b"].cert_pem),
        "malformed": b"FSKH\x01\x01" + b"\x00" * 3,
    }
    for payload in refused.values():
        with pytest.raises(MalformedMessage, match="^enrolment refused$"):
            service.handle(coordinator, ENROL, payload)
    assert service.state.enrolled() == [(0, "hosp-a", cert_identity(study.parties["hosp-a"].cert))]
    reasons = [e.payload()["reason"] for e in read_events(service.state.audit_path)
               if e.action == "enrol.refused"]
    assert reasons[:4] == ["revoked", "chain", "role", "roster"] and len(reasons) == 7


def test_a_restarted_key_holder_keeps_registrations_and_refuses_a_replaced_one(study, make_service):
    service = make_service()
    coordinator = peer(study, "coordinator")
    for i, name in enumerate(["hosp-a", "hosp-b"]):
        service.handle(coordinator, ENROL, encode_enrolment(i, study.parties[name].cert_pem))
    a = site_client(study, service, 0, "hosp-a")
    first = a._registration
    a = site_client(study, service, 0, "hosp-a")  # hosp-a restarted: a new tag key replaces the first
    b = site_client(study, service, 1, "hosp-b")
    service.close()
    restarted = make_service()
    with pytest.raises(MalformedMessage):
        restarted.handle(coordinator, REGISTER, first)  # the replaced registration stays refused
    server = aggregation(study, [a, b], 1)
    words = server.finish(restarted.handle(coordinator, DECRYPT, server.decryption_request()))
    assert words.tolist() == [3] * 7 + [2]
    assert json.loads(restarted.handle(coordinator, STATUS, b""))["last_sequence"] == 1


def test_requests_verify_only_under_the_calling_coordinators_certificate_key(study, make_service):
    service = make_service()
    coordinator, rogue = peer(study, "coordinator"), peer(study, "rogue-server")
    for i, name in enumerate(["hosp-a", "hosp-b"]):
        service.handle(coordinator, ENROL, encode_enrolment(i, study.parties[name].cert_pem))
    clients = [site_client(study, service, i, n) for i, n in enumerate(["hosp-a", "hosp-b"])]
    honest = aggregation(study, clients, 1)
    request = decode(honest.decryption_request(), DecryptionRequest)
    rogue_key = load_identity(identity_path(study.parties["rogue-server"]))
    forged = encode(replace(request, signature=rogue_key.sign(REQUEST_DOMAIN + request.signed_part())))
    assert service.handle(coordinator, DECRYPT, forged) == REFUSAL  # signed by another server's key
    assert service.holder.last_sequence == 0  # refused before anything was burned
    assert service.handle(rogue, DECRYPT, honest.decryption_request()) == REFUSAL  # the key of the caller
    assert honest.finish(service.handle(coordinator, DECRYPT, honest.decryption_request())).size == 8
    events = read_events(service.state.audit_path)
    refused = [e for e in events if e.action == "decrypt.refused"]
    assert [e.payload()["reason"] for e in refused] == ["malformed, or not signed by the server"] * 2
    replies = [e.payload() for e in events
               if e.action == "send" and e.payload()["kind"] == "paillier/decrypt.reply"]
    assert [r["to"] for r in replies] == ["coordinator", "rogue-server", "coordinator"]
    # one refusal, whatever the reason
    assert replies[0]["sha256"] == replies[1]["sha256"] != replies[2]["sha256"]


SITES = ["hosp-a", "hosp-b", "hosp-x", "hosp-revoked"]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(moves=st.lists(st.tuples(st.integers(0, 3), st.sampled_from(SITES + ["foreign", "rogue-server"])),
                      max_size=12))
def test_a_searching_coordinator_enrols_each_real_site_under_one_id_at_most(study, make_service, moves):
    """Adversary: the coordinator, enrolling any certificate it holds under any id, in any order.
    Invariant: the enrolled map is injective both ways, holds only valid unrevoked site certificates
    with their own identity keys, and a refused enrolment changes nothing."""
    service = make_service()
    coordinator = peer(study, "coordinator")
    expected: dict[int, str] = {}
    for client_id, who in moves:
        party = study.foreign if who == "foreign" else study.parties[who]
        valid = who in ("hosp-a", "hosp-b", "hosp-x")
        fits = expected.get(client_id, who) == who and all(n != who or i == client_id
                                                            for i, n in expected.items())
        try:
            service.handle(coordinator, ENROL, encode_enrolment(client_id, party.cert_pem))
            accepted = True
        except MalformedMessage:
            accepted = False
        assert accepted == (valid and fits)
        if accepted:
            expected[client_id] = who
        assert service.state.enrolled() == [(i, n, cert_identity(study.parties[n].cert))
                                            for i, n in sorted(expected.items())]
    service.close()
    for path in service.state.directory.glob("*.db*"):
        path.unlink()


def test_a_changed_threshold_or_an_open_key_file_is_refused(study, key_state, tmp_path):
    directory = tmp_path / "kh"
    directory.mkdir()
    (directory / "paillier.key").write_text(key_state)
    os.chmod(directory / "paillier.key", 0o644)
    with pytest.raises(ValueError, match="^state: .*chmod 600"):
        KeyHolderState(directory)
    os.chmod(directory / "paillier.key", 0o600)
    with pytest.raises(ValueError, match="^threshold: .* t = 2"):
        KeyHolderState(directory, threshold=3)
    with pytest.raises(ValueError, match="^threshold: a new key holder needs"):
        KeyHolderState(tmp_path / "new")
    assert not (tmp_path / "new").exists()  # refused before anything is written


def test_the_command_refuses_a_certificate_or_identity_that_is_not_the_key_holders(study, tmp_path, capsys):
    auditor, coordinator = study.parties["auditor"], study.parties["coordinator"]
    base = ["keyholder", "--ca", str(study.ca_dir / "ca.crt"), "--listen", "127.0.0.1:0", "--state",
            str(tmp_path / "kh"), "--coordinator", "coordinator", "--threshold", "2"]
    assert fedsec_main(base + ["--cert", str(coordinator.cert), "--key", str(coordinator.key)]) == 2
    assert "cert: " in capsys.readouterr().err
    assert fedsec_main(base + ["--cert", str(auditor.cert), "--key", str(auditor.key), "--identity",
                               str(identity_path(coordinator))]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("fedsec: error: identity: ") and len(err.splitlines()) == 1
    assert not (tmp_path / "kh").exists()  # nothing written before the arguments are checked
    assert fedsec_main(base[:-2] + ["--cert", str(auditor.cert), "--key", str(auditor.key),
                                    "--coordinator", "Not A Name"]) == 2
    revoked = enrol(study.ca_dir, tmp_path / "kh2", "auditor-old", "keyholder")
    from fedsec.network import pki

    pki.revoke(study.ca_dir, revoked.cert_pem)
    assert fedsec_main(base + ["--cert", str(revoked.cert), "--key", str(revoked.key)]) == 2
    assert "(revoked)" in capsys.readouterr().err


def test_an_enrolment_that_no_longer_verifies_stops_counting_at_once_and_after_restarts(study, make_service,
                                                                                       tmp_path):
    """Review S6-2: a site revoked after it enrolled and registered no longer counts, without a
    restart: its next decryption is refused (the number burned) and its registration refused, each
    logged with the reason; a restarted key holder does not replay it; an enrolment stored without a
    certificate (a state from before the fix) counts only once enrolled again."""
    from fedsec.network import pki

    late = enrol(study.ca_dir, tmp_path / "hosp-late", "hosp-late", "site")
    study.parties["hosp-late"] = late
    service = make_service()
    coordinator = peer(study, "coordinator")
    for i, name in enumerate(["hosp-a", "hosp-late", "hosp-b"]):
        service.handle(coordinator, ENROL, encode_enrolment(i, study.parties[name].cert_pem))
    a, b = site_client(study, service, 0, "hosp-a"), site_client(study, service, 2, "hosp-b")
    gone = site_client(study, service, 1, "hosp-late")
    roster = ("hosp-a", "hosp-b", "hosp-late")
    server = aggregation(study, [a, gone], 1, roster=roster)
    assert server.finish(service.handle(coordinator, DECRYPT, server.decryption_request())).size == 8
    pki.revoke(study.ca_dir, late.cert_pem)
    server = aggregation(study, [a, gone], 2, roster=roster)
    assert service.handle(coordinator, DECRYPT, server.decryption_request()) == REFUSAL
    assert service.holder.last_sequence == 2  # burned
    with pytest.raises(MalformedMessage):
        service.handle(coordinator, REGISTER, gone._registration)
    events = read_events(service.state.audit_path)
    withdrawn = [e.payload() for e in events if e.action == "enrol.withdrawn"]
    assert withdrawn == [{"client_id": 1, "site": "hosp-late", "reason": "revoked"}]
    assert "withdrawn" in [e for e in events if e.action == "decrypt.refused"][-1].payload()["reason"]
    server = aggregation(study, [a, b], 3, roster=roster)  # the others still sum
    assert server.finish(service.handle(coordinator, DECRYPT, server.decryption_request())).size == 8
    service.state._db.execute("DELETE FROM certificates WHERE client_id = 0")  # an older state's row
    service.close()
    restarted = make_service()
    start = [e.payload() for e in read_events(restarted.state.audit_path) if e.action == "enrol.withdrawn"]
    assert [(w["client_id"], w["reason"]) for w in start[1:]] == [
        (0, "no certificate stored for this enrolment"), (1, "revoked")]
    server = aggregation(study, [a, b], 4, roster=roster)
    assert restarted.handle(coordinator, DECRYPT, server.decryption_request()) == REFUSAL
    restarted.handle(coordinator, ENROL, encode_enrolment(0, study.parties["hosp-a"].cert_pem))
    a = site_client(study, restarted, 0, "hosp-a")  # enrolled again: it registers again and counts
    server = aggregation(study, [a, b], 5, roster=roster)
    assert server.finish(restarted.handle(coordinator, DECRYPT, server.decryption_request())).size == 8
