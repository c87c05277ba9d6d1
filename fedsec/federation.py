"""``fedsec.Federation``: federated training of the user's own torch model on the user's own data,
through the same server loop, protocols and privacy layers as ``fedsec run``.

    result = Federation(model=net, clients=[(x0, y0), (x1, y1), (x2, y2)], test=(xt, yt),
                        secure="masking", dp=DP(target_epsilon=3.0, delta=1e-5)).run()
    result.history[-1]["accuracy"], result.epsilon, result.model

Everything is checked when the federation is built, before any training: hyper-parameters by
name, every client's data by client and row (see :mod:`fedsec.client_data`), the model against
the data, the loss on a few samples, and the combination of secure layer, DP and optimiser.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from fedsec import fl_core
from fedsec.client_data import model_classes, to_dataset
from fedsec.dp.errors import BudgetExhaustedError
from fedsec.dp_spec import DP
from fedsec.experiment import make_protocol
from fedsec.fl_core.buffers import BUFFER_POLICIES, federate_buffers, restore_buffers
from fedsec.fl_core.data import stratified_split
from fedsec.fl_core.history import HistoryRecorder, RoundObserver, RoundRecord
from fedsec.fl_core.local import TorchTrainer, default_loss
from fedsec.fl_core.metrics import Evaluator, MetricFn
from fedsec.fl_core.server_optimizers import SERVER_OPTIMIZERS, make_server_optimizer
from fedsec.privacy import CLIENT_DATA_TEST, PrivacySettings, PrivacySetup, build_privacy_layer

SECURE_LAYERS = ("masking", "paillier")
ALGORITHMS = ("fedavg", "fedprox")
WEIGHTINGS = ("samples", "uniform")
SECURE_OPTIONS = ("clip", "bits", "graph", "threshold", "dropout", "active", "corrupt", "key_bits",
                  "custody")
Callback = Callable[[dict[str, Any]], Any]
"""Called with each round's history row; a truthy return stops the run before the next round."""


@dataclass
class FederationResult:
    """What :meth:`Federation.run` returns.

    Attributes:
        history: one dict per round run: ``round``, ``accuracy``, ``loss`` (test), ``epsilon`` and
            ``delta`` (None without DP), ``train_loss``, ``participants``, ``dropped``,
            ``status`` (``ok`` or ``aborted: ...``), then the metrics (``auroc``,
            ``sensitivity``, ``specificity`` for binary tasks, per-client accuracies, the user's
            own, and the protocol's and the budget's numbers).
        model: the final global model (a copy of the one given; buffers federated back in place).
        epsilon: the privacy spent (None without DP), at ``delta``.
        delta: the delta of ``epsilon`` (None without DP).
        stop_reason: ``rounds``, ``target_accuracy``, ``privacy_budget``, ``aborts``, ``callback``.
        noise_multiplier: the noise used (calibrated or given); None without DP.
        not_covered: releases epsilon does not account for (e.g. standardisation statistics).
        feature_mean, feature_std: with ``standardize=True``, the federated statistics the model's
            inputs must be scaled with: ``(x - feature_mean) / feature_std``, flattened per sample.
    """

    history: list[dict[str, Any]]
    model: nn.Module
    epsilon: float | None
    delta: float | None
    stop_reason: str
    noise_multiplier: float | None = None
    not_covered: list[str] = field(default_factory=list)
    feature_mean: np.ndarray | None = None
    feature_std: np.ndarray | None = None


def history_row(record: RoundRecord) -> dict[str, Any]:
    """A round record as the history dict of :class:`FederationResult`."""
    row: dict[str, Any] = {
        "round": record.round, "accuracy": record.accuracy, "loss": record.loss,
        "epsilon": record.metrics.get("epsilon"), "delta": record.metrics.get("delta"),
        "train_loss": record.train_loss, "participants": record.participants,
        "dropped": record.dropped, "status": record.status,
    }
    row.update({k: v for k, v in record.metrics.items() if k not in row})
    return row


class _Callbacks(RoundObserver):
    def __init__(self, callbacks: Sequence[Callback]) -> None:
        self.callbacks, self.stop = list(callbacks), False

    def after_round(self, record: RoundRecord) -> None:
        row = history_row(record)
        for fn in self.callbacks:
            if fn(dict(row)):
                self.stop = True

    def before_round(self, round_index: int) -> str | None:
        return "callback" if self.stop else None


def _per_example(loss: Any) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    if loss is None:
        return default_loss
    if isinstance(loss, nn.modules.loss._Loss):
        clone = copy.copy(loss)
        clone.reduction = "none"
        return clone
    if callable(loss):
        return loss
    raise ValueError(f"loss must be None (by task), a torch loss module or a callable "
                     f"fn(outputs, targets) -> per-example losses; got {type(loss).__name__}")


def _check_int(name: str, value: Any, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    return int(value)


def _check_float(name: str, value: Any, low: float, high: float = math.inf, *,
                 open_low: bool = True, open_high: bool = False) -> float:
    ok = (isinstance(value, (int, float, np.floating, np.integer)) and not isinstance(value, bool)
          and math.isfinite(value) and (value > low if open_low else value >= low)
          and (value < high if open_high else value <= high))
    if not ok:
        left, right = "(" if open_low else "[", ")" if open_high or high == math.inf else "]"
        raise ValueError(f"{name} must be a number in {left}{low:g}, {high:g}{right}, got {value!r}")
    return float(value)


class Federation:
    """Federated training of your own model on your clients' data, with the secure layer and DP.

    Args:
        model: your ``torch.nn.Module`` mapping a float32 batch to logits ``[batch, units]``
            (1 unit = binary logistic, k >= 2 units = k classes). Its weights are the initial
            global model; it is copied, never trained in place.
        clients: a list with one entry per client: ``(x, y)`` numpy arrays or torch tensors, a
            torch ``Dataset`` of ``(x_i, y_i)``, or a pandas DataFrame (with ``label``, or as a
            ``(frame, "label")`` pair). Labels are class indices in [0, classes).
        test: a global test set (any one of those forms), a list with one test set per client, or
            None: each client's data is split, stratified, ``test_fraction`` for testing.
        secure: ``"masking"`` (pairwise masks; needs >= 3 clients a round), ``"paillier"``,
            None (the server sees each update), or an ``fl_core.AggregationProtocol`` instance.
        dp: a :class:`fedsec.DP`, or None.
        rounds: >= 1. local_epochs: E >= 1. batch_size: B >= 1, or 0/None for the full batch.
        lr: local learning rate > 0. optimizer: ``sgd`` or ``adam``. momentum: SGD momentum in
            [0, 1). weight_decay: >= 0. (With DP-SGD: plain SGD only.)
        algorithm: ``fedavg`` or ``fedprox`` (with ``prox_mu`` > 0).
        server_optimizer: ``sgd``, ``momentum``, ``adam`` (FedAdam) or ``yogi`` (FedYogi), acting
            on the released average. server_lr: > 0, None = the optimizer's default (1 for sgd and
            momentum, 0.01 for adam and yogi). server_momentum: in [0, 1).
        loss: None (by task: logistic for 1 unit, cross-entropy otherwise), a torch loss module
            (its reduction is set to "none"), or ``fn(outputs, targets) -> per-example losses``.
        metrics: extra metrics ``{name: fn(y_true, y_score) -> float}``.
        weighting: ``samples`` (FedAvg's n_k) or ``uniform`` (every client alike).
        fraction: share of clients sampled each round, in (0, 1].
        standardize: scale features with federation-wide mean and spread (computed through the
            secure layer; not covered by DP, said in ``not_covered``). Default False.
        buffers: ``federate`` (float buffers such as BatchNorm statistics are averaged like
            weights) or ``refuse`` (a model with buffers is an error).
        label: the label column of DataFrame clients. test_fraction: in (0, 1), for test=None.
        secure_options: extra settings of the secure layer: clip, bits, graph, threshold,
            dropout, active, corrupt, key_bits, custody (as the ``secure.*`` config keys).
        target_accuracy: stop once reached; None = never.
        seed: the experiment seed (sampling, shuffles, splits; DP noise only if reproducible).
        progress: show a progress bar on stderr. callbacks: functions of each round's row.
    """

    def __init__(
        self, *, model: nn.Module, clients: Sequence[Any], test: Any = None,
        secure: str | fl_core.AggregationProtocol | None = "masking", dp: DP | None = None,
        rounds: int = 10, local_epochs: int = 1, batch_size: int | None = 32, lr: float = 0.1,
        optimizer: str = "sgd", momentum: float = 0.0, weight_decay: float = 0.0,
        algorithm: str = "fedavg", prox_mu: float = 0.0, server_optimizer: str = "sgd",
        server_lr: float | None = None, server_momentum: float = 0.9, loss: Any = None,
        metrics: Mapping[str, MetricFn] | None = None, weighting: str = "samples",
        fraction: float = 1.0, standardize: bool = False, buffers: str = "federate",
        label: str | None = None, test_fraction: float = 0.2,
        secure_options: Mapping[str, Any] | None = None, target_accuracy: float | None = None,
        seed: int = 0, progress: bool = False, callbacks: Sequence[Callback] = (),
    ) -> None:
        if not isinstance(model, nn.Module):
            raise ValueError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        self.rounds = _check_int("rounds", rounds, 1)
        self.seed = _check_int("seed", seed, 0)
        if self.seed >= 2**63:
            raise ValueError(f"seed must be < 2**63, got {seed}")
        self.fraction = _check_float("fraction", fraction, 0.0, 1.0)
        self.test_fraction = _check_float("test_fraction", test_fraction, 0.0, 1.0, open_high=True)
        self.target_accuracy = (None if target_accuracy is None else
                                _check_float("target_accuracy", target_accuracy, 0.0, 1.0,
                                             open_low=False))
        self.batch_size = 0 if batch_size is None else _check_int("batch_size", batch_size, 0)
        if algorithm not in ALGORITHMS:
            raise ValueError(f"algorithm must be one of {ALGORITHMS}, got {algorithm!r}")
        if algorithm == "fedprox" and not prox_mu > 0:
            raise ValueError(f"prox_mu must be > 0 with algorithm='fedprox', got {prox_mu!r}")
        if algorithm == "fedavg" and prox_mu:
            raise ValueError("prox_mu needs algorithm='fedprox'")
        if weighting not in WEIGHTINGS:
            raise ValueError(f"weighting must be one of {WEIGHTINGS}, got {weighting!r}")
        if buffers not in BUFFER_POLICIES:
            raise ValueError(f"buffers must be one of {BUFFER_POLICIES}, got {buffers!r}")
        if server_optimizer not in SERVER_OPTIMIZERS:
            raise ValueError(f"server_optimizer must be one of {SERVER_OPTIMIZERS}, "
                             f"got {server_optimizer!r}")
        if dp is not None and not isinstance(dp, DP):
            raise ValueError(f"dp must be a fedsec.DP or None, got {type(dp).__name__}")
        if not isinstance(standardize, bool) or not isinstance(progress, bool):
            raise ValueError("standardize and progress must be True or False")
        if dp is not None and standardize and weighting == "uniform":
            raise ValueError("standardize: the statistics pass sends each client's size n_k as its "
                             "weight, which equal weighting under DP is meant to hide; use "
                             "standardize=False")
        self.algorithm, self.weighting, self.buffers, self.dp = algorithm, weighting, buffers, dp
        self.standardize, self.progress = standardize, progress
        self.callbacks = list(callbacks)
        if not all(callable(c) for c in self.callbacks):
            raise ValueError("callbacks must be callables fn(row) -> stop?")
        self.loss = _per_example(loss)
        self.trainer = TorchTrainer(epochs=_check_int("local_epochs", local_epochs, 1),
                                    batch_size=self.batch_size, lr=lr, optimizer=optimizer,
                                    momentum=momentum, weight_decay=weight_decay, prox_mu=prox_mu,
                                    loss=self.loss)
        self.server_optimizer = make_server_optimizer(server_optimizer, lr=server_lr,
                                                      momentum=server_momentum)
        self.server_optimizer_name = server_optimizer
        self.evaluator_metrics = dict(metrics or {})
        self.model = model
        try:
            federate_buffers(copy.deepcopy(model), policy=buffers)
        except ValueError as error:
            raise ValueError(f"buffers: {error}") from None
        self.client_test = test is None or isinstance(test, list)
        self.test_is_client_data = not self.client_test and _shares_client_data(test, clients)
        self._ran = False
        self._load_data(clients, test, label)
        self.evaluator = Evaluator(loss=self.loss, metrics=self.evaluator_metrics,
                                   groups=self.test_groups)
        self._check_loss()
        self.secure, self.secure_options = self._check_secure(secure, dict(secure_options or {}))
        self._check_privacy()

    def _load_data(self, clients: Sequence[Any], test: Any, label: str | None) -> None:
        if not isinstance(clients, Sequence) or isinstance(clients, (str, bytes)) or not clients:
            raise ValueError("clients must be a non-empty list with one entry per client")
        if isinstance(clients, tuple) and len(clients) == 2 and not isinstance(clients[0], tuple):
            raise ValueError("clients must be a list with one entry per client, e.g. "
                             "[(x0, y0), (x1, y1)]; got one (x, y) pair")
        first = to_dataset(clients[0], "client 0", n_classes=2**62, sample_shape=None, label=label)
        self.n_classes = model_classes(self.model, first.x, "client 0")
        shape = tuple(first.x.shape[1:])
        train = [to_dataset(c, f"client {k}", n_classes=self.n_classes, sample_shape=shape,
                            label=label) for k, c in enumerate(clients)]
        groups: np.ndarray | None = None
        if test is None:
            rng = np.random.default_rng([self.seed, 1])
            parts, tests = [], []
            for k, data in enumerate(train):
                fit, held = stratified_split(data.y, test_fraction=self.test_fraction, rng=rng)
                if fit.size == 0 or held.size == 0:
                    raise ValueError(f"client {k}: {len(data)} samples cannot be split into "
                                     f"training and test data (test_fraction "
                                     f"{self.test_fraction}); pass test=")
                parts.append(data.subset(fit))
                tests.append(data.subset(held))
            train, test_sets = parts, tests
        elif isinstance(test, list):
            if len(test) != len(train):
                raise ValueError(f"test: a list must hold one test set per client ({len(train)}), "
                                 f"got {len(test)}; pass a tuple (x, y) for one global test set")
            test_sets = [to_dataset(t, f"test of client {k}", n_classes=self.n_classes,
                                    sample_shape=shape, label=label) for k, t in enumerate(test)]
        else:
            test_sets = [to_dataset(test, "test", n_classes=self.n_classes, sample_shape=shape,
                                    label=label)]
        if len(test_sets) > 1:
            groups = np.concatenate([np.full(len(t), k) for k, t in enumerate(test_sets)])
        pooled = fl_core.ArrayDataset(np.concatenate([t.x for t in test_sets]),
                                      np.concatenate([t.y for t in test_sets]))
        self.data = fl_core.FederatedDataset(
            name="user", clients=tuple(train), test=pooled, n_classes=self.n_classes,
            input_shape=shape, standardize=self.standardize)
        self.test_groups = groups

    def _check_loss(self) -> None:
        sample = self.data.clients[0]
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad():
                losses = self.loss(self.model(torch.from_numpy(sample.x[:2])),
                                   torch.from_numpy(sample.y[:2]))
        except Exception as error:  # the user's loss raises whatever torch raises
            raise ValueError(f"loss: fails on client 0's first samples "
                             f"({type(error).__name__}: {error})") from None
        finally:
            self.model.train(was_training)
        n = min(2, len(sample))
        if not isinstance(losses, torch.Tensor) or tuple(losses.shape) != (n,):
            shape = list(losses.shape) if isinstance(losses, torch.Tensor) else type(losses).__name__
            raise ValueError(f"loss: must return one loss per example (shape [{n}]), got {shape}; "
                             "use reduction='none'")

    def _check_secure(self, secure: Any, options: dict[str, Any]
                      ) -> tuple[str | fl_core.AggregationProtocol, dict[str, Any]]:
        unknown = sorted(set(options) - set(SECURE_OPTIONS))
        if unknown:
            raise ValueError(f"secure_options: unknown keys {unknown} (known: {SECURE_OPTIONS})")
        if isinstance(secure, fl_core.AggregationProtocol):
            if options:
                raise ValueError("secure_options apply to secure='masking' or 'paillier', not to "
                                 "a protocol instance")
            return secure, options
        if secure in (None, "none"):
            if options:
                raise ValueError("secure_options need secure='masking' or 'paillier'")
            return "none", options
        if secure not in SECURE_LAYERS:
            raise ValueError(f"secure must be one of {SECURE_LAYERS}, None, or an "
                             f"AggregationProtocol; got {secure!r}")
        m = fl_core.clients_per_round(self.fraction, self.data.n_clients)
        if secure == "masking" and m < 3:
            raise ValueError(f"secure: masking needs >= 3 clients a round (it takes a threshold of "
                             f"at least 2 survivors besides each client); {self.data.n_clients} "
                             f"clients x fraction {self.fraction} gives {m}: use secure='paillier'")
        if secure == "paillier" and m < 2:
            raise ValueError(f"secure: paillier needs >= 2 clients a round; got {m}")
        if self.dp is not None and self.dp.mode == "client":
            options.setdefault("clip", max(1.0, self.dp.max_grad_norm))
        try:
            if secure == "masking":
                self._protocol(secure, options, np.random.default_rng(0))
            else:  # building a Paillier layer generates its key: check the settings alone
                self._check_paillier(options, m)
        except (ValueError, TypeError) as error:
            raise ValueError(f"secure_options: {error}") from None
        return secure, options

    @staticmethod
    def _check_paillier(options: dict[str, Any], m: int) -> None:
        from fedsec.protocols.encoding import check_layer_arguments
        from fedsec.protocols.paillier.aggregation import CUSTODIES

        masking_only = sorted(set(options) & {"graph", "active", "corrupt", "workers"})
        if masking_only:
            raise ValueError(f"{masking_only} apply to secure='masking'")
        check_layer_arguments(max_weight=1, clip=options.get("clip", 1.0),
                              bits=options.get("bits", 16), dropout=options.get("dropout", 0.0))
        if options.get("key_bits", 2048) not in (2048, 3072):
            raise ValueError(f"key_bits must be 2048 or 3072, got {options['key_bits']!r}")
        if options.get("custody", "key_holder") not in CUSTODIES:
            raise ValueError(f"custody must be one of {CUSTODIES}, got {options['custody']!r}")
        threshold = options.get("threshold", 0)
        if threshold and not 2 <= threshold <= m:
            raise ValueError(f"threshold must be 0 (the default rule) or in [2, {m}] (clients a "
                             f"round), got {threshold!r}")

    def _protocol(self, secure: Any, options: dict[str, Any], rng: np.random.Generator
                  ) -> fl_core.AggregationProtocol:
        if isinstance(secure, fl_core.AggregationProtocol):
            return secure
        max_weight = 1 if self.weighting == "uniform" else max(len(c) for c in self.data.clients)
        reproducible = self.dp is not None and self.dp.reproducible
        return make_protocol(secure, max_weight=max_weight, n_clients=self.data.n_clients,
                             fraction=self.fraction, rng=rng, reproducible=reproducible, **options)

    def _check_privacy(self) -> None:
        dp = self.dp
        if dp is None:
            return
        if dp.mode == "dpsgd":
            from fedsec.dp.per_sample import check_model

            t = self.trainer
            if t.optimizer != "sgd" or t.momentum or t.weight_decay or t.prox_mu:
                raise ValueError("dp: DP-SGD runs plain SGD locally: optimizer='sgd' with no "
                                 "momentum, weight_decay or prox_mu (server optimizers are fine)")
            try:
                check_model(self.model)
            except ValueError as error:
                raise ValueError(f"dp: {error}") from None
            self._refuse_buffers()
            self._probe_examples(dp.max_grad_norm)
        else:
            if self.fraction < 1.0:
                raise ValueError("fraction: client-level DP is accounted with every client in "
                                 "every round: needs fraction = 1")
            clip = self.secure_options.get("clip")
            if clip is not None and clip < dp.max_grad_norm:
                raise ValueError(f"secure_options: clip must be >= dp.max_grad_norm = "
                                 f"{dp.max_grad_norm} (the coordinate range must hold a clipped "
                                 f"update); got {clip}")

    def _refuse_buffers(self) -> None:
        """DP-SGD noises the trainable parameters only: a float buffer, a frozen float parameter or
        an ``nn.Embedding(max_norm=...)`` (rows renormalised in place) would be released raw."""
        from fedsec.dp.per_sample import check_released_raw

        try:
            check_released_raw(self.model)
        except ValueError as error:
            raise ValueError(f"model: {error}") from None
        for name, module in self.model.named_modules():
            own = [b for b, value in module._buffers.items()
                   if value is not None and value.is_floating_point()]
            if own:
                raise ValueError(
                    f"buffers: module {name or type(module).__name__!r} "
                    f"({type(module).__name__}) holds float buffers {own}; DP-SGD noises only "
                    "trainable parameters, so federated buffers would be released without noise: "
                    "use a model without them (GroupNorm or LayerNorm, track_running_stats=False) "
                    "or client-level DP, whose noise covers the whole update")

    def _probe_examples(self, max_grad_norm: float) -> None:
        """Run DP-SGD's per-example probe (independence, exact gradients) once, on a copy of the
        model and the clients' first examples, so a model or loss that mixes the batch is refused
        here rather than in round 1."""
        from fedsec.dp.per_sample import PROBE_SIZE, PerExampleClipper, spread_indices

        rng = np.random.default_rng([self.seed, 2])
        picks = [spread_indices(len(c.y), rng) for c in self.data.clients]
        xs = np.concatenate([c.x[i] for c, i in zip(self.data.clients, picks)])[:2 * PROBE_SIZE]
        ys = np.concatenate([c.y[i] for c, i in zip(self.data.clients, picks)])[:2 * PROBE_SIZE]
        if len(xs) < 2:
            return
        try:
            PerExampleClipper(copy.deepcopy(self.model), max_grad_norm=max_grad_norm).probe(
                torch.from_numpy(xs), torch.from_numpy(ys), self.loss)
        except ValueError as error:
            raise ValueError(f"loss: {error}") from None

    def _settings(self) -> PrivacySettings:
        dp = self.dp
        assert dp is not None
        return PrivacySettings(
            mode=dp.mode, noise_multiplier=dp.noise_multiplier or 0.0,
            max_grad_norm=dp.max_grad_norm, target_epsilon=dp.target_epsilon or 0.0,
            delta=dp.delta, accountant=dp.accountant, reproducible=dp.reproducible,
            seed=self.seed, rounds=self.rounds, batch_size=self.batch_size,
            local_epochs=self.trainer.epochs, lr=self.trainer.lr)

    def run(self) -> FederationResult:
        """Train for ``rounds`` rounds (or until a stop condition) and return the result."""
        if self.dp is not None and self._ran:
            raise BudgetExhaustedError(
                "run: this Federation already released a model of these clients' records under "
                "its privacy budget; one budget per Federation: build a new Federation and account "
                "for both runs yourself (their epsilons compose)")
        self._ran = self.dp is not None
        rng = np.random.default_rng(self.seed)
        model = copy.deepcopy(self.model)
        federate_buffers(model, policy=self.buffers)
        protocol = self._protocol(self.secure, self.secure_options, rng)
        n_parameters = sum(p.numel() for p in model.parameters())
        privacy: PrivacySetup | None = None
        trainer: fl_core.LocalTrainer = self.trainer
        if self.dp is not None:
            privacy = build_privacy_layer(self._settings(), self.data, protocol, n_parameters,
                                          loss=self.loss, standardize_off="standardize=False",
                                          secure=hasattr(protocol, "min_contributions"),
                                          client_test=self.client_test)
            assert privacy is not None
            if self.test_is_client_data:
                privacy.not_covered.append(CLIENT_DATA_TEST)
            trainer = privacy.trainer or trainer
            protocol = privacy.protocol or protocol
        optimizer = make_server_optimizer(self.server_optimizer_name,
                                          lr=getattr(self.server_optimizer, "lr", None),
                                          momentum=getattr(self.server_optimizer, "momentum", 0.9))
        cls = fl_core.FedProx if self.algorithm == "fedprox" else fl_core.FedAvg
        equal = self.weighting == "uniform" or (privacy is not None and privacy.weighting == "equal")
        strategy: fl_core.Strategy = cls(trainer=trainer, server_optimizer=optimizer,
                                         weighting="equal" if equal else "samples")
        if privacy is not None and privacy.zero_on_failure:
            strategy = fl_core.ZeroOnFailure(strategy)
        history = HistoryRecorder()
        observers: list[RoundObserver] = [history]
        if privacy is not None:
            observers.append(privacy.budget)
        if self.progress:
            from fedsec.progress import ProgressBar

            observers.append(ProgressBar(target_accuracy=self.target_accuracy))
        if self.callbacks:
            observers.append(_Callbacks(self.callbacks))
        server = fl_core.FederatedServer(
            model=model, data=self.data, strategy=strategy, protocol=protocol, rounds=self.rounds,
            fraction=self.fraction, rng=rng, target_accuracy=self.target_accuracy,
            observers=observers, evaluator=self.evaluator)
        result = server.run()
        restore_buffers(model)
        info = server.data.info
        return FederationResult(
            history=[history_row(r) for r in history.records], model=model,
            epsilon=privacy.budget.spent if privacy is not None else None,
            delta=self.dp.delta if self.dp is not None else None,
            stop_reason=result.stop_reason,
            noise_multiplier=privacy.noise_multiplier if privacy is not None else None,
            not_covered=list(privacy.not_covered) if privacy is not None else [],
            feature_mean=info.get("feature_mean"), feature_std=info.get("feature_std"))


def _arrays(value: Any) -> list[np.ndarray]:
    """The numpy arrays (or tensors' arrays) directly inside ``value`` or a tuple/list of it."""
    items = value if isinstance(value, (tuple, list)) else [value]
    out = []
    for item in items:
        if isinstance(item, torch.Tensor):
            item = item.detach().cpu().numpy() if item.device.type == "cpu" else None
        if isinstance(item, np.ndarray):
            out.append(item)
    return out


def _shares_client_data(test: Any, clients: Sequence[Any]) -> bool:
    """Whether ``test`` is one of ``clients`` or one of its arrays shares memory with a client's."""
    if any(test is c for c in clients):
        return True
    mine = _arrays(test)
    return any(np.shares_memory(a, b) for c in clients for a in mine for b in _arrays(c))
