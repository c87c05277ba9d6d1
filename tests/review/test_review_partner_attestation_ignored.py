"""Review r9 -- FINDING, low (fails today): the server ignores the signed partner attestation it holds.

In authenticated mode every client signs a bitmap of the partners it actually masked with and the
server verifies it (``_MaskedInput.accept``) and stores it, but ``_Unmask._mask_terms`` removes the
pairwise masks of a dropped client d for every alive v with ``v in r.sealed[d]`` (what the server
believes it forwarded), and never compares that with v's attestation. If the two differ for any
reason -- one sealed bundle lost or cut from one ``ForwardedShares`` record in transit, a partial
forward -- the honest client correctly masks with fewer partners and says so in its signed bitmap,
the round completes with no abort and no record in ``rejected``/``misbehaved``, and the released sum
is garbage in every word (the weight word included): "never a wrong sum" does not hold, although the
server holds a signed statement that shows the mismatch.

Setting: 7 honest clients, complete graph, authenticated mode. One client's ForwardedShares loses
one bundle; the sender of that bundle drops before sending its masked input (so the server removes
its pairwise masks with everyone it forwarded to).
"""

import numpy as np
import pytest

from protocols.errors import ClientAbort, ProtocolAbort
from protocols.masked import messages as m
from tests.protocols.helpers import make_session
from tests.protocols.test_abort_rules import advance, tampered


def test_a_lost_bundle_is_caught_by_the_attestation_not_released_as_a_wrong_sum():
    s = make_session(7, seed=11, length=6)
    out = advance(s, "masked input")
    victim, gone = sorted(out)[:2]
    for c, message in out.items():
        if c == gone:
            continue  # drops after sharing keys: its masks are removed at unmasking
        if c == victim:  # one record of the forwarded set is lost
            message = tampered(message, m.ForwardedShares,
                               lambda b: m.ForwardedShares(tuple(x for x in b.sealed if x[0] != gone)))
        s.server.receive(c, s.clients[c].handle(message))
    try:
        s.server.close()
        while not s.server.done:
            for c, message in s.server.outgoing().items():
                try:
                    s.server.receive(c, s.clients[c].handle(message))
                except ClientAbort:
                    continue  # the victim refuses to be asked about a partner it never had
            s.server.close()
    except ProtocolAbort:
        return  # acceptable
    total, survivors = s.server.result()
    assert victim in survivors and not s.server.rejected and not s.server.misbehaved
    if not np.array_equal(total, s.expected_sum(survivors)):
        pytest.fail(f"a wrong sum was released silently (weight word {int(total[-2])}, "
                    f"expected {int(s.expected_sum(survivors)[-2])})")
