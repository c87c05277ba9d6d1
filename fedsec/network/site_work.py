"""What a site computes for the coordinator's jobs, with the simulation's own code.

- ``train``: the plan's strategy (``strategy.client_update``: local epochs of SGD, or DP-SGD with
  the noise multiplier the site checked), from the global model the job carries (or names by its
  SHA-256 when it is the model this site's last ``evaluate`` job sent: :meth:`SiteWork.job_model`)
  and with the round's training generator (the state the coordinator drew, as the simulation
  draws it);
- ``evaluate``: :func:`fl_core.federated_eval.local_evaluation` on the site's held-out split;
- ``moments``: the site's part of :func:`fl_core.standardize.federated_moments`; ``standardize``
  then scales its records with the federation's mean and spread.

Each leaves one pending *contribution* (vector, integer weight, purpose, round) that the secure
layer's site side sums next; a layer setup for another purpose or round is refused.

A contribution goes into at most one aggregation, ever: the first setup that names it consumes
it (recorded in the site's :class:`ContributionRecord` before the layer is built, so before any
message that depends on it leaves). A deployed site's record is ``site.db`` keyed by (plan
SHA-256, kind, round), so a restart does not reset it. An evaluation is answered for rounds
1..``rounds`` of the plan only, once per round; each stage of the feature moments once per run.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedsec import fl_core
from fedsec.config import ExperimentConfig
from fedsec.dp.errors import UnsupportedModelError
from fedsec.dp.noise import MIN_NOISE_MULTIPLIER
from fedsec.fl_core.csv_data import ClientData, load_client_csv
from fedsec.fl_core.errors import NonFiniteError
from fedsec.fl_core.federated_eval import local_evaluation, sums_length
from fedsec.fl_core.parameters import set_vector
from fedsec.network.client_noise import ClientNoise, noise_rule
from fedsec.network.envelope import MalformedEnvelope, field, vector_from
from fedsec.network.errors import PolicyRefused
from fedsec.protocols.errors import ClientAbort
from fedsec.protocols.privacy.client_level import clip_update

TrainInputs = tuple[np.ndarray, np.random.Generator, int | None]
"""A ``train`` job's global model, training generator and noise-stream offset
(:meth:`SiteWork.train_inputs`)."""
_SHA256_HEX = re.compile(r"[0-9a-f]{64}")
EPSILON_TOLERANCE = 1e-6
"""Relative slack when a site checks the plan's epsilon with the coordinator's noise multiplier."""


@dataclass
class Contribution:
    purpose: str
    round: int
    vector: np.ndarray
    weight: int
    kind: str = "update"
    """What produced it: ``update``, ``evaluation``, ``moments-1`` or ``moments-2``."""


def _check_noise(noise_multiplier: Any) -> None:
    """Refuse (``dp.noise``) a noise multiplier that is missing, not a finite positive number, or
    below the Gaussian sampler's floor."""
    if (isinstance(noise_multiplier, bool) or not isinstance(noise_multiplier, int | float)
            or not math.isfinite(noise_multiplier) or noise_multiplier <= 0):
        raise PolicyRefused("dp.noise", "the coordinator sent no valid noise multiplier")
    if noise_multiplier < MIN_NOISE_MULTIPLIER:
        raise PolicyRefused("dp.noise", f"noise multiplier {noise_multiplier:g} is below "
                                        f"{MIN_NOISE_MULTIPLIER:g}, the Gaussian sampler's floor")


class MemoryRecord:
    """The consumed contributions of one process (tests and the in-process harness; a deployed
    site uses :meth:`fedsec.network.site_state.SiteState.record`, on disk)."""

    def __init__(self) -> None:
        self._used: set[tuple[str, int]] = set()

    def used(self, kind: str, round_index: int) -> bool:
        return (kind, round_index) in self._used

    def consume(self, kind: str, round_index: int) -> None:
        if (kind, round_index) in self._used:
            raise PolicyRefused("contribution.used", f"this site's {kind} contribution of round "
                                                     f"{round_index} already went into an aggregation")
        self._used.add((kind, round_index))


class SiteWork:
    """A site's data, model, strategy and privacy for one plan."""

    def __init__(self, config: ExperimentConfig, *, client_id: int, data: ClientData,
                 record: Any = None) -> None:
        self.config, self.client_id = config, client_id
        self.record: Any = MemoryRecord() if record is None else record
        """Where consumed contributions are recorded (``used(kind, round)``, ``consume(kind, round)``)."""
        self.train_data, self.test_data = data.train, data.test
        self.n_classes = len(config.data.classes)
        self.input_shape = (int(data.train.x.shape[1]),)
        self.pending: Contribution | None = None
        self.epsilon: float | None = None
        self.strategy: fl_core.Strategy | None = None
        self.privacy: Any = None
        self.client_noise: ClientNoise | None = None
        """Client-level DP: the noise rule built from the noise multiplier this site checked."""
        self._moment_mean: np.ndarray | None = None
        self.held_model: tuple[str, np.ndarray] | None = None
        """The model of the last ``evaluate`` job completed (the SHA-256 hex of its body, its values): the
        next round's training starts from it, so a ``train`` job may name it instead of sending it
        (:meth:`job_model`). Kept in memory only: a restarted site holds none."""
        torch.set_num_threads(1)
        self.model = fl_core.build_model(config.model.name, input_shape=self.input_shape,
                                         n_classes=self.n_classes, seed=0)
        self.length = sum(p.numel() for p in self.model.parameters())
        self.evaluation_length = sums_length(self.n_classes)
        """The length of an evaluation's sums (what a statistics session set up before them sums)."""

    @classmethod
    def load(cls, config: ExperimentConfig, *, name: str, path: Path, record: Any = None) -> SiteWork:
        """Read and validate the site's file against the plan (raises ``SiteDataError``)."""
        from fedsec.site_data import schema

        index = config.federation.sites.index(name)
        data = load_client_csv(path, schema(config), test_fraction=config.data.test_fraction,
                               seed=config.seed, index=index)
        return cls(config, client_id=index, data=data, record=record)

    def report(self) -> dict[str, Any]:
        """What the site tells the coordinator when it accepts (public under the plan's unit)."""
        return {"n_train": len(self.train_data), "n_test": len(self.test_data),
                "input_shape": list(self.input_shape), "n_classes": self.n_classes}

    def start(self, *, noise_multiplier: Any) -> None:
        """Build the strategy; under DP (DP-SGD or client level) with the coordinator's noise
        multiplier, which must keep this site's own epsilon over the plan's rounds within
        ``dp.target_epsilon`` (client level: the plan's Skellam round of
        :func:`~fedsec.protocols.privacy.client_level.distributed_round_event`, unit ``client``).

        Raises:
            PolicyRefused: ``dp.noise`` (missing, or too small a noise multiplier).
        """
        from fedsec.experiment import build_strategy, local_trainer
        from fedsec.privacy import PrivacySettings, PrivacySetup, build_privacy_layer

        config = self.config
        trainer = local_trainer(config)
        weighting = "samples"
        if config.dp.mode in ("dpsgd", "client"):
            _check_noise(noise_multiplier)
        if config.dp.mode == "dpsgd":
            settings = dataclasses.replace(PrivacySettings.from_config(config),
                                           noise_multiplier=float(noise_multiplier))
            own = fl_core.FederatedDataset(name="site", clients=(self.train_data,), test=self.test_data,
                                           n_classes=self.n_classes, input_shape=self.input_shape,
                                           standardize=False)
            self.privacy = build_privacy_layer(settings, own, fl_core.PlainAggregation(), self.length)
            self._check_epsilon(self.privacy.budget, noise_multiplier)
            trainer, weighting = self.privacy.trainer, self.privacy.weighting
        elif config.dp.mode == "client":
            from fedsec.protocols.privacy import PrivacyBudget
            from fedsec.protocols.privacy.client_level import distributed_round_event

            s, p = config.secure, config.dp
            event = distributed_round_event(float(noise_multiplier), bits=s.bits, length=self.length,
                                            clip_ratio=p.max_grad_norm / s.clip)
            budget = PrivacyBudget(profiles=[[event]], delta=p.delta, target_epsilon=p.target_epsilon,
                                   accountant=p.accountant, unit="client",
                                   noise_multiplier=float(noise_multiplier))
            self._check_epsilon(budget, noise_multiplier)
            self.privacy = PrivacySetup("client", float(noise_multiplier), budget, weighting="equal",
                                        zero_on_failure=True)
            self.client_noise = noise_rule(config, float(noise_multiplier), self.length)
            weighting = "equal"
        strategy = build_strategy(config, trainer, weighting=weighting)
        self.strategy = fl_core.ZeroOnFailure(strategy) if config.dp.mode == "client" else strategy

    def _check_epsilon(self, budget: Any, noise_multiplier: float) -> None:
        """Refuse a noise multiplier that takes this site past the plan's epsilon over its rounds."""
        config = self.config
        target = config.dp.target_epsilon
        if target <= 0:
            return
        probe = type(budget)(profiles=budget.profiles, delta=budget.delta, target_epsilon=0.0,
                             accountant=config.dp.accountant, unit=budget.unit,
                             noise_multiplier=budget.noise_multiplier)
        for r in range(1, config.rounds + 1):
            probe.charge(r)
        if probe.spent > target * (1 + EPSILON_TOLERANCE):
            raise PolicyRefused("dp.noise", f"noise multiplier {noise_multiplier:g} gives this site "
                                            f"epsilon {probe.spent:.4g} over {config.rounds} rounds, "
                                            f"above the plan's {target:g}")

    def train_inputs(self, header: dict[str, Any], body: bytes) -> TrainInputs:
        """What a ``train`` job gives the training, each checked before anything is recorded (the
        caller reads them before ``site.db`` records the round): the global model
        (:meth:`job_model`), the round's training generator (a PCG64 state), and under
        reproducible DP-SGD the seeded noise stream's offset (>= 0; None otherwise).

        Raises:
            MalformedEnvelope: a field missing or malformed (review 10, R10-1: a malformed
                generator state was refused only after the round was recorded).
            ClientAbort: ``model.unknown`` (:meth:`job_model`).
        """
        field(header, "round", int)
        vector = self.job_model(header, body)
        rng = np.random.default_rng()
        state = header.get("rng")
        if not isinstance(state, dict) or state.get("bit_generator") != "PCG64":
            raise MalformedEnvelope("the training generator's state is not a PCG64 state")
        try:
            rng.bit_generator.state = state
        except (TypeError, ValueError, KeyError, OverflowError):
            raise MalformedEnvelope("the training generator's state is malformed") from None
        offset = None
        if self._noise_stream() is not None:
            offset = field(header, "noise", int)
            if offset < 0:
                raise MalformedEnvelope("negative noise-stream offset")
        return vector, rng, offset

    def train(self, header: dict[str, Any], body: bytes, *,
              inputs: TrainInputs | None = None) -> dict[str, Any]:
        """Local training for the job's round; returns what the answer adds (the noise stream's
        position under reproducible DP-SGD). Without DP, ``ClientAbort('nonfinite')`` when the
        local model is not finite (the simulation's failed client) and ``ClientAbort('training')``
        when training raises. Under DP (DP-SGD or client level) a failed training of either kind
        is a zero update with the usual weight, answered like any other: whether it fails is a
        function of the site's records, so the answer may not depend on it (post-processing of
        the mechanism's output; the round is charged as usual). ``inputs``: the job's
        :meth:`train_inputs` if already read."""
        assert self.strategy is not None
        round_index = field(header, "round", int)
        vector, rng, offset = self.train_inputs(header, body) if inputs is None else inputs
        random = self._noise_stream()
        if random is not None and offset is not None:
            random.load_state_dict({"key": random.state_dict()["key"], "offset": offset})
        self.model.train()  # an evaluation job may have come first (a restarted site)
        try:
            local = self.strategy.client_update(self.model, vector, self.train_data, rng=rng)
            vector, weight = local.vector, int(local.weight)
        except (NonFiniteError, UnsupportedModelError, RuntimeError, ArithmeticError) as error:
            if self.privacy is None:  # no DP promise: the simulation's failed client
                raise ClientAbort("nonfinite" if isinstance(error, NonFiniteError) else "training") from None
            # under DP a failed training is a zero update contributed as usual and answered ok:
            # whether training fails depends on the records, so the answer must not say so
            equal = self.privacy.weighting == "equal"
            vector, weight = np.zeros(self.length, dtype=np.float32), 1 if equal else len(self.train_data)
        if self.client_noise is not None:  # client level: clipped to S, weight 1 (the simulation's)
            vector, weight = clip_update(vector, self.config.dp.max_grad_norm), 1
        self.pending = Contribution("update", round_index, vector, weight)
        extra: dict[str, Any] = {}
        if self.privacy is not None:
            self.privacy.budget.charge(round_index)
            self.epsilon = float(self.privacy.budget.spent)
        if random is not None:
            extra["noise"] = int(random.state_dict()["offset"])
        return extra

    def job_model(self, header: dict[str, Any], body: bytes) -> np.ndarray:
        """The global model a ``train`` job starts from: its body's values, or, when the header
        names a model (``"model"``: the SHA-256 hex of the body it stands for, and the body is
        empty), a copy of :attr:`held_model` if that is the model named.

        Raises:
            MalformedEnvelope: a named model with a body, or a name that is not 64 hex digits;
                a body of the wrong length or with values that are not finite.
            ClientAbort: ``model.unknown``, the named model is not the one this site holds (it
                restarted since, or missed the evaluation): the site sits the round out and the
                coordinator sends the whole model next time.
        """
        named = header.get("model")
        if named is None:
            return vector_from(body, self.length)
        if not isinstance(named, str) or not _SHA256_HEX.fullmatch(named) or body:
            raise MalformedEnvelope("a train job names its model by a SHA-256 hex digest and sends no body")
        if self.held_model is None or self.held_model[0] != named:
            raise ClientAbort("model.unknown")
        return self.held_model[1].copy()

    def _noise_stream(self) -> Any:
        """The seeded DP-SGD noise stream under ``dp.reproducible`` (its position travels with the
        job, as the simulation's single stream passes from client to client); None otherwise."""
        if self.privacy is None or not self.config.dp.reproducible or self.privacy.trainer is None:
            return None
        return self.privacy.trainer.optimizer.random

    def evaluate(self, header: dict[str, Any], body: bytes) -> None:
        """The held-out sums of the job's model for a round of the plan (1..``rounds``), once.

        Raises:
            PolicyRefused: ``evaluation.round`` (outside the plan's rounds) or
                ``contribution.used`` (this round's evaluation already went into an aggregation).
        """
        round_index = field(header, "round", int)
        if not 1 <= round_index <= self.config.rounds:
            raise PolicyRefused("evaluation.round", f"round {round_index} is outside the plan's "
                                                    f"1..{self.config.rounds}")
        self._unused("evaluation", round_index)
        vector = vector_from(body, self.length)
        set_vector(self.model, vector)
        sums = local_evaluation(self.model, self.test_data, n_classes=self.n_classes)
        self.pending = Contribution("statistics", round_index, sums, 1, kind="evaluation")
        self.held_model = (hashlib.sha256(body).hexdigest(), vector)

    def moments(self, header: dict[str, Any], body: bytes) -> None:
        stage = field(header, "stage", int)
        if stage in (1, 2):
            self._unused(f"moments-{stage}", 0)
        flat = self.train_data.x.reshape(len(self.train_data), -1).astype(np.float64)
        if stage == 1:
            vector = flat.mean(axis=0)
        elif stage == 2:
            mean = np.frombuffer(body, dtype="<f8")
            if mean.shape != (flat.shape[1],) or not np.isfinite(mean).all():
                raise MalformedEnvelope("the federation's mean has the wrong size or is not finite")
            vector = ((flat - mean) ** 2).mean(axis=0)
        else:
            raise MalformedEnvelope("moments stage must be 1 or 2")
        self.pending = Contribution("statistics", 0, vector.astype(np.float32), len(self.train_data),
                                    kind=f"moments-{stage}")

    def standardize(self, header: dict[str, Any], body: bytes) -> None:
        d = self.input_shape[0]
        values = np.frombuffer(body, dtype="<f8")
        if values.shape != (2 * d,) or not np.isfinite(values).all() or (values[d:] <= 0).any():
            raise MalformedEnvelope("standardisation needs d finite means and d positive spreads")
        mean, std = values[:d], values[d:]

        def scale(part: fl_core.ArrayDataset) -> fl_core.ArrayDataset:
            return fl_core.ArrayDataset(((part.x - mean) / std).astype(np.float32), part.y)

        self.train_data, self.test_data = scale(self.train_data), scale(self.test_data)

    def _unused(self, kind: str, round_index: int) -> None:
        if self.record.used(kind, round_index):
            raise PolicyRefused("contribution.used", f"this site's {kind} contribution of round "
                                                     f"{round_index} already went into an aggregation")

    def contribution(self, purpose: Any, round_index: Any, *, kind: str | None = None,
                     length: int | None = None) -> tuple[np.ndarray, int]:
        """Consume the pending contribution for (``purpose``, ``round_index``): it is recorded as
        used and is no longer pending, so no later setup (whatever its session id or sequence
        number) gets it. ClientAbort when none is pending for that purpose and round, or when
        the record says it was already used (a restarted site handed the same job again).

        ``kind`` and ``length`` (a layer set up before its input, which takes it late) must match
        the pending contribution's, or it is refused *without* being consumed (review 8: a late
        statistics layer given the feature moments, of another length, used them up and then
        refused them)."""
        p = self.pending
        if p is None or p.purpose != purpose or p.round != round_index:
            raise ClientAbort("the aggregation's setup names no pending contribution of this site")
        if (kind is not None and p.kind != kind) or (length is not None and p.vector.size != length):
            raise ClientAbort("the pending contribution is not the input this aggregation takes")
        self.pending = None
        try:
            self.record.consume(p.kind, p.round)
        except PolicyRefused:
            raise ClientAbort("this contribution already went into an aggregation") from None
        return p.vector, p.weight
