"""Packed Paillier: keys, exact homomorphic sums, fresh randomness, batch validation, threshold."""

from __future__ import annotations

import itertools

import gmpy2
import pytest
from fedsec.secagg.errors import InvalidArgumentError, InvalidCiphertextError, ReconstructionError
from fedsec.secagg.paillier import (
    DJNRandomness,
    PaillierPublicKey,
    add_into,
    decode_batch,
    decrypt,
    encode_batch,
    encrypt,
    generate_keypair,
)
from fedsec.secagg.paillier.threshold import combine, deal_shares, decryption_shares
from hypothesis import given, settings
from hypothesis import strategies as st


@pytest.fixture(scope="module")
def keys():
    public, private = generate_keypair(1024, allow_insecure=True)
    return public, private, DJNRandomness(public)


def test_key_sizes_and_encoding(keys):
    public, _, _ = keys
    assert public.key_bits == 1024 and public.ciphertext_bytes == 256
    assert PaillierPublicKey.from_bytes(public.to_bytes()) == public
    with pytest.raises(InvalidArgumentError):
        generate_keypair(1024)  # insecure sizes need an explicit opt-in
    with pytest.raises(InvalidArgumentError):
        generate_keypair(2000)
    for bad in (b"", public.to_bytes()[:-1], b"NOPE" + public.to_bytes()[4:]):
        with pytest.raises(InvalidArgumentError):
            PaillierPublicKey.from_bytes(bad)
    prime = int(gmpy2.next_prime(gmpy2.mpz(1) << 1023))
    for n in (prime, (1 << 1023) + 2, prime * 3):
        with pytest.raises(InvalidArgumentError):
            PaillierPublicKey(n)
    assert "secret" in repr(keys[1]) and str(keys[1].decryption_exponent()) not in repr(keys[1])


@settings(max_examples=25, deadline=None)
@given(st.lists(st.lists(st.integers(0, 2**300), min_size=3, max_size=3), min_size=1, max_size=6))
def test_products_of_ciphertexts_decrypt_to_exact_sums(keys, vectors):
    public, private, randomness = keys
    total = None
    for v in vectors:
        c = encrypt(public, v, randomness)
        total = c if total is None else (add_into(total, c, public) or total)
    assert decrypt(private, total) == [sum(col) % public.n for col in zip(*vectors, strict=True)]


def test_randomness_is_never_reused(keys):
    public, private, randomness = keys
    draws = randomness.draw(300)
    assert len(set(draws)) == 300
    first, second = encrypt(public, [7] * 50, randomness), encrypt(public, [7] * 50, randomness)
    assert len(set(first) | set(second)) == 100
    assert decrypt(private, first + second) == [7] * 100
    other = DJNRandomness(public)  # every source draws its own secret base
    assert other._table[0][1] != randomness._table[0][1]
    assert all(gmpy2.gcd(r, public.n) == 1 for r in draws)


def test_encrypt_refuses_plaintexts_outside_the_message_space(keys):
    public, _, randomness = keys
    for bad in (-1, public.n):
        with pytest.raises(InvalidCiphertextError):
            encrypt(public, [bad], randomness)


def _batch(keys, values, *, round_index=3):
    return encode_batch(keys[0], round_index, values)


def test_valid_batch_round_trips(keys):
    public, _, randomness = keys
    values = encrypt(public, [1, 2, 3], randomness)
    assert decode_batch(_batch(keys, values), public, round_index=3, count=3) == values


def test_malformed_ciphertexts_are_refused_with_one_typed_error(keys):
    public, private, randomness = keys
    good = encrypt(public, [1, 2], randomness)
    p = private._key.p
    n, n2 = public.n, int(public.n_square)
    other_key, _ = generate_keypair(1024, allow_insecure=True)
    width = public.ciphertext_bytes
    cases = {
        "zero": _batch(keys, [good[0], 0]),
        "n": _batch(keys, [good[0], n]),
        "n squared": _batch(keys, [good[0], n2]),
        "n squared + 7": (_batch(keys, [good[0], 0])[:-width] + (n2 + 7).to_bytes(width, "big")),
        "multiple of p": _batch(keys, [good[0], p * 7]),
        "multiple of n": _batch(keys, [n * 6, good[1]]),
        "another key": encode_batch(other_key, 3, encrypt(other_key, [1, 2], DJNRandomness(other_key))),
        "another round": _batch(keys, good, round_index=4),
        "wrong count": _batch(keys, good + good[:1]),
        "truncated": _batch(keys, good)[:-1],
        "trailing": _batch(keys, good) + b"\x00",
        "garbage": b"\x13\x37" * 300,
        "empty": b"",
    }
    for name, data in cases.items():
        with pytest.raises(InvalidCiphertextError):
            decode_batch(data, public, round_index=3, count=2)
            pytest.fail(name)
    assert decode_batch(_batch(keys, good), public, round_index=3, count=2) == good


@settings(max_examples=12, deadline=None)
@given(parties=st.integers(2, 6), data=st.data())
def test_any_t_of_n_decryption_shares_decrypt_and_fewer_cannot(keys, parties, data):
    public, private, randomness = keys
    t = data.draw(st.integers(2, parties))
    plaintexts = data.draw(st.lists(st.integers(0, public.n - 1), min_size=1, max_size=3))
    ciphertexts = encrypt(public, plaintexts, randomness)
    shares = deal_shares(private, parties=parties, threshold=t)
    partial = {s.index: decryption_shares(s, ciphertexts) for s in shares}
    for subset in itertools.islice(itertools.combinations(sorted(partial), t), 4):
        assert combine(public, {i: partial[i] for i in subset}, parties=parties,
                       threshold=t) == plaintexts
    with pytest.raises(ReconstructionError):
        combine(public, {i: partial[i] for i in sorted(partial)[: t - 1]}, parties=parties,
                threshold=t)


def test_a_wrong_decryption_share_is_detected(keys):
    public, private, randomness = keys
    ciphertexts = encrypt(public, [5, 6], randomness)
    shares = deal_shares(private, parties=3, threshold=2)
    partial = {s.index: decryption_shares(s, ciphertexts) for s in shares[:2]}
    partial[2] = [p * 3 % public.n_square for p in partial[2]]
    with pytest.raises(ReconstructionError):
        combine(public, partial, parties=3, threshold=2)
    with pytest.raises(InvalidArgumentError):
        deal_shares(private, parties=3, threshold=4)
    assert "value" not in repr(shares[0])
