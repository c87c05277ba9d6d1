"""Review r11 (FINDING, low-medium; fails today): under threshold custody a carry between slots
forced by one corrupt client is released silently, every word in range.

Issue 11 item 5: "carries between slots can be made impossible or detectable at the packing
layer, so detect them." The fix (the slot MAC) exists only under key-holder custody; threshold
specs are untagged and the coordinator checks only the count word and the per-word bound. A
corrupt client (its own valid identity, a valid proof of knowledge: it knows its plaintext) puts
2^b - 1 in slot 0; the sum carries (slot 0 becomes s0 - 1, slot 1 gets +1) and is released as
the aggregate. A carry lets a client contribute a NEGATIVE value to a slot (the per-word bound
only limits positive bias), so it is more than the documented "bias within the range checks".
"""

from __future__ import annotations

import numpy as np
import pytest

from protocols.errors import ProtocolAbort
from protocols.paillier.binding import submission_context
from protocols.paillier.messages import SUBMIT_DOMAIN, Submission, encode
from secagg.paillier import encode_batch
from secagg.paillier.knowledge import encrypt_with_witness, prove_knowledge
from tests.protocols.paillier_helpers import make_paillier_session


def test_a_carry_forced_by_a_corrupt_client_is_not_released_under_threshold_custody():
    session = make_paillier_session(4, threshold=2, custody="threshold", key_bits=512)
    spec = session.spec(length=4)
    pk = session.public_key
    layout = spec.layout(pk)
    subs = session.submissions(spec, [0, 1, 2])
    corrupt = session.clients[3]
    words = np.zeros(spec.length, dtype=np.uint64)
    words[0] = (1 << spec.slot_bits) - 1  # one full slot: any honest s0 >= 1 carries
    words[-1] = 1
    plain = layout.pack(words)
    cts, exps = encrypt_with_witness(pk, plain, corrupt._randomness)
    batch = encode_batch(pk, spec.sequence, cts)
    proof = prove_knowledge(pk, corrupt._randomness, cts, plain, exps,
                            submission_context(pk, 3, spec.digest, batch))
    unsigned = Submission(3, spec.digest, batch, proof=proof)
    subs[3] = encode(Submission(3, spec.digest, batch, session.identities[3].sign(
        SUBMIT_DOMAIN + unsigned.signed_part()), proof))
    server = session.server(spec)
    for c, data in subs.items():
        server.receive(c, data)  # accepted: signed, proof verifies
    coordinator = session.coordinator(server)
    request = session.certify(coordinator)
    try:
        result = coordinator.combine({c: session.clients[c].decryption_share(request)
                                      for c in (0, 1)})
    except ProtocolAbort:
        return
    honest = session.expected([0, 1, 2])
    pytest.fail(f"carried sum released: slot 0 {int(result[0])} (honest {int(honest[0])}), "
                f"slot 1 {int(result[1])} (honest {int(honest[1])})")
