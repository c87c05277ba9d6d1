import os

import numpy as np
import pytest
from fedsec.secagg import keys
from fedsec.secagg.errors import CryptoError
from fedsec.secagg.prg import MaskExpander


@pytest.mark.parametrize("bits", [1, 5, 17, 32, 33, 64])
def test_masks_are_deterministic_in_range_and_key_separated(bits):
    expander = MaskExpander(length=4096, modulus_bits=bits)
    key = os.urandom(32)
    a, b, c = expander.expand(key), expander.expand(key), expander.expand(os.urandom(32))
    assert np.array_equal(a, b) and not np.array_equal(a, c)
    assert int(a.max()) < 2**bits


def test_masks_are_uniform_mod_2_to_the_b():
    counts = np.bincount(MaskExpander(length=320_000, modulus_bits=5).expand(os.urandom(32)), minlength=32)
    chi2 = ((counts - 10_000) ** 2 / 10_000).sum()
    assert chi2 < 80  # 31 degrees of freedom; p < 1e-5 at 80


def test_add_into_cancels():
    expander = MaskExpander(length=1000, modulus_bits=20)
    acc = np.arange(1000, dtype=np.uint32)
    key = os.urandom(32)
    expander.add_into(key, acc, sign=+1)
    expander.add_into(key, acc, sign=-1)
    assert np.array_equal(acc, np.arange(1000, dtype=np.uint32))


def test_x25519_agreement_is_symmetric():
    a, b = keys.KeyPair.generate(), keys.KeyPair.generate()
    assert a.agree(b.public) == b.agree(a.public)
    assert keys.KeyPair.from_private(a.private).public == a.public
    with pytest.raises(CryptoError):
        a.agree(bytes(32))  # a low-order point


def test_derived_keys_are_domain_separated():
    secret = os.urandom(32)
    base = dict(purpose=b"pairwise-mask", context=keys.context_bytes(b"s" * 16, 1, 2, 3))
    variants = [base, {**base, "purpose": b"self-mask"},
                {**base, "context": keys.context_bytes(b"s" * 16, 2, 2, 3)},
                {**base, "context": keys.context_bytes(b"t" * 16, 1, 2, 3)},
                {**base, "context": keys.context_bytes(b"s" * 16, 1, 2, 4)}]
    derived = {keys.derive_key(secret, **v) for v in variants}
    assert len(derived) == len(variants)


def test_aead_rejects_tampering_and_wrong_context_alike():
    key = os.urandom(32)
    sealed = keys.seal(key, b"share", b"ad")
    assert keys.open_sealed(key, sealed, b"ad") == b"share"
    tampered = bytes([sealed[0] ^ 1]) + sealed[1:]
    failures = []
    for args in ((key, tampered, b"ad"), (key, sealed, b"other"), (os.urandom(32), sealed, b"ad"),
                 (key, sealed[:10], b"ad")):
        with pytest.raises(CryptoError) as info:
            keys.open_sealed(*args)
        failures.append(str(info.value))
    assert len(set(failures)) == 1  # one opaque message for every failure


def test_signatures():
    signer = keys.SigningKey.generate()
    signature = signer.sign(b"message")
    keys.verify(signer.public, signature, b"message")
    with pytest.raises(CryptoError):
        keys.verify(signer.public, signature, b"messagE")
    with pytest.raises(CryptoError):
        keys.verify(keys.SigningKey.generate().public, signature, b"message")
