"""Packed Paillier encryption for summation, with no federated-learning knowledge.

Keys come from ``phe``; packing, DJN fixed-base randomness, the batch format, its validation and
bulk arithmetic are ours, on gmpy2. No per-value ``phe.EncryptedNumber`` and no floats: values
are the shared fixed-point encoder's non-negative words.
"""

from fedsec.secagg.paillier.ciphertexts import add_into, decode_batch, decrypt, encode_batch, encrypt
from fedsec.secagg.paillier.keys import PaillierPrivateKey, PaillierPublicKey, generate_keypair
from fedsec.secagg.paillier.packing import SlotLayout, slot_bits_for
from fedsec.secagg.paillier.randomness import DJNRandomness

__all__ = ["DJNRandomness", "PaillierPrivateKey", "PaillierPublicKey", "SlotLayout", "add_into",
           "decode_batch", "decrypt", "encode_batch", "encrypt", "generate_keypair", "slot_bits_for"]
