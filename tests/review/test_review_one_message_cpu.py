"""Review r9 -- FINDING, medium (fails today): one session-parameters message costs a client days of CPU.

Issue 9 item 8 asks: "A client's cost must stay linear in what it is sent, and its work linear in
its neighbourhood." docs/secure-aggregation-robustness.md lists "Session parameters naming a ring of
up to 2^20 ids, complete or sparse graph" as handled ("work on its own neighbourhood only"), and
notes under "Not covered" that Shamir sharing is O(t k) with no bound in ``ClientPolicy``. On the
complete graph the neighbourhood is the ring, so the work is quadratic in the message: a lying
server names a complete ring of 2^20 ids (an 8 MB message, within the wire limit), t just above
k / 2, and ``_AwaitParams`` starts ``shamir.split`` over k = 2^20 - 1 x-coordinates with a
degree-2^19 polynomial: about 2^40 big-integer multiplications (measured here: k = 1000, 2000, 4000
take 0.6 s, 2.6 s, 9.6 s, so k = 2^20 is on the order of a week), before the client can answer or
abort. Every honest client it sends this to is stuck. ``ClientPolicy`` has no degree or ring bound.

The test hands that message to an unmodified client and expects an answer (or a ``ClientAbort``)
within 2.5 s of handling (an interval timer interrupts it otherwise).
"""

import signal

import numpy as np

from protocols.errors import ClientAbort
from protocols.masked import messages as m
from protocols.masked.client import MaskedClient
from protocols.masked.policy import minimum_threshold
from secagg.keys import SigningKey


class Stalled(Exception):
    pass


def _stop(signum, frame):
    where = []
    while frame is not None:
        where.append(frame.f_code.co_name)
        frame = frame.f_back
    raise Stalled(" <- ".join(where[:4]))


def test_one_parameters_message_does_not_stall_a_client():
    n = 1 << 20
    ring = tuple(range(n))
    me = SigningKey.generate()
    directory = dict.fromkeys(ring, SigningKey.generate().public)
    directory[0] = me.public
    t = minimum_threshold(n, n - 1, 0.1, active=True)
    params = m.SessionParams(ring, n - 1, t, 4, 1.0, 8, n, 1, 4, True, 0)
    session = bytes(16)
    client = MaskedClient(client_id=0, session=session, round_index=1, update=np.zeros(4, np.float32),
                          weight=1, rng=np.random.default_rng(0), signing_key=me, directory=directory)
    data = m.encode(m.Header(0, session, 1, m.SERVER, 0), params)
    assert len(data) < 9 << 20
    previous = signal.signal(signal.SIGALRM, _stop)
    signal.setitimer(signal.ITIMER_REAL, 2.5)
    try:
        client.handle(data)
    except ClientAbort:
        pass
    except Stalled as stall:
        raise AssertionError(f"an honest client given one {len(data) >> 20} MB session-parameters "
                             f"message (complete ring of 2^20, t = {t}) is still computing after "
                             f"2.5 s, in {stall}: O(t k) Shamir sharing, no bound in ClientPolicy") from None
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
