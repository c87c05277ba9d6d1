"""DP-SGD (Abadi et al. 2016) on one party's data, in place on a torch model.

Each step samples every example independently with probability q = batch_size / n (Poisson
sampling, which the accountants assume), clips each sampled example's gradient to L2 norm C,
adds Gaussian noise of standard deviation sigma C to the sum (from :class:`~dp.noise.SecureRandom`)
and divides by the expected batch size q n, as Opacus does. An epoch is round(1 / q) steps; a
step whose sample is empty still adds the noise.

With a fixed ``sample_rate`` q instead, q, the number of steps and the divisor (``batch_size``,
a public constant) do not depend on n, so neither the output's distribution beyond the clipped
sums nor the accounting gives n away: adding or removing one record is then exactly the
neighbouring relation the subsampled-Gaussian accountant covers, at rate q.

The result names the sampling rate and the number of steps, which is what an accountant records.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from fedsec.dp.errors import InvalidPrivacyParameterError
from fedsec.dp.noise import MIN_NOISE_MULTIPLIER, SecureRandom
from fedsec.dp.per_sample import LossFn, PerExampleClipper, spread_indices
from torch import nn

GATHER_BYTES = 16 * 2**20
"""The sampled examples of consecutive steps are gathered at once, at most this many bytes of them
(or one step's, if more): one indexing for many steps, each batch then a slice."""


@dataclass(frozen=True)
class DPSGDResult:
    """What one call of :meth:`DPSGD.train` did: the mean loss over the sampled examples, the
    sampling rate q and the number of noisy steps."""

    loss: float
    sample_rate: float
    steps: int


class DPSGD:
    """Differentially private SGD.

    Args:
        noise_multiplier: sigma = 0 (clips without noise: not private) or >= 0.5 (noise std / C;
            below, the truncated sampler breaks the guarantee: ``dp.noise.MIN_NOISE_MULTIPLIER``).
        max_grad_norm: C > 0.
        batch_size: expected batch size B >= 1 (q = min(1, B / n)).
        epochs: passes over the data, >= 1.
        lr: learning rate, > 0.
        random: the noise and sampling source (default: a fresh :class:`SecureRandom`).
        sample_rate: None (q = min(1, B / n), divisor q n) or a fixed q in (0, 1] for every n
            (divisor B; the steps per epoch round(1 / q)).
    """

    def __init__(self, *, noise_multiplier: float, max_grad_norm: float, batch_size: int,
                 epochs: int = 1, lr: float = 0.1, random: SecureRandom | None = None,
                 sample_rate: float | None = None) -> None:
        if not (math.isfinite(noise_multiplier) and (noise_multiplier == 0
                                                     or noise_multiplier >= MIN_NOISE_MULTIPLIER)):
            raise InvalidPrivacyParameterError(
                f"noise_multiplier must be 0 (no noise, not private) or >= {MIN_NOISE_MULTIPLIER} "
                f"(the sampler is truncated at 8.57 sigma), got {noise_multiplier}")
        if not (math.isfinite(max_grad_norm) and max_grad_norm > 0):
            raise InvalidPrivacyParameterError(f"max_grad_norm must be > 0, got {max_grad_norm}")
        if batch_size < 1 or epochs < 1 or not lr > 0:
            raise InvalidPrivacyParameterError(
                f"batch_size and epochs must be >= 1 and lr > 0, got {batch_size}, {epochs}, {lr}")
        if sample_rate is not None and not (math.isfinite(sample_rate) and 0 < sample_rate <= 1):
            raise InvalidPrivacyParameterError(f"sample_rate must be in (0, 1], got {sample_rate}")
        self.fixed_rate = None if sample_rate is None else float(sample_rate)
        self.noise_multiplier, self.max_grad_norm = float(noise_multiplier), float(max_grad_norm)
        self.batch_size, self.epochs, self.lr = batch_size, epochs, lr
        self.random = random or SecureRandom()
        self._clippers: dict[int, PerExampleClipper] = {}

    def sample_rate(self, n: int) -> float:
        """q for a party of n examples: the fixed rate, or min(1, B / n)."""
        return self.fixed_rate if self.fixed_rate is not None else min(1.0, self.batch_size / n)

    def steps(self, n: int) -> int:
        """Noisy steps one call makes on n examples."""
        return self.epochs * max(1, round(1 / self.sample_rate(n)))

    def clipper(self, model: nn.Module) -> PerExampleClipper:
        clipper = self._clippers.get(id(model))
        if clipper is None or clipper.model is not model:
            clipper = self._clippers[id(model)] = PerExampleClipper(
                model, max_grad_norm=self.max_grad_norm)
        return clipper

    def _noise(self, params: list[torch.Tensor], steps: int, std: float) -> list[torch.Tensor] | None:
        """The Gaussian noise of every step, drawn at once (step by step, parameter by parameter,
        in the stream's order): for each parameter a [steps, *shape] view; None without noise."""
        if std <= 0:
            return None
        sizes = [p.numel() for p in params]
        drawn = torch.from_numpy(self.random.normal(steps * sum(sizes), std, np.float32))
        drawn = drawn.view(steps, -1).to(params[0].device)
        return [z.view(steps, *p.shape) for z, p in zip(drawn.split(sizes, dim=1), params, strict=True)]

    def train(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, loss_fn: LossFn
              ) -> DPSGDResult:
        """Run DP-SGD in place; ``loss_fn`` returns one loss per example."""
        n = int(x.shape[0])
        if n < 1:
            raise InvalidPrivacyParameterError("DP-SGD needs at least one example")
        clipper = self.clipper(model)
        if not clipper.probed and n >= 2:  # once: independence and the exact-path check
            index = spread_indices(n, np.random.default_rng(0))
            clipper.probe(x[index], y[index], loss_fn)
        model.train()
        q = self.sample_rate(n)
        expected = float(self.batch_size) if self.fixed_rate is not None else q * n
        std = self.noise_multiplier * self.max_grad_norm
        total_loss, seen = 0.0, 0
        steps = self.steps(n)
        masks = self.random.bernoulli(q, steps * n).reshape(steps, n)
        rows = np.flatnonzero(masks) % n  # the sampled examples, step after step
        bounds = np.zeros(steps + 1, dtype=np.int64)
        np.cumsum(masks.sum(1), out=bounds[1:])
        noise = self._noise(clipper.params, steps, std)
        per_step = None if noise is None else list(zip(*(z.unbind(0) for z in noise), strict=True))
        alpha = -self.lr / expected
        for first, last in _gathers(bounds, GATHER_BYTES // max(1, x[:1].nbytes)):
            start = int(bounds[first])
            index = torch.from_numpy(rows[start:bounds[last]])
            xs, ys = x[index], y[index]  # one gather for these steps; each batch is a slice
            for step in range(first, last):
                lo, hi = int(bounds[step]) - start, int(bounds[step + 1]) - start
                loss = clipper.step(xs[lo:hi], ys[lo:hi], loss_fn, alpha=alpha,
                                    noise=None if per_step is None else list(per_step[step]))
                total_loss, seen = total_loss + loss, seen + hi - lo
        return DPSGDResult(total_loss / max(seen, 1), q, steps)


def _gathers(bounds: np.ndarray, rows: int) -> list[tuple[int, int]]:
    """Consecutive step ranges [first, last) holding at most ``rows`` sampled examples together,
    or one step where a single step holds more (``bounds``: cumulative examples per step)."""
    ranges, first, steps = [], 0, len(bounds) - 1
    while first < steps:
        last = int(np.searchsorted(bounds, bounds[first] + rows, side="right")) - 1
        last = min(max(last, first + 1), steps)
        ranges.append((first, last))
        first = last
    return ranges
