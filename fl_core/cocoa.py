"""CoCoA / CoCoA+: communication-efficient primal-dual training of L2-regularised linear models.

Problem (n samples over K clients, x_i with an appended 1, labels y_i in {-1, +1}):

    P(w) = (1/n) sum_i l(y_i w.x_i) + (lambda/2) ||w||^2,
    D(alpha) = (1/n) sum_i -l*(-alpha_i) - (lambda/2) ||A alpha||^2,
    A alpha = (1/(lambda n)) sum_i alpha_i y_i x_i.

Each round every sampled client runs ``local_steps`` (H) SDCA steps on its own dual block against the
CoCoA+ local subproblem with curvature ``sigma_prime`` (Jaggi et al. 2014; Ma et al. 2015), and
sends Delta w_k = A Delta alpha_[k]. The server only needs the SUM of the Delta w_k, so that sum goes
through the aggregation seam (``purpose="update"``); it applies w <- w + gamma sum_k Delta w_k, and
each client whose update is in the sum applies alpha_[k] <- alpha_[k] + gamma Delta alpha_[k] (a client
not in the sum, e.g. a dropout, keeps its old block, so w = A alpha still holds).

Averaging: gamma = 1/K, sigma' = 1. Adding (CoCoA+): gamma = 1, sigma' = K (safe: sigma' = gamma K).

The duality gap P(w) - D(alpha) = (1/n) sum_i [l_i + l*_i(-alpha_i)] + lambda ||w||^2 certifies
suboptimality. Its data-dependent part is a sum too: each client sends the two means of its
primal-loss and dual terms (weight n_k) through the seam (``purpose="statistics"``), so the server
learns only the federation-wide means, two numbers a round. The server knows w, hence ||w||^2.

What goes through the seam is scaled to per-sample size (Delta w_k / n_k with weight n_k), so a
fixed-point layer with coordinates in [-clip, clip] carries it; any clipping is refused (an
AggregationError), because a clipped Delta w breaks w = A alpha.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
from fedsec.fl_core.aggregation import AggregationProtocol, ClientUpdate
from fedsec.fl_core.duality import make_loss, signed_labels, with_intercept
from fedsec.fl_core.errors import AggregationError, InvalidParameterError

COMBINE = ("adding", "averaging")


def local_sdca(
    x: np.ndarray, y: np.ndarray, alpha: np.ndarray, w: np.ndarray, *, loss_name: str, lam: float,
    n_total: int, sigma_prime: float, steps: int, rng: np.random.Generator,
) -> tuple[np.ndarray, np.ndarray]:
    """H = ``steps`` SDCA steps on one dual block; returns ``(delta_alpha, delta_w)``.

    Coordinates are drawn uniformly with replacement. Step i maximises the CoCoA+ subproblem in
    alpha_i: margin m = y_i x_i.(w + sigma' delta_w), curvature q = sigma' ||x_i||^2 / (lambda n).
    SDCA is sequential by nature: one Python iteration per step, each vectorised over features.
    """
    loss = make_loss(loss_name)
    scale = 1.0 / (lam * n_total)
    squares = np.einsum("ij,ij->i", x, x)
    delta_alpha = np.zeros_like(alpha)
    delta_w = np.zeros_like(w)
    for i in rng.integers(0, x.shape[0], size=steps):
        q = sigma_prime * squares[i] * scale
        if q == 0.0:
            continue
        margin = y[i] * (x[i] @ (w + sigma_prime * delta_w))
        current = alpha[i] + delta_alpha[i]
        change = float(loss.maximize(current, margin, q)) - current
        if change:
            delta_alpha[i] += change
            delta_w += (change * y[i] * scale) * x[i]
    return delta_alpha, delta_w


class CoCoAClient:
    """One client's stage: its data, its dual block alpha_[k], its local solver.

    Args:
        client_id: the id used in the seam.
        x: samples, first axis n_k (flattened; an intercept column is appended here).
        y: binary labels, 0/1 or -1/+1.
    """

    def __init__(self, *, client_id: int, x: np.ndarray, y: np.ndarray) -> None:
        if len(x) != len(y) or len(y) < 1:
            raise InvalidParameterError(f"client {client_id}: x and y must have the same length >= 1")
        self.client_id = client_id
        self.x = with_intercept(x)
        self.y = signed_labels(y)
        self.alpha = np.zeros(len(y))
        self._pending: np.ndarray | None = None

    @property
    def n(self) -> int:
        return int(self.y.shape[0])

    def propose(self, w: np.ndarray, *, loss_name: str, lam: float, n_total: int, sigma_prime: float,
                steps: int, rng: np.random.Generator) -> ClientUpdate:
        """Solve the local subproblem; return Delta w_k / n_k with weight n_k (kept until commit)."""
        delta_alpha, delta_w = local_sdca(self.x, self.y, self.alpha, w, loss_name=loss_name, lam=lam,
                                          n_total=n_total, sigma_prime=sigma_prime, steps=steps, rng=rng)
        self._pending = delta_alpha
        return ClientUpdate(self.client_id, delta_w / self.n, float(self.n))

    def commit(self, gamma: float, *, included: bool) -> None:
        """Apply gamma * Delta alpha_[k] if this client's Delta w is in the released sum."""
        if included and self._pending is not None:
            self.alpha = self.alpha + gamma * self._pending
        self._pending = None

    def gap_terms(self, w: np.ndarray, loss_name: str) -> ClientUpdate:
        """Means over this client's samples of l(y w.x) and -l*(-alpha), weight n_k."""
        loss = make_loss(loss_name)
        z = self.y * (self.x @ w)
        vector = np.array([loss.primal(z).mean(), loss.dual(self.alpha).mean()])
        return ClientUpdate(self.client_id, vector, float(self.n))


@dataclass
class CoCoARound:
    """One round: the gap after it, and what the seam reported."""

    round: int
    primal: float
    dual: float
    gap: float
    participants: int
    dropped: int
    upload_bytes: int
    status: str = "ok"


@dataclass
class CoCoAResult:
    """The final primal vector (last entry: intercept) and the per-round records."""

    w: np.ndarray
    rounds: list[CoCoARound] = field(default_factory=list)

    @property
    def weights(self) -> np.ndarray:
        return self.w[:-1]

    @property
    def intercept(self) -> float:
        return float(self.w[-1])


class CoCoA:
    """The CoCoA / CoCoA+ server loop over the aggregation seam.

    Args:
        loss: ``hinge`` (SVM) or ``logistic``.
        lam: lambda > 0, the L2 regularisation (per-sample scale, as in P(w) above).
        local_steps: H >= 1, SDCA steps per client per round.
        combine: ``adding`` (CoCoA+, gamma = 1, sigma' = K) or ``averaging`` (gamma = 1/K, sigma' = 1).
        report_gap: also aggregate the two gap means each round (a second, 2-number aggregation).
    """

    def __init__(self, *, loss: str = "hinge", lam: float = 1e-3, local_steps: int = 100,
                 combine: str = "adding", report_gap: bool = True) -> None:
        make_loss(loss)
        if not (np.isfinite(lam) and lam > 0):
            raise InvalidParameterError(f"lam must be a finite number > 0, got {lam}")
        if local_steps < 1:
            raise InvalidParameterError(f"local_steps must be >= 1, got {local_steps}")
        if combine not in COMBINE:
            raise InvalidParameterError(f"combine must be one of {COMBINE}, got {combine!r}")
        self.loss, self.lam, self.local_steps = loss, float(lam), int(local_steps)
        self.combine, self.report_gap = combine, report_gap

    def aggregation_parameters(self, k: int) -> tuple[float, float]:
        """(gamma, sigma') for K = ``k`` clients in the round."""
        return (1.0, float(k)) if self.combine == "adding" else (1.0 / k, 1.0)

    def fit(
        self, clients: Sequence[CoCoAClient], protocol: AggregationProtocol, *, rounds: int,
        rng: np.random.Generator, select: Callable[[int], Sequence[int]] | None = None,
        on_round: Callable[[CoCoARound, np.ndarray], None] | None = None,
    ) -> CoCoAResult:
        """Run ``rounds`` rounds; ``select(round)`` picks the client indices of a round (default all).

        A round whose Delta w aggregation aborts (AggregationError) changes nothing and is recorded
        with its reason; a protocol that had to clip raises AggregationError (w = A alpha would break).
        """
        n_total = sum(c.n for c in clients)
        w = np.zeros(clients[0].x.shape[1])
        result = CoCoAResult(w)
        for r in range(1, rounds + 1):
            chosen = [clients[i] for i in (select(r) if select else range(len(clients)))]
            gamma, sigma_prime = self.aggregation_parameters(len(chosen))
            updates = [c.propose(w, loss_name=self.loss, lam=self.lam, n_total=n_total,
                                 sigma_prime=sigma_prime, steps=self.local_steps, rng=rng) for c in chosen]
            try:
                released = protocol.aggregate(r, updates, purpose="update")
            except AggregationError as error:
                for c in chosen:
                    c.commit(gamma, included=False)
                record = CoCoARound(r, *self._gap(clients, w, protocol, r), 0, len(chosen), 0,
                                    status=f"aborted: {error}")
                result.rounds.append(record)
                if on_round is not None:
                    on_round(record, w)
                continue
            _refuse_clipping(released.metrics)
            included = set(released.participants)
            for c in chosen:
                c.commit(gamma, included=c.client_id in included)
            w = w + gamma * released.weighted_sum
            primal, dual, gap = self._gap(clients, w, protocol, r)
            record = CoCoARound(r, primal, dual, gap, len(included), len(released.dropped),
                                released.upload_bytes)
            result.rounds.append(record)
            if on_round is not None:
                on_round(record, w)
        result.w = w
        return result

    def _gap(self, clients: Sequence[CoCoAClient], w: np.ndarray, protocol: AggregationProtocol,
             r: int) -> tuple[float, float, float]:
        if not self.report_gap:
            return float("nan"), float("nan"), float("nan")
        try:
            sums = protocol.aggregate(r, [c.gap_terms(w, self.loss) for c in clients], purpose="statistics")
        except AggregationError:
            return float("nan"), float("nan"), float("nan")
        _refuse_clipping(sums.metrics)
        if len(sums.participants) != len(clients):
            return float("nan"), float("nan"), float("nan")
        mean_loss, mean_dual = sums.weighted_sum / sums.total_weight
        norm2 = float(w @ w)
        primal = float(mean_loss) + 0.5 * self.lam * norm2
        dual = float(mean_dual) - 0.5 * self.lam * norm2
        return primal, dual, primal - dual


def _refuse_clipping(metrics: dict[str, float]) -> None:
    if metrics.get("clipped", 0) > 0:
        raise AggregationError("a CoCoA message exceeds the aggregation protocol's range "
                               "(raise the clip bound): a clipped sum would break w = A alpha")


def primal_objective(x: np.ndarray, y: np.ndarray, w: np.ndarray, *, loss: str, lam: float) -> float:
    """P(w) on pooled samples ``x`` (no intercept column; w's last entry is the intercept)."""
    z = signed_labels(y) * (with_intercept(x) @ w)
    return float(make_loss(loss).primal(z).mean() + 0.5 * lam * (w @ w))
