"""How long the key holder takes to answer, by outcome: is a refusal's timing a plaintext oracle?

One key holder and K clients; each round the clients submit M words and the server sends one
request, chosen in turn among: the honest product (released); the product with +1 in one data
slot (refused: tags); with an offset that carries out of slot 0 (refused: tags); with a value
beyond the packed range added to one plaintext (refused: range and tags). The refusals differ
only in the plaintext, so their times should not differ beyond noise; the honest release is the
reference measured in the same run.

    python -m benchmarks.paillier_refusal --clients 4 --params 20000 --key-bits 2048 --rounds 5

Last stdout line (JSON): mean and min seconds of ``respond`` per outcome, and the largest ratio
between the mean times of two refusal kinds (``refusal_spread``).
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace

import numpy as np
from fedsec.protocols.paillier import PaillierClient, PaillierKeyHolder, PaillierServer, RoundSpec
from fedsec.protocols.paillier.keyholder import REFUSAL, default_name
from fedsec.protocols.paillier.messages import REQUEST_DOMAIN, DecryptionRequest, decode, encode
from fedsec.protocols.paillier.spec import roster_digest
from fedsec.secagg.keys import SigningKey
from fedsec.secagg.paillier import encode_batch, slot_bits_for

from benchmarks._common import emit, log

WORD_BOUND = 2**16 - 1
KINDS = ("honest", "data offset", "carry", "out of range")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--params", type=int, default=20_000)
    parser.add_argument("--key-bits", type=int, default=2048, choices=(1024, 2048, 3072))
    parser.add_argument("--rounds", type=int, default=5, help="requests of each kind")
    args = parser.parse_args()
    k, m = args.clients, args.params
    server_identity = SigningKey.generate()
    identities = {c: SigningKey.generate() for c in range(k)}
    holder = PaillierKeyHolder(threshold=2, key_bits=args.key_bits, allow_insecure=args.key_bits < 2048,
                               server_identity=server_identity.public)
    public = holder.public_key
    announcement = holder.announcement()
    clients = {}
    for c in range(k):
        clients[c] = PaillierClient(c, identity=identities[c], announcer_identity=holder.identity.public,
                                    min_key_bits=args.key_bits)
        holder.enroll(c, identities[c].public)
        clients[c].receive_welcome(holder.register(clients[c].receive_announcement(announcement)))
    rng = np.random.default_rng(0)
    roster = tuple(default_name(c) for c in range(k))
    times: dict[str, list[float]] = {kind: [] for kind in KINDS}
    sequence = 0
    for _ in range(args.rounds):
        for kind in KINDS:
            sequence += 1
            spec = RoundSpec(sequence=sequence, length=m + 1, slot_bits=slot_bits_for(WORD_BOUND, k),
                             word_bound=WORD_BOUND, max_contributions=k, roster=roster_digest(roster))
            server = PaillierServer(public, spec, expected=range(k), threshold=2,
                                    identities={c: s.public for c, s in identities.items()},
                                    identity=server_identity, roster=roster)
            for c in range(k):
                words = rng.integers(0, WORD_BOUND, m, dtype=np.uint64, endpoint=True)
                server.receive(c, clients[c].submit(spec.to_bytes(), words, roster=roster))
            total = list(server._total)
            offset = {"honest": 0, "data offset": 1, "carry": (1 << spec.slot_bits) - 1,
                      "out of range": 1 << public.plaintext_bits}[kind]
            total[0] = total[0] * (1 + offset * public.n) % public.n_square
            unsigned = replace_batch(decode(server.decryption_request(), DecryptionRequest),
                                     encode_batch(public, sequence, total))
            signature = server_identity.sign(REQUEST_DOMAIN + unsigned.signed_part())
            data = encode(replace(unsigned, signature=signature))
            start = time.perf_counter()
            answer = holder.respond(data)
            times[kind].append(time.perf_counter() - start)
            if (answer == REFUSAL) != (kind != "honest"):
                raise SystemExit(f"unexpected outcome for {kind}")
        log(f"round {sequence // len(KINDS)}: " + ", ".join(f"{kk} {times[kk][-1]:.3f} s" for kk in KINDS))
    means = {kind: float(np.mean(v)) for kind, v in times.items()}
    refusals = [means[kind] for kind in KINDS[1:]]
    emit({"clients": k, "params": m, "key_bits": args.key_bits, "rounds": args.rounds,
          **{f"{kind.replace(' ', '_')}_mean_s": round(means[kind], 4) for kind in KINDS},
          **{f"{kind.replace(' ', '_')}_min_s": round(float(np.min(times[kind])), 4) for kind in KINDS},
          "refusal_spread": round(max(refusals) / min(refusals), 3)})


def replace_batch(request: DecryptionRequest, batch: bytes) -> DecryptionRequest:
    return replace(request, batch=batch, signature=b"")


if __name__ == "__main__":
    main()
