"""Where the clients' local updates run: the seam between the server loop and its workers.

:class:`FederatedServer` hands each round's sampled clients to a :class:`ClientRunner` and gets
back, in the same order, each client's :class:`~fl_core.client.LocalResult` or a
:class:`ClientFailure` (a client that sends nothing this round: its update was not finite, or the
worker it ran on was lost). :class:`InProcessRunner`, the default, runs them one after another in
the server's own process exactly as the loop always did. Other runners (a Ray cluster, see
``fedsec.backends``) live above ``fl_core``; ``fl_core`` knows none of them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
from fedsec.fl_core.client import LocalResult, Strategy
from fedsec.fl_core.data import FederatedDataset
from fedsec.fl_core.errors import NonFiniteError
from torch import nn


@dataclass(frozen=True)
class ClientTask:
    """One sampled client's work in a round.

    Attributes:
        client_id: its index in the federation's clients, in [0, n_clients).
        seed: seeds the ``numpy.random.Generator`` of its local shuffling, in [0, 2**63).
    """

    client_id: int
    seed: int


@dataclass(frozen=True)
class ClientFailure:
    """A sampled client that sends no update this round (it drops out before the protocol).

    Attributes:
        client_id: the client.
        reason: ``non-finite`` (its local result was not finite) or ``lost: ...`` (the worker it
            ran on died or could not be reached).
    """

    client_id: int
    reason: str


Outcome = LocalResult | ClientFailure
"""What one task gives back."""


class ClientRunner(ABC):
    """Runs the clients' local updates for the server loop.

    The server calls :meth:`start` once before its first round (after the data are prepared),
    :meth:`run` once a round and :meth:`stop` when its loop ends, also after a failure.
    """

    @abstractmethod
    def start(self, *, model: nn.Module, strategy: Strategy, data: FederatedDataset) -> None:
        """Take the model (its architecture; weights come with every round), the strategy and
        the clients' data."""

    @abstractmethod
    def run(self, vector: np.ndarray, tasks: Sequence[ClientTask]) -> Iterator[Outcome]:
        """Run ``strategy.client_update`` from the global ``vector`` for every task; yield one
        outcome per task, in the order of ``tasks``."""

    def stop(self) -> None:
        """Release what :meth:`start` acquired (nothing by default)."""


class InProcessRunner(ClientRunner):
    """Runs every client in the server's process, one after another, on the server's own model
    object: the loop's behaviour before runners existed, byte for byte."""

    def __init__(self) -> None:
        self._model: nn.Module | None = None
        self._strategy: Strategy | None = None
        self._data: FederatedDataset | None = None

    def start(self, *, model: nn.Module, strategy: Strategy, data: FederatedDataset) -> None:
        self._model, self._strategy, self._data = model, strategy, data

    def run(self, vector: np.ndarray, tasks: Sequence[ClientTask]) -> Iterator[Outcome]:
        if self._model is None or self._strategy is None or self._data is None:
            raise RuntimeError("InProcessRunner.run before start")
        for task in tasks:
            try:
                yield self._strategy.client_update(self._model, vector, self._data.clients[task.client_id],
                                                   rng=np.random.default_rng(task.seed))
            except NonFiniteError:
                yield ClientFailure(task.client_id, "non-finite")
