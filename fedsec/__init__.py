"""fedsec: the face of the toolkit (CLI, TOML configuration, experiment runner, plots)."""

__version__ = "0.1.0"

from fedsec.config import ExperimentConfig, load_config, make_config  # noqa: E402
from fedsec.errors import ConfigError  # noqa: E402

__all__ = ["DP", "ConfigError", "ExperimentConfig", "Federation", "FederationResult", "__version__",
           "load_config", "make_config", "run_experiment"]


def run_experiment(config: ExperimentConfig, **kwargs):  # type: ignore[no-untyped-def]
    """Run one experiment (see :func:`fedsec.experiment.run_experiment`)."""
    from fedsec.experiment import run_experiment as _run

    return _run(config, **kwargs)


def __getattr__(name: str):  # type: ignore[no-untyped-def]
    """``fedsec.Federation``, ``fedsec.FederationResult`` and ``fedsec.DP``, imported on first use
    (they pull in torch and the protocols, which the CLI's ``--help`` does not need)."""
    if name in ("Federation", "FederationResult"):
        from fedsec import federation

        return getattr(federation, name)
    if name == "DP":
        from fedsec.dp_spec import DP

        return DP
    raise AttributeError(f"module 'fedsec' has no attribute {name!r}")
