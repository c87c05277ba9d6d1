"""Review r9 -- FINDING (fails today): a client "rejected" at the consistency or unmask stage is in the sum.

docs/secure-aggregation.md (Robustness) and ``MaskedServer.rejected``: "clients removed from the
round; they are never in the sum". A survivor whose masked input is already in the server's total
and that then sends one malformed message (a truncated consistency signature, or a malformed unmask
response) is listed in ``rejected``, but it stays in ``survivors``: its seed is rebuilt from the
other holders and its input is released in the sum. Issue 9 item 9 fixed this for the masked-input
stage only. Through ``MaskedAggregation`` the client is then both in ``participants`` and counted in
``metrics['rejected']`` / ``last_rejected``.
"""

import numpy as np
import pytest

from tests.protocols.helpers import make_session
from tests.protocols.test_abort_rules import advance


def _finish(s):
    while not s.server.done:
        for c, message in s.server.outgoing().items():
            s.server.receive(c, s.clients[c].handle(message))
        s.server.close()


@pytest.mark.parametrize("stage", ["consistency check", "unmask"])
def test_a_client_rejected_after_its_masked_input_is_never_in_the_sum(stage):
    s = make_session(8, seed=3)
    out = advance(s, stage)
    bad = sorted(out)[0]
    for c, message in out.items():
        reply = s.clients[c].handle(message)
        s.server.receive(c, reply[:-1] if c == bad else reply)  # one truncated message
    s.server.close()
    _finish(s)
    total, survivors = s.server.result()
    assert np.array_equal(total, s.expected_sum(survivors))  # the sum is exact ...
    assert bad in s.server.rejected  # ... the client is recorded as removed ...
    assert bad not in survivors, (  # ... and yet its input is released inside the sum
        f"client {bad} is in MaskedServer.rejected ({s.server.rejected[bad]!r}) and in the sum")
