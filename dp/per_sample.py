"""Per-example gradient clipping: the sum over a batch of each example's gradient scaled to an L2
norm of at most C, as DP-SGD needs it.

Fast path (every trainable parameter in ``nn.Linear`` layers fed 2-D inputs or ``nn.Conv2d``
layers, each layer used once per forward pass, no parameter held by two modules): one forward
pass records each layer's input, one backward pass asks autograd only for the gradients of the
layers' outputs (no weight gradients), and the per-example norms come from those two factors.
Where the loss offers its derivative in closed form (``loss_fn.value_and_grad(outputs,
targets)``, as ``fl_core.models.per_example_classification_loss`` does), the backward pass
starts from the model's output with it, and a model whose output is its only layer's output
(logistic regression) needs no backward pass at all. The per-example norms:

- Linear: ||g_i||^2 = ||a_i||^2 ||d_i||^2 + ||d_i||^2 (weight and bias), a closed form, so a
  logistic regression costs about one plain step;
- Conv2d: with the unfolded input A_i (K x P, :func:`unfold`) and output gradient D_i (C x P),
  either the per-example gradient D_i A_i^T, kept for the clipped sum, or the "ghost" norm
  sum((A_i^T A_i) * (D_i^T D_i)), whichever costs fewer multiply-adds (:func:`conv_method`;
  mixed ghost clipping, Bu et al. 2022).

The clipped sum is then one weighted product per layer, sum_i c_i D_i A_i^T with
c_i = min(1, C / ||g_i||) (book-keeping, Bu et al. 2023: no second backward pass). The closed
forms hold for a parameter of one layer only: a parameter shared by two modules (tied
embeddings, tied layers) has a per-example gradient that is the sum of both layers' terms, whose
norm has cross terms, so such a model, like a layer run twice, takes the Opacus path, which
accumulates each parameter's per-sample gradient over every module using it.
Any other model goes through Opacus' per-sample gradients (``GradSampleModule``, hooks mode),
after Opacus' ``ModuleValidator`` has refused what DP-SGD cannot train (batch normalisation and
the like) with its own message.

The structure alone does not prove a path right: a weight can also be used functionally
(``F.linear(h, layer.weight)``, ``h @ emb.weight.T``), from a hook, or be assigned by a pre-hook,
which neither the fast path nor Opacus sees. So before the first clipped sum, on a probe batch
(the first ``PROBE_SIZE`` examples the clipper is given and ``PROBE_SIZE`` more chosen at random
across them, :func:`spread_indices`), the clipper

1. checks that the model and the loss treat the examples independently: in train mode (dropout
   modules switched off for the probe), each example's output and per-example loss must equal
   those of that example alone (relative tolerance ``PROBE_RTOL``); otherwise
   :class:`~dp.errors.UnsupportedModelError` (a batch statistic such as a functional
   ``batch_norm``, or a loss weighted by a batch mean, gives one record a sensitivity above C);
2. computes the exact per-example gradients, one example at a time, and keeps the first path
   among fast, Opacus, ``torch.func`` (``vmap(grad(functional_call))``) whose clipped sums
   equal the exact ones at C and at a bound that clips every probe example; if none does, or one
   raises, the exact per-example loop itself is the path. A path that fails later (a layer run
   twice, an error) falls back to the exact path, never a bare crash; a model that even the
   loop cannot differentiate is refused with :class:`~dp.errors.UnsupportedModelError`.

The probe guards against mistakes, not against an adversarial model: a model may behave one way
on the probe batch and another way later (e.g. by counting its calls), which no finite probe
detects. Buffers are restored after the probe.

Refused outright (:func:`check_released_raw`, and in the probe by comparing every parameter and
buffer before and after its forward passes): what DP-SGD would release without noise, i.e. a float
parameter with ``requires_grad=False``, an ``nn.Embedding`` with ``max_norm`` (rows renormalised in
place), and any parameter or buffer that a forward pass changes. The independence check of step 1
runs on the probe batch and again on random inputs of its shape and dtype (:func:`synthetic_like`),
so a batch statistic is seen even when the client's examples coincide.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable

import numpy as np
import torch
from fedsec.dp.errors import UnsupportedModelError
from torch import nn
from torch.nn import functional as F

PROBE_SIZE = 8
"""Examples in the probe batch (the first ones the clipper is given)."""
PROBE_RTOL = 1e-5
"""Relative tolerance of the independence probe (outputs and losses; float32 reductions differ
by a few ulps between a batch and a single example)."""
_GRAD_RTOL = 1e-4

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""(outputs, targets) -> one loss per example."""


def check_model(model: nn.Module) -> None:
    """Refuse models that per-example clipping cannot handle (Opacus' validator's rules)."""
    from opacus.validators import ModuleValidator

    errors = ModuleValidator.validate(model, strict=False)
    if errors:
        reasons = "; ".join(sorted({str(e) for e in errors}))
        raise UnsupportedModelError(f"DP-SGD cannot train this model: {reasons} (replace the "
                                    "offending layers yourself, e.g. BatchNorm by GroupNorm)")


def check_released_raw(model: nn.Module) -> None:
    """Refuse what DP-SGD would release without noise: a float parameter with
    ``requires_grad=False`` (sent with the model, never clipped or noised) and an ``nn.Embedding``
    with ``max_norm`` (its forward renormalises the looked-up rows in place, outside the gradient)."""
    for name, p in model.named_parameters():
        if p.is_floating_point() and not p.requires_grad:
            raise UnsupportedModelError(
                f"DP-SGD cannot train this model: parameter {name!r} is frozen (requires_grad=False), "
                "so it would be released without noise; make it a constant outside the model or "
                "train it")
    for name, module in model.named_modules():
        if isinstance(module, nn.Embedding) and module.max_norm is not None:
            raise UnsupportedModelError(
                f"DP-SGD cannot train this model: module {name or type(module).__name__!r} is an "
                "nn.Embedding with max_norm, which renormalises the rows a batch looks up in place, "
                "outside the clipped, noised gradient; use max_norm=None")


def _state(model: nn.Module) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    """(name, tensor, saved copy) for every parameter and buffer of ``model``."""
    named = list(model.named_parameters()) + [(n, b) for n, b in model.named_buffers() if b is not None]
    return [(name, t, t.detach().clone()) for name, t in named]


def _refuse_changed(state: list[tuple[str, torch.Tensor, torch.Tensor]]) -> None:
    """Refuse a model whose parameters or buffers changed during a forward pass."""
    for name, tensor, saved in state:
        if tensor.shape != saved.shape or not torch.equal(tensor.detach(), saved):
            raise UnsupportedModelError(
                f"DP-SGD cannot train this model: {name!r} changes during a forward pass (updated "
                "from the inputs, outside the clipped, noised gradient), so it would carry the "
                "records without noise")


def synthetic_like(x: torch.Tensor, rng: np.random.Generator) -> torch.Tensor:
    """Random inputs of ``x``'s shape and dtype: uniform integers in ``x``'s observed range when ``x``
    holds integers (or integer-valued floats), otherwise Gaussian with ``x``'s per-feature mean and
    standard deviation (1 where the examples coincide)."""
    if not x.is_floating_point() or bool((x == x.round()).all()):
        low, high = int(x.min()), int(x.max())
        values = rng.integers(low, high + 1, size=tuple(x.shape))
        return torch.from_numpy(values).to(device=x.device, dtype=x.dtype)
    mean, std = x.mean(0, keepdim=True), x.std(0, keepdim=True)
    std = torch.where(std > 0, std, torch.ones_like(std))
    noise = torch.from_numpy(rng.standard_normal(size=tuple(x.shape))).to(device=x.device, dtype=x.dtype)
    return mean + std * noise


def spread_indices(n: int, rng: np.random.Generator) -> list[int]:
    """The first ``PROBE_SIZE`` indices of ``n`` examples and ``PROBE_SIZE`` more chosen by the numpy
    Generator ``rng`` across all of them (distinct, sorted)."""
    first = list(range(min(n, PROBE_SIZE)))
    rest = [i for i in range(PROBE_SIZE, n)]
    extra = sorted(rng.choice(rest, size=min(PROBE_SIZE, len(rest)), replace=False).tolist()) if rest else []
    return first + extra


def _fast_layers(model: nn.Module) -> list[nn.Module] | None:
    """The Linear/Conv2d layers holding every trainable parameter, or None if some other module
    holds one, a parameter is held by two modules (tied weights), or a convolution is grouped,
    dilated or not zero-padded."""
    layers, covered = [], set()
    for module in model.modules():
        own = [p for p in module.parameters(recurse=False) if p.requires_grad]
        if not own:
            continue
        if any(id(p) in covered for p in own):
            return None  # a tied parameter: its per-example gradient sums two layers' terms
        if isinstance(module, nn.Linear) or (
                isinstance(module, nn.Conv2d) and module.groups == 1 and module.dilation == (1, 1)
                and module.padding_mode == "zeros" and not isinstance(module.padding, str)):
            layers.append(module)
            covered.update(id(p) for p in own)
        else:
            return None
    if len(covered) != len([p for p in model.parameters() if p.requires_grad]):
        return None
    return layers


class PerExampleClipper:
    """Computes clipped gradient sums for one model.

    Args:
        model: the model; checked with :func:`check_model`, then probed on the first batch
            (module docstring).
        max_grad_norm: C > 0, the per-example L2 bound.
    """

    def __init__(self, model: nn.Module, *, max_grad_norm: float) -> None:
        check_model(model)
        check_released_raw(model)
        if not max_grad_norm > 0:
            raise UnsupportedModelError(f"max_grad_norm must be > 0, got {max_grad_norm}")
        self.model, self.max_grad_norm = model, float(max_grad_norm)
        self.params = [p for p in model.parameters() if p.requires_grad]
        if not self.params:
            raise UnsupportedModelError("the model has no trainable parameter")
        self.layers = _fast_layers(model)
        self.mode = "fast" if self.layers is not None else "opacus"
        self.probed = False
        self._records: list[tuple[nn.Module, torch.Tensor, torch.Tensor]] = []
        self._capturing = False
        if self.layers is not None:
            for layer in self.layers:
                layer.register_forward_hook(self._record)

    def _record(self, module: nn.Module, inputs: tuple, output: torch.Tensor) -> None:
        if torch.is_grad_enabled() and self._capturing:
            self._records.append((module, inputs[0].detach() if inputs else None, output))

    def clipped_sum(self, x: torch.Tensor, y: torch.Tensor, loss_fn: LossFn
                    ) -> tuple[list[torch.Tensor], float]:
        """(sum_i clip(grad_i) for each trainable parameter, summed loss) over the batch."""
        if x.shape[0] == 0:
            return [torch.zeros_like(p) for p in self.params], 0.0
        if not self.probed:
            if x.shape[0] < 2:
                return self._loop(x, y, loss_fn)  # exact; the probe waits for two examples
            index = spread_indices(int(x.shape[0]), np.random.default_rng(0))
            self.probe(x[index], y[index], loss_fn)
        path = self._fast if self.mode == "fast" else {
            "opacus": self._opacus, "vmap": self._vmap, "loop": self._loop}[self.mode]
        try:
            result = path(x, y, loss_fn)
        except (KeyError, IndexError, RuntimeError, TypeError, ValueError) as error:
            if isinstance(error, UnsupportedModelError) or self.mode == "loop":
                raise
            result = None
        return self._exact_from_now_on(x, y, loss_fn) if result is None else result

    def _exact_from_now_on(self, x, y, loss_fn):
        """The fallback when a path fails on a batch (e.g. a layer ran twice): the exact path, for
        this batch and every later one."""
        self._drop_opacus()
        self.mode = "loop"
        return self._loop(x, y, loss_fn)

    def step(self, x: torch.Tensor, y: torch.Tensor, loss_fn: LossFn, *, alpha: float,
             noise: list[torch.Tensor] | None = None) -> float:
        """One descent step in place: each trainable parameter += ``alpha`` (clipped sum over the
        batch + its ``noise`` tensor, if given); returns the summed loss.

        The same update as :meth:`clipped_sum` followed by the addition (equal up to float32
        rounding, which tests bound), but on the fast path each layer's weighted product is
        added into its parameters directly (``addmm_`` and the like), with no gradient lists in
        between: on a logistic regression the step's bookkeeping otherwise costs as much as its
        arithmetic."""
        fast = None
        if self.mode == "fast" and self.probed and x.shape[0] > 0:
            try:
                fast = self._fast_pass(x, y, loss_fn)
            except (KeyError, IndexError, RuntimeError, TypeError, ValueError) as error:
                if isinstance(error, UnsupportedModelError):
                    raise
                fast = None
        if fast is None:
            if self.mode == "fast" and self.probed and x.shape[0] > 0:
                grads, loss = self._exact_from_now_on(x, y, loss_fn)
            else:
                grads, loss = self.clipped_sum(x, y, loss_fn)
        with torch.no_grad():
            if fast is None:
                torch._foreach_add_(self.params, grads, alpha=alpha)
            else:
                records, grads_out, kept, scale, loss = fast
                for (layer, a, _), d, saved in zip(records, grads_out, kept, strict=True):
                    layer_descend(layer, a, d, saved, scale, alpha)
            if noise is not None:
                torch._foreach_add_(self.params, noise, alpha=alpha)
        return loss

    def probe(self, x: torch.Tensor, y: torch.Tensor, loss_fn: LossFn) -> str:
        """Check independence and pick the path on the probe batch ``x``, ``y`` (>= 2 examples);
        returns the path (``fast``, ``opacus``, ``vmap`` or ``loop``)."""
        if x.shape[0] < 2:
            raise UnsupportedModelError("the per-example probe needs at least two examples")
        dropouts = [m for m in self.model.modules()
                    if isinstance(m, nn.modules.dropout._DropoutNd) and m.training]
        buffers = [(b, b.detach().clone()) for b in self.model.buffers()]
        was_training = self.model.training
        self.model.train()
        for m in dropouts:
            m.eval()
        try:
            state = _state(self.model)
            with torch.no_grad():
                try:
                    self.model(x)
                except (RuntimeError, IndexError, KeyError, TypeError, ValueError):
                    pass  # judged by the independence check below, which names the error
            _refuse_changed(state)
            self._check_independent(x, y, loss_fn)
            _refuse_changed(state)
            self._check_synthetic(x, y, loss_fn)
            _refuse_changed(state)
            if [id(p) for p in self.model.parameters() if p.requires_grad] != [id(p) for p in self.params]:
                raise UnsupportedModelError(
                    "DP-SGD cannot train this model: its trainable parameters change when it runs "
                    "(a hook assigns a parameter); tie the weights before training")
            exact = self._exact_grads(x, y, loss_fn)
            self.mode = self._pick_mode(x, y, loss_fn, exact)
        finally:
            for m in dropouts:
                m.train()
            self.model.train(was_training)
            with torch.no_grad():
                for b, saved in buffers:
                    b.copy_(saved)
        self.probed = True
        return self.mode

    def _check_synthetic(self, x, y, loss_fn) -> None:
        """The independence check again on random inputs like ``x`` (:func:`synthetic_like`), so a
        batch statistic is seen even when the given examples coincide; a model that cannot run on
        such inputs (e.g. out-of-range values) is judged on the given examples alone."""
        fake = synthetic_like(x, np.random.default_rng(0))
        try:
            with torch.no_grad():
                loss_fn(self.model(fake), y)
        except (RuntimeError, IndexError, KeyError, TypeError, ValueError):
            return
        self._check_independent(fake, y, loss_fn)

    def _check_independent(self, x, y, loss_fn) -> None:
        with torch.no_grad():
            try:
                out = self.model(x)
                losses = loss_fn(out, y)
                alone = [self.model(x[i:i + 1]) for i in range(x.shape[0])]
                alone_losses = torch.cat([loss_fn(o, y[i:i + 1]).reshape(-1)
                                          for i, o in enumerate(alone)])
            except (RuntimeError, IndexError, KeyError, TypeError, ValueError) as error:
                raise UnsupportedModelError(
                    "DP-SGD cannot train this model: it fails on a single example, so the "
                    f"examples of a batch are not independent ({type(error).__name__}: {error})"
                ) from None
        checks = [("per-example loss", losses.reshape(-1), alone_losses)]
        if isinstance(out, torch.Tensor) and all(isinstance(o, torch.Tensor) for o in alone):
            checks.insert(0, ("output", out.reshape(x.shape[0], -1),
                              torch.cat([o.reshape(1, -1) for o in alone])))
        for what, batched, single in checks:
            if batched.shape != single.shape or not _close(batched, single, PROBE_RTOL):
                raise UnsupportedModelError(
                    f"DP-SGD cannot train this model with this loss: an example's {what} in a batch "
                    "differs from its value alone, so the examples are not independent (a batch "
                    "statistic such as a functional batch_norm, a loss weighted by a batch "
                    "mean, or randomness outside nn.Dropout), and one record could move the "
                    "clipped sum by more than C")

    def _exact_grads(self, x, y, loss_fn) -> list[torch.Tensor]:
        """Per-example gradients [batch, *shape] for each parameter, one example at a time."""
        try:
            per = [self._one_grad(x[i:i + 1], y[i:i + 1], loss_fn)[0] for i in range(x.shape[0])]
        except (RuntimeError, IndexError, KeyError, TypeError, ValueError) as error:
            raise UnsupportedModelError("DP-SGD cannot train this model: its per-example gradient "
                                        f"fails ({type(error).__name__}: {error})") from None
        return [torch.stack(g) for g in zip(*per, strict=True)]

    def _one_grad(self, x, y, loss_fn) -> tuple[list[torch.Tensor], float]:
        loss = loss_fn(self.model(x), y).sum()
        grads = torch.autograd.grad(loss, self.params, allow_unused=True)
        return [torch.zeros_like(p) if g is None else g for g, p in zip(grads, self.params,
                                                                         strict=True)], float(loss.detach())

    def _pick_mode(self, x, y, loss_fn, exact: list[torch.Tensor]) -> str:
        norms = example_norms(exact)
        finite = norms[torch.isfinite(norms)]
        small = float(finite.min()) / 2 if finite.numel() else 0.0
        bounds = [self.max_grad_norm] + ([small] if small > 0 else [])
        candidates = (["fast"] if self.layers is not None else ["opacus"]) + ["vmap"]
        for mode in candidates:
            if self._agrees(mode, x, y, loss_fn, exact, norms, bounds):
                return mode
            self._drop_opacus()
        return "loop"

    def _agrees(self, mode, x, y, loss_fn, exact, norms, bounds) -> bool:
        keep = self.max_grad_norm
        path = {"fast": self._fast, "opacus": self._opacus, "vmap": self._vmap}[mode]
        try:
            for bound in bounds:
                self.max_grad_norm = bound
                got = path(x, y, loss_fn)
                if got is None:
                    return False
                scale = clip_scale(norms, bound)
                want = [weighted_sum(scale, g) for g in exact]
                if not all(_close(g, w, _GRAD_RTOL) for g, w in zip(got[0], want, strict=True)):
                    return False
            return True
        except (RuntimeError, IndexError, KeyError, TypeError, ValueError):
            return False
        finally:
            self.max_grad_norm = keep
            for p in self.params:
                p.grad = None
                if hasattr(p, "grad_sample"):
                    p.grad_sample = None

    def _drop_opacus(self) -> None:
        wrapped = self.__dict__.pop("_wrapped", None)
        if wrapped is not None:
            wrapped.remove_hooks()

    def _loop(self, x, y, loss_fn):
        """The exact path: each example's gradient on its own, clipped, summed."""
        total = [torch.zeros_like(p) for p in self.params]
        loss_sum = 0.0
        for i in range(x.shape[0]):
            grads, loss = self._one_grad(x[i:i + 1], y[i:i + 1], loss_fn)
            norm = float(torch.sqrt(sum((g.double() ** 2).sum() for g in grads)))
            if not np.isfinite(norm):  # clip factor 0: the example adds nothing (see clip_scale)
                continue
            scale = min(1.0, self.max_grad_norm / (norm + 1e-12))
            torch._foreach_add_(total, grads, alpha=scale)
            loss_sum += loss if np.isfinite(loss) else 0.0  # as finite_sum
        return total, loss_sum

    def _vmap(self, x, y, loss_fn):
        """Exact per-example gradients with ``torch.func`` (vmap of grad over the examples)."""
        from torch.func import functional_call, grad, vmap

        named = dict(self.model.named_parameters())
        names = [n for n, p in named.items() if p.requires_grad]
        fixed = {n: p.detach() for n, p in named.items() if not p.requires_grad}
        fixed.update(dict(self.model.named_buffers()))

        def one(params, xi, yi):
            out = functional_call(self.model, {**params, **fixed}, (xi.unsqueeze(0),))
            loss = loss_fn(out, yi.unsqueeze(0)).sum()
            return loss, loss.detach()

        params = {n: named[n].detach() for n in names}
        grads, losses = vmap(grad(one, has_aux=True), in_dims=(None, 0, 0),
                             randomness="different")(params, x, y)
        samples = [grads[n] for n in names]
        scale = clip_scale(example_norms(samples), self.max_grad_norm)
        return [weighted_sum(scale, g) for g in samples], finite_sum(losses)

    def _fast(self, x, y, loss_fn):
        """Book-keeping clipping: :meth:`_fast_pass`, then each clipped sum as one weighted
        product (:func:`layer_clipped_sum`)."""
        fast = self._fast_pass(x, y, loss_fn)
        if fast is None:
            return None
        records, grads_out, kept, scale, loss = fast
        grads: dict[int, torch.Tensor] = {}
        for (layer, a, _), d, saved in zip(records, grads_out, kept, strict=True):
            grads.update(layer_clipped_sum(layer, a, d, saved, scale))
        return [grads[id(p)] for p in self.params], loss

    def _fast_pass(self, x, y, loss_fn):
        """One forward pass (the hooks keep each layer's input), one backward pass to the layers'
        outputs, each layer's per-example squared norms from those two factors
        (:func:`layer_norms`) and the clipping factors: (records, output gradients, what the
        clipped sums reuse, factors [B], summed loss), or None when the forward pass did not run
        each layer once on inputs the closed forms cover (a layer run twice, a sequence)."""
        records = self._records
        records.clear()
        self._capturing = True
        try:
            out = self.model(x)
        finally:
            self._capturing = False
        if len(records) != len(self.layers) or {id(m) for m, _, _ in records} != {
                id(m) for m in self.layers} or any(
                a is None or (isinstance(m, nn.Linear) and a.dim() != 2) for m, a, _ in records):
            return None
        records = list(records)
        outs = [o for _, _, o in records]
        closed = _closed_form(loss_fn, out, y)
        if closed is None:  # autograd through the loss, to the layers' outputs
            losses = loss_fn(out, y)
            grads_out = torch.autograd.grad(losses.sum(), outs)
        else:  # the loss's derivative in closed form, then autograd through the model only
            losses, grad = closed
            grads_out = (grad,) if len(outs) == 1 and outs[0] is out else torch.autograd.grad(
                out, outs, grad_outputs=grad)
        squared, kept = None, []
        for (layer, a, _), d in zip(records, grads_out, strict=True):
            term, saved = layer_norms(layer, a, d)
            squared = term if squared is None else squared.add_(term)
            kept.append(saved)
        # a sum of squares is finite only if every term is (one float, not a mask, in the usual case)
        bad = None if math.isfinite(float(squared.sum())) else ~torch.isfinite(squared)
        # min(1, C / ||g_i||) = 1 / sqrt(max(1, ||g_i||^2 / C^2)), 1 for a zero gradient; 0 for a
        # gradient that is not finite, whose example's factors are zeroed (0 * inf is NaN)
        scale = squared.mul_(1.0 / self.max_grad_norm ** 2).clamp_(min=1.0).rsqrt_()
        if bad is not None and bool(bad.any()):
            scale = scale.masked_fill(bad, 0.0)
            records = [(layer, _zero_rows(a, bad), out) for layer, a, out in records]
            grads_out = tuple(_zero_rows(d, bad) for d in grads_out)
            kept = [None if saved is None else
                    tuple(None if t is None else _zero_rows(t, bad) for t in saved) for saved in kept]
        return records, grads_out, kept, scale, finite_sum(losses.detach())

    def _opacus(self, x, y, loss_fn):
        from opacus.grad_sample import GradSampleModule

        if not hasattr(self, "_wrapped"):
            self._wrapped = GradSampleModule(self.model, batch_first=True, loss_reduction="sum")
        losses = loss_fn(self._wrapped(x), y)
        for p in self.params:
            p.grad_sample = None
        with warnings.catch_warnings():  # torch notes that the inputs need no gradient: true
            warnings.filterwarnings("ignore", message="Full backward hook is firing")
            losses.sum().backward()
        samples = [p.grad_sample for p in self.params]
        scale = clip_scale(example_norms(samples), self.max_grad_norm)
        out = [weighted_sum(scale, g) for g in samples]
        for p in self.params:
            p.grad, p.grad_sample = None, None
        return out, finite_sum(losses.detach())


EXPLICIT_BYTES = 64 * 2**20
"""Largest per-example gradient tensor (bytes, over the batch) a convolution may materialise; above
it the ghost norm is used whatever the arithmetic says."""


_UNFOLD_INDEX: dict[tuple, torch.Tensor] = {}


def unfold(layer: nn.Conv2d, a: torch.Tensor) -> torch.Tensor:
    """``F.unfold(a, kernel, padding, stride)`` of a [B, C, H, W] input, [B, C kh kw, P], as one
    gather from the zero-padded input with a cached index (two to three times faster than
    ``F.unfold``'s im2col at the small images here; tests check the two are equal)."""
    ph, pw = layer.padding
    b, c, h, w = a.shape
    key = (c, h, w, layer.kernel_size, layer.padding, layer.stride, a.device)
    index = _UNFOLD_INDEX.get(key)
    if index is None:
        positions = torch.arange(c * (h + 2 * ph) * (w + 2 * pw), dtype=torch.float64)
        positions = positions.view(1, c, h + 2 * ph, w + 2 * pw)
        index = F.unfold(positions, layer.kernel_size, stride=layer.stride).round().long().view(-1)
        index = _UNFOLD_INDEX[key] = index.to(a.device)
    padded = F.pad(a, (pw, pw, ph, ph)).flatten(1)
    return padded.index_select(1, index).view(b, c * layer.kernel_size[0] * layer.kernel_size[1], -1)


def conv_method(layer: nn.Conv2d, a: torch.Tensor, d: torch.Tensor) -> str:
    """How the per-example norms of convolution ``layer`` are computed for input ``a`` and output
    gradient ``d``, whichever costs fewer multiply-adds per example (mixed ghost clipping, Bu et
    al. 2022): ``explicit`` (the per-example gradients D_i A_i^T from the unfolded input A_i,
    K x P, and the output gradient D_i, C_out x P: C_out K P, and they then give the clipped sum
    for C_out K more) or ``ghost`` (sum((A_i^T A_i) * (D_i^T D_i)): P^2 (K + C_out), plus the
    clipped sum as one batched weight gradient, C_out K P over the batch). Explicit when it
    costs no more and its [B, C_out, K] tensor stays under ``EXPLICIT_BYTES``.

    Counting every multiply-add, explicit never costs more, but the batched product of many small
    matrices runs at a fraction of the speed of oneDNN's weight gradient: measured on the digits
    CNN's second layer (16 to 32 channels, 4 x 4 positions), explicit made the whole clipped sum
    about 15 % slower, so the comparison leaves out the weight gradient, as Bu et al. do."""
    c_out, p = d.shape[1], d.shape[2] * d.shape[3]
    k = a.shape[1] * layer.kernel_size[0] * layer.kernel_size[1]
    small = a.shape[0] * c_out * k * a.element_size() <= EXPLICIT_BYTES
    return "explicit" if small and c_out * k <= p * (k + c_out) else "ghost"


def layer_norms(layer: nn.Module, a: torch.Tensor, d: torch.Tensor
                ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor | None] | None]:
    """(per-example squared gradient norm of ``layer``'s parameters [B], what the clipped sum can
    reuse) from its input ``a`` and output gradient ``d``.

    Linear: ||a_i||^2 ||d_i||^2 (+ ||d_i||^2 for the bias), a closed form. Conv2d: by
    :func:`conv_method`; the explicit method keeps the per-example gradients of the weight
    [B, C_out, K] and of the bias [B, C_out]."""
    if isinstance(layer, nn.Linear):
        d_sq = torch.linalg.vecdot(d, d)
        a_sq = torch.linalg.vecdot(a, a)
        return (torch.addcmul(d_sq, a_sq, d_sq) if layer.bias is not None else a_sq * d_sq), None
    flat = d.flatten(2)
    cols = unfold(layer, a)
    bias = flat.sum(2) if layer.bias is not None else None
    if conv_method(layer, a, d) == "explicit":
        weight = torch.bmm(flat, cols.transpose(1, 2)).flatten(1)
        term = torch.linalg.vecdot(weight, weight)
        saved = (weight, bias)
    else:
        gram = torch.bmm(cols.transpose(1, 2), cols)
        term = (gram * torch.bmm(flat.transpose(1, 2), flat)).flatten(1).sum(1)
        saved = None
    if bias is not None:
        term = term.add_(torch.linalg.vecdot(bias, bias))
    return term, saved


def layer_clipped_sum(layer: nn.Module, a: torch.Tensor, d: torch.Tensor,
                      saved: tuple[torch.Tensor, torch.Tensor | None] | None, scale: torch.Tensor
                      ) -> dict[int, torch.Tensor]:
    """{id(parameter): sum_i scale_i grad_i} for ``layer``: G^T diag(scale) A, one product."""
    grads: dict[int, torch.Tensor] = {}
    weight, bias = layer.weight, layer.bias
    if isinstance(layer, nn.Linear):
        ds = d * scale[:, None]
        grads[id(weight)] = ds.T @ a
        if bias is not None:
            grads[id(bias)] = ds.sum(0)
        return grads
    if saved is not None:  # explicit: the per-example gradients, weighted
        per_weight, per_bias = saved
        grads[id(weight)] = (scale @ per_weight).view(weight.shape)
        if bias is not None:
            grads[id(bias)] = scale @ per_bias
        return grads
    ds = d * scale[:, None, None, None]  # the batched weight gradient of the rescaled output grads
    grads[id(weight)] = torch.nn.grad.conv2d_weight(
        a, weight.shape, ds, stride=layer.stride, padding=layer.padding)
    if bias is not None:
        grads[id(bias)] = ds.sum((0, 2, 3))
    return grads


def layer_descend(layer: nn.Module, a: torch.Tensor, d: torch.Tensor,
                  saved: tuple[torch.Tensor, torch.Tensor | None] | None, scale: torch.Tensor,
                  alpha: float) -> None:
    """Add ``alpha`` times :func:`layer_clipped_sum` to ``layer``'s parameters in place, each
    product fused into its addition where torch has the fused form (``addmm_``)."""
    weight, bias = layer.weight, layer.bias
    if isinstance(layer, nn.Linear):  # W += alpha (D^T diag(c)) A, b += alpha D^T c
        weight.addmm_(d.T * scale, a, alpha=alpha)
        if bias is not None:
            bias.addmv_(d.T, scale, alpha=alpha)
        return
    if saved is not None:
        per_weight, per_bias = saved
        weight.add_((scale @ per_weight).view(weight.shape), alpha=alpha)
        if bias is not None:
            bias.add_(scale @ per_bias, alpha=alpha)
        return
    ds = d * scale[:, None, None, None]
    weight.add_(torch.nn.grad.conv2d_weight(a, weight.shape, ds, stride=layer.stride,
                                            padding=layer.padding), alpha=alpha)
    if bias is not None:
        bias.add_(ds.sum((0, 2, 3)), alpha=alpha)


def example_norms(samples: list[torch.Tensor]) -> torch.Tensor:
    """Each example's L2 norm [B] over per-example gradients ``samples`` ([B, *shape] each); NaN or
    infinity for an example whose gradient is not finite."""
    return torch.stack([g.flatten(1).norm(dim=1) for g in samples], dim=1).norm(dim=1)


def clip_scale(norms: torch.Tensor, bound: float) -> torch.Tensor:
    """Per-example clip factors [B]: min(1, ``bound`` / norm), and 0 where the norm is not finite
    (NaN or infinity), so the clipped sum holds at most ``bound`` per example for any model."""
    scale = (bound / (norms + 1e-12)).clamp(max=1.0)
    return torch.where(torch.isfinite(norms), scale, torch.zeros_like(scale))


def weighted_sum(scale: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """sum_i scale_i g_i over the examples of ``g`` [B, *shape]; an example with factor 0 adds
    exactly 0 even where its gradient is NaN or infinite."""
    return torch.einsum("b,b...->...", scale, _zero_rows(g, scale == 0))


def finite_sum(losses: torch.Tensor) -> float:
    """The summed loss over the examples whose loss is finite (the reported training loss)."""
    flat = losses.reshape(-1)
    total = float(flat.sum())  # finite only if every loss is: then it is the sum asked for
    # otherwise a loss is not finite, or finite float32 losses overflowed their float32 sum
    return total if math.isfinite(total) else float(flat[torch.isfinite(flat)].double().sum())


def _closed_form(loss_fn: LossFn, out: object, y: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(per-example losses, d sum(losses) / d out) from the loss's own closed form
    (``loss_fn.value_and_grad``, e.g. ``fl_core.models.per_example_classification_loss``), or
    None where the loss has none, the output is not one tensor, or the closed form refuses these
    values (autograd through ``loss_fn`` then decides). The probe checks the result against
    autograd through ``loss_fn`` itself; a wrong derivative there takes the model off this path."""
    value_and_grad = getattr(loss_fn, "value_and_grad", None)
    if value_and_grad is None or not isinstance(out, torch.Tensor):
        return None
    try:
        losses, grad = value_and_grad(out.detach(), y)
    except (IndexError, RuntimeError, TypeError, ValueError):
        return None
    if not (isinstance(grad, torch.Tensor) and grad.shape == out.shape and grad.dtype == out.dtype
            and isinstance(losses, torch.Tensor) and losses.shape[:1] == out.shape[:1]):
        return None
    return losses, grad


def _zero_rows(t: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """``t`` [B, ...] with the examples where ``rows`` [B] is True set to 0."""
    if not bool(rows.any()):
        return t
    return t.masked_fill(rows.reshape(-1, *([1] * (t.dim() - 1))), 0.0)


def _close(got: torch.Tensor, want: torch.Tensor, rtol: float) -> bool:
    """Equal up to ``rtol`` relative to the larger finite magnitude of ``want`` (and at least 1e-2
    times ``rtol``); non-finite entries must be in the same places with the same values (NaN with
    NaN), and never raise (a crafted model's NaN is a value to compare, not an error)."""
    if got.shape != want.shape:
        return False
    got_ok, want_ok = torch.isfinite(got), torch.isfinite(want)
    if not torch.equal(got_ok, want_ok):
        return False
    if not bool(want_ok.all()):
        odd_got, odd_want = got[~want_ok], want[~want_ok]
        if not torch.equal(torch.isnan(odd_got), torch.isnan(odd_want)) or not torch.equal(
                torch.nan_to_num(odd_got), torch.nan_to_num(odd_want)):
            return False
        got, want = got[want_ok], want[want_ok]
    scale = max(float(want.abs().max()) if want.numel() else 0.0, 1e-2)
    return bool(torch.allclose(got, want, rtol=rtol, atol=rtol * scale))
