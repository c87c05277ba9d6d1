"""fedsec: the face of the toolkit (CLI, TOML configuration, experiment runner, plots)."""

__version__ = "0.1.0"

from fedsec.config import ExperimentConfig, load_config, make_config  # noqa: E402
from fedsec.errors import ConfigError  # noqa: E402

__all__ = ["ConfigError", "ExperimentConfig", "__version__", "load_config", "make_config",
           "run_experiment"]


def run_experiment(config: ExperimentConfig, **kwargs):  # type: ignore[no-untyped-def]
    """Run one experiment (see :func:`fedsec.experiment.run_experiment`)."""
    from fedsec.experiment import run_experiment as _run

    return _run(config, **kwargs)
