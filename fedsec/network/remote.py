"""The coordinator's stand-ins for what the simulation does in one process: the sites train,
evaluate and compute feature statistics; the coordinator's server loop is the simulation's own
(:class:`fl_core.FederatedServer`, built by :func:`fedsec.experiment.assemble_experiment`).

- :class:`RemoteStrategy` wraps the plan's strategy: ``client_update`` records the round's
  training seed for the site (the server loop draws it from the run generator as in the
  simulation) and returns a placeholder; ``apply`` is the plan's (the server optimiser runs here).
- :class:`RemoteRound` is the protocol the server loop sees: for an update it sends each sampled
  site a ``train`` job (global model, seed; under ``dp.reproducible`` DP-SGD also the position
  in the seeded noise stream, the sites then train one after the other in client order as the
  simulation's single stream does), then runs the secure layer over the sites that trained.
- :class:`RemoteEvaluator` is the csv plan's federated evaluator with ``evaluate`` jobs: every
  site computes its sums on its own held-out split, the secure layer sums them.
- :func:`remote_moments` is :func:`fl_core.standardize.federated_moments` with ``moments`` jobs.

Each draws from the run generator exactly what its simulated counterpart draws, in the same
order, so a reproducible plan gives the simulation's history.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from torch import nn

from fedsec.fl_core.aggregation import AggregateResult, AggregationProtocol, ClientUpdate, Purpose
from fedsec.fl_core.client import LocalResult, Strategy
from fedsec.fl_core.data import ArrayDataset
from fedsec.fl_core.errors import AggregationError
from fedsec.fl_core.federated_eval import FederatedEvaluator, sum_evaluations, sums_length
from fedsec.fl_core.parameters import get_vector
from fedsec.fl_core.server import clients_per_round, draw_round
from fedsec.fl_core.standardize import MIN_STD
from fedsec.network.client_noise import noise_rule
from fedsec.network.coordinator import Bundle, Hub
from fedsec.network.envelope import vector_bytes
from fedsec.network.layers.base import CoordinatorLayer
from fedsec.network.party_audit import identity_fingerprint
from fedsec.protocols.errors import ProtocolAbort


class RemoteStrategy(Strategy):
    """The plan's strategy with local updates left to the sites (see the module)."""

    def __init__(self, inner: Strategy, clients: Sequence[ArrayDataset]) -> None:
        self.inner, self.name = inner, inner.name
        self.clients = tuple(clients)
        self.pending: dict[int, dict[str, Any]] = {}
        self.vector: np.ndarray | None = None

    def client_update(self, model: nn.Module, global_vector: np.ndarray, data: ArrayDataset, *,
                      rng: np.random.Generator) -> LocalResult:
        client = next(k for k, c in enumerate(self.clients) if c is data)
        self.pending[client] = rng.bit_generator.state
        self.vector = global_vector
        return LocalResult(np.zeros_like(global_vector), 1.0, None)

    def apply(self, global_vector: np.ndarray, average: np.ndarray) -> np.ndarray:
        return self.inner.apply(global_vector, average)


@dataclass
class _Ahead:
    """A round's update aggregation opened during the round before (see :meth:`RemoteRound.open_ahead`)."""

    round_index: int
    ids: list[int]
    session: Any
    before: dict[str, Any]
    """The run generator's state after the round's sample and training seeds: what it must be when
    the round's aggregation opens for this one to be that aggregation."""
    after: dict[str, Any]
    """Its state after the aggregation's own draws: where the run generator goes when it is taken."""
    joins: dict[str, int]
    """How many times each site had accepted the plan when it was opened (a site that accepts again
    restarted, and lost its layers: the round then opens its own aggregation)."""
    states: dict[int, dict[str, Any]]
    """Each sampled client's training generator state, as the server loop will record it
    (:meth:`RemoteStrategy.client_update`) from the round's training seeds."""
    model: str | None = None
    """The SHA-256 of the model its ``train`` jobs were sent with, once they were (speculated
    during the round before's evaluation, :meth:`RemoteRound.train_ahead`); None before."""
    replayed: set[int] = field(default_factory=set)
    """Sites that refused that training as ``rounds.replayed``."""


class RemoteRound(AggregationProtocol):
    """The server loop's protocol: ``train`` jobs, then the secure layer (see the module).

    Args:
        layer: the secure layer's coordinator side.
        hub: the coordinator's network side.
        strategy: the :class:`RemoteStrategy` that recorded the round's seeds.
        deadline: seconds a site has to train (``federation.stage_timeout``).
        sequential_noise: under ``dp.reproducible`` DP-SGD, pass the seeded noise stream's
            position from site to site.
        on_trained: called with ``(round, names)`` of the sites that trained (their ledgers).
    """

    client_metrics: frozenset[str] = frozenset()
    """Sites report nothing outside the secure layer (no training loss)."""

    def __init__(self, *, layer: CoordinatorLayer, hub: Hub, strategy: RemoteStrategy, deadline: float,
                 sequential_noise: bool, on_trained: Callable[[int, list[str]], None]) -> None:
        self.layer, self.hub, self.strategy = layer, hub, strategy
        self.deadline, self.sequential_noise = deadline, sequential_noise
        self.noise_offset = 0
        self.on_trained = on_trained
        self.on_released: Callable[[int], None] | None = None
        """Charges the run's own budget for a round (set by the coordinator under DP): called when
        a site refuses the round as ``rounds.replayed``, i.e. an earlier incarnation of this
        coordinator released that round's sum (S4-6). Each site's update is in at most one release
        of a round, so this one charge covers the dead incarnation's release and a re-run's."""
        self.replayed: set[int] = set()
        """Sites that refused this round's training as ``rounds.replayed`` (charged: see ``aggregate``)."""
        self.evaluation: RemoteRound | None = None
        """The evaluation's own round over its own layer instance (set by the coordinator)."""
        self.client_noise: Any = None
        """Set by :class:`~fedsec.protocols.privacy.ClientLevelDP` for one update (client-level DP):
        its share object carries the run's client-noise stream; the shares themselves are drawn at
        the sites, by the rule of :mod:`fedsec.network.client_noise`."""
        self.noise_multiplier: float | None = None
        """The calibrated noise multiplier the sites were sent (client-level DP)."""
        self.first: Bundle | None = None
        """Jobs the next aggregation's first stage carries (the evaluation's, set by
        :class:`RemoteEvaluator`); taken by :meth:`aggregate`."""
        self.opened: Any = None
        """The evaluation's aggregation of this round, opened by the update's round so that its
        first stages ride in the update's calls (a
        :class:`~fedsec.network.layers.masking.MaskedSession`); driven by :meth:`aggregate`."""
        self.update: RemoteRound | None = None
        """The update's round (set on the evaluation's round by the coordinator): an evaluation's
        calls carry the key stages of the next round's update aggregation (:meth:`open_ahead`)."""
        self.ahead: _Ahead | None = None
        """The next round's update aggregation, opened during this round's evaluation."""
        self.early: tuple[Any, dict[str, Any], dict[str, Any]] | None = None
        """An evaluation opened early (:meth:`open_evaluation`), with the evaluation generator's
        state before and after its draws (drawn from a copy)."""
        self.post: Callable[[str, dict[int, bytes]], Any] | None = None
        self.collect: Callable[[Any], dict[int, bytes]] | None = None
        """Post a ``layer`` exchange without waiting for it, and collect its replies (set by the
        coordinator; the layer's own exchanges are ``collect(post(...))``)."""
        self.prefetched: tuple[_Ahead, Any] | None = None
        """The first call of the round opened ahead, posted at the end of the round before's
        evaluation: that aggregation and the posted exchange (:meth:`prefetch`)."""
        self.released: tuple[bytes, str] | None = None
        """The model the evaluation in flight is of (its body and SHA-256; set by
        :class:`RemoteEvaluator`): the model the next round trains from."""

    @property
    def max_weight(self) -> int:
        return self.layer.context.max_weight

    @property
    def bits(self) -> int:
        return self.layer.context.config.secure.bits

    @property
    def clip(self) -> float:
        return self.layer.context.config.secure.clip

    def min_contributions(self, n: int) -> int:
        return self.layer.min_contributions(n)

    def tolerated_colluders(self, n: int) -> int:
        return self.layer.tolerated_colluders(n)

    def present(self) -> list[int]:
        """The roster positions of the sites connected now (an evaluation's sites)."""
        hub = self.hub
        return [k for k, n in enumerate(hub.names) if n in hub.sites and n not in hub.absent]

    def open_evaluation(self, round_index: int, *, early: bool = False) -> Any:
        """Open this round's evaluation sum (this is the evaluation's round) over the sites present
        now, drawing what its :meth:`aggregate` would draw from the evaluation's own generator
        (the simulation's order is kept: the evaluation's draws are of their own stream), so that
        the update's calls carry its stages that need no contribution; None when its layer cannot
        be opened ahead (every layer but masking) or no site is present.

        ``early``: opened at the end of the round before (:meth:`prefetch`), before that round is
        recorded and checkpointed, so from a *copy* of the evaluation generator; the generator
        itself moves past its draws only when the round opens its evaluation (the call without
        ``early``) and it still stands where the copy was (review 11b, R11b-1: drawn at once, a
        stop after the round before, or a resume from its checkpoint, left it past draws the run
        did not take, or took twice). Otherwise the early one is never driven and one is opened."""
        rng = self.layer.context.rng
        early_opened, self.early = self.early, None
        if not early and early_opened is not None:
            session, before, after = early_opened
            if (session is self.opened and session.round_index == round_index
                    and rng.bit_generator.state == before):
                rng.bit_generator.state = after
                return session  # its first stage posted at the end of the round before
        opener = getattr(self.layer, "open", None)
        ids = self.present()
        if opener is None or not ids:
            return None
        length = sums_length(len(self.layer.context.config.data.classes))
        updates = [ClientUpdate(k, np.zeros(length, dtype=np.float32), 1.0) for k in ids]
        draws = copy.deepcopy(rng) if early else rng
        before = draws.bit_generator.state
        try:
            self.opened = opener(round_index, updates, purpose="statistics", rng=draws)
        except ProtocolAbort:  # refused before any draw: the evaluation opens it again, and aborts
            self.opened = None
        if early and self.opened is not None:
            self.early = (self.opened, before, draws.bit_generator.state)
        return self.opened

    def open_ahead(self, round_index: int) -> Any:
        """Open round ``round_index``'s update aggregation now (this is the update's round, and
        the round before is evaluating), so that the evaluation's calls carry its stages that need
        no contribution (advertise keys, share keys) and the round's ``train`` jobs then travel
        with its masked input: a round of 6 exchanges instead of 8.

        It is opened over the clients the server loop will sample, drawing from a *copy* of the
        run generator what the round will draw (its sample and training seeds,
        :func:`~fedsec.fl_core.server.draw_round`, then the aggregation's own draws); the run
        generator itself is moved only when the round takes it (:meth:`_take_ahead`), so the
        history stays the simulation's. None where it cannot be: a layer that cannot be opened
        ahead (every layer but masking), reproducible DP-SGD (its sites train one by one first),
        client-level DP (each update's noise is drawn when it opens), a round past the plan's, no
        global model yet, or a refusal before any draw."""
        if self.ahead is not None:  # opened for a round that never took it
            self._record_ahead(self.ahead)
        self.ahead = None
        config = self.layer.context.config
        opener = getattr(self.layer, "open", None)
        if (opener is None or self.sequential_noise or not self.layer.bundles_first_job
                or config.dp.mode == "client" or not 1 <= round_index <= config.rounds
                or self.strategy.vector is None):
            return None
        draws = copy.deepcopy(self.layer.context.rng)
        n = len(self.hub.names)
        selected, seeds = draw_round(draws, n, clients_per_round(config.train.fraction, n))
        before = draws.bit_generator.state
        ids = [int(c) for c in selected]
        zeros = np.zeros(self.strategy.vector.size, dtype=np.float32)
        try:
            session = opener(round_index, [ClientUpdate(c, zeros, 1.0) for c in ids], purpose="update",
                             rng=draws)
        except ProtocolAbort:  # refused before any draw: the round opens its own
            return None
        # the clients' training generators as the server loop's runner seeds them (fl_core.execution)
        states = {c: np.random.default_rng(int(s)).bit_generator.state
                  for c, s in zip(ids, seeds, strict=True)}
        self.ahead = _Ahead(round_index, ids, session, before, draws.bit_generator.state,
                            dict(self.hub.joins), states)
        return session

    def train_ahead(self) -> Bundle | None:
        """The ``train`` jobs of the round opened ahead, to travel with its masked input in the
        last call of the round before's evaluation (the evaluation's unmask): the training is
        speculated, the sum is not. Its consistency check and unmask, which release it, run only
        when the server loop has recorded the round before and begins this round
        (:meth:`_take_ahead`), so a stop (a target accuracy reached, the last round) still comes
        before any release: a round of 5 exchanges instead of 6. None, and the jobs go with the
        round as before, where it cannot be: not a plan without DP (a training the run does not
        take would have charged the sites' ledgers), ``federation.train_ahead`` false (a
        coordinator crash then loses only the round in flight), no aggregation opened ahead or not at its
        masked input, key stages that did not complete with every sampled site or a site that
        accepted the plan again since, or no model being evaluated."""
        ahead, config = self.ahead, self.layer.context.config
        if (ahead is None or config.dp.mode != "none" or not config.federation.train_ahead
                or self.released is None or ahead.model is not None):
            return None
        session, names = ahead.session, self.hub.names
        if (session.done or session.stage != "masked input" or set(session.server.members) != set(ahead.ids)
                or any(self.hub.joins.get(names[c]) != ahead.joins.get(names[c]) for c in ahead.ids)):
            return None
        body, digest = self.released
        ahead.model = digest
        jobs = self._jobs_for(ahead.ids, body, digest, ahead.states)
        round_index, ids = ahead.round_index, ahead.ids

        def done(answers: dict[str, tuple[dict[str, Any], bytes]], refusals: dict[str, str]) -> None:
            ahead.replayed |= {c for c in ids if refusals.get(names[c]) == "rounds.replayed"}
            self._ack(round_index, answers)
            self._charge(round_index, {c for c in ids if names[c] in answers}, ahead.replayed)

        return Bundle("train", {names[c]: jobs[c] for c in ids}, done, round_index=round_index)

    def prefetch(self, round_index: int, evaluation: RemoteRound) -> None:
        """Post the first call of round ``round_index`` now, at the end of the round before's
        evaluation, when its training went ahead (:meth:`train_ahead`): its update's consistency
        check, with the advertise keys of its evaluation (opened now, over the sites present:
        :meth:`open_evaluation`) as the second part. The sites work on it while the server loop
        records the round before (history, checkpoint, audit) and begins this round, which
        collects the replies (:meth:`aggregate`); nothing is released by it. Nothing is posted
        where the aggregation ahead was not trained ahead, has failed, or is not past its input."""
        ahead, hub = self.ahead, self.hub
        if (ahead is None or ahead.model is None or self.post is None or ahead.round_index != round_index
                or ahead.session.done or ahead.session.before_input or ahead.session.stage == "masked input"):
            return
        rider = evaluation.open_evaluation(round_index, early=True)
        saved = hub.round, hub.purpose, hub.rider, hub.rider_training
        hub.round, hub.purpose, hub.rider, hub.rider_training = round_index, "update", rider, None
        try:
            stage, outgoing = ahead.session.outgoing()
            if not ahead.session.done:
                self.prefetched = (ahead, self.post(stage, outgoing))
        finally:
            hub.round, hub.purpose, hub.rider, hub.rider_training = saved

    def settle(self) -> None:
        """At the end of the run: collect a first call posted ahead for a round the run did not
        begin (its dropouts recorded), and record that its aggregation was never driven."""
        prefetched, self.prefetched = self.prefetched, None
        if prefetched is None or self.collect is None:
            return
        ahead, posted = prefetched
        ahead.session.take(self.collect(posted))  # a bad reply is its site's misbehaviour (R11b-2)
        self._record_ahead(ahead)
        self.hub.audit.event("abort", round=ahead.round_index,
                             stage=f"{self.layer.name}/update (trained ahead)",
                             details={"reason": "the run ended before this round began: its sum was "
                                                "never released"})

    def _take_ahead(self, round_index: int, ids: list[int]) -> tuple[Any, bool]:
        """The update aggregation opened ahead for this round, if it is the one the round's own
        draws call for (same clients, the run generator where the copy was) and its key stages
        completed with every one of them, none of which accepted the plan again since (a restarted
        site lost its layers): the run generator then moves past its draws, as if the round had
        opened it now. None otherwise: it is never driven, the round opens its own (a site that set
        it up replaces it at the new setup)."""
        ahead, self.ahead = self.ahead, None
        if ahead is None:
            return None, False
        rng, session = self.layer.context.rng, ahead.session
        names, joins = self.hub.names, self.hub.joins
        same = (ahead.round_index == round_index and ahead.ids == ids
                and rng.bit_generator.state == ahead.before)
        if ahead.model is not None:
            # its training went out with its masked input (train_ahead): it is this round's sum only
            # if the loop trains the same clients, from the same generators and the same model; then
            # it is driven even if it failed (a round's update is in one session: a site that sent
            # its masked input would refuse another, so the round ends there, as any round whose
            # masked input failed)
            assert self.strategy.vector is not None
            if (same and all(self.strategy.pending.get(c) == ahead.states[c] for c in ids)
                    and hashlib.sha256(vector_bytes(self.strategy.vector)).hexdigest() == ahead.model):
                rng.bit_generator.state = ahead.after
                self.replayed = set(ahead.replayed)
                return session, True
            self._record_ahead(ahead)
            self.hub.audit.event("abort", round=ahead.round_index,
                                 stage=f"{self.layer.name}/update (trained ahead)",
                                 details={"reason": "the server loop's round is not the one trained "
                                                    "ahead: its sites' updates of this round are spent"})
            return None, False
        if (not same or session.done or session.stage != "masked input"
                or set(session.server.members) != set(ids)
                or any(joins.get(names[c]) != ahead.joins.get(names[c]) for c in ids)):
            self._record_ahead(ahead)
            return None, False
        rng.bit_generator.state = ahead.after
        return session, False

    def _record_ahead(self, ahead: _Ahead) -> None:
        """An aggregation opened ahead and never driven: the sites its key stages lost, and those
        that misbehaved in them, in the audit log under its round (review 10, R10-3: a site that
        sent garbage there was recorded nowhere, and the round silently took 8 exchanges)."""
        server, names = ahead.session.server, self.hub.names
        stage = f"{self.layer.name}/update (keys ahead)"
        members = set(server.members)
        for c in ahead.ids:
            if c not in members:
                why = server.rejected.get(c, "no answer before a stage deadline, or aborted")
                self.hub.audit.event("dropout", round=ahead.round_index, stage=stage,
                                     details={"site": names[c], "reason": why})
        for c, why in sorted(server.misbehaved.items()):
            self.hub.audit.event("misbehaved", round=ahead.round_index, stage=stage,
                                 details={"site": names[c], "reason": why})

    def aggregate(self, round_index: int, updates: Sequence[ClientUpdate], *,
                  purpose: Purpose = "update") -> AggregateResult:
        self.hub.round, self.hub.purpose = round_index, purpose
        bundle, self.first = self.first, None
        opened, self.opened = self.opened, None
        if opened is not None and (purpose != "statistics" or opened.round_index != round_index
                                   or [int(u.client_id) for u in updates] != opened.ids):
            opened = None  # not the aggregation it was opened for: it is never driven
        rider = None
        if purpose == "statistics" and opened is not None and self.update is not None:
            # this round's evaluation (opened in the update's calls): the next round's update
            # aggregation agrees its keys in these calls, and its training goes with its masked
            # input in the last of them where it can (train_ahead)
            rider = self.update.open_ahead(round_index + 1)
            self.hub.rider_training = self.update.train_ahead if rider is not None else None
        if purpose == "update":
            ids = [int(u.client_id) for u in updates]
            self.replayed = set()
            if self.sequential_noise or not self.layer.bundles_first_job:
                self.ahead = None
                trained = self._train(round_index, ids)
                self._charge(round_index, trained)
                updates = [u for u in updates if int(u.client_id) in trained]
                if not updates:
                    raise ProtocolAbort("no site trained before the deadline")
            else:  # the train jobs travel with the layer's first stage: a site that fails them drops out
                # opened during the last evaluation, its keys agreed: the jobs travel with its masked
                # input, or went with it already (its training speculated during that evaluation)
                prefetched, self.prefetched = self.prefetched, None
                if prefetched is not None and self.collect is not None:
                    # the round's first call, posted at the end of the last evaluation (prefetch):
                    # its replies go to the aggregation it was posted for (its evaluation took its
                    # part in collect), before that is taken or not (a refused one records them:
                    # review 11b, R11b-2)
                    ahead, posted = prefetched
                    ahead.session.take(self.collect(posted))
                opened, trained = self._take_ahead(round_index, ids)
                bundle = None if trained else self._training_bundle(round_index, ids)
                if self.evaluation is not None and hasattr(self.layer, "open"):
                    # the evaluation's stages that need no sums ride in this aggregation's first
                    # calls (not under reproducible DP-SGD, whose sites train one by one first: a
                    # plan for checking a deployment against the simulation, kept as it was)
                    rider = self.evaluation.open_evaluation(round_index)
        noisy = purpose == "update" and self.client_noise is not None
        if noisy:
            if not hasattr(self.layer, "client_noise") or self.noise_multiplier is None:
                raise ProtocolAbort(f"the {self.layer.name} layer carries no client-level noise")
            rule = noise_rule(self.layer.context.config, self.noise_multiplier, int(updates[0].vector.size))
            self.layer.client_noise = (rule, self.client_noise.random)
        self.hub.bundle, self.hub.rider = bundle, rider
        try:
            if opened is not None:
                return self.layer.drive(opened)
            return self.layer.aggregate(round_index, updates, purpose=purpose)
        except ProtocolAbort as abort:
            self.hub.audit.event("abort", round=round_index, stage=purpose, details={"reason": str(abort)})
            raise
        finally:
            self.hub.rider, self.hub.rider_training = None, None
            if bundle is not None:
                self.hub.bundle = None
                if not bundle.sent:  # the layer ended before its first stage: no site got the jobs
                    bundle.done({}, {})
            if noisy:
                self.layer.client_noise = None
            self._record(round_index, purpose)
            if purpose == "statistics" and rider is not None and self.update is not None:
                # the next round's first call, its training gone ahead: posted now (prefetch)
                self.update.prefetch(round_index + 1, self)

    def _charge(self, round_index: int, trained: set[int], replayed: set[int] | None = None) -> None:
        """The sites that trained (or refused as ``rounds.replayed``: a resumed coordinator's re-run
        of a round they already released) are charged in their ledgers; a replayed round in the run's."""
        replayed = self.replayed if replayed is None else replayed
        self.on_trained(round_index, [self.hub.names[c] for c in sorted(trained | replayed)])
        if replayed and self.on_released is not None:  # charged even if the re-run aborts
            self.on_released(round_index)

    def _train_jobs(self, round_index: int, ids: list[int]) -> dict[int, tuple[dict[str, Any], bytes]]:
        """Each site's ``train`` job from the server loop's global model and training generators."""
        assert self.strategy.vector is not None
        body = vector_bytes(self.strategy.vector)
        return self._jobs_for(ids, body, hashlib.sha256(body).hexdigest(), self.strategy.pending)

    def _jobs_for(self, ids: list[int], body: bytes, digest: str,
                  states: dict[int, dict[str, Any]]) -> dict[int, tuple[dict[str, Any], bytes]]:
        """Each site's ``train`` job: its training generator's state and the model's body, or its
        SHA-256 ``digest`` alone for a site that holds it (the model its last evaluation was of:
        the next round starts from it)."""
        head = self.hub.audit.head()  # one read for all: every row before it is on disk
        jobs = {}
        for c in ids:
            header = {"rng": states[c], "head": head, "noise_multiplier": self.hub.noise_multiplier}
            held = self.hub.holds_model(self.hub.names[c], digest)
            jobs[c] = ({**header, "model": digest}, b"") if held else (header, body)
        return jobs

    def _training_bundle(self, round_index: int, ids: list[int]) -> Bundle:
        """The round's ``train`` jobs as a bundle for the layer's first stage; once answered, the
        sites that trained are acknowledged and charged as after a ``train`` exchange."""
        names = self.hub.names
        jobs = self._train_jobs(round_index, ids)

        def done(answers: dict[str, tuple[dict[str, Any], bytes]], refusals: dict[str, str]) -> None:
            self.replayed |= {c for c in ids if refusals.get(names[c]) == "rounds.replayed"}
            self._ack(round_index, answers)
            self._charge(round_index, {c for c in ids if names[c] in answers})

        return Bundle("train", {names[c]: jobs[c] for c in ids}, done)

    def _record(self, round_index: int, purpose: str) -> None:
        """Dropouts and misbehaviour the layer saw, in the audit log."""
        names = self.hub.names
        for c, why in sorted(self.layer.last_dropped.items()):
            self.hub.audit.event("dropout", round=round_index, stage=f"{self.layer.name}/{purpose}",
                                 details={"site": names[c], "reason": why})
        for c, why in sorted(getattr(self.layer, "last_misbehaved", {}).items()):
            self.hub.audit.event("misbehaved", round=round_index, stage=f"{self.layer.name}/{purpose}",
                                 details={"site": names[c], "reason": why})

    def _train(self, round_index: int, ids: list[int]) -> set[int]:
        names = self.hub.names
        jobs = self._train_jobs(round_index, ids)
        done: set[int] = set()
        if not self.sequential_noise:
            answers = self.hub.exchange("train", round_index, {names[c]: jobs[c] for c in ids}, self.deadline)
            self._replayed(ids)
            done = {c for c in ids if names[c] in answers}
            self._ack(round_index, answers)
            return done
        for c in ids:
            header, body = jobs[c]
            job = {names[c]: ({**header, "noise": self.noise_offset}, body)}
            answers = self.hub.exchange("train", round_index, job, self.deadline)
            self._replayed([c])
            if names[c] in answers:
                offset = answers[names[c]][0].get("noise")
                if isinstance(offset, int) and not isinstance(offset, bool) and offset >= self.noise_offset:
                    self.noise_offset = offset
                    done.add(c)
                self._ack(round_index, answers)
        return done

    def _replayed(self, ids: list[int]) -> None:
        self.replayed |= {c for c in ids if self.hub.refusals.get(self.hub.names[c]) == "rounds.replayed"}

    def _ack(self, round_index: int, answers: dict[str, tuple[dict[str, Any], bytes]]) -> None:
        """Acknowledge each answering site's head if it is that site's log (its certificate's name
        and identity key, no row below one acknowledged before); else a recorded misbehaviour."""
        for name, (header, _) in answers.items():
            peer = self.hub.peers.get(name)
            problem = ("no certificate on record" if peer is None else
                       self.hub.audit.ack_checked(header.get("head"), actor=name, round=round_index,
                                                  fingerprint=identity_fingerprint(peer.identity_key)))
            if problem is not None:
                self.hub.audit.event("misbehaved", round=round_index, stage="ack",
                                     details={"site": name, "reason": problem})


class RemoteEvaluator(FederatedEvaluator):
    """:class:`FederatedEvaluator` whose sites are remote: ``evaluate`` jobs, then the layer."""

    def __init__(self, *, hub: Hub, deadline: float, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.hub, self.deadline = hub, deadline

    def evaluate_sites(self, model: nn.Module, tests: Sequence[ArrayDataset], *,
                       round_index: int) -> dict[str, float]:
        names, hub = self.hub.names, self.hub
        body = vector_bytes(get_vector(model))
        digest = hashlib.sha256(body).hexdigest()
        length = sums_length(self.n_classes)
        protocol = self.protocol

        def done(answers: dict[str, Any], refusals: dict[str, str]) -> None:
            hub.evaluated(answers, digest)  # they hold the model: the next train job names it

        if isinstance(protocol, RemoteRound) and protocol.update is not None:
            protocol.update.released = (body, digest)  # the next round trains from it
        if isinstance(protocol, RemoteRound) and protocol.opened is not None:
            # opened by the update's round (its first stages rode in the update's calls): the
            # evaluate jobs travel with its next stage, the masked input, to the sites in it
            present = [names[k] for k in protocol.opened.ids]
            protocol.first = Bundle("evaluate", {n: ({}, body) for n in present}, done)
            answered = set(present)
        elif isinstance(protocol, RemoteRound) and protocol.layer.bundles_first_job:
            # the evaluate jobs travel with the sum's first stage: a site that fails one drops out there
            present = [n for n in names if n in hub.sites and n not in hub.absent]
            protocol.first = Bundle("evaluate", {n: ({}, body) for n in present}, done)
            answered = set(present)
        else:
            answered = set(hub.exchange("evaluate", round_index, {n: ({}, body) for n in hub.sites},
                                        self.deadline))
            hub.evaluated(answered, digest)
        updates = [ClientUpdate(k, np.zeros(length, dtype=np.float32), 1.0)
                   for k, n in enumerate(names) if n in answered]
        # one attempt: a site contributes its evaluation vector to one aggregation only (a retry
        # would be refused), so an aborted evaluation leaves the round's metrics blank
        try:
            return sum_evaluations(self.protocol, round_index, updates, n_classes=self.n_classes,
                                   max_error=self.max_error, attempts=1)
        finally:
            if isinstance(protocol, RemoteRound):
                protocol.first = None
                if protocol.opened is not None and protocol.opened.round_index <= round_index:
                    protocol.opened = None  # a later round's, opened at the end of this one, stays


def remote_moments(hub: Hub, protocol: AggregationProtocol, *, features: int, deadline: float,
                   sizes: dict[str, int]) -> tuple[np.ndarray, np.ndarray, int]:
    """The federation's per-feature ``(mean, std, upload_bytes)`` as
    :func:`~fedsec.fl_core.standardize.federated_moments` computes them, the sites computing their
    own moments (``moments`` jobs, stage 1: means; stage 2: squared deviations about ``mean``).

    Raises:
        AggregationError: every attempt aborted, or a statistic was clipped.
    """
    names = hub.names

    def aggregate(stage: int, body: bytes) -> tuple[np.ndarray, int]:
        answers = hub.exchange("moments", 0, {n: ({"stage": stage}, body) for n in hub.sites}, deadline)
        updates = [ClientUpdate(k, np.zeros(features, dtype=np.float32), float(sizes[n]))
                   for k, n in enumerate(names) if n in answers]
        if not updates:
            raise AggregationError("no site computed its feature statistics in time")
        # one attempt: each site answers each stage of the moments once per run (a retry would be
        # refused), so an aborted sum ends the set-up with the AggregationError
        result = protocol.aggregate(0, updates, purpose="statistics")
        if result.metrics.get("clipped", 0) > 0:
            raise AggregationError("feature statistics exceed the aggregation protocol's range")
        return result.weighted_sum / result.total_weight, result.upload_bytes

    mean, upload_mean = aggregate(1, b"")
    variance, upload_var = aggregate(2, np.asarray(mean, dtype="<f8").tobytes())
    std = np.sqrt(np.maximum(variance, 0.0))
    std[std < MIN_STD] = 1.0
    scaling = np.asarray(mean, dtype="<f8").tobytes() + np.asarray(std, dtype="<f8").tobytes()
    hub.standardization = scaling
    hub.exchange("standardize", 0, {n: ({}, scaling) for n in hub.sites}, deadline)
    return mean, std, upload_mean + upload_var
