"""Review r11 (FINDING, fails today; robustness): one spec with sequence number 2^64 - 1 bricks an
honest client for the lifetime of the key.

Issue 11 item 4 was "the sequence number is burned before any other check; one junk request with
2^64 - 1 makes every later aggregation undecryptable" for the key holder. The key holder now
accepts only the next number, but the client keeps the same rule the key holder dropped:
`PaillierClient.submit` accepts ANY sequence above its last one (specs are unauthenticated) and
records it, so after one spec with 2^64 - 1 (or 2^63, beyond what the key holder's store can ever
reach) it refuses every later aggregation as a REPLAY, in both custodies. The key holder and the
threshold parties can never reach that number (the key holder only accepts last + 1 and caps at
2^63 - 1), so the client is out for good, even after the server is replaced or honest again.
"""

from __future__ import annotations

import numpy as np
import pytest

from protocols.errors import ClientAbort
from protocols.paillier import RoundSpec
from tests.protocols.paillier_helpers import make_paillier_session


@pytest.mark.parametrize("custody", ["key_holder", "threshold"])
def test_one_huge_sequence_number_locks_a_client_out_for_good(custody):
    session = make_paillier_session(3, threshold=2, custody=custody, key_bits=512)
    honest = session.spec(length=4)
    probe = RoundSpec(sequence=(1 << 64) - 1, length=honest.length, slot_bits=honest.slot_bits,
                      word_bound=honest.word_bound, max_contributions=honest.max_contributions,
                      tagged=honest.tagged)
    words = np.zeros(honest.length - 1, dtype=np.uint64)
    session.clients[0].submit(probe.to_bytes(), words)  # accepted: any number above the last
    try:
        session.clients[0].submit(honest.to_bytes(), words)
    except ClientAbort as abort:
        pytest.fail(f"client 0 refuses aggregation {honest.sequence} for good: {abort.reason}")
