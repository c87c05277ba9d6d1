"""Review S6-3 (fixed: ``workers.HUNG_AFTER_S``): a HUNG unmask worker process blocked the masked
server forever (no typed error).

Claim attacked (``protocols/masked/workers.py`` module docstring, docs/secure-aggregation.md, the
brief of the worker-pool change): "a worker that dies, or answers anything else, raises
:class:`WorkerError` ... the round releases nothing". A worker that neither dies nor answers (stopped,
swapping, deadlocked) is never noticed: ``WorkerPool.partial_sum`` and ``DeferredSignatures`` wait
on ``Future.result()`` with no deadline, so the coordinator's round (and with it the whole run, the
other sites' stage deadlines included) hangs at the unmask stage instead of aborting with the
typed error and starting a fresh pool.

The round is the project's own (``tests.protocols.test_unmask_workers``'s recording of honest
clients, one dropping out), replayed into an unmodified ``MaskedServer(workers=2)`` whose single
worker process is stopped (SIGSTOP) before the unmask stage. The secure outcome: within a bounded
time the server ends the round with :class:`WorkerError` (or finishes it correctly). The worker is
killed in ``finally`` (which lets the blocked call end with the BrokenProcessPool it was waiting for).
"""

from __future__ import annotations

import os
import signal
import threading

import pytest
from fedsec.protocols.masked import workers
from fedsec.protocols.masked.deferred import DeferredSignatures
from fedsec.protocols.masked.workers import WorkerError, close_pools, shared_pool
from fedsec.secagg import keys as crypto

from tests.protocols.helpers import make_session, stopped_worker
from tests.protocols.test_unmask_workers import _play, _replay

WAIT_S = 8.0
"""How long the server may take to notice (the whole replay takes well under a second otherwise)."""


@pytest.mark.slow
def test_a_hung_worker_is_a_typed_abort_not_a_hang(monkeypatch):
    monkeypatch.setattr(workers, "HUNG_AFTER_S", 1.0)  # the default, 30 s, is the same rule
    s = make_session(9, length=30, graph="harary", seed=5)
    stages = _play(s, {sorted(s.clients)[2]: "drop 2"})
    close_pools()
    pool = shared_pool(2)
    (pid,) = pool.warm()
    outcome: list[object] = []
    thread = threading.Thread(target=lambda: outcome.append(_replay(s, stages, workers=2)[0]), daemon=True)
    try:
        os.kill(pid, signal.SIGSTOP)
        thread.start()
        thread.join(WAIT_S)
        hung = thread.is_alive()
    finally:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        thread.join(10)
        close_pools()
    assert not hung, f"the masked server still waits for the stopped worker after {WAIT_S} s"
    ending = outcome[0]
    assert ending[0] == "aborted" and "worker process failed" in ending[1]
    assert "no answer within" in ending[1]


@pytest.mark.slow
def test_a_hung_worker_checking_signatures_is_a_typed_abort(monkeypatch):
    monkeypatch.setattr(workers, "HUNG_AFTER_S", 1.0)
    identity = crypto.SigningKey.generate()
    with stopped_worker() as pool:
        checks = DeferredSignatures(pool, batch=1)
        checks.add(0, identity.public, identity.sign(b"m"), b"m")
        with pytest.raises(WorkerError, match="no answer within"):
            checks.finish()
        assert pool.broken and shared_pool(2) is not pool  # the next round gets a fresh pool
