"""Review r11 (FINDING, low; fails today; liveness): after a key rotation the key holder's burned
numbers start again at 1 ("The burned number is per Paillier key id; a new key starts again at
1", docs/paillier-keyholder.md), but every client keeps its last submitted sequence number across
keys and refuses anything not above it. So the first aggregation under the new key (sequence 1,
the only one the new key holder accepts) is refused by every client that ever contributed, and a
continued numbering is refused by the key holder: no aggregation decrypts until the server has
void-burned as many numbers as the old key ever used.
"""

from __future__ import annotations

import numpy as np
import pytest

from protocols.errors import ClientAbort
from protocols.paillier import PaillierKeyHolder, RoundSpec
from tests.protocols.paillier_helpers import WORD_BOUND, make_paillier_session
from secagg.paillier import slot_bits_for


def test_after_a_key_rotation_the_first_aggregation_is_accepted_by_clients():
    session = make_paillier_session(3, threshold=2, key_bits=512)
    for _ in range(3):  # three aggregations under the first key
        spec = session.spec(length=4)
        server = session.server(spec)
        for c, data in session.submissions(spec).items():
            server.receive(c, data)
        server.finish(session.key_holder.decrypt(server.decryption_request()))
    old = session.key_holder
    rotated = PaillierKeyHolder(threshold=2, key_bits=512, server_identity=old.server_identity,
                                identity=old.identity, epoch=2, allow_insecure=True)
    for c, client in session.clients.items():
        rotated.enroll(c, session.identities[c].public)
        client.receive_welcome(rotated.register(client.receive_announcement(rotated.announcement())))
    assert rotated.last_sequence == 0
    spec = RoundSpec(sequence=1, length=5, slot_bits=slot_bits_for(WORD_BOUND, 3),
                     word_bound=WORD_BOUND, max_contributions=3)
    try:
        session.clients[0].submit(spec.to_bytes(), np.zeros(4, dtype=np.uint64))
    except ClientAbort as abort:
        pytest.fail(f"the new key holder only accepts sequence 1, the client refuses it: {abort}")
