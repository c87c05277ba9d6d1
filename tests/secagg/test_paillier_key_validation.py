"""Key validation refuses moduli that anyone can factor cheaply, and accepts real keys."""

from __future__ import annotations

import gmpy2
import pytest
from fedsec.secagg.errors import InvalidArgumentError
from fedsec.secagg.paillier import PaillierPublicKey, generate_keypair
from fedsec.secagg.paillier.keys import FERMAT_STEPS, TRIAL_DIVISION_BOUND, cheaply_factorable


def _prime_with_bits(bits: int) -> gmpy2.mpz:
    return gmpy2.next_prime((gmpy2.mpz(1) << (bits - 1)) + (gmpy2.mpz(1) << (bits - 2)))


def _modulus(bits: int, factor: gmpy2.mpz) -> int:
    """factor x a prime cofactor, the product of exactly ``bits`` bits."""
    cofactor = gmpy2.next_prime(((gmpy2.mpz(1) << (bits - 1)) + (gmpy2.mpz(1) << (bits - 3))) // factor)
    n = factor * cofactor
    assert n.bit_length() == bits
    return int(n)


def _weak_moduli() -> dict[str, int]:
    cube_root = gmpy2.iroot(gmpy2.mpz(3) << 1022, 3)[0]
    p = gmpy2.next_prime(cube_root)
    while (p ** 3).bit_length() != 1024:
        p = gmpy2.next_prime(p)
    q = _prime_with_bits(512)
    close = gmpy2.next_prime(q + (gmpy2.isqrt(gmpy2.mpz(8) * FERMAT_STEPS) << 254))
    return {
        "p^3": int(p ** 3),
        "p^2": int(q * q),
        "p next_prime(p) (Fermat, one step)": int(q * gmpy2.next_prime(q)),
        "p and q a few Fermat steps apart": int(q * close),
        "17-bit factor": _modulus(1024, gmpy2.next_prime(1 << 16)),
        "factor just below 2^20": _modulus(1024, gmpy2.prev_prime(TRIAL_DIVISION_BOUND)),
        "factor 3": _modulus(1024, gmpy2.mpz(3)),
        "prime": int(gmpy2.next_prime(gmpy2.mpz(1) << 1023)),
        "even": int((gmpy2.mpz(1) << 1023) + 2),
    }


@pytest.mark.parametrize("name", list(_weak_moduli()))
def test_cheaply_factorable_moduli_are_refused(name):
    n = _weak_moduli()[name]
    assert n.bit_length() == 1024, name
    assert cheaply_factorable(n)
    with pytest.raises(InvalidArgumentError, match="not a product of two large primes"):
        PaillierPublicKey(n)
    encoded = b"FSPK" + (1024).to_bytes(2, "big") + n.to_bytes(128, "big")
    with pytest.raises(InvalidArgumentError):
        PaillierPublicKey.from_bytes(encoded)


def test_generated_keys_and_far_apart_primes_pass():
    for bits in (512, 1024):
        public, _ = generate_keypair(bits, allow_insecure=True)
        assert not cheaply_factorable(public.n)
    q = _prime_with_bits(512)
    # just beyond the Fermat bound: |p - q| about 2^8 n^(1/4) needs ~ 2^12 x 2 steps
    far = gmpy2.next_prime(q + (gmpy2.mpz(1) << 264))
    assert not cheaply_factorable(int(q * far))
    # a 48-bit smallest factor is beyond rho's budget (about 2^24 iterations): the documented limit
    assert not cheaply_factorable(_modulus(1024, _prime_with_bits(48)))


def _rho_witness(n: int) -> int:
    """An independent textbook rho (Floyd), to show the modulus falls in milliseconds."""
    n = gmpy2.mpz(n)
    for c in range(1, 20):
        x = y = gmpy2.mpz(2)
        d = gmpy2.mpz(1)
        while d == 1:
            x = (x * x + c) % n
            y = (y * y + c) % n
            y = (y * y + c) % n
            d = gmpy2.gcd(abs(x - y), n)
        if d != n:
            return int(d)
    raise AssertionError("rho failed")


def _fermat_with_multiplier(n: int, k: int) -> int:
    a = gmpy2.isqrt(k * n) + 1
    for _ in range(10):
        b2 = a * a - k * n
        if gmpy2.is_square(b2):
            return int(gmpy2.gcd(a - gmpy2.isqrt(b2), n))
        a += 1
    raise AssertionError("not found")


def _small_factor_modulus() -> int:
    p = gmpy2.next_prime(1 << 29)
    q = gmpy2.next_prime((1 << 1023) // p + 12345)
    assert (p * q).bit_length() == 1024
    return int(p * q)


def _review_ratio_two_modulus() -> int:
    """Review r11's modulus: p = next_prime(2^511 + 2^509), q = next_prime(2 p)."""
    p = gmpy2.next_prime((gmpy2.mpz(1) << 511) + (gmpy2.mpz(1) << 509))
    n = p * gmpy2.next_prime(2 * p)
    assert n.bit_length() == 1024
    return int(n)


def _ratio_modulus(r: int, s: int) -> int:
    """q = next_prime(r p / s), n of 1024 bits: p and q far apart (plain Fermat needs ~ 2^500
    steps) but in a small ratio."""
    p = gmpy2.next_prime(gmpy2.isqrt(((gmpy2.mpz(3) << 1022) * s) // r))
    n = p * gmpy2.next_prime(r * p // s)
    assert n.bit_length() == 1024
    return int(n)


@pytest.mark.parametrize("make, factor", [
    (_small_factor_modulus, _rho_witness),
    (_review_ratio_two_modulus, lambda n: _fermat_with_multiplier(n, 8)),
], ids=["30-bit-factor", "q-next-prime-of-2p"])
def test_the_review_moduli_are_refused(make, factor):
    """Review r11's moduli: a 30-bit prime factor (beyond trial division; Pollard rho), and
    q = next_prime(2 p) (Fermat on 8 n, Lehman's multiplier k = 2)."""
    n = make()
    p = factor(n)
    assert 1 < p < n and n % p == 0  # anyone factors it, in milliseconds
    with pytest.raises(InvalidArgumentError):
        PaillierPublicKey(n)


@pytest.mark.parametrize("r, s", [(3, 1), (3, 2), (5, 3), (4, 3), (16, 1)])
def test_factors_in_a_small_ratio_are_refused(r, s):
    n = _ratio_modulus(r, s)
    assert cheaply_factorable(n)


@pytest.mark.parametrize("bits", [21, 24])
def test_a_factor_just_above_trial_division_falls_to_rho(bits):
    assert cheaply_factorable(_modulus(1024, _prime_with_bits(bits)))
