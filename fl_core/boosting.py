"""Federated component-wise (model-based) boosting through the aggregation seam.

Component-wise L2/likelihood boosting (Buehlmann & Hothorn 2007, mboost): start from an offset,
then every iteration

1. each client computes the pseudo-residuals u = -dL/df of the current additive model f on its
   own samples (the model is public: the server broadcasts it);
2. for every base learner j the federation sums B_j'u (B_j'B_j is summed once at set-up: it
   depends on the data only);
3. the server fits every learner, beta_j = (B_j'B_j + lambda_j P_j)^+ B_j'u, and selects the one
   with the smallest residual sum of squares ||u - B_j beta_j||^2 = u'u - 2 beta_j'B_j'u +
   beta_j'B_j'B_j beta_j (u'u is the same for all learners, so only sums are needed);
4. f <- f + nu B_j* beta_j*.

Every sum goes through :class:`AggregationProtocol` with ``purpose="statistics"``: each client
sends its own sums over its samples with weight 1, so the protocol's sum is the pooled sum (sums
rather than per-sample averages with weight n_k: a fixed-point encoder's absolute step then costs
a relative error n_k times smaller). A client's sums must lie in the statistics range of the
secure layer (|value| < 2^24 for fedsec's encoders); otherwise the fit stops with an
AggregationError, nothing is clipped silently. With plain
aggregation the fit equals centralised component-wise boosting on the pooled data up to float
rounding; with a secure layer, up to its fixed-point quantisation. No privacy knowledge lives here.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
from fedsec.fl_core.aggregation import AggregateResult, AggregationProtocol, ClientUpdate
from fedsec.fl_core.boosting_checks import INCONSISTENT, check_iteration, check_setup
from fedsec.fl_core.boosting_learners import BaseLearner, LinearLearner, PSplineLearner, lambda_for_df
from fedsec.fl_core.data import ArrayDataset
from fedsec.fl_core.errors import AggregationError, InvalidParameterError

FAMILIES = ("binomial", "gaussian")
LEARNER_SETS = ("linear", "spline", "both")
ATTEMPTS = 3
"""A sum that misses a client (dropout, rejection) or aborts is retried up to this many times."""


class Gaussian:
    """Squared error L = (y - f)^2 / 2: offset mean(y), pseudo-residuals y - f."""

    name = "gaussian"

    @staticmethod
    def offset(mean_y: float) -> float:
        return float(mean_y)

    @staticmethod
    def negative_gradient(y: np.ndarray, f: np.ndarray) -> np.ndarray:
        return y - f

    @staticmethod
    def loss(y: np.ndarray, f: np.ndarray) -> np.ndarray:
        return 0.5 * (y - f) ** 2

    @staticmethod
    def probability(f: np.ndarray) -> np.ndarray:
        return np.clip(f, 0.0, 1.0)


class Binomial:
    """Logistic loss for y in {0, 1} with f the log-odds: offset logit(mean y), pseudo-residuals
    y - sigmoid(f)."""

    name = "binomial"

    @staticmethod
    def offset(mean_y: float) -> float:
        p = min(max(float(mean_y), 1e-12), 1 - 1e-12)
        return float(np.log(p / (1 - p)))

    @staticmethod
    def negative_gradient(y: np.ndarray, f: np.ndarray) -> np.ndarray:
        return y - Binomial.probability(f)

    @staticmethod
    def loss(y: np.ndarray, f: np.ndarray) -> np.ndarray:
        return np.logaddexp(0.0, f) - y * f

    @staticmethod
    def probability(f: np.ndarray) -> np.ndarray:
        return 0.5 * (1.0 + np.tanh(0.5 * f))


def family_named(name: str) -> type[Gaussian] | type[Binomial]:
    return Gaussian if name == "gaussian" else Binomial


@dataclass(frozen=True)
class BoostingSpec:
    """The public description of the boosting model; every party builds the same learners.

    Args:
        family: ``binomial`` (logistic, labels 0/1) or ``gaussian`` (squared error).
        learners: ``linear``, ``spline`` or ``both`` base learners per feature.
        nu: step length in (0, 1].
        df: degrees of freedom of each P-spline learner, > difference (the null space).
        inner_knots: inner knots of each P-spline, >= 1.
        degree: B-spline degree, in [1, 5].
        difference: order of the difference penalty, in [1, 3], < inner_knots + degree + 1.
        spline_range: the public knot range [-r, r] of the standardised features, r > 0.
    """

    family: str = "binomial"
    learners: str = "both"
    nu: float = 0.1
    df: float = 4.0
    inner_knots: int = 20
    degree: int = 3
    difference: int = 2
    spline_range: float = 3.0

    def __post_init__(self) -> None:
        checks = (
            ("family", self.family in FAMILIES, f"one of {', '.join(FAMILIES)}"),
            ("learners", self.learners in LEARNER_SETS, f"one of {', '.join(LEARNER_SETS)}"),
            ("nu", 0 < self.nu <= 1, "in (0, 1]"),
            ("inner_knots", 1 <= self.inner_knots <= 200, "an integer in [1, 200]"),
            ("degree", 1 <= self.degree <= 5, "an integer in [1, 5]"),
            ("difference", 1 <= self.difference <= 3, "an integer in [1, 3]"),
            ("df", self.difference < self.df <= self.inner_knots + self.degree + 1,
             "in (difference, inner_knots + degree + 1]"),
            ("spline_range", 0 < self.spline_range < 1e6, "in (0, 1e6)"),
        )
        for key, ok, allowed in checks:
            if not ok:
                raise InvalidParameterError(f"{key} must be {allowed}, got {getattr(self, key)!r}")

    def base_learners(self, n_features: int) -> tuple[BaseLearner, ...]:
        """Linear learners of every feature, then P-spline learners, as ``learners`` asks."""
        linear = [LinearLearner(j) for j in range(n_features)] if self.learners != "spline" else []
        splines = [PSplineLearner(j, self.inner_knots, self.degree, self.difference, self.df,
                                  self.spline_range)
                   for j in range(n_features)] if self.learners != "linear" else []
        return (*linear, *splines)


def _triangle(size: int) -> tuple[np.ndarray, np.ndarray]:
    return np.triu_indices(size)


class BoostingClient:
    """A client's side: its design matrices, and the sums over its samples it contributes."""

    def __init__(self, *, data: ArrayDataset, learners: Sequence[BaseLearner], family: str) -> None:
        self.x = data.x.reshape(len(data), -1).astype(np.float64)
        self.y = data.y.astype(np.float64)
        self.family = family_named(family)
        self.designs = [learner.design(self.x) for learner in learners]
        self.n = len(data)

    def setup_statistics(self) -> np.ndarray:
        """[n, sum y, upper triangles of B_j'B_j for every learner j]."""
        parts = [np.array([float(self.n), self.y.sum()])]
        for design in self.designs:
            upper = _triangle(design.shape[1])
            parts.append((design.T @ design)[upper])
        return np.concatenate(parts)

    def gradient_statistics(self, model: BoostingModel) -> np.ndarray:
        """[sum of losses, B_j'u for every learner j] for the pseudo-residuals u of ``model``."""
        f = model.predict_designs(self.designs)
        u = self.family.negative_gradient(self.y, f)
        parts = [np.array([self.family.loss(self.y, f).sum()])]
        parts.extend(design.T @ u for design in self.designs)
        return np.concatenate(parts)


@dataclass
class BoostingModel:
    """The additive model: ``offset`` + sum over learners of B_j(x) coefficients[j]."""

    learners: tuple[BaseLearner, ...]
    family: str
    offset: float = 0.0
    coefficients: list[np.ndarray] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.coefficients:
            self.coefficients = [np.zeros(learner.size) for learner in self.learners]

    def predict_designs(self, designs: Sequence[np.ndarray]) -> np.ndarray:
        f = np.full(designs[0].shape[0], self.offset)
        for design, beta in zip(designs, self.coefficients, strict=True):
            if beta.any():
                f += design @ beta
        return f

    def decision_function(self, x: np.ndarray) -> np.ndarray:
        """f(x) for samples ``x`` (n x features, standardised like the training data)."""
        flat = np.asarray(x, dtype=np.float64).reshape(len(x), -1)
        return self.predict_designs([learner.design(flat) for learner in self.learners])

    def predict(self, x: np.ndarray) -> np.ndarray:
        """0/1 class labels (P(y = 1) >= 1/2)."""
        return (family_named(self.family).probability(self.decision_function(x)) >= 0.5).astype(int)

    def flat_coefficients(self) -> np.ndarray:
        """[offset, every learner's coefficients] as one vector (for comparisons)."""
        return np.concatenate([[self.offset], *self.coefficients])

    def linear_slopes(self) -> dict[int, float]:
        """Slope of every linear learner, by feature."""
        return {learner.feature: float(beta[1]) for learner, beta in
                zip(self.learners, self.coefficients, strict=True)
                if isinstance(learner, LinearLearner)}


@dataclass(frozen=True)
class BoostingStep:
    """One boosting iteration, as the server saw it."""

    iteration: int
    selected: int
    learner: str
    train_loss: float
    rss_reduction: float
    upload_bytes: int
    seconds: float


@dataclass
class BoostingFit:
    """The result of :meth:`FederatedBoosting.fit`: the model, the steps, and the coefficient path
    (``path[t]`` is :meth:`BoostingModel.flat_coefficients` after iteration t + 1)."""

    model: BoostingModel
    steps: list[BoostingStep]
    path: np.ndarray
    lambdas: np.ndarray
    setup_upload_bytes: int

    def selection_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for step in self.steps:
            counts[step.learner] = counts.get(step.learner, 0) + 1
        return counts


class SetupStage:
    """Stage 1: sum n, sum y and every B_j'B_j once; derive each learner's lambda for its df."""

    def __init__(self, learners: Sequence[BaseLearner]) -> None:
        self.learners = tuple(learners)

    def finish(self, total: np.ndarray, *, clients: int, family: str
               ) -> tuple[float, float, list[np.ndarray], np.ndarray]:
        """From the pooled sums to (n, mean y, grams, lambdas); AggregationError when the sums
        fail :func:`fl_core.boosting_checks.check_setup`."""
        n = float(np.round(total[0]))
        grams, start = [], 2
        for learner in self.learners:
            size = learner.size
            upper = _triangle(size)
            count = upper[0].size
            gram = np.zeros((size, size))
            gram[upper] = total[start:start + count]
            gram = gram + np.triu(gram, 1).T
            start += count
            grams.append(gram)
        check_setup(self.learners, grams, n, float(total[1]), clients, family)
        try:
            lambdas = [0.0 if learner.df() is None else
                       lambda_for_df(gram, learner.penalty(), learner.df())
                       for learner, gram in zip(self.learners, grams, strict=True)]
        except (InvalidParameterError, np.linalg.LinAlgError):
            raise AggregationError(INCONSISTENT) from None
        return n, float(total[1]) / n, grams, np.array(lambdas)


class SelectionStage:
    """Stage 2 (every iteration): from the pooled B_j'u, fit each learner and pick the best."""

    def __init__(self, learners: Sequence[BaseLearner], grams: Sequence[np.ndarray],
                 lambdas: np.ndarray) -> None:
        self.learners = tuple(learners)
        self.grams = list(grams)
        try:
            self.solvers = [np.linalg.pinv(g + lam * learner.penalty())
                            for g, lam, learner in zip(grams, lambdas, self.learners, strict=True)]
        except np.linalg.LinAlgError:
            raise AggregationError(INCONSISTENT) from None
        self.offsets = np.cumsum([0] + [learner.size for learner in self.learners])

    def blocks(self, cross: np.ndarray) -> list[np.ndarray]:
        """The pooled B_j'u of every learner j, from their concatenation."""
        return [cross[self.offsets[j]:self.offsets[j + 1]] for j in range(len(self.learners))]

    def select(self, blocks: Sequence[np.ndarray]) -> tuple[int, np.ndarray, float]:
        """(index of the best learner, its coefficients, its RSS reduction u'u - RSS)."""
        best, best_beta, best_gain = -1, np.zeros(0), -np.inf
        for j, (solver, gram, b) in enumerate(zip(self.solvers, self.grams, blocks, strict=True)):
            beta = solver @ b
            gain = float(2 * beta @ b - beta @ gram @ beta)
            if gain > best_gain:
                best, best_beta, best_gain = j, beta, gain
        return best, best_beta, best_gain


class FederatedBoosting:
    """Runs component-wise boosting over ``clients`` with sums from ``protocol``.

    Args:
        spec: the public model description.
        protocol: the aggregation seam (plain, masking, Paillier...).
        iterations: boosting iterations (mstop), >= 1.
    """

    def __init__(self, *, spec: BoostingSpec, protocol: AggregationProtocol, iterations: int) -> None:
        if iterations < 1:
            raise InvalidParameterError(f"iterations must be >= 1, got {iterations}")
        self.spec, self.protocol, self.iterations = spec, protocol, iterations

    def _sum(self, round_index: int, vectors: Sequence[np.ndarray]) -> AggregateResult:
        updates = [ClientUpdate(k, v, 1.0) for k, v in enumerate(vectors)]
        for attempt in range(ATTEMPTS):
            try:
                result = self.protocol.aggregate(round_index, updates, purpose="statistics")
            except AggregationError:
                if attempt == ATTEMPTS - 1:
                    raise
                continue
            if len(result.participants) == len(updates):
                break
            if attempt == ATTEMPTS - 1:
                raise AggregationError(f"boosting sums need every client; round {round_index} "
                                       f"missed {len(updates) - len(result.participants)}")
        if result.metrics.get("clipped", 0) > 0:
            raise AggregationError("boosting statistics exceed the aggregation protocol's range")
        return result

    def fit(self, clients: Sequence[ArrayDataset], *,
            callback: Callable[[BoostingStep, BoostingModel], bool] | None = None) -> BoostingFit:
        """Boost ``iterations`` times; ``callback`` sees every step and the model after it and
        returns True to stop there."""
        n_features = int(np.prod(clients[0].x.shape[1:]))
        learners = self.spec.base_learners(n_features)
        parties = [BoostingClient(data=c, learners=learners, family=self.spec.family) for c in clients]
        setup = SetupStage(learners)
        result = self._sum(0, [p.setup_statistics() for p in parties])
        n, mean_y, grams, lambdas = setup.finish(result.weighted_sum, clients=len(parties),
                                                 family=self.spec.family)
        selection = SelectionStage(learners, grams, lambdas)
        family = family_named(self.spec.family)
        model = BoostingModel(learners, self.spec.family, offset=family.offset(mean_y))
        steps, path = [], []
        for t in range(1, self.iterations + 1):
            start = time.perf_counter()
            summed = self._sum(t, [p.gradient_statistics(model) for p in parties])
            blocks = selection.blocks(summed.weighted_sum[1:])
            check_iteration(learners, blocks, float(summed.weighted_sum[0]), n)
            j, beta, gain = selection.select(blocks)
            model.coefficients[j] = model.coefficients[j] + self.spec.nu * beta
            step = BoostingStep(t, j, learners[j].name, float(summed.weighted_sum[0] / n), gain / n,
                                summed.upload_bytes, time.perf_counter() - start)
            steps.append(step)
            path.append(model.flat_coefficients())
            if callback is not None and callback(step, model):
                break
        return BoostingFit(model, steps, np.array(path), lambdas, result.upload_bytes)
