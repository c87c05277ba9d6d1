"""Review r11 (FINDING, low; fails today; robustness at the seam): on the wire the key holder
answers a refused request with the fieldless `REFUSAL` bytes (`PaillierKeyHolder.respond`), but
`PaillierServer.finish`, the server's only handler of the key holder's answer, raises
`MalformedMessage` (a ValueError, not an `fl_core` `AggregationError`) for it, so a wire deployment
crashes the round instead of recording it as aborted. Same for a junk answer.
"""

from __future__ import annotations

import pytest

from protocols.errors import ProtocolAbort
from tests.protocols.paillier_helpers import make_paillier_session


@pytest.mark.parametrize("answer", ["refusal", "junk"])
def test_server_turns_a_wire_refusal_into_a_protocol_abort(answer):
    session = make_paillier_session(3, threshold=2, key_bits=512)
    spec = session.spec(length=4)
    server = session.server(spec)
    for c, data in session.submissions(spec).items():
        server.receive(c, data)
    request = server.decryption_request()
    session.key_holder.respond(request)  # the round's number is now burned
    reply = session.key_holder.respond(request) if answer == "refusal" else b"\x00" * 7
    with pytest.raises(ProtocolAbort):
        server.finish(reply)
