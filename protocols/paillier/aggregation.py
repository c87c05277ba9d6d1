"""Paillier summation behind the ``fl_core`` seam (all roles simulated in one process).

Each call is one aggregation: every sampled client encodes its update with the shared
fixed-point encoder, packs and encrypts it under the key holder's key and sends it to the server;
the server validates and multiplies the ciphertexts and asks the key holder for the sum, which
the key holder releases only after its checks (:mod:`protocols.paillier.keyholder`). The server
object only ever holds the public key.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from fl_core.aggregation import AggregateResult, AggregationProtocol, ClientUpdate, Purpose
from fl_core.errors import InvalidParameterError
from protocols.encoding import encoder_for, validate_updates
from protocols.errors import ClientAbort, MalformedMessage, ProtocolAbort
from protocols.paillier.client import PaillierClient
from protocols.paillier.keyholder import PaillierKeyHolder
from protocols.paillier.server import PaillierServer
from protocols.paillier.spec import RoundSpec
from protocols.transport import InMemoryTransport, Transport
from secagg.keys import SigningKey
from secagg.paillier import slot_bits_for


class PaillierAggregation(AggregationProtocol):
    """Packed Paillier summation with a separate key holder.

    Args:
        max_weight: largest client weight n_k (a public bound), >= 1; weights must be integers.
        rng: the run's generator (dropout draws and stochastic rounding; never cryptography).
        clip: update coordinates are clipped to [-clip, clip] before encoding, > 0.
        bits: quantisation bits per coordinate, in [1, 32].
        threshold: fewest contributions the key holder decrypts a sum of, >= 2.
        dropout: simulated fraction in [0, 1) of sampled clients that never send.
        key_bits: Paillier modulus size, 2048 or 3072 (512/1024 only with ``allow_insecure_key``).
    """

    name = "paillier"

    def __init__(self, *, max_weight: int, rng: np.random.Generator, clip: float = 1.0,
                 bits: int = 16, threshold: int = 2, dropout: float = 0.0, key_bits: int = 2048,
                 allow_insecure_key: bool = False) -> None:
        if max_weight < 1:
            raise InvalidParameterError(f"max_weight must be >= 1, got {max_weight}")
        if not (math.isfinite(clip) and clip > 0):
            raise InvalidParameterError(f"clip must be a finite number > 0, got {clip}")
        if not 1 <= bits <= 32:
            raise InvalidParameterError(f"bits must be in [1, 32], got {bits}")
        if threshold < 2:
            raise InvalidParameterError(f"threshold must be >= 2, got {threshold}")
        if not 0 <= dropout < 1:
            raise InvalidParameterError(f"dropout must be in [0, 1), got {dropout}")
        self.max_weight, self.clip, self.bits, self.dropout = max_weight, float(clip), bits, dropout
        self.rng = rng
        self.key_holder = PaillierKeyHolder(threshold=threshold, key_bits=key_bits,
                                            allow_insecure=allow_insecure_key)
        self._announcement = self.key_holder.announcement()
        self._min_key_bits = min(key_bits, 2048)
        self._clients: dict[int, PaillierClient] = {}
        self._sequence = 0

    @property
    def public_key(self):
        return self.key_holder.public_key

    def _client(self, client_id: int, transport: Transport) -> PaillierClient:
        """The client object of ``client_id``, enrolled and registered on first use."""
        client = self._clients.get(client_id)
        if client is None:
            identity = SigningKey.generate()
            self.key_holder.enroll(client_id, identity.public)
            client = PaillierClient(client_id, identity=identity,
                                    key_holder_identity=self.key_holder.identity.public,
                                    min_key_bits=self._min_key_bits)
            transport.to_client(client_id, self._announcement)
            registration = client.receive_announcement(self._announcement)
            transport.to_server(client_id, registration)
            self.key_holder.register(registration)
            self._clients[client_id] = client
        return client

    def aggregate(self, round_index: int, updates: Sequence[ClientUpdate], *,
                  purpose: Purpose = "update") -> AggregateResult:
        valid, rejected = validate_updates(updates, self.max_weight)
        threshold = self.key_holder.threshold
        if len(valid) < threshold:
            raise ProtocolAbort(f"{len(valid)} valid clients, the key holder decrypts only sums "
                                f"of >= {threshold}")
        n = len(valid)
        length = int(valid[0].vector.size)
        encoder = encoder_for(purpose, clients=n, length=length, max_weight=self.max_weight,
                              clip=self.clip, bits=self.bits)
        word_bound = max(self.max_weight * encoder.levels, length)
        self._sequence += 1
        spec = RoundSpec(sequence=self._sequence, length=length + 3,
                         slot_bits=slot_bits_for(word_bound, n), word_bound=word_bound,
                         max_contributions=n)
        spec_bytes = spec.to_bytes()
        ids = [u.client_id for u in valid]
        server = PaillierServer(self.public_key, spec, expected=ids, threshold=threshold)
        transport = InMemoryTransport()
        aborts = 0
        for u in valid:
            client = self._client(u.client_id, transport)
            rounding = np.random.default_rng(self.rng.integers(0, 2**63 - 1))
            if self.dropout > 0 and self.rng.random() < self.dropout:
                continue
            transport.to_client(u.client_id, spec_bytes)
            encoded = encoder.encode(u.vector.astype(np.float64), int(u.weight), rng=rounding)
            try:
                data = client.submit(spec_bytes, encoded.words)
            except ClientAbort:
                aborts += 1
                continue
            transport.to_server(u.client_id, data)
            try:
                server.receive(u.client_id, data)
            except MalformedMessage:
                continue
        result = self.key_holder.decrypt(server.decryption_request())
        words = server.finish(result)
        weighted, total_weight, clipped = encoder.decode(words[:-1])
        participants = tuple(server.participants)
        return AggregateResult(
            weighted_sum=weighted,
            total_weight=float(total_weight),
            participants=participants,
            dropped=tuple(u.client_id for u in updates if u.client_id not in set(participants)),
            upload_bytes=transport.upload_bytes,
            metrics={"clipped": float(clipped), "rejected": float(len(rejected) + len(server.rejected)),
                     "client_aborts": float(aborts), "contributions": float(words[-1])},
        )
