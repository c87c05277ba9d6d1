"""The unmask stage on worker processes (``MaskedServer(workers=2)``) equals the one-process path.

Adversary: any clients of the round, who may drop out at any stage, deal Shamir shares of a value
that is not their secret (above 2^256: no 32-byte secret; below: a wrong seed, or a mask key that
does not match the advertised public key), answer the unmask request with a share that does not
match its commitment, or sign the survivor list with garbage. A hypothesis search over those
choices plays the round once against the project's unmodified honest clients and server, records
every answer, and feeds the same answers to a fresh one-process server and a fresh pooled server:
both must end the same way bit for bit (the same sum and survivors, or the same abort reason), with
the same rejected and misbehaved clients. A worker process killed before the unmask stage ends
the round with the typed :class:`WorkerError` (nothing released), and the next round gets a
fresh pool.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import time

import numpy as np
import pytest
from fedsec.protocols.errors import ClientAbort, ProtocolAbort
from fedsec.protocols.masked import MaskedAggregation, MaskedServer, deferred
from fedsec.protocols.masked import messages as m
from fedsec.protocols.masked.workers import (
    WorkerError,
    WorkerPool,
    shared_pool,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from fedsec import fl_core
from tests.protocols.helpers import make_session
from tests.protocols.test_masked_keys_and_shares import Rewriting, _dealing, _Silent

BATCH = deferred.SIGNATURE_BATCH
HASHES = deferred.HASH_BATCH
ROLES = ("honest", "drop 2", "drop 3", "drop 4", "secret above 2^256", "wrong seed", "wrong mask key",
         "bad unmask share", "bad survivor signature", "bad key signature", "twice",
         "bad key signature, twice", "bad survivor signature, twice", "bad attestation",
         "bad attestation, twice")


def _bad_share(body: m.UnmaskResponse) -> m.UnmaskResponse:
    if not body.shares:
        return body
    (owner, kind, share), *rest = body.shares
    flipped = bytes([share[0], share[1] ^ 1]) + share[2:]  # still a field element, not the committed one
    return m.UnmaskResponse(((owner, kind, flipped), *rest))


def _bad_signature(body: m.ConsistencySignature) -> m.ConsistencySignature:
    return dataclasses.replace(body, signature=bytes(64))


def _bad_attestation(body: m.MaskedInput) -> m.MaskedInput:
    return dataclasses.replace(body, signature=bytes(64))


def _bad_key_signature(body: m.AdvertiseKeys) -> m.AdvertiseKeys:
    return m.AdvertiseKeys(dataclasses.replace(body.entry, signature=bytes(63) + b"\x01"))


def _play(s, roles: dict[int, str]) -> list[list[tuple[int, bytes]]]:
    """Play the round with each client in its role; every stage's answers in arrival order (the
    server's sees them as they come, so the recording is also what a one-process server did)."""
    clients = dict(s.clients)
    for c, role in roles.items():
        if role.startswith("drop"):
            clients[c] = _Silent(s.clients[c], after=int(role[-1]))
        elif role == "secret above 2^256":
            clients[c] = _dealing(s, c, 2**256 + 5, m.SHARE_OF_SEED)
        elif role == "wrong seed":
            clients[c] = _dealing(s, c, 12345, m.SHARE_OF_SEED)
        elif role == "wrong mask key":  # rebuilt (it drops) into a key that is not the advertised one
            clients[c] = _Silent(_dealing(s, c, 2**255 + 7, m.SHARE_OF_MASK_KEY), after=2)
        elif role == "bad unmask share":
            clients[c] = Rewriting(s.clients[c], m.UnmaskResponse, _bad_share)
        elif role.startswith("bad survivor signature"):
            clients[c] = Rewriting(s.clients[c], m.ConsistencySignature, _bad_signature)
        elif role.startswith("bad attestation"):
            clients[c] = Rewriting(s.clients[c], m.MaskedInput, _bad_attestation)
        elif role.startswith("bad key signature"):
            clients[c] = Rewriting(s.clients[c], m.AdvertiseKeys, _bad_key_signature)
    stages, server = [], s.server
    while not server.done:
        answers = []
        for c, message in server.outgoing().items():
            try:
                reply = clients[c].handle(message)
            except ClientAbort:
                continue
            if reply is not None:
                # "twice": the client sends every answer again (a repeat the server must ignore).
                for _ in range(2 if roles.get(c, "").endswith("twice") else 1):
                    answers.append((c, reply))
                    server.receive(c, reply)
        stages.append(answers)
        try:
            server.close()
        except ProtocolAbort:
            break
    return stages


def _replay(s, stages, *, workers: int):
    """A fresh server of the same session fed the recorded answers: how it ended."""
    r = s.server._round
    server = MaskedServer(session=r.session, round_index=r.round_index, graph=r.graph,
                          threshold=r.params.threshold, encoder=r.encoder, length=r.params.length,
                          active=r.params.active, directory=r.directory, corrupt=0.1, workers=workers)
    for answers in stages:
        server.outgoing()
        for c, reply in answers:
            server.receive(c, reply)
        try:
            server.close()
        except ProtocolAbort:
            break
    if server.abort_reason is not None:
        ending = ("aborted", server.abort_reason)
    else:
        total, survivors = server.result()
        ending = ("done", total.tobytes(), total.dtype.str, survivors)
    return ending, server.rejected, server.misbehaved, server.profile.keys()


@pytest.mark.slow  # starts a worker process (once per test session)
@settings(max_examples=14)
@given(graph=st.sampled_from(["complete", "harary"]), seed=st.integers(0, 50),
       roles=st.lists(st.sampled_from(ROLES[1:]), min_size=0, max_size=4))
def test_the_pooled_server_equals_the_one_process_path_under_malicious_clients(graph, seed, roles):
    s = make_session(10, length=9, graph=graph, seed=seed)
    ring = sorted(s.clients)
    chosen = {ring[(seed + 3 * i) % len(ring)]: role for i, role in enumerate(roles)}
    try:  # restored whatever raises: a later test in this process must see the defaults
        deferred.SIGNATURE_BATCH = 3  # small batches: most signature checks go to the worker
        deferred.HASH_BATCH = 2  # and the unmask answers' share hashes too
        stages = _play(s, chosen)
        single, pooled = _replay(s, stages, workers=1), _replay(s, stages, workers=2)
    finally:
        deferred.SIGNATURE_BATCH, deferred.HASH_BATCH = BATCH, HASHES
    assert single[:3] == pooled[:3]
    # The recording server (one process) ended the same way too.
    if s.server.abort_reason is not None:
        assert single[0] == ("aborted", s.server.abort_reason)
    else:
        total, survivors = s.server.result()
        assert single[0] == ("done", total.tobytes(), total.dtype.str, survivors)
        if not set(chosen.values()) & {"wrong seed"}:  # a wrong seed is a lie about its own input
            assert np.array_equal(total, s.expected_sum(survivors))


@pytest.mark.slow
@pytest.mark.parametrize("role", ["secret above 2^256", "wrong mask key"])
def test_each_abort_of_the_reconstruction_is_the_same_on_workers(role):
    s = make_session(10, length=9, graph="harary", seed=21)
    stages = _play(s, {sorted(s.clients)[4]: role, sorted(s.clients)[7]: "drop 2"})
    reason = ("do not rebuild a 32-byte secret" if role == "secret above 2^256"
              else "mask key are inconsistent")
    assert s.server.abort_reason is not None and reason in s.server.abort_reason
    assert _replay(s, stages, workers=2)[0] == ("aborted", s.server.abort_reason)


@pytest.mark.slow
@pytest.mark.parametrize("batch", [BATCH, 2], ids=["at unmasking", "at a signature check"])
def test_a_killed_worker_is_a_typed_abort_and_the_next_round_gets_a_fresh_pool(batch, monkeypatch):
    monkeypatch.setattr(deferred, "SIGNATURE_BATCH", batch)
    s = make_session(9, length=30, graph="harary", seed=5)
    stages = _play(s, {sorted(s.clients)[2]: "drop 2"})
    total, survivors = s.server.result()
    pool = shared_pool(2)
    (pid,) = pool.warm()
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # wait until the process is gone (or a zombie)
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().split(") ")[1].startswith("Z"):
                    break
        except FileNotFoundError:
            break
        time.sleep(0.02)
    ending, _, _, _ = _replay(s, stages, workers=2)
    assert ending[0] == "aborted" and "worker process failed" in ending[1]
    assert ending[1].startswith("unmask: ") == (batch == BATCH)  # 9 signatures: none sent in 64s
    assert pool.broken and shared_pool(2) is not pool
    with pytest.raises(WorkerError):
        pool.partial_sum([], session=s.session, round_index=s.round_index, length=4, modulus_bits=12)
    assert _replay(s, stages, workers=2)[0] == ("done", total.tobytes(), total.dtype.str, survivors)


def test_a_worker_error_is_a_protocol_abort_and_never_a_sum():
    assert issubclass(WorkerError, ProtocolAbort)


@pytest.mark.parametrize("workers", [0, -1, 65, True, 2.0, "2", None])
def test_workers_must_be_an_integer_in_range(workers):
    s = make_session(5, length=4)
    r = s.server._round
    with pytest.raises(ValueError, match="workers must be an integer in"):
        MaskedServer(session=r.session, round_index=r.round_index, graph=r.graph,
                     threshold=r.params.threshold, encoder=r.encoder, length=r.params.length,
                     directory=r.directory, workers=workers)
    with pytest.raises(fl_core.errors.InvalidParameterError, match="workers"):
        MaskedAggregation(max_weight=3, rng=np.random.default_rng(0), workers=workers)
    with pytest.raises(ValueError, match="workers >= 2"):
        WorkerPool(workers=1)


@pytest.mark.slow
def test_masked_aggregation_with_workers_gives_the_same_average():
    rng = np.random.default_rng(3)
    updates = [fl_core.ClientUpdate(c, rng.normal(0, 0.2, 40).astype(np.float32), 2.0) for c in range(8)]
    results = [MaskedAggregation(max_weight=4, rng=np.random.default_rng(9), graph="harary", dropout=0.2,
                                 workers=w).aggregate(1, updates) for w in (1, 2)]
    assert np.array_equal(results[0].weighted_sum, results[1].weighted_sum)
    assert results[0].participants == results[1].participants
