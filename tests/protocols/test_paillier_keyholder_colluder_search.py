"""Key-holder custody against the server WITH a colluding enrolled client that hands over its
group MAC key K and its own pad key (a searching adversary; written in review r11).

The searching server draws, per aggregation, a claimed contributor list S (any subset of the five
clients), an exponent in {-1, 0, 1, 2} per honest client and ciphertext index (so it may drop,
invert, double or add an honest client whether or not that client is listed), and a colluder
contribution it crafts with K: arbitrary words (beyond the word bound too), a correct MAC of them
(with or without the colluder's pad), and a +/- x * 2^(j b) shift of one slot whose MAC change it
pre-compensates (the comparison/borrow probe). Claim checked: every released sum has every honest
client of S exactly once and no other honest client (so what the server learns is a function of
the sum over S, |S| >= t); and whenever that holds with an in-range colluder term, the sum is
released. Honest clients are unmodified `PaillierClient`s, the key holder an unmodified
`PaillierKeyHolder`.
"""

from __future__ import annotations

import random
from dataclasses import replace

import numpy as np
from fedsec.protocols.paillier.keyholder import REFUSAL
from fedsec.protocols.paillier.messages import (
    REQUEST_DOMAIN,
    DecryptionRequest,
    DecryptionResult,
    Submission,
    decode,
    encode,
)
from fedsec.protocols.paillier.spec import client_tags, round_coefficients
from fedsec.secagg.paillier import DJNRandomness, decode_batch, encode_batch, encrypt
from fedsec.secagg.paillier.packing import MAC_PRIME

from tests.protocols.paillier_helpers import WORD_BOUND, make_paillier_session

HONEST, COLLUDER, T = (0, 1, 2, 3), 4, 3


def _limbs_to_int(limbs) -> int:
    return sum(int(v) << (16 * i) for i, v in enumerate(limbs))


def test_searching_server_with_a_colluder_learns_only_sums_over_its_list():
    rng = random.Random(11)
    session = make_paillier_session(5, threshold=T, key_bits=512)
    pk, holder = session.public_key, session.key_holder
    colluder = session.clients[COLLUDER]
    mac_key, pad_key = colluder._mac_key, colluder._tag_key  # handed over by the colluder
    chosen = DJNRandomness(pk)
    released = refused_well_formed = 0
    for trial in range(40):
        spec = session.spec(length=6, contributions=5)
        layout = spec.layout(pk)
        count = spec.ciphertexts(pk)
        subs = session.submissions(spec, list(HONEST), seed=trial)
        cts = {c: decode_batch(decode(d, Submission).batch, pk, round_index=spec.sequence,
                               count=count) for c, d in subs.items()}
        members = sorted(rng.sample(range(5), rng.randint(2, 5)))
        well_formed = rng.random() < 0.4
        exps = {h: [(1 if h in members else 0) if well_formed else rng.choice([-1, 0, 1, 2])
                    for _ in range(count)] for h in HONEST}
        # the colluder's crafted term
        words = np.array([rng.randrange(0, 3 * WORD_BOUND) for _ in range(spec.length - 1)]
                         + [1 if COLLUDER in members else 0], dtype=np.uint64)
        if well_formed:
            words[:-1] %= WORD_BOUND
        rows = layout.rows(words)
        tags = client_tags(mac_key, pad_key, spec, layout, rows)
        if COLLUDER not in members:
            tags = client_tags(mac_key, bytes(32), spec, layout, rows)  # no pad: wrong on purpose
        plain = layout.pack(words, tags)
        probe = rng.random() < 0.5
        if probe:  # shift slot j of index 0 by +/- x, MAC pre-compensated with the known a_{0,j}
            j, x, sign = rng.randrange(layout.slots), rng.randrange(1, WORD_BOUND), rng.choice([1, -1])
            a = _limbs_to_int(round_coefficients(mac_key, spec, layout, count)[0, j])
            top = plain[0] >> layout.data_bits
            data = plain[0] & ((1 << layout.data_bits) - 1)
            top = (top + sign * a * x) % MAC_PRIME
            data = (data + sign * x * (1 << (j * layout.slot_bits))) % (1 << layout.data_bits)
            plain[0] = (top << layout.data_bits) | data
        crafted = encrypt(pk, [p % pk.n for p in plain], chosen)
        values = []
        for k in range(count):
            c = crafted[k]
            for h in HONEST:
                c = c * pow(int(cts[h][k]), exps[h][k], int(pk.n_square)) % pk.n_square
            values.append(c)
        unsigned = DecryptionRequest(spec.to_bytes(), tuple(members),
                                     encode_batch(pk, spec.sequence, values), roster=session.names)
        request = encode(replace(unsigned, signature=session.server_identity.sign(
            REQUEST_DOMAIN + unsigned.signed_part())))
        answer = holder.respond(request)
        exact = all(exps[h][k] == (1 if h in members else 0) for h in HONEST for k in range(count))
        if answer != REFUSAL:
            released += 1
            assert exact and len(members) >= T, (trial, members, exps)
            result = decode(answer, DecryptionResult).words
            in_s = [h for h in HONEST if h in members]
            honest_sum = np.zeros(spec.length, dtype=object)
            for h in in_s:
                honest_sum += np.append(session.words[h].astype(object), 1)
            if not probe:
                expected = honest_sum + words.astype(object)
                assert np.array_equal(result.astype(object), expected)
        elif exact and len(members) >= T and COLLUDER in members and not probe and well_formed:
            refused_well_formed += 1
    assert released > 0
    assert refused_well_formed == 0
