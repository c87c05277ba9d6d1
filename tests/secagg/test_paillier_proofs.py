"""Threshold Paillier proofs: safe-prime keys, the batched proof of plaintext knowledge, the
batched proof of correct decryption shares, and the bucket multi-exponentiation."""

from __future__ import annotations

import itertools
import secrets

import gmpy2
import pytest
from fedsec.secagg.errors import CryptoError
from fedsec.secagg.paillier import DJNRandomness, encrypt
from fedsec.secagg.paillier.knowledge import (
    encrypt_with_witness,
    proof_bytes,
    prove_knowledge,
    verify_knowledge,
)
from fedsec.secagg.paillier.safe_keys import generate_safe_keypair, safe_prime
from fedsec.secagg.paillier.share_proofs import make_verification_keys, prove_decryption, verify_decryption
from fedsec.secagg.paillier.threshold import combine, deal_shares, decryption_shares
from fedsec.secagg.paillier.transcript import multi_exp
from hypothesis import given, settings
from hypothesis import strategies as st

FEW = settings(max_examples=8, deadline=None)


@pytest.fixture(scope="module")
def setup():
    public_key, private_key = generate_safe_keypair(512, allow_insecure=True)
    shares = deal_shares(private_key, parties=4, threshold=2)
    keys = make_verification_keys(shares)
    randomness = DJNRandomness(public_key)
    plaintexts = [secrets.randbelow(1 << 200) for _ in range(70)]
    ciphertexts, exponents = encrypt_with_witness(public_key, plaintexts, randomness)
    return public_key, private_key, shares, keys, randomness, plaintexts, ciphertexts, exponents


def test_safe_primes_are_safe_and_sized():
    for bits in (256, 300):
        p = safe_prime(bits)
        assert p.bit_length() == bits and gmpy2.is_prime(p, 40) and gmpy2.is_prime((p - 1) // 2, 40)


@FEW
@given(st.integers(1, 140), st.integers(0, 2**32))
def test_multi_exp_equals_separate_exponentiations(count, seed):
    modulus = gmpy2.next_prime(gmpy2.mpz(seed) << 300)
    bases = [gmpy2.mpz(secrets.randbelow(int(modulus))) for _ in range(count)]
    exponents = [secrets.randbits(128) for _ in range(count)]
    expected = gmpy2.mpz(1)
    for b, e in zip(bases, exponents):
        expected = expected * gmpy2.powmod(b, e, modulus) % modulus
    assert multi_exp(bases, exponents, modulus) == expected


def test_knowledge_proof_accepts_the_honest_prover_and_is_bound_to_its_context(setup):
    pk, _, _, _, randomness, plaintexts, ciphertexts, exponents = setup
    proof = prove_knowledge(pk, randomness, ciphertexts, plaintexts, exponents, b"client 1")
    assert len(proof) == proof_bytes(pk)
    verify_knowledge(pk, ciphertexts, b"client 1", proof)
    for context, values in ((b"client 2", ciphertexts), (b"client 1", ciphertexts[::-1]),
                            (b"client 1", ciphertexts[:-1])):
        with pytest.raises(CryptoError):
            verify_knowledge(pk, values, context, proof)


@FEW
@given(st.integers(0, 69), st.integers(1, 2**64))
def test_knowledge_proof_refuses_a_function_of_someone_elses_ciphertext(setup, index, x):
    """c_v^-1 Enc(x) at one index, proved with everything the forger knows, is refused."""
    pk, _, _, _, randomness, plaintexts, ciphertexts, exponents = setup
    victim = encrypt(pk, [secrets.randbelow(1 << 100)], randomness)[0]
    own = encrypt(pk, [x], randomness)[0]
    forged = list(ciphertexts)
    forged[index] = gmpy2.invert(victim, pk.n_square) * own % pk.n_square
    # the forger does not know the plaintext at ``index``: it proves with its best guess
    guess = list(plaintexts)
    guess[index] = x
    proof = prove_knowledge(pk, randomness, forged, guess, exponents, b"corrupt")
    with pytest.raises(CryptoError):
        verify_knowledge(pk, forged, b"corrupt", proof)


@FEW
@given(st.data())
def test_a_tampered_knowledge_proof_is_refused(setup, data):
    pk, _, _, _, randomness, plaintexts, ciphertexts, exponents = setup
    proof = bytearray(prove_knowledge(pk, randomness, ciphertexts, plaintexts, exponents, b"c"))
    position = data.draw(st.integers(0, len(proof) - 1))
    proof[position] ^= data.draw(st.integers(1, 255))
    with pytest.raises(CryptoError):
        verify_knowledge(pk, ciphertexts, b"c", bytes(proof))


def _proved(setup, party, values, context=b"request"):
    pk, _, shares, keys = setup[:4]
    ds = decryption_shares(shares[party - 1], values)
    return ds, prove_decryption(shares[party - 1], keys, values, ds, context)


def test_verified_shares_of_any_threshold_decrypt_exactly(setup):
    pk, _, shares, keys, _, plaintexts, ciphertexts, _ = setup
    proved = {i: _proved(setup, i, ciphertexts) for i in range(1, 5)}
    for i, (ds, proof) in proved.items():
        verify_decryption(pk, keys, i, ciphertexts, ds, b"request", proof, parties=4, threshold=2)
        with pytest.raises(CryptoError):  # bound to its party and context
            verify_decryption(pk, keys, i % 4 + 1, ciphertexts, ds, b"request", proof, parties=4,
                              threshold=2)
        with pytest.raises(CryptoError):
            verify_decryption(pk, keys, i, ciphertexts, ds, b"other", proof, parties=4, threshold=2)
    for pair in itertools.combinations(range(1, 5), 2):
        assert combine(pk, {i: proved[i][0] for i in pair}, parties=4, threshold=2) == plaintexts


@FEW
@given(st.integers(0, 69), st.integers(1, 2**40), st.booleans())
def test_a_shifted_decryption_share_never_verifies(setup, index, delta, reprove):
    """The +delta shift (share times 1 + x n) fails whether the liar keeps its honest proof or
    proves over the shifted shares with its real secret."""
    pk, _, shares, keys, _, _, ciphertexts, _ = setup
    ds, proof = _proved(setup, 3, ciphertexts)
    lied = list(ds)
    lied[index] = lied[index] * (1 + delta * pk.n) % pk.n_square
    if reprove:
        proof = prove_decryption(shares[2], keys, ciphertexts, lied, b"request")
    with pytest.raises(CryptoError):
        verify_decryption(pk, keys, 3, ciphertexts, lied, b"request", proof, parties=4, threshold=2)


def test_the_only_unverifiable_lie_is_a_root_of_one_and_it_changes_nothing(setup):
    pk, _, shares, keys, _, plaintexts, ciphertexts, _ = setup
    ds, _ = _proved(setup, 2, ciphertexts)
    negated = [pk.n_square - v for v in ds]
    proof = prove_decryption(shares[1], keys, ciphertexts, negated, b"request")
    verify_decryption(pk, keys, 2, ciphertexts, negated, b"request", proof, parties=4, threshold=2)
    other, _ = _proved(setup, 4, ciphertexts)
    assert combine(pk, {2: negated, 4: other}, parties=4, threshold=2) == plaintexts
