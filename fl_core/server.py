"""The server round loop: sample, collect client updates, aggregate through the seam, apply."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import numpy as np
from fedsec.fl_core.aggregation import AggregationProtocol, ClientUpdate
from fedsec.fl_core.client import Strategy
from fedsec.fl_core.data import ArrayDataset, FederatedDataset
from fedsec.fl_core.errors import AggregationError, InvalidParameterError
from fedsec.fl_core.execution import ClientFailure, ClientRunner, ClientTask, InProcessRunner
from fedsec.fl_core.history import ResumePoint, RoundObserver, RoundRecord, TrainingResult
from fedsec.fl_core.interrupts import deferred_interrupt
from fedsec.fl_core.models import evaluate
from fedsec.fl_core.parameters import get_vector, set_vector
from fedsec.fl_core.standardize import apply_standardization, federated_moments
from torch import nn


def clients_per_round(fraction: float, n_clients: int) -> int:
    """m = max(floor(C * K), 1) clients sampled per round."""
    return max(int(fraction * n_clients + 1e-9), 1)


def draw_round(rng: np.random.Generator, n_clients: int, m: int) -> tuple[np.ndarray, np.ndarray]:
    """A round's draws from the run generator, in order: the ``m`` sampled clients of
    ``n_clients`` (sorted, without replacement) and one training seed each (in [0, 2**63 - 1)).
    What :meth:`FederatedServer._round` draws first (a backend that prepares the next round ahead
    draws the same from a copy of the generator)."""
    selected = np.sort(rng.choice(n_clients, size=m, replace=False))
    seeds = rng.integers(0, 2**63 - 1, size=m)
    return selected, seeds


class FederatedServer:
    """Runs federated training in simulation over one :class:`FederatedDataset`.

    Args:
        model: the torch model; its current weights are the initial global model.
        data: the clients' training data and the global test split.
        strategy: FedAvg or FedSGD (what clients send, how the server applies it).
        protocol: the aggregation protocol behind the seam.
        rounds: maximum number of rounds, >= 1.
        fraction: C in (0, 1], the share of clients sampled each round.
        rng: the run's seeded generator (client sampling and local shuffling draw from it).
        target_accuracy: stop once test accuracy reaches it; None (or 0) = never.
        stop_tol: stop once the global update's L2 norm falls below it; 0 = never.
        observers: round observers, called in order (history, accountant, audit, progress).
        max_consecutive_aborts: stop after this many rounds in a row without a sum, >= 1.
        evaluator: ``(model, test) -> {"accuracy", "loss", ...}`` after every round (e.g.
            :class:`fl_core.metrics.Evaluator`); its other values go to the round's metrics.
            None = accuracy and loss of :func:`fl_core.models.evaluate`.
        runner: where the clients' local updates run (:mod:`fl_core.execution`); None = one after
            another in this process. A client that fails there (not finite, worker lost) sends no
            update and is counted in the round's ``failed_clients``.
    """

    def __init__(
        self,
        *,
        model: nn.Module,
        data: FederatedDataset,
        strategy: Strategy,
        protocol: AggregationProtocol,
        rounds: int,
        fraction: float = 1.0,
        rng: np.random.Generator,
        target_accuracy: float | None = None,
        stop_tol: float = 0.0,
        observers: Sequence[RoundObserver] = (),
        max_consecutive_aborts: int = 3,
        evaluator: Callable[[nn.Module, ArrayDataset], dict[str, float]] | None = None,
        runner: ClientRunner | None = None,
    ) -> None:
        if rounds < 1:
            raise InvalidParameterError(f"rounds must be >= 1, got {rounds}")
        if not 0.0 < fraction <= 1.0:
            raise InvalidParameterError(f"fraction must be in (0, 1], got {fraction}")
        if target_accuracy is not None and not 0.0 <= target_accuracy <= 1.0:
            raise InvalidParameterError(f"target_accuracy must be in [0, 1], got {target_accuracy}")
        if stop_tol < 0:
            raise InvalidParameterError(f"stop_tol must be >= 0, got {stop_tol}")
        if max_consecutive_aborts < 1:
            raise InvalidParameterError(
                f"max_consecutive_aborts must be >= 1, got {max_consecutive_aborts}"
            )
        self.model = model
        self.data = data
        self.strategy = strategy
        self.protocol = protocol
        self.rounds = rounds
        self.fraction = fraction
        self.rng = rng
        self.target_accuracy = target_accuracy or None
        self.stop_tol = stop_tol
        self.observers = list(observers)
        self.max_consecutive_aborts = max_consecutive_aborts
        self.setup_upload_bytes = 0
        self.evaluator = evaluator
        self.runner = runner if runner is not None else InProcessRunner()
        self._prepared = False

    def prepare_data(self) -> None:
        """Standardise features with federation-wide statistics if the data set asks for it (once;
        later calls do nothing)."""
        if self._prepared:
            return
        self._prepared = True
        if self.data.standardize:
            mean, std, upload = federated_moments(self.data, self.protocol)
            self.data = apply_standardization(self.data, mean, std)
            self.setup_upload_bytes += upload

    def run(self, *, resume: ResumePoint | None = None) -> TrainingResult:
        """Train until a stop condition holds and return the result.

        ``resume`` continues a checkpointed run after its last completed round (the caller has
        restored the generators, ledgers and optimiser state that go with it). Ctrl-C
        (KeyboardInterrupt) ends the loop with stop reason ``interrupted``: the round in flight
        is dropped and the result holds the rounds done.
        """
        self.prepare_data()
        k = self.data.n_clients
        m = clients_per_round(self.fraction, k)
        for observer in self.observers:
            observer.on_start(n_clients=k, clients_per_round=m, rounds=self.rounds)
        vector = get_vector(self.model)
        records: list[RoundRecord] = []
        rounds_to_target: int | None = None
        stop_reason = "rounds"
        aborts_in_a_row, first = 0, 1
        if resume is not None:
            vector, records = resume.vector.copy(), list(resume.records)
            aborts_in_a_row, first = resume.aborts_in_a_row, resume.round + 1
            for observer in self.observers:
                observer.on_resume(resume)
        self.runner.start(model=self.model, strategy=self.strategy, data=self.data)
        try:
            for round_index in range(first, self.rounds + 1):
                veto = next(
                    (r for o in self.observers if (r := o.before_round(round_index)) is not None), None
                )
                if veto is not None:
                    stop_reason = veto
                    break
                record, new_vector = self._round(round_index, vector, m)
                with deferred_interrupt():  # Ctrl-C waits until the round is wholly committed
                    for observer in self.observers:
                        observer.after_round(record)
                    # committed only once every observer (the privacy ledger first) has seen it
                    records.append(record)
                    vector = new_vector
                aborts_in_a_row = aborts_in_a_row + 1 if record.status != "ok" else 0
                if self.target_accuracy is not None and record.accuracy >= self.target_accuracy:
                    rounds_to_target = round_index
                    stop_reason = "target_accuracy"
                    break
                if record.status == "ok" and record.update_norm < self.stop_tol:
                    stop_reason = "stop_tol"
                    break
                if aborts_in_a_row >= self.max_consecutive_aborts:
                    stop_reason = "aborts"
                    break
        except KeyboardInterrupt:
            stop_reason = "interrupted"
        finally:
            self.runner.stop()
        set_vector(self.model, vector)
        result = TrainingResult(vector, records, rounds_to_target, stop_reason)
        for observer in self.observers:
            observer.on_finish(result)
        return result

    def _round(self, round_index: int, vector: np.ndarray, m: int) -> tuple[RoundRecord, np.ndarray]:
        start = time.perf_counter()
        selected, seeds = draw_round(self.rng, self.data.n_clients, m)
        updates, losses, failed = [], [], 0
        report_loss = "train_loss" in self.protocol.client_metrics
        tasks = [ClientTask(c, s) for c, s in zip(selected.tolist(), seeds.tolist(), strict=True)]
        for task, local in zip(tasks, self.runner.run(vector, tasks), strict=True):
            if isinstance(local, ClientFailure):
                failed += 1
                continue
            updates.append(ClientUpdate(task.client_id, local.vector, float(local.weight)))
            if report_loss and local.loss is not None:
                losses.append(local.loss)
        status, participants, upload, norm = "ok", 0, 0, 0.0
        metrics: dict[str, float] = {"failed_clients": float(failed)}
        try:
            aggregate = self.protocol.aggregate(round_index, updates)
            average = aggregate.average()
            if average.shape != vector.shape:
                raise AggregationError(f"the released average has {average.size} values, the "
                                       f"model {vector.size}")
        except AggregationError as error:
            status = f"aborted: {error}"
        else:
            new_vector = self.strategy.apply(vector, average)
            # numpy's own pairwise sum, not BLAS (np.linalg.norm's dot): BLAS would start its thread
            # pool here, whose threads spin after every call, taking CPU from the clients' workers
            step = new_vector.astype(np.float64) - vector
            norm = float(np.sqrt(np.sum(step * step)))
            vector = new_vector
            participants = len(aggregate.participants)
            upload = aggregate.upload_bytes
            metrics.update(aggregate.metrics)
        set_vector(self.model, vector)
        if self.evaluator is None:
            accuracy, loss = evaluate(self.model, self.data.test.x, self.data.test.y)
        else:
            scores = dict(self.evaluator(self.model, self.data.test))
            accuracy, loss = scores.pop("accuracy"), scores.pop("loss")
            metrics.update(scores)
        record = RoundRecord(
            round=round_index,
            accuracy=accuracy,
            loss=loss,
            train_loss=float(np.mean(losses)) if losses else float("nan"),
            participants=participants,
            dropped=m - participants,
            upload_bytes=upload,
            seconds=time.perf_counter() - start,
            update_norm=norm,
            status=status,
            metrics=metrics,
        )
        return record, vector
