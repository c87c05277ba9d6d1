"""``fedsec audit verify|show|reconcile``: registered by :func:`register` into the main parser."""

from __future__ import annotations

import argparse
import json
import sys

EXIT_BROKEN = 4
"""Exit code of ``verify`` and ``reconcile`` when a log is broken or the logs disagree."""


def register(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add the ``audit`` command and its tools to the main parser's subcommands."""
    audit = commands.add_parser("audit", help="check and read audit logs (audit.db)")
    tools = audit.add_subparsers(dest="tool", required=True, metavar="TOOL")
    verify = tools.add_parser(
        "verify", help="check one log's sequence, JSON, hash chain and signatures",
        description="Check one audit log. Exit 0 prints the number of events, the signer and its key "
                    "fingerprint; a broken log exits 4 naming the first bad row and what is wrong; "
                    "a missing or non-log file exits 2. With --ca, the log's signing key must also be "
                    "the identity key that a certificate of that CA binds to the log's actor (the "
                    "certificate from --cert, else ACTOR.crt beside the log); exit 4 if not.")
    verify.add_argument("path", help="the audit.db file")
    verify.add_argument("--ca", metavar="CA_CERT", help="the study's CA certificate (ca.crt)")
    verify.add_argument("--cert", metavar="CERT", help="the signer's certificate (default: ACTOR.crt "
                                                       "beside the log; only with --ca)")
    show = tools.add_parser("show", help="print a log's events as a table")
    show.add_argument("path", help="the audit.db file")
    show.add_argument("--round", type=int, help="only this round's events")
    show.add_argument("--json", action="store_true", help="one JSON array of events")
    rec = tools.add_parser(
        "reconcile", help="compare parties' logs (messages, epsilon, acknowledged heads)",
        description="Verify each log, then list every mismatch between them: messages one side "
                    "sent and the other did not receive (or with another size or digest), "
                    "epsilon differing from the coordinator's ledger, acknowledged rows missing. "
                    "Exit 0 when they agree, 4 on a broken log or any mismatch.")
    rec.add_argument("paths", nargs="+", metavar="PATH", help="two or more audit.db files")
    rec.add_argument("--coordinator", required=True, help="the actor whose epsilon rows are the ledger")


def main(args: argparse.Namespace) -> int:
    """Run ``fedsec audit TOOL``; returns the exit code."""
    from fedsec.audit.verify import LogBroken

    try:
        if args.tool == "verify":
            return _verify(args.path, args.ca, args.cert)
        if args.tool == "show":
            return _show(args.path, args.round, args.json)
        return _reconcile(args.paths, args.coordinator)
    except LogBroken as broken:
        print(f"fedsec: audit: {broken}", file=sys.stderr)
        return EXIT_BROKEN
    except ValueError as error:
        print(f"fedsec: error: {error}", file=sys.stderr)
        return 2


def _verify(path: str, ca: str | None, cert: str | None) -> int:
    from fedsec.audit.log import read_header
    from fedsec.audit.signer import certificate_beside, check_signer, load_pem
    from fedsec.audit.verify import verify_log

    if cert is not None and ca is None:
        raise ValueError("--cert: only with --ca")
    ok = verify_log(path)
    bound = ""
    if ca is not None:
        authority = load_pem(ca, "--ca")
        leaf = load_pem(cert if cert is not None else certificate_beside(path, ok.actor), "--cert")
        check_signer(read_header(path), leaf, authority)
        bound = ", bound to it by the CA's certificate"
    print(f"ok: {ok.events} events, signer {ok.actor}, key fingerprint {ok.fingerprint}{bound}, "
          f"head {ok.head.hash}")
    return 0


def _show(path: str, round_: int | None, as_json: bool) -> int:
    from fedsec.audit.log import read_events, read_header

    read_header(path)
    events = read_events(path, round=round_)
    if as_json:
        print(json.dumps([{"seq": e.seq, "time": e.time, "actor": e.actor, "action": e.action,
                           "run_id": e.run_id, "round": e.round, "stage": e.stage,
                           "details": json.loads(e.details), "peer_ref": e.peer_ref, "hash": e.hash}
                          for e in events], indent=1))
        return 0
    print(f"{'seq':>4}  {'time (UTC)':<19}  {'actor':<12}  {'action':<10}  {'round':>5}  details")
    for e in events:
        round_text = "" if e.round is None else str(e.round)
        print(f"{e.seq:>4}  {e.time[:19]:<19}  {e.actor:<12}  {e.action:<10}  {round_text:>5}  "
              f"{e.details}")
    return 0


def _reconcile(paths: list[str], coordinator: str) -> int:
    from fedsec.audit.reconcile import reconcile_paths

    found = reconcile_paths(paths, coordinator=coordinator)
    for mismatch in found:
        print(mismatch)
    print(f"{len(found)} mismatches between {len(paths)} logs")
    return EXIT_BROKEN if found else 0
