"""Compare parties' audit logs (``fedsec audit reconcile``): messages, epsilon, acknowledged heads.

A pure function over verified events. The events it reads (everything else is ignored):

* ``send`` with details ``{"to": ACTOR, "kind": K, "size": BYTES, "sha256": HEX}`` and
  ``receive`` with ``{"from": ACTOR, "kind": K, "size": BYTES, "sha256": HEX}``, both with the
  event's ``round``. The n-th send of kind K from A to B in round r is paired with the n-th
  receive of kind K by B from A in round r; every unpaired event and every pair whose size or
  digest differ is a mismatch.
* ``call`` (a call this party made) with ``{"to": ACTOR, "kind": K, "size", "sha256", "reply":
  {"size", "sha256"}}``: read as the ``send`` of its request (kind K) and the ``receive`` of its
  reply (kind K + ``.reply``), both at the row's seq and round; ``served`` (a call this party
  served) with ``"from"`` and the same fields: the ``receive`` of the request and the ``send`` of
  the reply. A party's one row per call pairs with a peer's two rows (older logs, the key holder's)
  as with its one row.
* ``epsilon`` with ``{"epsilon": E}`` (optionally ``"party": ACTOR`` when a coordinator keeps a
  ledger per site): a site's epsilon for round r must equal the coordinator's entry for that site
  (or its entry without ``party``) for round r, to a relative 1e-9.
* ``plan_loaded`` (the coordinator) and ``plan_accepted`` (a site), both with ``{"sha256": HEX}``:
  every site must have accepted the plan the coordinator loaded, and the same plan as every other
  site; a coordinator that shows different sites different plans (review finding R7) is listed,
  naming both parties.
* ``ack`` (see :meth:`fedsec.audit.log.AuditLog.ack`): the acknowledged row must still be in the
  acknowledged party's log with the same hash (tail truncation, rewriting), and the head's key
  fingerprint must be the one that log is signed with. Nothing is skipped (review finding R9): an
  ack of seq 0 (an empty log: heads are handed only after messages were exchanged), of a lower row
  than one acknowledged before, of a party the acknowledging log exchanged no message with, or of
  a party whose log is not among those given, is listed.
* ``head_refused`` (a site) and ``misbehaved`` at stage ``ack`` (the coordinator): a party was
  handed a head that is not its peer's log; listed, naming both.

The logs must be one study's (a site that keeps its audit log across studies has its earlier
plans and messages listed against a later study's coordinator).

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
    found = [*_messages(logs), *_epsilons(logs, coordinator), *_plans(logs, coordinator), *_acks(logs),
             *_refused_heads(logs)]
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


@dataclass(frozen=True)
class _Message:
    """One message a row records: ``direction`` ``send`` or ``receive``, the ``peer`` it went to or
    came from, its kind, size and digest, and the row's seq and round."""

    direction: str
    peer: str
    kind: str
    size: Any
    sha256: Any
    seq: int
    round: int | None


def _recorded(event: Event) -> list[_Message]:
    """The messages one row records: one for ``send``/``receive``, two for ``call``/``served``
    (request, then reply), none for any other row."""
    d = _details(event)

    def one(direction: str, peer: Any, kind: str, fields: dict[str, Any]) -> _Message:
        return _Message(direction, str(peer), kind, fields.get("size"), fields.get("sha256"), event.seq,
                        event.round)

    if event.action in ("send", "receive"):
        peer = d.get("to" if event.action == "send" else "from")
        return [one(event.action, peer, str(d.get("kind")), d)]
    if event.action not in ("call", "served"):
        return []
    reply = d.get("reply") if isinstance(d.get("reply"), dict) else {}
    kind = str(d.get("kind"))
    if event.action == "call":
        return [one("send", d.get("to"), kind, d), one("receive", d.get("to"), kind + ".reply", reply)]
    return [one("receive", d.get("from"), kind, d), one("send", d.get("from"), kind + ".reply", reply)]


def _messages(logs: Mapping[str, Sequence[Event]]) -> list[Mismatch]:
    sent: dict[tuple[str, str, int | None, str], list[_Message]] = defaultdict(list)
    received: dict[tuple[str, str, int | None, str], list[_Message]] = defaultdict(list)
    for actor, events in logs.items():
        for event in events:
            for m in _recorded(event):
                if m.direction == "send":
                    sent[(actor, m.peer, m.round, m.kind)].append(m)
                else:
                    received[(m.peer, actor, m.round, m.kind)].append(m)
    found = []
    for key in sorted(set(sent) | set(received), key=str):
        sender, receiver, round_, kind = key
        outs, ins = sent.get(key, []), received.get(key, [])
        for out, got in zip(outs, ins):
            if out.size != got.size:
                found.append(Mismatch(receiver, got.seq, round_, f"{kind} from {sender}: received "
                                      f"{got.size} bytes, {sender} row {out.seq} sent {out.size}"))
            if out.sha256 != got.sha256:
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


def _plans(logs: Mapping[str, Sequence[Event]], coordinator: str) -> list[Mismatch]:
    def rows(events: Sequence[Event], action: str) -> list[tuple[int, str]]:
        return [(e.seq, str(_details(e).get("sha256"))) for e in events if e.action == action]

    loaded = rows(logs[coordinator], "plan_loaded")
    found = [Mismatch(coordinator, seq, None, f"loaded plan {sha[:16]}, its row {loaded[0][0]} loaded plan "
                                              f"{loaded[0][1][:16]}")
             for seq, sha in loaded[1:] if sha != loaded[0][1]]
    accepted = {actor: rows(events, "plan_accepted") for actor, events in sorted(logs.items())
                if actor != coordinator}
    accepted = {actor: plans for actor, plans in accepted.items() if plans}
    if not accepted:
        return found
    first_actor, (first_seq, first_sha) = next((a, plans[0]) for a, plans in accepted.items())
    for actor, plans in accepted.items():
        for seq, sha in plans:
            if loaded and sha != loaded[0][1]:
                found.append(Mismatch(actor, seq, None, f"accepted plan {sha[:16]}, {coordinator} row "
                                                        f"{loaded[0][0]} loaded plan {loaded[0][1][:16]}"))
            if actor != first_actor and sha != first_sha:
                found.append(Mismatch(actor, seq, None, f"accepted plan {sha[:16]}, {first_actor} row "
                                                        f"{first_seq} accepted plan {first_sha[:16]}"))
    if not loaded:
        found.append(Mismatch(coordinator, 0, None, f"no plan_loaded row, {first_actor} row {first_seq} "
                                                    f"accepted plan {first_sha[:16]}"))
    return found


def _acks(logs: Mapping[str, Sequence[Event]]) -> list[Mismatch]:
    found = []
    for actor, events in logs.items():
        talked: set[str] = set()
        last: dict[str, int] = {}
        for event in events:
            talked.update(m.peer for m in _recorded(event))
            if event.action != "ack":
                continue
            found.extend(_ack(logs, actor, event, _details(event), talked, last))
    return found


def _ack(logs: Mapping[str, Sequence[Event]], actor: str, event: Event, d: dict[str, Any], talked: set[str],
         last: dict[str, int]) -> list[Mismatch]:
    """The mismatches of one ``ack`` row of ``actor``'s log (``talked``: the parties it exchanged a
    message with before this row; ``last``: the highest row it acknowledged so far, per party)."""
    peer, seq, digest = str(d.get("actor")), d.get("seq"), d.get("hash")
    mine = f"{actor} row {event.seq} acknowledged"
    if isinstance(seq, bool) or not isinstance(seq, int) or seq < 0:
        return [Mismatch(actor, event.seq, event.round, f"acknowledged a malformed head of {peer}")]
    found = []
    if peer not in talked:
        found.append(Mismatch(actor, event.seq, event.round, f"acknowledged a head of {peer}, a party it "
                                                             f"exchanged no message with"))
    if seq == 0:
        found.append(Mismatch(actor, event.seq, event.round, f"acknowledged an empty log (row 0) of {peer}"))
    if seq < last.get(peer, 0):
        found.append(Mismatch(actor, event.seq, event.round, f"acknowledged row {seq} of {peer} after its "
                                                             f"row {last[peer]}"))
    last[peer] = max(last.get(peer, 0), seq)
    if peer not in logs:
        found.append(Mismatch(actor, event.seq, event.round, f"acknowledged row {seq} of {peer}, whose log "
                                                             f"is not among those reconciled"))
        return found
    theirs = logs[peer]
    if theirs and d.get("fingerprint") != theirs[0].key_fp:
        found.append(Mismatch(peer, seq, None, f"{mine} a head with key fingerprint "
                                               f"{str(d.get('fingerprint'))[:16]}..., this log is signed "
                                               f"by {theirs[0].key_fp[:16]}..."))
    if seq == 0:
        return found
    rows = {e.seq: e for e in theirs}
    if seq not in rows:
        found.append(Mismatch(peer, seq, None, f"row missing: {mine} it (tail truncated)"))
    elif rows[seq].hash != digest:
        found.append(Mismatch(peer, seq, None, f"hash differs from the one {mine} (log rewritten)"))
    return found


def _refused_heads(logs: Mapping[str, Sequence[Event]]) -> list[Mismatch]:
    found = []
    for actor, events in logs.items():
        for event in events:
            d = _details(event)
            if event.action == "head_refused":
                found.append(Mismatch(actor, event.seq, event.round, f"refused the head {d.get('from')} "
                                                                     f"handed it: {d.get('reason')}"))
            elif event.action == "misbehaved" and event.stage == "ack":
                found.append(Mismatch(actor, event.seq, event.round, f"{d.get('site')} handed a head that "
                                                                     f"is not its log: {d.get('reason')}"))
    return found
