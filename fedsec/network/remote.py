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

import hashlib
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from torch import nn

from fedsec.fl_core.aggregation import AggregateResult, AggregationProtocol, ClientUpdate, Purpose
from fedsec.fl_core.client import LocalResult, Strategy
from fedsec.fl_core.data import ArrayDataset
from fedsec.fl_core.errors import AggregationError
from fedsec.fl_core.federated_eval import FederatedEvaluator, sum_evaluations, sums_length
from fedsec.fl_core.parameters import get_vector
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

    def open_evaluation(self, round_index: int) -> Any:
        """Open this round's evaluation sum (this is the evaluation's round) over the sites present
        now, drawing what its :meth:`aggregate` would draw from the evaluation's own generator
        (the simulation's order is kept: the evaluation's draws are of their own stream), so that
        the update's calls carry its stages that need no contribution; None when its layer cannot
        be opened ahead (every layer but masking) or no site is present."""
        opener = getattr(self.layer, "open", None)
        ids = self.present()
        if opener is None or not ids:
            return None
        length = sums_length(len(self.layer.context.config.data.classes))
        updates = [ClientUpdate(k, np.zeros(length, dtype=np.float32), 1.0) for k in ids]
        try:
            self.opened = opener(round_index, updates, purpose="statistics")
        except ProtocolAbort:  # refused before any draw: the evaluation opens it again, and aborts
            self.opened = None
        return self.opened

    def aggregate(self, round_index: int, updates: Sequence[ClientUpdate], *,
                  purpose: Purpose = "update") -> AggregateResult:
        self.hub.round, self.hub.purpose = round_index, purpose
        bundle, self.first = self.first, None
        opened, self.opened = self.opened, None
        if opened is not None and (purpose != "statistics" or opened.round_index != round_index
                                   or [int(u.client_id) for u in updates] != opened.ids):
            opened = None  # not the aggregation it was opened for: it is never driven
        rider = None
        if purpose == "update":
            ids = [int(u.client_id) for u in updates]
            self.replayed = set()
            if self.sequential_noise or not self.layer.bundles_first_job:
                trained = self._train(round_index, ids)
                self._charge(round_index, trained)
                updates = [u for u in updates if int(u.client_id) in trained]
                if not updates:
                    raise ProtocolAbort("no site trained before the deadline")
            else:  # the train jobs travel with the layer's first stage: a site that fails them drops out
                bundle = self._training_bundle(round_index, ids)
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
            self.hub.rider = None
            if bundle is not None:
                self.hub.bundle = None
                if not bundle.sent:  # the layer ended before its first stage: no site got the jobs
                    bundle.done({}, {})
            if noisy:
                self.layer.client_noise = None
            self._record(round_index, purpose)

    def _charge(self, round_index: int, trained: set[int]) -> None:
        """The sites that trained (or refused as ``rounds.replayed``: a resumed coordinator's re-run
        of a round they already released) are charged in their ledgers; a replayed round in the run's."""
        self.on_trained(round_index, [self.hub.names[c] for c in sorted(trained | self.replayed)])
        if self.replayed and self.on_released is not None:  # charged even if the re-run aborts
            self.on_released(round_index)

    def _train_jobs(self, round_index: int, ids: list[int]) -> dict[int, tuple[dict[str, Any], bytes]]:
        """Each site's ``train`` job: the global model's body, or its SHA-256 alone for a site that
        holds it (the model its last evaluation was of: the next round starts from it)."""
        assert self.strategy.vector is not None
        body = vector_bytes(self.strategy.vector)
        digest = hashlib.sha256(body).hexdigest()
        head = self.hub.audit.head()  # one read for all: every row before it is on disk
        jobs = {}
        for c in ids:
            header = {"rng": self.strategy.pending[c], "head": head,
                      "noise_multiplier": self.hub.noise_multiplier}
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
                protocol.first, protocol.opened = None, None


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
