"""Connecting to Ray: start a local instance or join a cluster, with one-line failures."""

from __future__ import annotations

import importlib.util
import logging
import warnings
from types import ModuleType

from fedsec.errors import ConfigError
from fedsec.fl_core.errors import FLError

INSTALL_HINT = "pip install 'fedsec[ray]'"

LOCAL_START_ATTEMPTS = 2
"""Times a local Ray is started before giving up: on a loaded machine its node can miss Ray's 30 s
wait for the raylet to register (seen once in a full test run on 2 cores: "The current node timed
out during startup"); it is shut down and started once more. A cluster's address is tried once."""
INLINE_BYTES = 8 << 20
"""Largest object (bytes) a local Ray passes inside the call itself, not through its shared-memory
object store (Ray's default is 100 KiB). A round's arguments and replies (a worker's share of the
masking clients and their messages, a run of clients' updates) are hundreds of KiB; through the
object store each such call cost about 4 ms of CPU (the raylet, the driver and the worker; 600
calls of 200 KiB each way: 2.3 CPU s), inline about 1.3 ms (0.8 CPU s). Larger objects still go
through the store. A cluster joined with ``sim.address`` keeps its own setting."""

QUIET = {"task_events_report_interval_ms": 0, "event_stats": False, "enable_metrics_collection": False}
"""Ray's periodic bookkeeping that nothing here reads, off in a local Ray started for the run: the
task-event reports (the workers record none), the event-loop statistics and the metrics export
(there is no dashboard). Idle, a local Ray with two workers then takes about 0.03 CPU s a second
instead of about 0.04 (the workers' share of it 0.012 instead of 0.018); its daemons tick during
every round, for longer the longer a loaded machine makes the round."""


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
        options["_system_config"] = {"max_direct_call_object_size": INLINE_BYTES, **QUIET}
    attempts_left = LOCAL_START_ATTEMPTS if not address else 1
    while True:
        attempts_left -= 1
        try:
            with warnings.catch_warnings():  # Ray's own multi-line warnings: the one line below says it
                warnings.simplefilter("ignore")
                ray.init(**options)
            return ray
        except Exception as error:  # Ray raises many kinds (ConnectionError, RuntimeError, ...)
            if attempts_left > 0:  # a local node that missed its start-up wait: start it again
                ray.shutdown()
                continue
            detail = " ".join(str(error).split())[:300] or type(error).__name__
            raise BackendError(f"could not start or join {where}: {type(error).__name__}: {detail}") from None
