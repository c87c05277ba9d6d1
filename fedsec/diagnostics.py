"""A pre-flight check of a private run: is the calibrated noise so large that learning is hopeless?

The heuristic compares, over the whole run, the L2 norm of the DP noise in the global model with
the largest possible norm of the signal, both in units of the clip norm C:

- DP-SGD (example level): each of the ``s`` local steps of a client adds Gaussian noise of
  standard deviation ``sigma * C / B`` per coordinate to a mean of clipped gradients whose norm is
  at most ``C``. Over ``s`` steps the signal adds up coherently (at most ``s C``) while the noise
  adds up in quadrature (``sqrt(s d) sigma C / B`` for ``d`` parameters); averaging ``m`` clients
  divides the noise by a further ``sqrt(m)``. One round: ``sigma sqrt(d) / (B sqrt(s m))``.
- Client level: the sum of ``m`` clipped updates (at most ``m C``) carries noise of norm
  ``sigma C sqrt(d)``. One round: ``sigma sqrt(d) / m``.
- Over ``R`` rounds the signal again adds up coherently and the noise in quadrature: the run's
  ratio is the round's divided by ``sqrt(R)``.

The ratio is optimistic for learning (real gradients are shorter than C and turn between steps),
so a ratio above :data:`HOPELESS_RATIO` means the noise swamps the signal. The threshold was set
on the bundled data sets (``docs/configuration.md`` lists the measurements): the default
breast-cancer run (ratio 0.03 at epsilon 3, 0.16 at epsilon 0.5) reaches 0.90-0.96 accuracy,
while epsilon 0.1 (ratio 0.72) ends at 0.65, the majority-class rate, and the digits CNN of
issue 12 (ratio 0.69) at 0.19.
"""

from __future__ import annotations

import math

HOPELESS_RATIO = 0.6
"""Noise-to-signal ratio of a whole run above which a warning is given."""


def noise_to_signal(*, mode: str, noise_multiplier: float, n_parameters: int, clients_per_round: int,
                    rounds: int, batch_size: float = 1.0, local_steps: int = 1) -> float:
    """The noise-to-signal ratio of a run's global model (module docstring).

    Args:
        mode: ``dpsgd`` or ``client``.
        noise_multiplier: sigma, >= 0.
        n_parameters: d, the model's trainable parameter count, >= 1.
        clients_per_round: m, >= 1.
        rounds: R, >= 1.
        batch_size: B, the expected local batch size in examples, > 0 (DP-SGD only).
        local_steps: s, local DP-SGD steps per round, >= 1 (DP-SGD only).
    """
    if mode not in ("dpsgd", "client"):
        raise ValueError(f"mode must be 'dpsgd' or 'client', got {mode!r}")
    if noise_multiplier < 0 or n_parameters < 1 or clients_per_round < 1 or rounds < 1:
        raise ValueError("noise_multiplier must be >= 0; n_parameters, clients_per_round and rounds "
                         ">= 1")
    if batch_size <= 0 or local_steps < 1:
        raise ValueError(f"batch_size must be > 0 and local_steps >= 1, got {batch_size}, {local_steps}")
    root_d = math.sqrt(n_parameters)
    if mode == "client":
        per_round = noise_multiplier * root_d / clients_per_round
    else:
        per_round = noise_multiplier * root_d / (batch_size * math.sqrt(local_steps * clients_per_round))
    return per_round / math.sqrt(rounds)


def hopeless_noise_warning(ratio: float, *, noise_multiplier: float) -> str | None:
    """The one-line warning for ``ratio`` above :data:`HOPELESS_RATIO`, else None."""
    if ratio <= HOPELESS_RATIO:
        return None
    return (f"noise multiplier {noise_multiplier:.3g} gives a noise-to-signal ratio of {ratio:.3g} "
            f"(> {HOPELESS_RATIO:g}): the noise swamps learning; raise dp.target_epsilon, "
            f"data.clients or train.batch_size, or use a smaller model")
