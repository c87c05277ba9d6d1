"""``fedsec serve`` (the coordinator) and ``fedsec join`` (a hospital).

Exit codes: 0 done; 1 failure at run time (a coordinator that cannot be reached, fewer sites than
``federation.min_sites``); 2 a bad argument, plan or data file (one line naming the key, or the
file, row and column); 3 the site's policy refused the plan (one line naming the rule);
130 interrupted (Ctrl-C; SIGTERM ends ``join`` with 0 and ``serve`` like Ctrl-C, after the round
in flight, with the run directory written).
"""

from __future__ import annotations

import argparse
import hashlib
import signal
import sys
from pathlib import Path
from typing import Any

from fedsec.network.heap import keep_freed_memory
from fedsec.network.pki import Trust, verify_peer


def register(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    serve = commands.add_parser("serve", help="run a deployment plan as its coordinator (gRPC + mTLS)",
                                description="The coordinator: waits for the plan's sites to dial in, "
                                "then runs the plan and writes the run directory fedsec run writes.")
    serve.add_argument("plan", metavar="PLAN.toml")
    serve.add_argument("--listen", default="0.0.0.0:7443", metavar="HOST:PORT",
                       help="address to listen on (port 0: any free one; default %(default)s)")
    serve.add_argument("--out", required=True, metavar="RUN_DIR")
    serve.add_argument("--force", action="store_true", help="replace an earlier run in RUN_DIR")
    serve.add_argument("--resume", action="store_true", help="continue the killed or interrupted run of "
                       "RUN_DIR (or of its staging folder) from its last checkpoint, with the same plan")
    join = commands.add_parser("join", help="take part in a deployed federation as a site",
                               description="A hospital: dials the coordinator, checks the plan "
                               "against its own policy and ledger, validates its CSV file, and trains.")
    join.add_argument("address", metavar="HOST:PORT")
    join.add_argument("--data", required=True, metavar="FILE.csv")
    join.add_argument("--policy", metavar="SITE.toml", help="the site's policy (default: the protective "
                      "defaults of docs/deployment.md)")
    join.add_argument("--state", default="fedsec-state", metavar="DIR",
                      help="the site's state: ledger, accepted plans, audit log (default %(default)s)")
    join.add_argument("--server", default="coordinator", metavar="NAME",
                      help="the coordinator's certificate name (default %(default)s)")
    demo = commands.add_parser("demo", help="demonstrations on this machine",
                               description="Run a demonstration on this machine.")
    demo_tools = demo.add_subparsers(dest="tool", required=True, metavar="TOOL")
    deploy = demo_tools.add_parser(
        "deploy", help="a real deployment on 127.0.0.1: a CA, a coordinator and N hospitals, each its "
        "own OS process", description="Creates a study CA, enrols a coordinator and N hospitals, "
        "writes each hospital its own CSV shard of the breast-cancer data, and runs the default "
        "private experiment (masking + DP-SGD) with every party as its own process on 127.0.0.1.")
    deploy.add_argument("--sites", type=int, default=4, help="hospitals, >= 3 (default %(default)s)")
    deploy.add_argument("--rounds", type=int, default=30, help="rounds, >= 1 (default %(default)s)")
    deploy.add_argument("--out", default="fedsec-demo", metavar="DIR", help="a new folder for every "
                        "party's files (default %(default)s)")
    deploy.set_defaults(network_handler=_demo)
    for parser, handler in ((serve, _serve), (join, _join)):
        parser.add_argument("--ca", required=True, metavar="CA_CERT")
        parser.add_argument("--crl", metavar="CA_CRL", help="the revocation list (default: ca.crl beside "
                            "CA_CERT, if present)")
        parser.add_argument("--cert", required=True, metavar="CERT")
        parser.add_argument("--key", required=True, metavar="KEY")
        parser.add_argument("--identity", metavar="KEY", help="the Ed25519 identity key (default: "
                            "NAME.identity.key beside KEY)")
        parser.set_defaults(network_handler=handler, tool="")


def _paths(args: argparse.Namespace) -> tuple[Path, Path | None, Path, Path, Path]:
    ca, key = Path(args.ca), Path(args.key)
    crl = Path(args.crl) if args.crl else (ca.parent / "ca.crl")
    identity = Path(args.identity) if args.identity else key.with_name(key.name.removesuffix(".key")
                                                                        + ".identity.key")
    for path, flag in ((ca, "--ca"), (Path(args.cert), "--cert"), (key, "--key"), (identity, "--identity")):
        if not path.is_file():
            raise ValueError(f"{flag}: {path} is not a file")
    return ca, crl if crl.exists() else None, Path(args.cert), key, identity


def _serve(args: argparse.Namespace) -> int:
    from fedsec.config import load_config
    from fedsec.errors import ConfigError
    from fedsec.network.coordinator import Hub
    from fedsec.network.party_audit import PartyAudit
    from fedsec.network.serve import run_coordinator
    from fedsec.network.site import deployment_problem, load_identity
    from fedsec.rundir import RunDirectory, check_out

    ca, crl, cert, key, identity_path = _paths(args)
    keep_freed_memory()
    plan_bytes = Path(args.plan).read_bytes()
    try:
        config = load_config(args.plan)
    except ConfigError as error:
        print(f"fedsec: error: {error}", file=sys.stderr)
        return 2
    problem = deployment_problem(config)
    if problem is not None:
        print(f"fedsec: error: {problem[0]}: {problem[1]}", file=sys.stderr)
        return 2
    trust = Trust.load(ca, crl)
    me = verify_peer(cert.read_bytes(), trust=trust, roles=("server",))
    if me.name != config.federation.server:
        print(f"fedsec: error: federation.server: the plan names {config.federation.server!r}, this "
              f"certificate is {me.name!r}", file=sys.stderr)
        return 2
    identity = load_identity(identity_path)
    sha = hashlib.sha256(plan_bytes).hexdigest()
    checkpoint, folder, adopted = None, None, None
    try:
        if args.resume:
            checkpoint, folder, adopted = _checkpoint(args, config, sha)
        else:
            check_out(args.out, force=args.force)
    except ConfigError as error:
        print(f"fedsec: error: {error}", file=sys.stderr)
        return 2
    staging = adopted if adopted is not None else (None if args.resume else RunDirectory(args.out,
                                                                                        force=args.force))
    out_dir = staging.path if staging is not None else folder
    audit = PartyAudit(out_dir, actor=me.name, key=identity, run_id=sha[:16], certificate=cert.read_bytes())
    if checkpoint is None:
        audit.event("plan_loaded", details={"sha256": sha, "sites": list(config.federation.sites)})
    else:
        audit.event("resumed", round=int(checkpoint.meta["round"]),
                    details={"checkpoint_round": int(checkpoint.meta["round"]), "plan_sha256": sha})
    hub = Hub(config=config, plan_bytes=plan_bytes, trust=trust, cert_pem=cert.read_bytes(),
              key_pem=key.read_bytes(), audit=audit, listen=args.listen)
    hub.identity, hub.cert_path, hub.key_path = identity, cert, key
    if checkpoint is not None:  # before it listens: the still-running sites' polls are served at once
        from fedsec.network.serve import HUB_STATE, restore_hub

        restore_hub(hub, checkpoint.meta["extra"][HUB_STATE])
    code = 0
    previous = signal.signal(signal.SIGTERM, _interrupt)  # SIGTERM stops like Ctrl-C
    try:
        port = hub.start()
        print(f"listening {port}", flush=True)
        print(f"plan sha256 {sha}; waiting for {len(config.federation.sites)} sites", flush=True)
        summary = run_coordinator(config, hub, out_dir, checkpoint=checkpoint)
        print(f"done: {summary['rounds_run']} rounds ({summary['stop_reason']}), final accuracy "
              f"{summary['final_accuracy']}, epsilon {summary.get('epsilon')}; run directory {args.out}",
              flush=True)
        code = 130 if summary["stop_reason"] == "interrupted" else 0
    except ConfigError as error:
        print(f"fedsec: error: {error}", file=sys.stderr)
        code = 2
    except RuntimeError as error:
        print(f"fedsec: serve failed: {error}", file=sys.stderr)
        code = 1
    except KeyboardInterrupt:
        audit.event("interrupted")
        code = 130
    finally:
        signal.signal(signal.SIGTERM, previous)
        hub.stop()
        audit.close()
        if staging is not None:
            staging.publish()
    return code


def _checkpoint(args: argparse.Namespace, config: Any, sha: str) -> tuple[Any, Path, Any]:
    """``--resume``: the checkpoint of RUN_DIR (or of its staging folder), the folder, and the
    staging folder adopted to be published at the end (None when RUN_DIR itself is continued).

    Raises:
        ConfigError: ``--resume`` (with --force, no checkpoint, another plan or configuration) or
            ``secure.aggregation`` (a layer whose state a checkpoint does not hold).
    """
    from fedsec.checkpoint import check_resumable, find_run, read_checkpoint
    from fedsec.errors import ConfigError
    from fedsec.network.serve import HUB_STATE
    from fedsec.rundir import RunDirectory

    if args.force:
        raise ConfigError("--resume", "continues RUN_DIR: it takes no --force")
    check_resumable(config)
    folder, staged = find_run(args.out)
    checkpoint = read_checkpoint(folder)
    hub = (checkpoint.meta.get("extra") or {}).get(HUB_STATE)
    if hub is None:
        raise ConfigError("--resume", f"{folder} is not a checkpointed fedsec serve run")
    if hub.get("plan_sha256") != sha or checkpoint.meta.get("config_sha256") != config.sha256():
        raise ConfigError("--resume", f"{args.plan} (SHA-256 {sha[:16]}...) is not the plan of the "
                                      f"checkpointed run ({str(hub.get('plan_sha256'))[:16]}...)")
    return checkpoint, folder, RunDirectory.adopt(args.out, folder) if staged else None


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt()


def _join(args: argparse.Namespace) -> int:
    from fedsec.network.policy import SitePolicy, load_policy
    from fedsec.network.site import Site, SitePaths

    ca, crl, cert, key, identity = _paths(args)
    keep_freed_memory()
    data = Path(args.data)
    policy = load_policy(args.policy) if args.policy else SitePolicy()
    site = Site(address=args.address, paths=SitePaths(ca=ca, crl=crl, cert=cert, key=key, identity=identity,
                                                      data=data, state=Path(args.state)),
                policy=policy, server_name=args.server)
    return site.run()


def _demo(args: argparse.Namespace) -> int:
    from fedsec.network.demo import run_demo

    if args.sites < 3:
        raise ValueError(f"--sites: masking needs >= 3 hospitals, got {args.sites}")
    if args.rounds < 1:
        raise ValueError(f"--rounds: must be >= 1, got {args.rounds}")
    out = Path(args.out)
    if out.exists() and any(out.iterdir()):
        raise ValueError(f"--out: {out} exists and is not empty")
    return run_demo(out.resolve(), args.sites, rounds=args.rounds, say=lambda text: print(text, flush=True))
