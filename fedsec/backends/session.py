"""Connecting to Ray: start a local instance or join a cluster, with one-line failures."""

from __future__ import annotations

import importlib.util
import logging
import warnings
from types import ModuleType

from fedsec.errors import ConfigError
from fedsec.fl_core.errors import FLError

INSTALL_HINT = "pip install 'fedsec[ray]'"


class BackendError(FLError):
    """The simulation backend failed at run time (Ray did not start, or the cluster went away);
    the message is one line."""


def ray_available() -> bool:
    """Whether the ``ray`` package can be imported (without importing it)."""
    try:
        return importlib.util.find_spec("ray") is not None
    except (ImportError, ValueError):
        return False


def connect(*, address: str = "", num_cpus: int = 0) -> ModuleType:
    """The ``ray`` module, connected: a Ray already initialised in this process is used as it is;
    otherwise ``address`` ``""`` starts a local Ray of ``num_cpus`` CPUs (0 = all of this machine)
    without a dashboard, and ``"auto"`` or ``"ray://HOST:PORT"`` joins that cluster.

    Raises:
        ConfigError: (key ``sim.backend``) the ray package is not installed.
        BackendError: Ray did not start or the cluster could not be reached (one line).
    """
    try:
        import ray
    except ImportError:
        raise ConfigError("sim.backend", f"'ray' needs the ray package, which is not installed: "
                                         f"{INSTALL_HINT}") from None
    if ray.is_initialized():
        return ray
    where = "a local Ray" if not address else f"the Ray cluster at {address!r}"
    options = {"address": address or "local", "include_dashboard": False,
               "logging_level": logging.ERROR, "log_to_driver": False}
    if not address:
        options["num_cpus"] = num_cpus or None
    try:
        with warnings.catch_warnings():  # Ray's own multi-line warnings: the one line below says it
            warnings.simplefilter("ignore")
            ray.init(**options)
    except Exception as error:  # Ray raises many kinds (ConnectionError, RuntimeError, ...)
        detail = " ".join(str(error).split())[:300] or type(error).__name__
        raise BackendError(f"could not start or join {where}: {type(error).__name__}: {detail}") from None
    return ray
