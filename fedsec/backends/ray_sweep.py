"""A sweep's experiments in parallel: one Ray task per run, results as they finish."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import Any

from fedsec.backends.session import BackendError, connect
from fedsec.config import ExperimentConfig, SimConfig


def _run_one(config: ExperimentConfig) -> dict[str, Any]:
    from fedsec.experiment import run_experiment

    return run_experiment(config)


def run_parallel(configs: Sequence[ExperimentConfig], *, sim: SimConfig
                 ) -> Iterator[tuple[int, dict[str, Any]]]:
    """Run every configuration as one Ray task of ``sim.cpus_per_client`` CPUs (each run itself on
    the local backend, in its worker) on the cluster ``sim`` names; yield ``(index, summary)`` as
    each run finishes. A run whose worker dies is re-run (up to twice: it writes nothing); a run
    that fails raises its error here; unfinished runs are cancelled when the caller stops."""
    ray = connect(address=sim.address, num_cpus=sim.num_cpus)
    task = ray.remote(num_cpus=sim.cpus_per_client, max_retries=2)(_run_one)
    refs = {task.remote(replace(config, sim=SimConfig())): index for index, config in enumerate(configs)}
    try:
        while refs:
            done, _ = ray.wait(list(refs), num_returns=1)
            for ref in done:
                index = refs.pop(ref)
                try:
                    summary = ray.get(ref)
                except ray.exceptions.RayTaskError as error:
                    raise error.as_instanceof_cause() from None
                except ray.exceptions.RayError as error:
                    raise BackendError(f"sweep run {index} was lost: {type(error).__name__}") from None
                yield index, summary
    finally:
        for ref in refs:
            ray.cancel(ref, force=True)
