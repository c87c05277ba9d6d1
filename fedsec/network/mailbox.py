"""The coordinator's side of the sites' long poll: one queue of jobs per site, answers by job id.

Sites dial out (hospital firewalls allow outbound connections only), so the coordinator never
calls a site: it puts a job in the site's mailbox and the site picks it up with a ``poll`` call
(held open up to ``poll_wait`` seconds when the mailbox is empty) and returns its answer with an
``answer`` call. :meth:`Mailboxes.exchange` posts one job to each of several sites and waits
until all have answered or the stage deadline passes; a job not answered in time is withdrawn
(an answer that arrives later is refused as unknown) and the site is a dropout for that stage.

One lock guards everything; each site's poll waits on its own condition and the exchanges on
another, so a job or an answer wakes only the thread that waits for it (with one condition for
all, every answer woke every site's poll thread: a herd of wake-ups per stage on few cores). An
exchange is woken once, by the last of its jobs' answers (or by a withdrawal, a reconnection or
the closing), not by each answer: one wake-up of the coordinator's main thread per stage instead
of one per site.
"""

from __future__ import annotations

import itertools
import secrets
import threading
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Posted:
    """Jobs posted by :meth:`Mailboxes.send`: ``{site: (job id, payload)}`` and the monotonic time
    their answers are waited for until."""

    jobs: dict[str, tuple[int, bytes]]
    end: float


class Mailboxes:
    """Per-site job queues and the answers to them (thread-safe).

    Args:
        names: the roster (site names).
    """

    def __init__(self, names: tuple[str, ...]) -> None:
        self.names = frozenset(names)
        lock = threading.RLock()
        self._cond = threading.Condition(lock)
        """The exchanges wait on it (answers); each site's poll on its own in ``_site_cond``."""
        self._site_cond = {n: threading.Condition(lock) for n in names}
        self._queues: dict[str, deque[tuple[int, bytes]]] = {n: deque() for n in names}
        self._pending: dict[int, str] = {}
        self._answers: dict[int, bytes] = {}
        self._outstanding: dict[int, set[int]] = {}
        """``job -> the jobs of its exchange not answered yet`` (one set shared by an exchange's jobs)."""
        # a random 40-bit start: job ids differ between coordinator incarnations, so an answer to a
        # job of a killed coordinator never matches a job of the one that resumed the run
        self._ids = itertools.count(secrets.randbelow(2**40) + 1)
        self._closed = False

    def next_id(self) -> int:
        with self._cond:
            return next(self._ids)

    def poll(self, name: str, wait: float) -> tuple[int, bytes] | None:
        """The next job for ``name`` (its id and payload), waiting up to ``wait`` seconds; None if
        there is none (or the mailboxes are closed)."""
        end = time.monotonic() + wait
        with self._cond:
            while not self._queues[name] and not self._closed:
                left = end - time.monotonic()
                if left <= 0:
                    return None
                self._site_cond[name].wait(left)
            return self._queues[name].popleft() if self._queues[name] else None

    def answer(self, name: str, job: int, payload: bytes) -> bool:
        """Record ``name``'s answer to ``job``; False for a job that is not pending for ``name``
        (withdrawn after its deadline, already answered, or another site's)."""
        with self._cond:
            if self._pending.get(job) != name:
                return False
            del self._pending[job]
            self._answers[job] = payload
            outstanding = self._outstanding.pop(job, set())
            outstanding.discard(job)
            if not outstanding:  # the last answer its exchange waits for
                self._cond.notify_all()
            return True

    def exchange(self, jobs: Mapping[str, tuple[int, bytes]], deadline: float) -> dict[str, bytes]:
        """Post ``{site: (job id, payload)}`` and return ``{site: answer}`` of those that answered
        within ``deadline`` seconds; the others' jobs are withdrawn."""
        return self.collect(self.send(jobs, deadline))

    def send(self, jobs: Mapping[str, tuple[int, bytes]], deadline: float) -> Posted:
        """Post ``{site: (job id, payload)}`` without waiting: :meth:`collect` waits for the
        answers, until ``deadline`` seconds after now."""
        with self._cond:
            waiting = {job for job, _ in jobs.values()}
            outstanding = set(waiting)
            for name, (job, payload) in jobs.items():
                self._queues[name].append((job, payload))
                self._pending[job] = name
                self._outstanding[job] = outstanding
                self._site_cond[name].notify_all()
        return Posted(dict(jobs), time.monotonic() + deadline)

    def collect(self, posted: Posted) -> dict[str, bytes]:
        """``{site: answer}`` of the jobs :meth:`send` posted that were answered before its
        deadline (waiting for them until then); the others' jobs are withdrawn."""
        jobs, end = posted.jobs, posted.end
        with self._cond:
            waiting = {job for job, _ in jobs.values()}
            while waiting & set(self._pending) and not self._closed:
                left = end - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            for job in waiting:
                self._outstanding.pop(job, None)
            out = {}
            for name, (job, _) in jobs.items():
                if job in self._answers:
                    out[name] = self._answers.pop(job)
                else:
                    self._pending.pop(job, None)
                    self._queues[name] = deque(j for j in self._queues[name] if j[0] != job)
            return out

    def post(self, name: str, job: int, payload: bytes) -> None:
        """Queue a job that needs no answer (e.g. the end of the run)."""
        with self._cond:
            self._queues[name].append((job, payload))
            self._site_cond[name].notify_all()

    def queued(self, name: str) -> int:
        """Jobs waiting for ``name`` to poll them."""
        with self._cond:
            return len(self._queues[name])

    def clear(self, name: str) -> None:
        """Withdraw ``name``'s jobs, queued or already delivered (it reconnected: it starts afresh
        with the next job, and an exchange waiting on one of its old jobs ends without it now
        rather than at the stage deadline)."""
        with self._cond:
            for job in [j for j, owner in self._pending.items() if owner == name]:
                del self._pending[job]
                self._outstanding.pop(job, set()).discard(job)  # its exchange no longer waits for it
            self._queues[name].clear()
            self._cond.notify_all()
            self._site_cond[name].notify_all()

    def close(self) -> None:
        """Wake every waiter; polls return None from now on once the queues are empty."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            for condition in self._site_cond.values():
                condition.notify_all()
