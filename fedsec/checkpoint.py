"""Checkpoints of a ``fedsec run`` and what ``--resume`` needs to go on exactly where it stopped.

After every round :class:`CheckpointWriter` writes ``checkpoint.npz`` into the run directory
atomically (a temporary file in the same folder, fsync, ``os.replace``, fsync of the folder): a
kill at any instant leaves either the previous round's checkpoint or this one. It holds

* the global vector after the round and the optimiser state of the server (momentum, Adam
  moments) as arrays;
* in ``meta`` (JSON): the round, the history records, the numpy Generator's bit-generator state,
  the privacy ledgers (:meth:`PrivacyBudget.state_dict`), the DP noise streams' positions
  (:meth:`dp.noise.SecureRandom.state_dict`, only with ``dp.reproducible``: otherwise a resumed
  run draws fresh CSPRNG noise and nothing secret is written), the config's SHA-256, and
  ``extra``: the :class:`SavedState` entries of whoever runs the loop (the csv evaluator's own
  generator; a deployed coordinator's sites, noise position, site ledgers and byte counters).

It is read with ``allow_pickle=False``: a checkpoint is data, never code. The masking protocol
keeps no state across rounds but the run's Generator (session ids and keys are fresh per round);
what it draws from the Generator is restored with it.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fedsec.config import ExperimentConfig
from fedsec.errors import ConfigError
from fedsec.fl_core.history import ResumePoint, RoundObserver, RoundRecord

CHECKPOINT = "checkpoint.npz"
FORMAT = "fedsec-checkpoint-1"
RESUMABLE_ALGORITHMS = ("fedavg", "fedprox", "fedsgd")
RESUMABLE_AGGREGATIONS = ("none", "masking")
_OPTIMIZER_ARRAYS = ("m", "v")


def check_resumable(config: ExperimentConfig) -> None:
    """Refuse a configuration whose state a checkpoint does not hold.

    Raises:
        ConfigError: (naming the key) Paillier (its key holder's state belongs to a deployment),
            the methods with per-client state, or a robust section.
    """
    if config.train.algorithm not in RESUMABLE_ALGORITHMS:
        raise ConfigError("train.algorithm", f"--resume supports {', '.join(RESUMABLE_ALGORITHMS)}; "
                                             f"{config.train.algorithm!r} keeps per-client state")
    if config.secure.aggregation not in RESUMABLE_AGGREGATIONS:
        raise ConfigError("secure.aggregation", f"--resume supports {' and '.join(RESUMABLE_AGGREGATIONS)}"
                                                f"; Paillier's key holder state is a deployment's")
    if config.robust != type(config.robust)():
        raise ConfigError("robust", "--resume does not support the [robust] section")


def resumable(config: ExperimentConfig) -> bool:
    try:
        check_resumable(config)
    except ConfigError:
        return False
    return True


@dataclass(frozen=True)
class SavedState:
    """A named piece of run state a checkpoint carries besides the server loop's own.

    Attributes:
        name: its key in the checkpoint's ``extra`` (unique per run).
        get: returns the state as JSON-able data (called after every round).
        set: puts a value ``get`` returned back (called on ``--resume``).
    """

    name: str
    get: Callable[[], Any]
    set: Callable[[Any], None]


def generator_state(name: str, rng: np.random.Generator) -> SavedState:
    """The :class:`SavedState` of a numpy Generator's bit-generator state."""

    def put(state: Any) -> None:
        rng.bit_generator.state = state

    return SavedState(name, lambda: rng.bit_generator.state, put)


@dataclass
class Checkpoint:
    """A checkpoint as read back."""

    meta: dict[str, Any]
    arrays: dict[str, np.ndarray]

    def point(self) -> ResumePoint:
        records = [RoundRecord(**r) for r in self.meta["records"]]
        aborts = 0
        for record in reversed(records):
            if record.status == "ok":
                break
            aborts += 1
        return ResumePoint(int(self.meta["round"]), self.arrays["vector"], records, aborts)


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path``: temporary file, fsync, rename, fsync of the folder."""
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _optimizer(server: Any) -> Any:
    strategy = server.strategy
    strategy = getattr(strategy, "inner", strategy)
    return getattr(strategy, "server_optimizer", None)


class CheckpointWriter(RoundObserver):
    """Writes ``checkpoint.npz`` after every round (register it after the privacy budget)."""

    def __init__(self, directory: Path, *, config: ExperimentConfig, server: Any, history: Any,
                 privacy: Any, saved: tuple[SavedState, ...] = ()) -> None:
        self.directory, self.config, self.server = directory, config, server
        self.history, self.privacy, self.saved = history, privacy, tuple(saved)
        self.config_sha256 = config.sha256()
        """Computed once (the configuration is frozen): rendering it took 2.4 ms a round, on the
        deployed coordinator's path between two rounds."""

    def after_round(self, record: RoundRecord) -> None:
        from fedsec.fl_core.parameters import get_vector

        arrays = {"vector": get_vector(self.server.model)}
        optimizer = _optimizer(self.server)
        if optimizer is not None:
            for name in _OPTIMIZER_ARRAYS:
                value = getattr(optimizer, name, None)
                if value is not None:
                    arrays[f"optimizer_{name}"] = value
        meta = {
            "format": FORMAT, "round": record.round, "config_sha256": self.config_sha256,
            "records": [dataclasses.asdict(r) for r in self.history.records],
            "rng": self.server.rng.bit_generator.state,
            "ledger": self.privacy.budget.state_dict() if self.privacy is not None else None,
            "noise": ([r.state_dict() for r in self.privacy.randoms]
                      if self.privacy is not None and self.config.dp.reproducible else None),
            "extra": {entry.name: entry.get() for entry in self.saved},
        }
        buffer = io.BytesIO()
        np.savez(buffer, meta=np.array(json.dumps(meta)), **arrays)
        write_atomic(self.directory / CHECKPOINT, buffer.getvalue())


def carry_released_charges(directory: Path, privacy: Any) -> None:
    """After an interrupt: write the budget's current ledgers into the last checkpoint.

    A round interrupted after its aggregate was released is charged by the budget but never
    checkpointed; a resumed run re-runs (and charges) that round again, so without this the first
    release would be counted nowhere. With it the resumed run is over-charged by that release,
    never under-charged. Nothing happens without a checkpoint (an interrupt in round 1: nothing
    to resume) or without a privacy layer.
    """
    path = directory / CHECKPOINT
    if privacy is None or not path.is_file():
        return
    with np.load(path, allow_pickle=False) as data:
        arrays = {name: data[name] for name in data.files if name != "meta"}
        meta = json.loads(str(data["meta"]))
    meta["ledger"] = privacy.budget.state_dict()
    buffer = io.BytesIO()
    np.savez(buffer, meta=np.array(json.dumps(meta)), **arrays)
    write_atomic(path, buffer.getvalue())


def read_checkpoint(directory: Path) -> Checkpoint:
    """Read ``directory/checkpoint.npz``.

    Raises:
        ConfigError: (key ``--resume``) no checkpoint, or one this version cannot read.
    """
    path = directory / CHECKPOINT
    if not path.is_file():
        raise ConfigError("--resume", f"{directory} holds no {CHECKPOINT}")
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
        meta = json.loads(str(arrays.pop("meta")))
    except (OSError, ValueError, KeyError) as error:
        raise ConfigError("--resume", f"{path} is not a readable checkpoint ({error})") from None
    if meta.get("format") != FORMAT or "vector" not in arrays:
        raise ConfigError("--resume", f"{path} is not a {FORMAT} checkpoint")
    return Checkpoint(meta, arrays)


def restore(checkpoint: Checkpoint, *, server: Any, privacy: Any, reproducible: bool,
            saved: tuple[SavedState, ...] = ()) -> ResumePoint:
    """Put the server's generator, optimiser, ledgers, noise streams and the ``saved`` entries
    back; returns the point the loop continues from (call after
    :meth:`FederatedServer.prepare_data`).

    Raises:
        ConfigError: (key ``--resume``) the checkpoint lacks one of the ``saved`` entries.
    """
    from fedsec.fl_core.parameters import set_vector

    meta = checkpoint.meta
    server.rng.bit_generator.state = meta["rng"]
    optimizer = _optimizer(server)
    if optimizer is not None:
        for name in _OPTIMIZER_ARRAYS:
            if f"optimizer_{name}" in checkpoint.arrays:
                setattr(optimizer, name, checkpoint.arrays[f"optimizer_{name}"])
    if privacy is not None:
        privacy.budget.load_state_dict(meta["ledger"])
        if reproducible and meta.get("noise") is not None:
            for source, state in zip(privacy.randoms, meta["noise"], strict=True):
                source.load_state_dict(state)
    extra = meta.get("extra") or {}
    for entry in saved:
        if entry.name not in extra:
            raise ConfigError("--resume", f"the checkpoint holds no {entry.name!r}: it was written by "
                                          f"another version or kind of run")
        entry.set(extra[entry.name])
    point = checkpoint.point()
    set_vector(server.model, point.vector)
    return point


def find_run(out: str | Path) -> tuple[Path, bool]:
    """The folder ``--resume OUT`` continues: ``OUT`` itself if it holds a checkpoint (a run that
    was interrupted and published), else the newest staging folder ``.OUT.*.tmp`` beside it that
    does (a run killed before it could publish). Returns (folder, is_staging).

    Raises:
        ConfigError: (key ``--resume``) neither exists.
    """
    path = Path(out)
    if (path / CHECKPOINT).is_file():
        return path, False
    parent = path.absolute().parent
    staged = sorted((p for p in parent.glob(f".{path.name}.*.tmp") if (p / CHECKPOINT).is_file()),
                    key=lambda p: (p / CHECKPOINT).stat().st_mtime)
    if not staged:
        raise ConfigError("--resume", f"no checkpoint in {path} or in a staging folder beside it")
    return staged[-1], True
