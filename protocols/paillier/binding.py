"""What threshold custody's proofs and endorsements are bound to, and the endorsement quorum.

A submission's proof of plaintext knowledge is bound to the key, the submitter's id, the
aggregation (spec digest, whose spec holds the sequence number) and the exact batch, so it can be
neither replayed under another id or aggregation nor moved onto another batch. A party's
decryption-share proof is bound to the key, the sequence number and the endorsed contributor
list.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from fedsec.protocols.paillier.messages import Submission
from fedsec.protocols.wire import Writer
from fedsec.secagg.paillier.keys import KEY_ID_BYTES, PaillierPublicKey
from fedsec.secagg.paillier.knowledge import verify_knowledge

_SUBMISSION = b"fedsec/paillier/submission-proof/v1"
_SHARES = b"fedsec/paillier/share-proof/v1"


def quorum(parties: int, threshold: int) -> int:
    """Endorsements a contributor list needs: the least q with 2 q - N > c for c = t - 1 corrupt
    parties, so two quorums always share an honest party. q = floor((N + t - 1) / 2) + 1."""
    return (parties + threshold - 1) // 2 + 1


def submission_context(public_key: PaillierPublicKey, client_id: int, spec_digest: bytes,
                       batch: bytes) -> bytes:
    return (Writer().fixed(_SUBMISSION, len(_SUBMISSION)).fixed(public_key.key_id, KEY_ID_BYTES)
            .u64(client_id).fixed(spec_digest, 32).fixed(hashlib.sha256(batch).digest(), 32)
            .getvalue())


def share_context(public_key: PaillierPublicKey, sequence: int, list_digest: bytes) -> bytes:
    return (Writer().fixed(_SHARES, len(_SHARES)).fixed(public_key.key_id, KEY_ID_BYTES)
            .u64(sequence).fixed(list_digest, 32).getvalue())


def check_submission_proof(public_key: PaillierPublicKey, submission: Submission,
                           values: Sequence[int]) -> None:
    """The opaque CryptoError unless ``submission`` proves knowledge of its ``values``' plaintexts."""
    verify_knowledge(public_key, values, submission_context(
        public_key, submission.client_id, submission.spec_digest, submission.batch), submission.proof)
