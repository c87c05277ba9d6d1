"""The interface between the deployment framework and one secure layer (see the package docstring).

The coordinator side is an ``AggregationProtocol`` whose ``aggregate`` drives stages over an
:data:`Exchange`; the site side answers them. The first message of an aggregation to a site is
``first_message(setup, message)``: a JSON object (the layer's setup: purpose, round, the ring's
certificates, whatever the layer needs) and the first protocol message.
"""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fedsec.config import ExperimentConfig
from fedsec.fl_core.aggregation import AggregateResult, AggregationProtocol, ClientUpdate, Purpose
from fedsec.network import envelope
from fedsec.network.pki import Peer, Trust
from fedsec.protocols.errors import ClientAbort
from fedsec.secagg.keys import SigningKey

SPENT = "this contribution already went into an aggregation"
OUT_OF_ORDER = "a stage message this aggregation already answered, or out of order"
CLOSED = "this aggregation is over at this site (finished or aborted); a stage needs a new setup"
NO_INPUT = "the stage that takes this site's contribution came without one"

Exchange = Callable[[str, Mapping[int, bytes]], dict[int, bytes]]
"""``exchange(stage, {client: message}) -> {client: reply}``: sends one message to each client's
site and returns the replies that arrived before the stage deadline (``federation.stage_timeout``
seconds). A site that misses the deadline, aborts, or is not connected is absent from the result:
a dropout for the rest of this aggregation."""


@dataclass
class CoordinatorContext:
    """What a coordinator layer gets from the framework.

    Attributes:
        config: the plan.
        rng: the run generator; draw from it exactly what the simulation's protocol draws.
        names: the roster; client id i is ``names[i]``.
        certificates: ``name -> PEM`` of every site's TLS-verified certificate (relayed to the
            ring, which verifies each one itself).
        peers: ``name -> Peer`` of the same certificates, as the coordinator verified them (the
            identity key each binds).
        max_weight: the public bound on a site's weight (the largest reported n_k).
        exchange: see :data:`Exchange`.
        identity: the coordinator's Ed25519 identity key (its certificate binds the public half;
            the Paillier layer signs its key-holder requests with it).
        trust, cert_path, key_path: the study's root and the coordinator's certificate and TLS
            key files (a layer that dials another party, e.g. the Paillier key holder).
        audit: the coordinator's :class:`~fedsec.network.party_audit.PartyAudit` (such a layer
            records its own calls there), or None.
    """

    config: ExperimentConfig
    rng: np.random.Generator
    names: tuple[str, ...]
    certificates: Mapping[str, bytes]
    peers: Mapping[str, Peer]
    max_weight: int
    exchange: Exchange
    identity: SigningKey | None = None
    trust: Trust | None = None
    cert_path: Path | None = None
    key_path: Path | None = None
    audit: Any = None


class CoordinatorLayer(AggregationProtocol, ABC):
    """The coordinator side of a layer: an aggregation protocol over the network."""

    bundles_first_job = False
    """True when the layer's first exchange of every aggregation goes to every site it was given,
    so the framework may send each site the job that makes its contribution (train, evaluate)
    together with that first stage message (one call instead of two); a site that fails the job
    then drops out at the first stage."""

    def __init__(self, context: CoordinatorContext) -> None:
        self.context = context
        self.last_dropped: dict[int, str] = {}
        """Sites asked in the last call that are not in the sum, with why (for the audit)."""

    @abstractmethod
    def aggregate(self, round_index: int, updates: Sequence[ClientUpdate], *,
                  purpose: Purpose = "update") -> AggregateResult:
        """Sum the contributions the sites of ``updates`` hold for (``round_index``, ``purpose``)."""


@dataclass
class SiteContext:
    """What a site layer gets from the framework.

    Attributes:
        config: the plan, as the site accepted it.
        name: this site's certificate name; ``client_id`` its position on the roster.
        names: the roster.
        identity: this site's Ed25519 identity key (its certificate binds the public half).
        trust: the federation's root and revocation list (to verify relayed certificates).
        sessions: where the site records the protocol sessions it took part in (durable in a
            deployment; None: the layer's process-wide default).
        state: the site's state directory (a layer's durable records, e.g. the Paillier key
            share and endorsements), or None.
        policy: the site's :class:`~fedsec.network.policy.SitePolicy` (its ``min_sites`` and
            ``min_threshold`` are enforced at every aggregation, see :func:`round_floor`), or None.
        spent: the contributions this process has put into an aggregation, as (purpose, round,
            SHA-256 of vector and weight): a second setup handing a layer the same contribution
            is refused whatever session id or sequence number it carries. (The site's own,
            durable rule is :meth:`~fedsec.network.site_work.SiteWork.contribution`'s.)
        client_noise: under ``dp.mode = "client"``, the site's
            :class:`~fedsec.network.client_noise.ClientNoise` (built from the noise multiplier it
            checked against its own epsilon); None until then, and a layer asked to sum an update
            without it refuses.
    """

    config: ExperimentConfig
    name: str
    client_id: int
    names: tuple[str, ...]
    identity: SigningKey
    trust: Trust
    sessions: Any = None
    state: Path | None = None
    spent: set[tuple[str, str, str]] = field(default_factory=set)
    policy: Any = None
    client_noise: Any = None


def round_floor(context: SiteContext) -> tuple[int, int]:
    """``(fewest sites, smallest threshold)`` this site accepts in one aggregation, for every
    purpose: the larger of its own policy's ``aggregation.min_sites`` / ``min_threshold``
    (``context.policy``, a :class:`~fedsec.network.policy.SitePolicy`, when set) and the plan's
    ``federation.min_sites`` and the threshold the plan implies for that many sites (what the
    site's policy admitted when it joined). Checked at every aggregation, never only at join."""
    from fedsec.network.policy import plan_facts

    config = context.config
    facts = plan_facts(config, min_sites=config.federation.min_sites)
    sites, threshold = facts.sites_per_round, facts.threshold
    if context.policy is not None:
        sites = max(sites, context.policy.min_sites)
        threshold = max(threshold, context.policy.min_threshold)
    return sites, threshold


class SiteLayer(ABC):
    """The site side of one aggregation.

    The framework's rule, for every layer (never trust the coordinator's stage sequence): the layer
    answers each stage of :attr:`STAGES` at most once, in that order (a stage may be skipped, never
    repeated or gone back to); after its last stage, or after any abort, it is :attr:`closed` and
    refuses every message (``ClientAbort``), so a contribution-dependent reply (a masked input, a
    ciphertext, a decryption share) is produced at most once per setup, and a setup consumes the
    contribution (:data:`SPENT` here, ``site.db`` at the site). Subclasses implement :meth:`answer`.

    A layer whose :attr:`INPUT_STAGE` is set may be built *without* its contribution
    (``vector=None``, ``length`` given): its first stages do not depend on it, and it takes the
    contribution at :attr:`INPUT_STAGE` from the ``supply`` that :meth:`handle` is given for that
    stage (which consumes it at the site, durably, before anything derived from it is computed);
    that stage without a supply is refused (:data:`NO_INPUT`).

    Args:
        context: the site's context.
        setup: the layer's setup from the first message (untrusted: validate everything).
        vector: this site's contribution (float32) for the aggregation the setup names, or None
            for a contribution supplied at :attr:`INPUT_STAGE`.
        weight: its integer weight (n_k or 1); ignored when ``vector`` is None.
        length: the contribution's length when ``vector`` is None (>= 1).
    """

    STAGES: tuple[str, ...] = ()
    """The layer's stage names in protocol order (a subclass or instance sets them)."""
    INPUT_STAGE: str | None = None
    """The first stage whose reply depends on the contribution, for a layer that may be built
    without it; None: the contribution is needed at the setup."""

    def __init__(self, context: SiteContext, *, setup: dict[str, Any], vector: np.ndarray | None,
                 weight: int, length: int | None = None) -> None:
        if vector is None and (self.INPUT_STAGE is None or isinstance(length, bool)
                               or not isinstance(length, int) or length < 1):
            raise ClientAbort(NO_INPUT)
        self.context, self.setup, self.vector, self.weight = context, setup, vector, weight
        self.length = int(vector.size) if vector is not None else int(length)  # type: ignore[arg-type]
        self.closed = False
        """True once the last stage was answered or any message was refused: nothing more is answered."""
        self._answered = -1
        if vector is not None:
            self._spend(vector, weight)

    def _spend(self, vector: np.ndarray, weight: int) -> None:
        """Refuse (``SPENT``) a contribution this process already put into an aggregation."""
        content = np.ascontiguousarray(vector).tobytes() + str(int(weight)).encode()
        digest = hashlib.sha256(content).hexdigest()
        key = (repr(self.setup.get("purpose")), repr(self.setup.get("round")), digest)  # untrusted: any JSON
        if key in self.context.spent:
            raise ClientAbort(SPENT)
        self.context.spent.add(key)

    @property
    def awaits_input(self) -> bool:
        """True while the layer was built without its contribution and has not been given it."""
        return self.vector is None

    def handle(self, stage: str, message: bytes, *,
               supply: Callable[[], tuple[np.ndarray, int]] | None = None) -> bytes | None:
        """Answer one stage message under the framework's rule (see the class docstring): the reply,
        or None; raises ``ClientAbort`` to refuse (and the layer is closed from then on).

        ``supply``: for a layer built without its contribution, called (once) at
        :attr:`INPUT_STAGE`, after the stage's order is checked, for ``(vector, weight)``."""
        if self.closed:
            raise ClientAbort(CLOSED)
        position = self.STAGES.index(stage) if stage in self.STAGES else -1
        if position <= self._answered:
            self.closed = True
            raise ClientAbort(OUT_OF_ORDER)
        self._answered = position
        try:
            self.check_stage(stage, message)
            if self.vector is None and stage == self.INPUT_STAGE:
                if supply is None:
                    raise ClientAbort(NO_INPUT)
                vector, weight = supply()
                if vector.shape != (self.length,):
                    raise ClientAbort(NO_INPUT)
                self._spend(vector, weight)
                self.vector, self.weight = vector, weight
                self.take_input(vector, weight)
            reply = self.answer(stage, message)
        except BaseException:
            self.closed = True
            raise
        if position == len(self.STAGES) - 1:
            self.closed = True
        return reply

    def check_stage(self, stage: str, message: bytes) -> None:
        """Refuse (``ClientAbort``) a message labelled ``stage`` that the protocol is not at, or that
        is not of this aggregation, before any contribution is taken for it (a layer that can tell
        does; by default nothing)."""

    def take_input(self, vector: np.ndarray, weight: int) -> None:
        """A late contribution, at :attr:`INPUT_STAGE` (a layer that sets it implements this)."""
        raise ClientAbort(NO_INPUT)

    @abstractmethod
    def answer(self, stage: str, message: bytes) -> bytes | None:
        """Answer one stage message, called by :meth:`handle` at most once per stage, in order (the
        reply, or None); raise ``ClientAbort`` to refuse."""


def first_message(setup: dict[str, Any], message: bytes) -> bytes:
    """The first message of an aggregation to one site: the setup and the first protocol message."""
    return envelope.encode(setup, message)


def split_first(data: bytes) -> tuple[dict[str, Any], bytes]:
    """Inverse of :func:`first_message`; raises ``MalformedEnvelope``."""
    return envelope.decode(data)
