"""Build a Paillier session (key holder or threshold dealer, enrolled clients) for tests."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from fedsec.protocols.paillier import (
    PaillierClient,
    PaillierKeyHolder,
    PaillierServer,
    RoundSpec,
    ThresholdDealer,
)
from fedsec.protocols.paillier.coordinator import ThresholdCoordinator
from fedsec.protocols.paillier.keyholder import default_name
from fedsec.protocols.paillier.spec import NO_ROSTER, roster_digest
from fedsec.protocols.paillier.trust import read_verification_keys
from fedsec.secagg.keys import SigningKey
from fedsec.secagg.paillier import slot_bits_for

WORD_BOUND = 2**16 - 1


@dataclass
class PaillierSession:
    clients: dict[int, PaillierClient]
    identities: dict[int, SigningKey]
    threshold: int
    server_identity: SigningKey
    key_holder: PaillierKeyHolder | None = None
    dealer: ThresholdDealer | None = None
    sequence: int = 0
    words: dict[int, np.ndarray] = field(default_factory=dict)
    keys: bytes = b""

    @property
    def directory(self):
        return read_verification_keys(self.keys, dealer_identity=self.dealer.identity.public,
                                      public_key=self.public_key, threshold=self.threshold)

    @property
    def names(self) -> tuple[str, ...]:
        """The key-holder custody roster: every client's default enrolment name."""
        return tuple(default_name(c) for c in self.clients)

    @property
    def roster(self) -> dict[int, bytes]:
        return {c: k.public for c, k in self.identities.items()}

    def coordinator(self, server: PaillierServer) -> ThresholdCoordinator:
        return ThresholdCoordinator(server, directory=self.directory, roster=self.roster)

    def certify(self, coordinator: ThresholdCoordinator, endorsers=None) -> bytes:
        """Ask ``endorsers`` (default: every party) to endorse; the certified request."""
        listing = coordinator.contributor_list()
        for c in endorsers if endorsers is not None else self.clients:
            coordinator.add_endorsement(c, self.clients[c].endorse(listing))
        return coordinator.request()

    @property
    def public_key(self):
        return (self.key_holder or self.dealer).public_key

    def spec(self, length: int = 40, *, contributions: int | None = None) -> RoundSpec:
        self.sequence += 1
        m = contributions or len(self.clients)
        return RoundSpec(sequence=self.sequence, length=length + 1,
                         slot_bits=slot_bits_for(WORD_BOUND, m), word_bound=WORD_BOUND,
                         max_contributions=m, tagged=self.key_holder is not None,
                         roster=roster_digest(self.names) if self.key_holder is not None else NO_ROSTER)

    def server(self, spec: RoundSpec) -> PaillierServer:
        return PaillierServer(self.public_key, spec, expected=list(self.clients),
                              threshold=self.threshold,
                              identities={c: k.public for c, k in self.identities.items()},
                              identity=self.server_identity, roster=self.names)

    def submissions(self, spec: RoundSpec, ids=None, seed: int = 0) -> dict[int, bytes]:
        rng = np.random.default_rng(seed)
        out = {}
        for c in ids if ids is not None else self.clients:
            self.words[c] = rng.integers(0, WORD_BOUND, spec.length - 1, dtype=np.uint64,
                                         endpoint=True)
            out[c] = self.clients[c].submit(spec.to_bytes(), self.words[c], roster=self.names)
        return out

    def expected(self, ids) -> np.ndarray:
        total = sum(self.words[c].astype(object) for c in ids)
        return np.append(np.array(total, dtype=np.uint64), np.uint64(len(ids)))


def make_paillier_session(n: int = 4, *, threshold: int = 3, custody: str = "key_holder",
                          key_bits: int = 1024) -> PaillierSession:
    identities = {c: SigningKey.generate() for c in range(n)}
    roster = {c: k.public for c, k in identities.items()}
    server_identity = SigningKey.generate()
    if custody == "key_holder":
        holder = PaillierKeyHolder(threshold=threshold, key_bits=key_bits,
                                   server_identity=server_identity.public, allow_insecure=True)
        announcer, dealer = holder, None
    else:
        holder = None
        dealer = announcer = ThresholdDealer(parties=list(range(n)), threshold=threshold,
                                             key_bits=key_bits, allow_insecure=True)
    announcement = announcer.announcement()
    keys = dealer.verification_keys() if dealer else b""
    clients = {}
    for c in range(n):
        share = dealer.hand_out(c) if dealer else None
        clients[c] = PaillierClient(c, identity=identities[c],
                                    announcer_identity=announcer.identity.public, share=share,
                                    roster=roster if dealer else None, min_key_bits=key_bits)
        registration = clients[c].receive_announcement(announcement)
        if dealer is not None:
            clients[c].receive_verification_keys(keys)
        if holder is not None:
            holder.enroll(c, identities[c].public)
            clients[c].receive_welcome(holder.register(registration))
    return PaillierSession(clients, identities, threshold, server_identity, holder, dealer, keys=keys)
