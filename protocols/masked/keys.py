"""Key derivation and signed statements of the masking protocol, each domain-separated.

Every derived key is HKDF-SHA256 of an X25519 secret (or the self-mask seed) bound to a purpose
label and the context (session, round, parties), so no key is ever reused across sessions,
rounds, pairs or purposes.
"""

from __future__ import annotations

from secagg import keys as crypto


def mask_key(own: crypto.KeyPair, peer_public: bytes, session: bytes, round_index: int, u: int,
             v: int) -> bytes:
    """AES key of the pairwise mask between clients u and v (symmetric in u, v)."""
    lo, hi = min(u, v), max(u, v)
    return crypto.derive_key(own.agree(peer_public), purpose=b"pairwise-mask",
                             context=crypto.context_bytes(session, round_index, lo, hi))


def self_mask_key(seed: bytes, session: bytes, round_index: int, owner: int) -> bytes:
    """AES key of client ``owner``'s self-mask, from its 32-byte seed."""
    return crypto.derive_key(seed, purpose=b"self-mask",
                             context=crypto.context_bytes(session, round_index, owner))


def share_box_key(own: crypto.KeyPair, peer_public: bytes, session: bytes, round_index: int,
                  sender: int, recipient: int) -> bytes:
    """AES-GCM key for share bundles between ``sender`` and ``recipient`` (either direction)."""
    lo, hi = min(sender, recipient), max(sender, recipient)
    return crypto.derive_key(own.agree(peer_public), purpose=b"share-encryption",
                             context=crypto.context_bytes(session, round_index, lo, hi))


def share_box_context(session: bytes, round_index: int, sender: int, recipient: int) -> bytes:
    """Associated data of a share bundle: session, round, sender and recipient, in that order."""
    return b"share-bundle" + crypto.context_bytes(session, round_index, sender, recipient)


def key_message(session: bytes, round_index: int, client: int, encryption_key: bytes,
                mask_public: bytes) -> bytes:
    """The statement a client signs when it advertises its keys (active mode)."""
    context = crypto.context_bytes(session, round_index, client)
    return b"advertise-keys" + context + encryption_key + mask_public


def consistency_message(session: bytes, round_index: int, survivors: tuple[int, ...]) -> bytes:
    """The statement a client signs over the survivor list (active mode)."""
    return b"survivors" + crypto.context_bytes(session, round_index, *sorted(survivors))
