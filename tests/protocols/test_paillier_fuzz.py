"""Malformed-input robustness of every Paillier seam (written in review r11).

Random bit flips, truncations, extensions and 0xff runs of valid messages at each entry point
(server.receive, client endorse / decryption_share / receive_verification_keys /
receive_announcement / submit, coordinator add_endorsement / combine, key holder respond /
register), plus server-SIGNED random decryption requests (any spec fields, contributor lists and
batches, always the next sequence number) to the key holder: only typed refusals
(MalformedMessage, ClientAbort, ProtocolAbort) come out, and the key holder always answers bytes.
"""

from __future__ import annotations

import random
import struct
from dataclasses import replace

import numpy as np
from fedsec.protocols.errors import ClientAbort, MalformedMessage, ProtocolAbort
from fedsec.protocols.paillier.messages import REQUEST_DOMAIN, DecryptionRequest, encode
from fedsec.protocols.paillier.spec import roster_digest

from tests.protocols.paillier_helpers import make_paillier_session

TYPED = (MalformedMessage, ClientAbort, ProtocolAbort)


def _mutate(rng, data: bytes) -> bytes:
    b = bytearray(data)
    kind = rng.randrange(5)
    if kind == 0 and b:
        for _ in range(rng.randrange(1, 4)):
            b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
    elif kind == 1:
        del b[rng.randrange(len(b) + 1):]
    elif kind == 2:
        b += bytes(rng.randrange(256) for _ in range(rng.randrange(1, 10)))
    elif kind == 3 and b:
        i = rng.randrange(len(b))
        b[i:i + 4] = b"\xff\xff\xff\xff"
    else:
        i = rng.randrange(len(b) + 1)
        b[i:i] = bytes(rng.randrange(1, 9))
    return bytes(b)


def _fuzz(rng, fn, data, n=60):
    for _ in range(n):
        try:
            fn(_mutate(rng, data))
        except TYPED:
            pass


def test_every_threshold_seam_refuses_malformed_input_with_a_typed_error():
    rng = random.Random(7)
    s = make_paillier_session(4, threshold=2, custody="threshold", key_bits=512)
    spec = s.spec(length=4)
    subs = s.submissions(spec)
    server = s.server(spec)
    for c, d in subs.items():
        server.receive(c, d)
    coord = s.coordinator(server)
    listing = coord.contributor_list()
    request = s.certify(coord)
    responses = {c: s.clients[c].decryption_share(request) for c in (0, 1)}
    _fuzz(rng, lambda m: s.server(spec).receive(0, m), subs[0])
    _fuzz(rng, lambda m: s.clients[2].endorse(m), listing)
    _fuzz(rng, lambda m: s.clients[3].decryption_share(m), request, 30)
    _fuzz(rng, lambda m: coord.add_endorsement(1, m), s.clients[1].endorse(listing))
    _fuzz(rng, lambda m: s.coordinator(server).combine({0: m, 1: responses[1]}), responses[0], 30)
    _fuzz(rng, lambda m: s.clients[1].receive_verification_keys(m), s.keys)
    _fuzz(rng, lambda m: s.clients[1].receive_announcement(m), s.dealer.announcement())
    _fuzz(rng, lambda m: s.clients[1].submit(m, np.zeros(spec.length - 1, dtype=np.uint64),
                                             roster=s.names),
          spec.to_bytes())


def test_the_key_holder_answers_bytes_to_anything_even_server_signed():
    rng = random.Random(8)
    k = make_paillier_session(4, threshold=2, key_bits=512)
    spec = k.spec(length=4)
    server = k.server(spec)
    for c, d in k.submissions(spec).items():
        server.receive(c, d)
    holder = k.key_holder
    _fuzz(rng, lambda m: holder.register(m), k.clients[0]._registration)
    _fuzz(rng, lambda m: k.clients[1].receive_announcement(m), holder.announcement())
    for m in (_mutate(rng, server.decryption_request()) for _ in range(60)):
        assert isinstance(holder.respond(m), bytes)
    for _ in range(300):
        wb = rng.choice([1, 2**16 - 1, 2**63, 2**64 - 1, rng.randrange(1, 2**40)])
        mc = rng.choice([1, 2, 3, 4, 2**32 - 1, rng.randrange(1, 100)])
        sb = (wb * mc).bit_length() if rng.random() < 0.9 else rng.randrange(256)
        raw = struct.pack(">QIBQI?32s", holder.last_sequence + 1,
                          rng.choice([1, 2, 5, 2**32 - 1, rng.randrange(1, 10**6)]),
                          sb & 0xFF, wb, mc, rng.random() < 0.9,
                          rng.choice([bytes(32), roster_digest(k.names), rng.randbytes(32)]))
        unsigned = DecryptionRequest(raw, tuple(rng.sample(range(6), rng.randrange(0, 6))),
                                     bytes(rng.randrange(256) for _ in range(rng.randrange(200))),
                                     roster=rng.choice([(), k.names, k.names[::-1], ("x", "x")]))
        signature = k.server_identity.sign(REQUEST_DOMAIN + unsigned.signed_part())
        data = encode(replace(unsigned, signature=signature))
        assert isinstance(holder.respond(data), bytes)
