"""X25519 public keys: every small-order point and every non-canonical encoding is refused.

The small-order set is checked against an independent x-only Montgomery ladder: a u-coordinate
has order dividing 8 (on Curve25519 or its twist) exactly when three doublings reach infinity.
"""

import itertools

import pytest
from fedsec.secagg import keys
from fedsec.secagg.errors import CryptoError
from hypothesis import given, settings
from hypothesis import strategies as st

P = keys.FIELD_PRIME
A = 486662


def eight_times_is_infinity(u: int) -> bool:
    x, z = u % P, 1
    for _ in range(3):
        x, z = (x * x - z * z) ** 2 % P, 4 * x * z * (x * x + A * x * z + z * z) % P
    return z == 0


def encodings(u: int) -> list[bytes]:
    """u, u + p when it still fits 255 bits, and both with the ignored top bit set."""
    values = [u] + ([u + P] if u + P < 2**255 else [])
    return [(v | top).to_bytes(32, "little") for v, top in itertools.product(values, (0, 2**255))]


SMALL_ORDER_ENCODINGS = [e for u in sorted(keys.SMALL_ORDER_U) for e in encodings(u)]


def test_the_small_order_set_is_exactly_the_points_of_order_dividing_8():
    assert all(eight_times_is_infinity(u) for u in keys.SMALL_ORDER_U)
    order_8 = [u for u in keys.SMALL_ORDER_U if u not in (0, 1, P - 1)]
    assert len(order_8) == 2
    for u in order_8:  # order exactly 8: two doublings do not reach infinity
        x, z = u, 1
        for _ in range(2):
            x, z = (x * x - z * z) ** 2 % P, 4 * x * z * (x * x + A * x * z + z * z) % P
        assert z != 0
    # 14 encodings: 5 canonical values, p and p + 1 for 0 and 1, each with or without the top bit.
    assert len(SMALL_ORDER_ENCODINGS) == len(set(SMALL_ORDER_ENCODINGS)) == 14


@pytest.mark.parametrize("public", SMALL_ORDER_ENCODINGS, ids=lambda b: b.hex()[:8] + b.hex()[-2:])
def test_small_order_keys_are_refused_and_agreement_with_them_fails(public):
    with pytest.raises(CryptoError):
        keys.check_public_key(public)
    with pytest.raises(CryptoError) as info:
        keys.KeyPair.generate().agree(public)
    assert str(info.value) == "cryptographic verification failed"  # says nothing more


@settings(max_examples=40)
@given(raw=st.binary(min_size=32, max_size=32))
def test_random_encodings_are_accepted_iff_canonical_and_not_small_order(raw):
    u = int.from_bytes(raw, "little")
    should_pass = u < P and not eight_times_is_infinity(u)
    try:
        keys.check_public_key(raw)
        passed = True
    except CryptoError:
        passed = False
    assert passed == should_pass


@settings(max_examples=40)
@given(offset=st.integers(0, 2**256 - P - 1))
def test_non_canonical_encodings_of_any_point_are_refused(offset):
    # Every value in [p, 2^256) is non-canonical (u >= p, or the top bit set).
    with pytest.raises(CryptoError):
        keys.check_public_key((P + offset).to_bytes(32, "little"))


@pytest.mark.parametrize("bad", [b"", bytes(31), bytes(33), "x" * 32])
def test_keys_of_the_wrong_size_or_type_are_refused(bad):
    with pytest.raises(CryptoError):
        keys.check_public_key(bad)


def test_honest_keys_pass_and_agree():
    a, b = keys.KeyPair.generate(), keys.KeyPair.generate()
    for pair in (a, b):
        keys.check_public_key(pair.public)
    assert a.agree(b.public) == b.agree(a.public) != bytes(32)
