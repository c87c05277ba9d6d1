"""Compare parties' audit logs (``fedsec audit reconcile``): messages, epsilon, acknowledged heads.

A pure function over verified events. The events it reads (everything else is ignored):

* ``send`` with details ``{"to": ACTOR, "kind": K, "size": BYTES, "sha256": HEX}`` and
  ``receive`` with ``{"from": ACTOR, "kind": K, "size": BYTES, "sha256": HEX}``, both with the
  event's ``round``. The n-th send of kind K from A to B in round r is paired with the n-th
  receive of kind K by B from A in round r; every unpaired event and every pair whose size or
  digest differ is a mismatch.
* ``epsilon`` with ``{"epsilon": E}`` (optionally ``"party": ACTOR`` when a coordinator keeps a
  ledger per site): a site's epsilon for round r must equal the coordinator's entry for that site
  (or its entry without ``party``) for round r, to a relative 1e-9.
* ``ack`` (see :meth:`fedsec.audit.log.AuditLog.ack`): the acknowledged row must still be in the
  acknowledged party's log with the same hash (tail truncation, rewriting).

Deployments (issue 13) produce one log per party; ``fedsec run`` produces one log (the
simulation has no second party whose record could differ), so a run's log is verified, not
reconciled.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedsec.audit.log import Event, read_events
from fedsec.audit.verify import verify_log

_REL_TOL = 1e-9


@dataclass(frozen=True)
class Mismatch:
    """One disagreement: whose row (``actor``, ``seq``; 0 when the row is missing), which round,
    and what."""

    actor: str
    seq: int
    round: int | None
    what: str

    def __str__(self) -> str:
        where = f"{self.actor} row {self.seq}" if self.seq else self.actor
        at = f" (round {self.round})" if self.round is not None else ""
        return f"{where}{at}: {self.what}"


def reconcile(logs: Mapping[str, Sequence[Event]], *, coordinator: str) -> list[Mismatch]:
    """Every mismatch between the logs ``{actor: events}``; ``coordinator`` names the party whose
    ``epsilon`` rows are the ledger. Returns them ordered by actor, round and row.

    Raises:
        ValueError: (key ``coordinator``) it is not one of the logs.
    """
    if coordinator not in logs:
        raise ValueError(f"coordinator: {coordinator!r} is not among the logs {sorted(logs)}")
    found = [*_messages(logs), *_epsilons(logs, coordinator), *_acks(logs)]
    return sorted(found, key=lambda m: (m.actor, m.round if m.round is not None else -1, m.seq, m.what))


def reconcile_paths(paths: Sequence[str | Path], *, coordinator: str) -> list[Mismatch]:
    """Verify each log at ``paths`` (raises :class:`fedsec.audit.verify.LogBroken` on the first
    broken one), then :func:`reconcile` them.

    Raises:
        ValueError: two logs of the same actor, or fewer than two logs.
    """
    if len(paths) < 2:
        raise ValueError("paths: reconcile needs at least two logs")
    logs: dict[str, list[Event]] = {}
    for path in paths:
        actor = verify_log(path).actor
        if actor in logs:
            raise ValueError(f"paths: two logs of {actor!r}")
        logs[actor] = read_events(path)
    return reconcile(logs, coordinator=coordinator)


def _details(event: Event) -> dict[str, Any]:
    return event.payload()


def _messages(logs: Mapping[str, Sequence[Event]]) -> list[Mismatch]:
    sent: dict[tuple[str, str, int | None, str], list[Event]] = defaultdict(list)
    received: dict[tuple[str, str, int | None, str], list[Event]] = defaultdict(list)
    for actor, events in logs.items():
        for event in events:
            d = _details(event)
            if event.action == "send":
                sent[(actor, str(d.get("to")), event.round, str(d.get("kind")))].append(event)
            elif event.action == "receive":
                received[(str(d.get("from")), actor, event.round, str(d.get("kind")))].append(event)
    found = []
    for key in sorted(set(sent) | set(received), key=str):
        sender, receiver, round_, kind = key
        outs, ins = sent.get(key, []), received.get(key, [])
        for out, got in zip(outs, ins):
            a, b = _details(out), _details(got)
            if a.get("size") != b.get("size"):
                found.append(Mismatch(receiver, got.seq, round_, f"{kind} from {sender}: received "
                                      f"{b.get('size')} bytes, {sender} row {out.seq} sent "
                                      f"{a.get('size')}"))
            if a.get("sha256") != b.get("sha256"):
                found.append(Mismatch(receiver, got.seq, round_, f"{kind} from {sender}: received "
                                      f"digest differs from {sender} row {out.seq}"))
        for out in outs[len(ins):]:
            if receiver in logs:
                found.append(Mismatch(sender, out.seq, round_, f"{kind} sent to {receiver}, "
                                      f"which records no such receipt"))
        for got in ins[len(outs):]:
            if sender in logs:
                found.append(Mismatch(receiver, got.seq, round_, f"{kind} received from {sender}, "
                                      f"which records no such send"))
    return found


def _epsilons(logs: Mapping[str, Sequence[Event]], coordinator: str) -> list[Mismatch]:
    ledger: dict[tuple[str | None, int | None], float] = {}
    for event in logs[coordinator]:
        if event.action == "epsilon":
            d = _details(event)
            ledger[(d.get("party"), event.round)] = float(d["epsilon"])
    found = []
    for actor, events in logs.items():
        if actor == coordinator:
            continue
        for event in events:
            if event.action != "epsilon":
                continue
            mine = float(_details(event)["epsilon"])
            theirs = ledger.get((actor, event.round), ledger.get((None, event.round)))
            if theirs is None:
                found.append(Mismatch(actor, event.seq, event.round,
                                      f"epsilon {mine:.6g} recorded, none in {coordinator}'s ledger"))
            elif not math.isclose(mine, theirs, rel_tol=_REL_TOL, abs_tol=0.0):
                found.append(Mismatch(actor, event.seq, event.round, f"epsilon {mine:.6g}, "
                                      f"{coordinator}'s ledger says {theirs:.6g}"))
    return found


def _acks(logs: Mapping[str, Sequence[Event]]) -> list[Mismatch]:
    found = []
    for actor, events in logs.items():
        for event in events:
            if event.action != "ack":
                continue
            d = _details(event)
            peer, seq, digest = str(d.get("actor")), int(d.get("seq", 0)), d.get("hash")
            if peer not in logs or seq == 0:
                continue
            rows = {e.seq: e for e in logs[peer]}
            if seq not in rows:
                found.append(Mismatch(peer, seq, None, f"row missing: {actor} row {event.seq} "
                                      f"acknowledged it (tail truncated)"))
            elif rows[seq].hash != digest:
                found.append(Mismatch(peer, seq, None, f"hash differs from the one {actor} row "
                                      f"{event.seq} acknowledged (log rewritten)"))
    return found
