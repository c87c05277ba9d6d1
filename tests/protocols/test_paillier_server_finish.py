"""The server turns the key holder's wire refusal, or a junk answer, into a typed abort.

On the wire the key holder answers a refused request with the fieldless `REFUSAL` bytes
(`PaillierKeyHolder.respond`). `PaillierServer.finish` raises `DecryptionRefused` for it and
`ProtocolAbort` for junk, both `fl_core` `AggregationError`s, so the round is recorded as
aborted, never a crash (review r11 found a `MalformedMessage`, a ValueError, here).
"""

from __future__ import annotations

import pytest
from fedsec.fl_core.errors import AggregationError
from fedsec.protocols.errors import ProtocolAbort
from fedsec.protocols.paillier import DecryptionRefused

from tests.protocols.paillier_helpers import make_paillier_session


@pytest.mark.parametrize("answer, error", [("refusal", DecryptionRefused), ("junk", ProtocolAbort),
                                           ("truncated", ProtocolAbort)])
def test_server_turns_a_wire_refusal_into_a_protocol_abort(answer, error):
    session = make_paillier_session(3, threshold=2, key_bits=512)
    spec = session.spec(length=4)
    server = session.server(spec)
    for c, data in session.submissions(spec).items():
        server.receive(c, data)
    request = server.decryption_request()
    session.key_holder.respond(request)  # the round's number is now burned
    refusal = session.key_holder.respond(request)
    reply = {"refusal": refusal, "junk": b"\x00" * 7, "truncated": refusal[:-1]}[answer]
    with pytest.raises(error) as raised:
        server.finish(reply)
    assert isinstance(raised.value, AggregationError)
    assert (type(raised.value) is DecryptionRefused) == (answer == "refusal")
