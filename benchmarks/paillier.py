"""Packed Paillier summation: key generation, client encryption, upload, server sum, decryption.

K clients each encode M float32 parameters (normal, sd 0.1; 16-bit quantisation, clip 1, weight
1 unless --max-weight) and run one aggregation of the real protocol objects: each client packs,
tags and encrypts its words and signs the submission; the server validates every ciphertext and
multiplies; the key holder checks and decrypts (or, with --custody threshold, t parties compute
decryption shares and the server combines them).

    python -m benchmarks.paillier --clients 10 --params 100000 --key-bits 2048

Last stdout line (JSON): keygen_s, client_setup_s (per client, once per key: DJN table),
client_encrypt_s (mean per client per round: encode + pack + encrypt + serialise + sign),
ciphertext_bytes_per_client (the whole submission message), ciphertexts_per_client,
slots_per_ciphertext, slot_bits, server_sum_s (validate + multiply all K, build the request),
decrypt_s (the key holder: validate, decrypt, unpack, check tags; or under threshold custody the
server's proof checks and combination), exact (the released sum equals the integer sum of the encoded words),
phe_value_encrypt_s (one ``phe`` EncryptedNumber, measured on --phe-sample values),
phe_projected_client_s (that x M) and speedup_vs_phe; with --custody threshold also
partial_decrypt_s (one party: check the quorum, every submission's signature and proof of
plaintext knowledge, compute its decryption shares and their proof), threshold, quorum, endorse_s
(one party's endorsement), knowledge_proof_bytes, share_proof_bytes, request_bytes and
share_response_bytes. Under threshold custody client_encrypt_s includes the proof of plaintext
knowledge and server_sum_s its verification; knowledge_prove_s, knowledge_verify_s (one
submission), share_proof_s and share_verify_s (one party) time the proofs alone.
"""

from __future__ import annotations

import argparse
import secrets
import time

import numpy as np
import phe
from fedsec.protocols.paillier import (
    PaillierClient,
    PaillierKeyHolder,
    PaillierServer,
    RoundSpec,
    ThresholdDealer,
    default_threshold,
)
from fedsec.protocols.paillier import threshold_messages as tm
from fedsec.protocols.paillier.binding import check_submission_proof
from fedsec.protocols.paillier.coordinator import ThresholdCoordinator
from fedsec.protocols.paillier.keyholder import default_name
from fedsec.protocols.paillier.messages import Submission, decode
from fedsec.protocols.paillier.spec import NO_ROSTER, roster_digest
from fedsec.protocols.paillier.trust import read_verification_keys
from fedsec.secagg.encoding import FixedPointEncoder
from fedsec.secagg.keys import SigningKey
from fedsec.secagg.paillier import decode_batch, slot_bits_for
from fedsec.secagg.paillier.knowledge import encrypt_with_witness, prove_knowledge
from fedsec.secagg.paillier.share_proofs import prove_decryption, verify_decryption
from fedsec.secagg.paillier.threshold import decryption_shares

from benchmarks._common import emit, log


def _threshold_costs(public, client, submission, server, coordinator, spec) -> dict[str, float]:
    """What the proofs add, timed alone: one proof of plaintext knowledge made and checked, one
    party's share proof made and checked (the decryption shares themselves are not included)."""
    message = decode(submission, Submission)
    values = decode_batch(message.batch, public, round_index=spec.sequence,
                          count=spec.ciphertexts(public))
    plaintexts = [secrets.randbelow(public.n) for _ in values]
    randomness = client._randomness
    ciphertexts, exponents = encrypt_with_witness(public, plaintexts, randomness)
    start = time.perf_counter()
    prove_knowledge(public, randomness, ciphertexts, plaintexts, exponents, b"benchmark")
    prove_s = time.perf_counter() - start
    start = time.perf_counter()
    check_submission_proof(public, message, values)
    verify_s = time.perf_counter() - start
    share = client._share
    product = server.product
    partial = decryption_shares(share, product)
    start = time.perf_counter()
    proof = prove_decryption(share, coordinator.directory.keys, product, partial, b"benchmark")
    share_prove_s = time.perf_counter() - start
    start = time.perf_counter()
    verify_decryption(public, coordinator.directory.keys, share.index, product, partial, b"benchmark",
                      proof, parties=share.parties, threshold=share.threshold)
    share_verify_s = time.perf_counter() - start
    return {"knowledge_prove_s": round(prove_s, 4), "knowledge_verify_s": round(verify_s, 4),
            "share_proof_s": round(share_prove_s, 4), "share_verify_s": round(share_verify_s, 4)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--params", type=int, default=100_000)
    parser.add_argument("--key-bits", type=int, default=2048, choices=(512, 1024, 2048, 3072))
    parser.add_argument("--bits", type=int, default=16)
    parser.add_argument("--max-weight", type=int, default=1)
    parser.add_argument("--custody", choices=("key_holder", "threshold"), default="key_holder")
    parser.add_argument("--phe-sample", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    k, m = args.clients, args.params
    insecure = args.key_bits < 2048
    threshold = default_threshold(k)
    rng = np.random.default_rng(args.seed)
    identities = {c: SigningKey.generate() for c in range(k)}
    server_identity = SigningKey.generate()

    start = time.perf_counter()
    if args.custody == "key_holder":
        announcer = PaillierKeyHolder(threshold=threshold, key_bits=args.key_bits,
                                      server_identity=server_identity.public,
                                      allow_insecure=insecure)
    else:
        announcer = ThresholdDealer(parties=list(range(k)), threshold=threshold,
                                    key_bits=args.key_bits, allow_insecure=insecure)
    keygen_s = time.perf_counter() - start
    public = announcer.public_key
    announcement = announcer.announcement()
    verification_keys = announcer.verification_keys() if args.custody == "threshold" else b""
    log(f"key generation {keygen_s:.2f} s ({args.key_bits}-bit, {args.custody})")

    clients, setup = {}, []
    for c in range(k):
        start = time.perf_counter()
        share = announcer.hand_out(c) if args.custody == "threshold" else None
        client = PaillierClient(c, identity=identities[c], announcer_identity=announcer.identity.public,
                                share=share, roster={i: s.public for i, s in identities.items()},
                                min_key_bits=args.key_bits)
        registration = client.receive_announcement(announcement)
        if args.custody == "threshold":
            client.receive_verification_keys(verification_keys)
        setup.append(time.perf_counter() - start)
        if args.custody == "key_holder":
            announcer.enroll(c, identities[c].public)
            client.receive_welcome(announcer.register(registration))
        clients[c] = client

    roster = tuple(default_name(c) for c in range(k))
    encoder = FixedPointEncoder(clip=1.0, bits=args.bits, max_clients=k, max_weight=args.max_weight,
                                max_length=m)
    word_bound = max(args.max_weight * encoder.levels, m)
    spec = RoundSpec(sequence=1, length=m + 3, slot_bits=slot_bits_for(word_bound, k),
                     word_bound=word_bound, max_contributions=k,
                     tagged=args.custody == "key_holder",
                     roster=roster_digest(roster) if args.custody == "key_holder" else NO_ROSTER)
    layout = spec.layout(public)
    updates = {c: rng.normal(0, 0.1, m).astype(np.float32) for c in range(k)}
    words, submissions, encrypt_s = {}, {}, []
    for c in range(k):
        start = time.perf_counter()
        words[c] = encoder.encode(updates[c].astype(np.float64), args.max_weight,
                                  rng=np.random.default_rng(c)).words
        submissions[c] = clients[c].submit(spec.to_bytes(), words[c], roster=roster)
        encrypt_s.append(time.perf_counter() - start)
    log(f"client encryption {np.mean(encrypt_s):.3f} s mean, {len(submissions[0]) / 1e6:.3f} MB")

    server = PaillierServer(public, spec, expected=range(k), threshold=threshold,
                            identities={c: s.public for c, s in identities.items()},
                            identity=server_identity, roster=roster)
    start = time.perf_counter()
    for c in range(k):
        server.receive(c, submissions[c])
    request = server.decryption_request() if args.custody == "key_holder" else None
    server_sum_s = time.perf_counter() - start
    log(f"server validation + sum {server_sum_s:.3f} s")

    extra = {}
    if args.custody == "key_holder":
        start = time.perf_counter()
        result = announcer.decrypt(request)
        decrypt_s = time.perf_counter() - start
        total = server.finish(result)
    else:
        directory = read_verification_keys(verification_keys,
                                           dealer_identity=announcer.identity.public,
                                           public_key=public, threshold=threshold)
        coordinator = ThresholdCoordinator(server, directory=directory,
                                           roster={c: s.public for c, s in identities.items()})
        listing = coordinator.contributor_list()
        start = time.perf_counter()
        for c in range(k):
            coordinator.add_endorsement(c, clients[c].endorse(listing))
        endorse_s = (time.perf_counter() - start) / k
        request = coordinator.request()
        shares, partial_s = {}, []
        for c in range(threshold):
            start = time.perf_counter()
            shares[c] = clients[c].decryption_share(request)
            partial_s.append(time.perf_counter() - start)
        start = time.perf_counter()
        total = coordinator.combine(shares)
        decrypt_s = time.perf_counter() - start
        proof = tm.decode(shares[0], tm.VerifiedShares).proof
        costs = _threshold_costs(public, clients[0], submissions[0], server, coordinator, spec)
        extra = {**costs,"partial_decrypt_s": round(float(np.mean(partial_s)), 4), "threshold": threshold,
                 "quorum": coordinator.quorum, "endorse_s": round(endorse_s, 5),
                 "knowledge_proof_bytes": len(decode(submissions[0], Submission).proof),
                 "share_proof_bytes": len(proof),
                 "request_bytes": len(request), "share_response_bytes": len(shares[0])}
        log(f"one party's checks + decryption shares + proof {extra['partial_decrypt_s']:.2f} s")
    log(f"decryption {decrypt_s:.3f} s")
    expected = np.zeros(m + 2, dtype=np.uint64)
    for c in range(k):
        expected += words[c].astype(np.uint64)
    exact = bool(np.array_equal(total[:-1], expected) and int(total[-1]) == k)

    phe_public, _ = phe.generate_paillier_keypair(n_length=args.key_bits)
    sample = rng.normal(0, 0.1, args.phe_sample)
    start = time.perf_counter()
    for value in sample:
        phe_public.encrypt(float(value))
    phe_value_s = (time.perf_counter() - start) / args.phe_sample
    client_s = float(np.mean(encrypt_s))
    emit({
        "clients": k, "params": m, "key_bits": args.key_bits, "custody": args.custody,
        "keygen_s": round(keygen_s, 4),
        "client_setup_s": round(float(np.mean(setup)), 4),
        "client_encrypt_s": round(client_s, 4),
        "ciphertext_bytes_per_client": len(submissions[0]),
        "ciphertexts_per_client": spec.ciphertexts(public),
        "slots_per_ciphertext": layout.slots,
        "slot_bits": layout.slot_bits,
        "server_sum_s": round(server_sum_s, 4),
        "decrypt_s": round(decrypt_s, 4),
        "exact": exact,
        "phe_value_encrypt_s": round(phe_value_s, 5),
        "phe_projected_client_s": round(phe_value_s * m, 1),
        "speedup_vs_phe": round(phe_value_s * m / client_s, 1),
        **extra,
    })


if __name__ == "__main__":
    main()
