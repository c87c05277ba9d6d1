"""Per-example gradient clipping: the sum over a batch of each example's gradient scaled to an L2
norm of at most C, as DP-SGD needs it.

Fast path (every trainable parameter in ``nn.Linear`` layers fed 2-D inputs or ``nn.Conv2d``
layers, each layer used once per forward pass, no parameter held by two modules): one forward
pass records each layer's input, one backward pass asks autograd only for the gradients of the
layers' outputs (no weight gradients), and the per-example norms come from those two factors:

- Linear: ||g_i||^2 = ||a_i||^2 ||d_i||^2 + ||d_i||^2 (weight and bias), a closed form, so a
  logistic regression costs about one plain step;
- Conv2d: with the unfolded input A_i (K x P) and output gradient D_i (C x P), either the
  per-example gradient D_i A_i^T when C K <= P^2, or the "ghost" norm
  sum((A_i^T A_i) * (D_i^T D_i)) otherwise.

The clipped sum is then one matrix product per layer, sum_i c_i D_i A_i^T with
c_i = min(1, C / ||g_i||). The closed forms hold for a parameter of one layer only: a parameter
shared by two modules (tied embeddings, tied layers) has a per-example gradient that is the sum of
both layers' terms, whose norm has cross terms, so such a model, like a layer run twice, takes the
Opacus path, which accumulates each parameter's per-sample gradient over every module using it.
Any other model goes through Opacus' per-sample gradients (``GradSampleModule``, hooks mode),
after Opacus' ``ModuleValidator`` has refused what DP-SGD cannot train (batch normalisation and
the like) with its own message.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import torch
from torch import nn
from torch.nn import functional as F

from dp.errors import UnsupportedModelError

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
        model: the model; checked with :func:`check_model`.
        max_grad_norm: C > 0, the per-example L2 bound.
    """

    def __init__(self, model: nn.Module, *, max_grad_norm: float) -> None:
        check_model(model)
        if not max_grad_norm > 0:
            raise UnsupportedModelError(f"max_grad_norm must be > 0, got {max_grad_norm}")
        self.model, self.max_grad_norm = model, float(max_grad_norm)
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.layers = _fast_layers(model)
        self.mode = "fast" if self.layers is not None else "opacus"
        self._records: list[tuple[nn.Module, torch.Tensor, torch.Tensor]] = []
        self._capturing = False
        if self.layers is not None:
            for layer in self.layers:
                layer.register_forward_hook(self._record)

    def _record(self, module: nn.Module, inputs: tuple, output: torch.Tensor) -> None:
        if torch.is_grad_enabled() and self._capturing:
            self._records.append((module, inputs[0].detach(), output))

    def clipped_sum(self, x: torch.Tensor, y: torch.Tensor, loss_fn: LossFn
                    ) -> tuple[list[torch.Tensor], float]:
        """(sum_i clip(grad_i) for each trainable parameter, summed loss) over the batch."""
        if x.shape[0] == 0:
            return [torch.zeros_like(p) for p in self.params], 0.0
        if self.mode == "fast":
            result = self._fast(x, y, loss_fn)
            if result is not None:
                return result
            self.mode = "opacus"  # a layer was used twice: tied weights need true per-example sums
        return self._opacus(x, y, loss_fn)

    def _fast(self, x, y, loss_fn):
        self._records.clear()
        self._capturing = True
        try:
            losses = loss_fn(self.model(x), y)
        finally:
            self._capturing = False
        records = self._records
        if len(records) != len(self.layers) or any(
                isinstance(m, nn.Linear) and a.dim() != 2 for m, a, _ in records):
            return None  # a layer ran twice (tied weights) or saw a sequence
        total = losses.sum()
        grads_out = torch.autograd.grad(total, [out for _, _, out in records])
        squared = None
        factors = []
        for (layer, a, _), d in zip(records, grads_out, strict=True):
            if isinstance(layer, nn.Linear):
                d_sq = (d * d).sum(1)
                term = (a * a).sum(1) * d_sq
                if layer.bias is not None:
                    term = term + d_sq
            else:
                cols = F.unfold(a, layer.kernel_size, padding=layer.padding, stride=layer.stride)
                flat = d.flatten(2)
                c_out, k, p = flat.shape[1], cols.shape[1], flat.shape[2]
                if c_out * k <= p * p:
                    per = torch.bmm(flat, cols.transpose(1, 2))
                    term = torch.einsum("bck,bck->b", per, per)
                else:
                    term = torch.einsum("bpq,bpq->b", torch.bmm(cols.transpose(1, 2), cols),
                                        torch.bmm(flat.transpose(1, 2), flat))
                if layer.bias is not None:
                    term = term + flat.sum(2).pow(2).sum(1)
            squared = term if squared is None else squared + term
            factors.append((layer, a, d))
        scale = (self.max_grad_norm * torch.rsqrt(squared + 1e-24)).clamp_(max=1.0)
        grads: dict[int, torch.Tensor] = {}
        for layer, a, d in factors:
            if isinstance(layer, nn.Linear):
                ds = d * scale[:, None]
                grads[id(layer.weight)] = ds.T @ a
                if layer.bias is not None:
                    grads[id(layer.bias)] = ds.sum(0)
            else:  # the batched weight gradient of the rescaled output gradients
                ds = d * scale[:, None, None, None]
                grads[id(layer.weight)] = torch.nn.grad.conv2d_weight(
                    a, layer.weight.shape, ds, stride=layer.stride, padding=layer.padding)
                if layer.bias is not None:
                    grads[id(layer.bias)] = ds.sum((0, 2, 3))
        return [grads[id(p)] for p in self.params], float(total.detach())

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
        norms = torch.stack([g.flatten(1).norm(dim=1) for g in samples], dim=1).norm(dim=1)
        scale = (self.max_grad_norm / (norms + 1e-12)).clamp(max=1.0)
        out = [torch.einsum("b,b...->...", scale, g) for g in samples]
        for p in self.params:
            p.grad, p.grad_sample = None, None
        return out, float(losses.detach().sum())
