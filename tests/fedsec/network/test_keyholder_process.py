"""``fedsec keyholder`` as a real OS process: kill -9 and restart, replays, admission, audit."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import numpy as np
import pytest
from fedsec.protocols.paillier import DecryptionRefused
from fedsec.protocols.paillier.keyholder import REFUSAL

from fedsec.audit.log import read_events
from fedsec.network.transport import TransportClient, TransportError
from tests.fedsec.network.conftest import enrol
from tests.fedsec.network.keyholder_helpers import ROOT, coordinator_client, enrol_sites, keyholder_process

pytestmark = pytest.mark.slow


def test_kill_9_restart_refuses_every_burned_number_and_serves_the_next(study, tmp_path):
    state = tmp_path / "kh"
    rng = np.random.default_rng(7)
    with keyholder_process(study, state) as (process, port):
        with coordinator_client(study, port) as coordinator:
            federation = enrol_sites(study, coordinator, ["hosp-a", "hosp-b"], rng)
            requests = {}
            for sequence in (1, 2):
                spec, server, expected = federation.round(sequence)
                requests[sequence] = server.decryption_request()
                assert np.array_equal(server.finish(coordinator.decrypt(requests[sequence])), expected)
            key_id = coordinator.status()["key_id"]
        os.kill(process.pid, signal.SIGKILL)
        assert process.wait(timeout=10) == -signal.SIGKILL
    assert (state / "paillier.key").stat().st_mode & 0o777 == 0o600
    with keyholder_process(study, state, threshold=None) as (process, port):
        with coordinator_client(study, port) as coordinator:
            status = coordinator.status()
            assert (status["key_id"], status["last_sequence"]) == (key_id, 2)
            for sequence in (2, 1):
                assert coordinator.decrypt(requests[sequence]) == REFUSAL
            spec, server, expected = federation.round(3)
            with pytest.raises(DecryptionRefused):  # the client replay of 2 burned nothing: 3 is next
                server.finish(coordinator.decrypt(requests[2]))
            assert np.array_equal(server.finish(coordinator.decrypt(server.decryption_request())), expected)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=20) == 0
    verify = subprocess.run([sys.executable, "-m", "fedsec", "audit", "verify", str(state / "audit.db")],
                            cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert verify.returncode == 0, verify.stderr
    assert "signer auditor" in verify.stdout
    events = read_events(state / "audit.db")
    served = [(e.round, e.payload()["contributors"]) for e in events if e.action == "decrypt.served"]
    assert served == [(1, [0, 1]), (2, [0, 1]), (3, [0, 1])]
    refused = [(e.round, e.payload()["reason"]) for e in events if e.action == "decrypt.refused"]
    assert refused == [(2, "not the next sequence number (3)"), (1, "not the next sequence number (3)"),
                       (2, "not the next sequence number (3)")]
    assert [e.action for e in events].count("start") == 2 and events[-1].action == "stop"
    assert all("reason" not in e.payload() or e.action.endswith("refused") for e in events)


def test_only_the_named_coordinator_is_admitted(study, tmp_path):
    other = enrol(study.foreign_ca_dir, tmp_path / "foreign-coordinator", "coordinator", "server")
    revoked = enrol(study.ca_dir, tmp_path / "revoked-coordinator", "coordinator", "server")
    from fedsec.network import pki

    pki.revoke(study.ca_dir, revoked.cert_pem)
    with keyholder_process(study, tmp_path / "kh") as (process, port):
        def code(party) -> str:
            with TransportClient(address=f"127.0.0.1:{port}", trust=study.trust(), cert_path=party.cert,
                                 key_path=party.key, server_name="auditor", server_role="keyholder",
                                 deadline=10) as client:
                client._server_checked = True  # go straight to the gRPC handshake and admission
                with pytest.raises(TransportError) as caught:
                    client.call("paillier/decrypt", b"junk")
            return caught.value.code

        assert code(other) == "UNAVAILABLE"  # another CA: the TLS handshake fails
        assert code(study.parties["hosp-a"]) == "PERMISSION_DENIED"  # a site may not ask to decrypt
        assert code(study.parties["rogue-server"]) == "PERMISSION_DENIED"  # a server, not the named one
        assert code(revoked) == "UNAUTHENTICATED"  # the coordinator's name on a revoked certificate
        with coordinator_client(study, port) as coordinator:
            assert coordinator.status()["last_sequence"] == 0  # the real coordinator is admitted
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=20) == 130
    actions = [e.action for e in read_events(tmp_path / "kh" / "audit.db")]
    assert actions == ["start", "receive", "send", "stop"]  # refused peers reached no handler
