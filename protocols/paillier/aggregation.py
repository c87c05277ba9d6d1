"""Paillier summation behind the ``fl_core`` seam (all roles simulated in one process).

Each call is one aggregation: every sampled client encodes its update with the shared
fixed-point encoder, packs and encrypts it and sends it to the server; the server validates and
multiplies the ciphertexts, and the sum is decrypted either by the key holder after its checks
(:mod:`protocols.paillier.keyholder`) or by ``threshold`` clients' key shares, each party first
checking the signed submissions and their proofs of plaintext knowledge, and that a quorum of
parties endorsed this one contributor list for the aggregation (:mod:`protocols.paillier.party`);
every party's decryption shares are verified and a liar named. The server object only ever holds
the public key.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
from fedsec.fl_core.aggregation import AggregateResult, AggregationProtocol, ClientUpdate, Purpose
from fedsec.fl_core.errors import InvalidParameterError
from fedsec.protocols.encoding import (
    ShiftedNoise,
    check_layer_arguments,
    encoder_for,
    remove_offsets,
    validate_updates,
)
from fedsec.protocols.errors import ClientAbort, MalformedMessage, ProtocolAbort
from fedsec.protocols.masked.policy import population_corrupt
from fedsec.protocols.paillier.client import PaillierClient
from fedsec.protocols.paillier.coordinator import ThresholdCoordinator
from fedsec.protocols.paillier.dealer import ThresholdDealer
from fedsec.protocols.paillier.keyholder import PaillierKeyHolder, default_name
from fedsec.protocols.paillier.server import PaillierServer
from fedsec.protocols.paillier.spec import NO_ROSTER, RoundSpec, roster_digest
from fedsec.protocols.paillier.trust import read_verification_keys
from fedsec.protocols.transport import InMemoryTransport, Transport
from fedsec.secagg.keys import SigningKey
from fedsec.secagg.paillier import PaillierPublicKey, slot_bits_for

CUSTODIES = ("key_holder", "threshold")


def default_threshold(clients_per_round: int) -> int:
    """A majority of the clients sampled per round, and at least 2."""
    return max(2, clients_per_round // 2 + 1)


class PaillierAggregation(AggregationProtocol):
    """Packed Paillier summation; the server cannot decrypt.

    Args:
        max_weight: largest client weight n_k (a public bound), >= 1; weights must be integers.
        rng: the run's generator (dropout draws and stochastic rounding; never cryptography).
        clip: update coordinates are clipped to [-clip, clip] before encoding, > 0.
        bits: quantisation bits per coordinate, in [1, 32].
        threshold: t >= 2: the fewest contributions a sum is decrypted for; under threshold
            custody also the number of key shares that decrypt.
        dropout: simulated fraction in [0, 1) of sampled clients that drop (before sending their
            ciphertexts, or under threshold custody possibly before their decryption share).
        key_bits: Paillier modulus size, 2048 or 3072 (512/1024 only with ``allow_insecure_key``).
        custody: ``key_holder`` (one party apart from the server holds the key) or ``threshold``
            (the key is split t-of-N among ``parties``).
        parties: every client id of the federation (threshold custody).
        tolerated_corrupt: fraction in [0, 1) of the population that may collude with the server;
            only client-level DP uses it (:meth:`tolerated_colluders`).
        population: the enrolled clients (the federation size), >= 1; None: the parties under
            threshold custody, else the valid clients of each call.
    """

    name = "paillier"

    def __init__(self, *, max_weight: int, rng: np.random.Generator, clip: float = 1.0,
                 bits: int = 16, threshold: int = 2, dropout: float = 0.0, key_bits: int = 2048,
                 custody: str = "key_holder", parties: Iterable[int] | None = None,
                 allow_insecure_key: bool = False, tolerated_corrupt: float = 0.1,
                 population: int | None = None) -> None:
        check_layer_arguments(max_weight=max_weight, clip=clip, bits=bits, dropout=dropout)
        if isinstance(tolerated_corrupt, bool) or not 0 <= tolerated_corrupt < 1:
            raise InvalidParameterError(f"tolerated_corrupt must be in [0, 1), got {tolerated_corrupt}")
        if population is not None and (isinstance(population, bool) or not isinstance(population, int)
                                       or population < 1):
            raise InvalidParameterError(f"population must be None or an integer >= 1, got {population!r}")
        self.tolerated_corrupt, self.population = float(tolerated_corrupt), population
        if threshold < 2:
            raise InvalidParameterError(f"threshold must be >= 2, got {threshold}")
        if custody not in CUSTODIES:
            raise InvalidParameterError(f"custody must be one of {CUSTODIES}, got {custody!r}")
        self.max_weight, self.clip, self.bits, self.dropout = max_weight, float(clip), bits, dropout
        self.threshold, self.custody, self.rng = threshold, custody, rng
        self._identities: dict[int, SigningKey] = {}
        self.key_holder: PaillierKeyHolder | None = None
        self.dealer: ThresholdDealer | None = None
        self._server_identity = SigningKey.generate()
        if custody == "key_holder":
            self.key_holder = PaillierKeyHolder(threshold=threshold, key_bits=key_bits,
                                                server_identity=self._server_identity.public,
                                                allow_insecure=allow_insecure_key)
            announcer = self.key_holder
        else:
            members = list(parties or ())
            self.population = population or len(members)
            if not 2 <= threshold <= len(members):
                raise InvalidParameterError(f"threshold custody needs 2 <= threshold <= "
                                            f"{len(members)} parties, got {threshold}")
            self._identities = {c: SigningKey.generate() for c in members}
            self._party_index = {c: i + 1 for i, c in enumerate(members)}
            self.dealer = ThresholdDealer(parties=members, threshold=threshold, key_bits=key_bits,
                                          allow_insecure=allow_insecure_key)
            announcer = self.dealer
        self.public_key: PaillierPublicKey = announcer.public_key
        self._announcer_identity = announcer.identity.public
        self._announcement = announcer.announcement()
        self._verification_keys = self.dealer.verification_keys() if self.dealer else b""
        self._min_key_bits = min(key_bits, 2048)
        self._clients: dict[int, PaillierClient] = {}
        self._sequence = 0
        self._population_roster: tuple[str, ...] = ()
        self.client_noise: ShiftedNoise | None = None
        """Shifted integer noise every client adds to its encoded update (client-level DP)."""

    def min_contributions(self, n: int) -> int:
        """The fewest inputs a decrypted sum can hold (the threshold)."""
        return self.threshold

    def tolerated_colluders(self, n: int) -> int:
        """c = floor(tolerated_corrupt x population): the clients that may collude with the server
        (the whole federation's, whoever is sampled; n, the round's valid clients, stands for the
        population when none was given). Under threshold custody c >= t would let the colluders
        decrypt any one ciphertext the server hands them, so t > c is needed there anyway; under
        key-holder custody the key holder is not among them."""
        return population_corrupt(self.population or n, self.tolerated_corrupt)

    def _roster(self, valid: Sequence[ClientUpdate]) -> tuple[str, ...]:
        """The simulated roster (key-holder custody binds it into every spec): the names of the
        ``population`` clients 0 .. population - 1, or, with no population given, of the
        call's valid clients (the population :meth:`tolerated_colluders` assumes then)."""
        if self.population:
            if len(self._population_roster) != self.population:
                self._population_roster = tuple(default_name(c) for c in range(self.population))
            return self._population_roster
        return tuple(default_name(c) for c in sorted({u.client_id for u in valid}))

    def _client(self, client_id: int, transport: Transport) -> PaillierClient:
        """The client object of ``client_id``, set up (enrolled, key share, registered) on first use."""
        client = self._clients.get(client_id)
        if client is not None:
            return client
        share = roster = None
        if self.dealer is not None:
            if client_id not in self._identities:
                raise ProtocolAbort(f"client {client_id} holds no key share (not a party)")
            share = self.dealer.hand_out(client_id)
            roster = {c: k.public for c, k in self._identities.items()}
        identity = self._identities.setdefault(client_id, SigningKey.generate())
        if self.key_holder is not None:
            self.key_holder.enroll(client_id, identity.public, name=default_name(client_id))
        client = PaillierClient(client_id, identity=identity,
                                announcer_identity=self._announcer_identity, share=share,
                                roster=roster, min_key_bits=self._min_key_bits)
        transport.to_client(client_id, self._announcement)
        registration = client.receive_announcement(self._announcement)
        if self.dealer is not None:
            transport.to_client(client_id, self._verification_keys)
            client.receive_verification_keys(self._verification_keys)
        if registration is not None:
            transport.to_server(client_id, registration)
            client.receive_welcome(self.key_holder.register(registration))
        self._clients[client_id] = client
        return client

    def aggregate(self, round_index: int, updates: Sequence[ClientUpdate], *,
                  purpose: Purpose = "update") -> AggregateResult:
        valid, rejected = validate_updates(updates, self.max_weight)
        if len(valid) < self.threshold:
            raise ProtocolAbort(f"{len(valid)} valid clients; only sums of >= {self.threshold} "
                                "are decrypted")
        n = len(valid)
        length = int(valid[0].vector.size)
        noise = self.client_noise if purpose == "update" else None
        encoder = encoder_for(purpose, clients=n, length=length, max_weight=self.max_weight,
                              clip=self.clip, bits=self.bits, noise=noise)
        word_bound = encoder.word_bound
        self._sequence += 1
        roster = self._roster(valid)
        spec = RoundSpec(sequence=self._sequence, length=length + 3,
                         slot_bits=slot_bits_for(word_bound, n), word_bound=word_bound,
                         max_contributions=n, tagged=self.key_holder is not None,
                         roster=roster_digest(roster) if self.key_holder is not None else NO_ROSTER)
        spec_bytes = spec.to_bytes()
        transport = InMemoryTransport()
        clients = {u.client_id: self._client(u.client_id, transport) for u in valid}
        server = PaillierServer(self.public_key, spec, expected=[u.client_id for u in valid],
                                threshold=self.threshold,
                                identities={c: k.public for c, k in self._identities.items()},
                                identity=self._server_identity, roster=roster)
        aborts, late_drops = 0, set()
        for u in valid:
            rounding = np.random.default_rng(self.rng.integers(0, 2**63 - 1))
            if self.dropout > 0 and self.rng.random() < self.dropout:
                if self.dealer is None or self.rng.random() < 0.5:
                    continue
                late_drops.add(u.client_id)
            transport.to_client(u.client_id, spec_bytes)
            encoded = encoder.encode(u.vector.astype(np.float64), int(u.weight), rng=rounding)
            if noise is not None:
                encoded.words[:-2] += noise.draw(length).astype(encoded.words.dtype)
            try:
                data = clients[u.client_id].submit(spec_bytes, encoded.words, roster=roster)
            except ClientAbort:
                aborts += 1
                continue
            transport.to_server(u.client_id, data)
            try:
                server.receive(u.client_id, data)
            except MalformedMessage:
                continue
        if self.key_holder is not None:
            try:
                request = server.decryption_request()
            except ProtocolAbort:
                self.key_holder.respond(server.void_request())  # burn the number: next one next
                raise
            words = server.finish(self.key_holder.decrypt(request))
        else:
            words, refused = self._threshold_decrypt(server, transport, late_drops)
            aborts += refused
        weighted, total_weight, clipped = encoder.decode(
            remove_offsets(words[:-1], int(words[-1]), noise))
        participants = tuple(server.participants)
        in_sum = set(participants)
        dropped = [r.client_id for r in rejected] + [u.client_id for u in valid
                                                     if u.client_id not in in_sum]
        return AggregateResult(
            weighted_sum=weighted,
            total_weight=float(total_weight),
            participants=participants,
            dropped=tuple(dropped),
            upload_bytes=transport.upload_bytes,
            metrics={"clipped": float(clipped),
                     "rejected": float(len(rejected) + len(server.rejected)),
                     "client_aborts": float(aborts), "contributions": float(words[-1])},
        )

    def _threshold_decrypt(self, server: PaillierServer, transport: Transport,
                           late_drops: set[int]) -> tuple[np.ndarray, int]:
        """The summed words, and how many parties refused to endorse or give decryption shares.

        Every party (online before the late drops) is asked to endorse the contributor list; the
        contributors that did not drop are asked for decryption shares.
        """
        directory = read_verification_keys(self._verification_keys,
                                           dealer_identity=self._announcer_identity,
                                           public_key=self.public_key, threshold=self.threshold)
        coordinator = ThresholdCoordinator(server, directory=directory,
                                           roster={c: k.public for c, k in self._identities.items()})
        listing = coordinator.contributor_list()
        refused = 0
        for party in directory.parties:
            client = self._client(party, transport)
            transport.to_client(party, listing)
            try:
                endorsement = client.endorse(listing)
            except ClientAbort:
                refused += 1
                continue
            transport.to_server(party, endorsement)
            coordinator.add_endorsement(party, endorsement)
        request = coordinator.request()
        responses = {}
        for client_id in server.participants:
            if client_id in late_drops:
                continue
            transport.to_client(client_id, request)
            try:
                response = self._clients[client_id].decryption_share(request)
            except ClientAbort:
                refused += 1
                continue
            transport.to_server(client_id, response)
            responses[client_id] = response
        return coordinator.combine(responses), refused
