"""Model buffers (BatchNorm running statistics and the like) in federated training.

The global model is the flat vector of ``model.parameters()``; a buffer is not in it, so after a
round it would keep whatever the last client to train left in it. That is never allowed: a
model's floating-point buffers are either federated (turned into non-trainable parameters for the
duration of training, so every client's running statistics enter the weighted average like the
weights do) or the model is refused. Integer buffers cannot be averaged; the one tolerated is
BatchNorm's ``num_batches_tracked`` when the layer has a fixed ``momentum`` (the counter is
then never read).
"""

from __future__ import annotations

from fedsec.fl_core.errors import InvalidParameterError
from torch import nn

BUFFER_POLICIES = ("federate", "refuse")
_MARK = "_fedsec_federated_buffers"


def _ignorable(module: nn.Module, name: str) -> bool:
    return (name == "num_batches_tracked" and isinstance(module, nn.modules.batchnorm._BatchNorm)
            and module.momentum is not None)


def buffer_names(model: nn.Module) -> list[str]:
    """Qualified names of the buffers that would matter in federated training."""
    return [f"{prefix}.{name}" if prefix else name
            for prefix, module in model.named_modules()
            for name, buffer in module._buffers.items()
            if buffer is not None and not _ignorable(module, name)]


def federate_buffers(model: nn.Module, *, policy: str = "federate") -> list[str]:
    """Make ``model``'s floating buffers non-trainable parameters, in place; return their names.

    Raises:
        InvalidParameterError: ``policy`` is ``refuse`` and the model has buffers, or a buffer
            holds integers (it cannot be averaged), naming it.
    """
    if policy not in BUFFER_POLICIES:
        raise InvalidParameterError(f"buffers must be one of {BUFFER_POLICIES}, got {policy!r}")
    names = buffer_names(model)
    if names and policy == "refuse":
        raise InvalidParameterError(
            f"the model has buffers {names}, which federated averaging would leave at the last "
            "client's values: use buffers='federate', or a model without them (e.g. GroupNorm "
            "or LayerNorm instead of BatchNorm, or track_running_stats=False)")
    done: list[str] = []
    for prefix, module in model.named_modules():
        for name, buffer in list(module._buffers.items()):
            if buffer is None or _ignorable(module, name):
                continue
            qualified = f"{prefix}.{name}" if prefix else name
            if not buffer.is_floating_point():
                raise InvalidParameterError(
                    f"buffer {qualified!r} holds {buffer.dtype} values, which cannot be "
                    "averaged across clients; remove it from the model")
            del module._buffers[name]
            module.register_parameter(name, nn.Parameter(buffer.detach().clone(),
                                                         requires_grad=False))
            done.append(qualified)
    setattr(model, _MARK, tuple(done))
    return done


def restore_buffers(model: nn.Module) -> None:
    """Undo :func:`federate_buffers`: the federated values become ordinary buffers again."""
    for qualified in getattr(model, _MARK, ()):
        prefix, _, name = qualified.rpartition(".")
        module = model.get_submodule(prefix) if prefix else model
        value = module._parameters.pop(name)
        module.register_buffer(name, value.detach().clone())
    if hasattr(model, _MARK):
        delattr(model, _MARK)
