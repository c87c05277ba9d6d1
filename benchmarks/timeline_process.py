"""Run ``python -m fedsec ARGS`` recording when each exchange and each job happened (wall clock).

    python -m benchmarks.timeline_process OUT.jsonl fedsec [ARGS...]

In the coordinator (``fedsec serve``) every :meth:`~fedsec.network.coordinator.Hub.exchange` is
recorded as ``{"party": "coordinator", "what": LABEL, "round", "posted", "returned", "jobs",
"answers": [times the answers arrived]}``; in a site (``fedsec join``) every job it works,
``{"party": "site", "what": LABEL, "round", "start", "end", "thread_cpu"}`` (``thread_cpu``: CPU
seconds of the main thread while working it). ``LABEL`` is the job's kind, ``layer:STAGE`` for a
stage of the secure layer, prefixed ``FIRST+`` when a ``train`` or ``evaluate`` job travels with
it. Times are ``time.time()`` (one clock for every process of the machine). The records are
written to OUT.jsonl when the process exits; the exit code is the module's. Nothing of the parties'
behaviour changes: the wrappers only read the clock around the original methods.
"""

from __future__ import annotations

import atexit
import json
import runpy
import sys
import threading
import time
from typing import Any


def _label(kind: Any, header: dict[str, Any]) -> str:
    label = str(kind)
    if kind == "layer":
        label = f"layer:{header.get('stage')}"
    first = header.get("first")
    if isinstance(first, dict):
        label = f"{first.get('kind')}+{label}"
    second = header.get("also")
    if isinstance(second, dict):
        label = f"{label}+{'train+' if 'train' in second else ''}{second.get('stage')}"
    return label


def install(records: list[dict[str, Any]]) -> None:
    """Wrap the coordinator's exchanges (posting and collecting) and answers, and the site's job
    runner. An exchange posted ahead (a next round's first call, posted at the end of the round
    before) is timed from its posting: the coordinator's work until it is collected overlaps it."""
    from fedsec.network import coordinator, site
    from fedsec.network.mailbox import Mailboxes

    lock = threading.Lock()
    arrivals: dict[int, float] = {}
    answer, send, receive, run = (Mailboxes.answer, coordinator.Hub.send, coordinator.Hub.receive,
                                  site.SiteJobs.run)
    in_flight: dict[int, dict[str, Any]] = {}

    def timed_answer(self: Mailboxes, name: str, job: int, payload: bytes) -> bool:
        ok = answer(self, name, job, payload)
        with lock:
            arrivals[job] = time.time()
        return ok

    def timed_send(self: coordinator.Hub, kind: str, round_index: int | None, jobs: Any, deadline: float,
                   *, first: Any = None, also: Any = None, also_train: Any = None) -> Any:
        headers = [h for h, _ in jobs.values()]
        label = _label(kind, headers[0] if headers else {})
        if first is not None:
            label = f"{first.kind}+{label}"
        if also:
            label = f"{label}+{'train+' if also_train is not None else ''}" \
                    f"{_label('layer', next(iter(also.values()))[0])}"
        posted = time.time()
        sent = send(self, kind, round_index, jobs, deadline, first=first, also=also, also_train=also_train)
        in_flight[id(sent)] = {"party": "coordinator", "what": label, "round": round_index, "posted": posted,
                               "jobs": len(jobs)}
        return sent

    def timed_receive(self: coordinator.Hub, sent: Any) -> Any:
        try:
            return receive(self, sent)
        finally:
            record = in_flight.pop(id(sent))
            ids = {job for job, _ in sent.posted.values()}
            with lock:
                times = sorted(t for job, t in arrivals.items() if job in ids)
                for job in ids:
                    arrivals.pop(job, None)
            records.append({**record, "returned": time.time(), "answers": times})

    def timed_run(self: site.SiteJobs, job: int, header: dict[str, Any], body: bytes,
                  round_index: int | None) -> Any:
        start, cpu = time.time(), time.thread_time()
        try:
            return run(self, job, header, body, round_index)
        finally:
            records.append({"party": "site", "what": _label(header.get("kind"), header), "round": round_index,
                            "start": start, "end": time.time(), "thread_cpu": time.thread_time() - cpu})

    Mailboxes.answer = timed_answer  # type: ignore[method-assign]
    coordinator.Hub.send = timed_send  # type: ignore[method-assign]
    coordinator.Hub.receive = timed_receive  # type: ignore[method-assign]
    site.SiteJobs.run = timed_run  # type: ignore[method-assign]


def main() -> int:
    if len(sys.argv) < 3:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    out, module, *rest = sys.argv[1:]
    records: list[dict[str, Any]] = []
    install(records)

    def write() -> None:
        with open(out, "w") as handle:
            for record in records:
                handle.write(json.dumps(record) + "\n")

    atexit.register(write)
    sys.argv = [module, *rest]
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as leaving:
        return leaving.code if isinstance(leaving.code, int) else (0 if leaving.code is None else 1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
