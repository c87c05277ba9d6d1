import dataclasses

import pytest
from fedsec.protocols.errors import MalformedMessage
from fedsec.protocols.masked import messages as m
from hypothesis import given
from hypothesis import strategies as st

HEADER = m.Header(0, b"s" * 16, 3, 17, m.SERVER)
KEY = m.KeyEntry(5, b"a" * 32, b"b" * 32, b"h" * 32, b"")
SAMPLES = [
    m.SessionParams((3, 1, 2), 2, 2, 10, 1.5, 16, 3, 100, 10, True),
    m.AdvertiseKeys(dataclasses.replace(KEY, signature=b"z" * 64)),
    m.KeyList((KEY, dataclasses.replace(KEY, client=6))),
    m.ShareKeys(((1, b"x" * m.SEALED_BYTES), (2, b"y" * m.SEALED_BYTES)), b"c" * 128),
    m.ForwardedShares(((1, b"x" * m.SEALED_BYTES),)),
    m.MaskedInput(b"\x00\x01" * 40),
    m.MaskedInput(b"\x00\x01" * 40, b"\x05", b"p" * 64),
    m.ConsistencyRequest((1, 2, 3)),
    m.ConsistencySignature(b"q" * 64),
    m.UnmaskRequest((1, 2), (3,), ((1, b"s" * 64),)),
    m.UnmaskRequest((1, 2), (3,), ((1, b"s" * 64),), ((1, b"\x03", b"a" * 64), (2, b"\x06", b"b" * 64))),
    m.UnmaskResponse(((1, m.SHARE_OF_SEED, b"\x00" * 33), (3, m.SHARE_OF_MASK_KEY, b"\x01" * 33))),
]


@pytest.mark.parametrize("body", SAMPLES, ids=lambda b: type(b).__name__)
def test_round_trip_and_strict_parsing(body):
    data = m.encode(dataclasses.replace(HEADER, kind=body.KIND), body)
    header, parsed = m.decode(data, expect=type(body), session=b"s" * 16, round_index=3)
    assert parsed == body and header.sender == 17
    for broken in (data[:-1], data + b"\x00", b"NOPE" + data[4:]):
        with pytest.raises(MalformedMessage):
            m.decode(broken, expect=type(body))
    other = next(t for t in m.MESSAGE_TYPES.values() if t.KIND != body.KIND)
    with pytest.raises(MalformedMessage):
        m.decode(data, expect=other)
    with pytest.raises(MalformedMessage, match="another round"):
        m.decode(data, expect=type(body), round_index=4)


@given(data=st.binary(max_size=300), kind=st.sampled_from(sorted(m.MESSAGE_TYPES)))
def test_random_bytes_never_raise_anything_but_malformed(data, kind):
    prefix = m.MAGIC + bytes([kind]) + b"s" * 16 + bytes(24)
    for candidate in (data, prefix + data):
        try:
            m.decode(candidate, expect=m.MESSAGE_TYPES[kind])
        except MalformedMessage:
            pass


def test_unknown_share_kind_is_malformed():
    body = m.UnmaskResponse(((1, 7, b"\x00" * 33),))
    with pytest.raises(MalformedMessage):
        m.decode(m.encode(HEADER, body), expect=m.UnmaskResponse)
