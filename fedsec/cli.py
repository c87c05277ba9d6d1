"""The ``fedsec`` command line."""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from fedsec import __version__
from fedsec.audit import cli as audit_cli
from fedsec.config import ExperimentConfig, load_config
from fedsec.dp.errors import DPError
from fedsec.errors import ConfigError
from fedsec.fl_core.errors import FLError
from fedsec.network import cli as network_cli

EXIT_CONFIG = 2
EXIT_FAILED = 1
EXIT_INTERRUPTED = 130


def default_run_text() -> str:
    """The built-in default run in words, read from the defaults themselves."""
    c = ExperimentConfig()
    return (f"Without CONFIG: {c.data.clients} hospitals, {c.data.dataset.replace('_', '-')} data, "
            f"{c.model.name}, {c.train.algorithm}, {c.rounds} rounds, with pairwise-mask secure "
            f"aggregation (secure.aggregation = {c.secure.aggregation!r}) and DP-SGD spending at "
            f"most epsilon {c.dp.target_epsilon:g} at delta {c.dp.delta:g} (dp.mode = "
            f"{c.dp.mode!r}).")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fedsec", description="Federated learning whose server learns only the average."
    )
    parser.add_argument("--version", action="version", version=f"fedsec {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    run = commands.add_parser(
        "run",
        help="run one experiment",
        description=f"Run one experiment. {default_run_text()} Nothing is saved unless --out DIR "
        "is given; the result line is printed either way. Exit codes: 0 done, 1 failed while "
        "running, 2 bad configuration or argument (nothing written), 130 interrupted.",
    )
    run.add_argument("config", nargs="?", help="experiment TOML file (default: built-in)")
    run.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                     help="override one config key, e.g. --set train.lr=0.05 (repeatable)")
    run.add_argument("--out", metavar="DIR",
                     help="write the run directory here (default: nothing is saved); an existing "
                          "non-empty DIR is refused unless --force")
    run.add_argument("--force", action="store_true",
                     help="replace an earlier run in --out whole (no stale file survives)")
    run.add_argument("--quiet", action="store_true", help="no progress bar")
    run.add_argument("--resume", metavar="DIR", help="continue the interrupted or killed run of "
                     "--out DIR from its last checkpoint (its own config.toml; no CONFIG)")
    sweep = commands.add_parser(
        "sweep", help="privacy-utility sweep (accuracy against epsilon)",
        description="Run the experiment once per target epsilon and seed (noise calibrated to "
        "each target) and once without DP per seed; write sweep.csv and sweep.png.")
    sweep.add_argument("config", nargs="?", help="experiment TOML file (default: built-in)")
    sweep.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    sweep.add_argument("--epsilons", default="0.5,1,2,4,8", help="comma-separated targets")
    sweep.add_argument("--seeds", default="0,1,2", help="comma-separated seeds")
    sweep.add_argument("--out", metavar="DIR", default="runs/sweep",
                       help="write sweep.csv, sweep.png and config.toml here (default: %(default)s)")
    sweep.add_argument("--force", action="store_true", help="replace an earlier sweep in --out")
    sweep.add_argument("--quiet", action="store_true", help="no progress bar")
    privacy = commands.add_parser("privacy", help="privacy accounting tools")
    tools = privacy.add_subparsers(dest="tool", required=True, metavar="TOOL")
    eps = tools.add_parser(
        "epsilon", help="epsilon of a subsampled Gaussian mechanism",
        description="Epsilon at delta of T Poisson-subsampled Gaussian mechanisms (DP-SGD steps "
        "with sampling rate q and noise multiplier sigma).")
    eps.add_argument("--q", type=float, required=True, help="sampling rate, in (0, 1]")
    eps.add_argument("--sigma", type=float, required=True, help="noise multiplier, > 0")
    eps.add_argument("--steps", type=int, required=True, help="number of steps T, >= 1")
    eps.add_argument("--delta", type=float, required=True, help="delta, in (0, 1)")
    eps.add_argument("--accountant", choices=("pld", "prv", "rdp"), default="pld")
    eps.add_argument("--json", action="store_true", help='print {"epsilon": ...}')
    network_cli.register(commands)
    audit_cli.register(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``fedsec`` console script; returns the exit code."""
    args = _parser().parse_args(argv)
    try:
        with _one_line_warnings():
            if args.command == "run":
                return _run(args)
            if args.command == "privacy":
                return _epsilon(args)
            if args.command == "sweep":
                return _sweep(args)
            if args.command in network_cli.COMMANDS:
                return network_cli.run(args)
            if args.command == "audit":
                return audit_cli.main(args)
    except KeyboardInterrupt:
        print("fedsec: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    return EXIT_CONFIG


@contextmanager
def _one_line_warnings() -> Iterator[None]:
    """Show the run's own warnings as ``fedsec: warning: ...`` lines on stderr."""
    from fedsec.experiment import RunWarning

    original = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):  # type: ignore[no-untyped-def]
        if issubclass(category, RunWarning):
            print(f"fedsec: warning: {message}", file=sys.stderr)
        else:
            original(message, category, filename, lineno, file, line)

    with warnings.catch_warnings():
        # opacus' RDP search says this on every call at extreme noise; the accountant copes
        warnings.filterwarnings("ignore", message="Optimal order is the largest alpha")
        warnings.showwarning = show
        try:
            yield
        finally:
            warnings.showwarning = original


def _failure(error: Exception, command: str) -> int:
    """Report ``error`` on stderr in one line; a bad input exits 2, a failed run 1."""
    if isinstance(error, ConfigError) or (isinstance(error, ValueError)
                                          and not isinstance(error, FLError)):
        print(f"fedsec: error: {_one_line(error)}", file=sys.stderr)
        return EXIT_CONFIG
    if isinstance(error, OSError):
        detail = f"{error.strerror}: {error.filename}" if error.filename else str(error)
        print(f"fedsec: {command} failed: {detail}", file=sys.stderr)
        return EXIT_FAILED
    print(f"fedsec: {command} failed: {_one_line(error)}", file=sys.stderr)
    return EXIT_FAILED


def _one_line(error: Exception) -> str:
    return " ".join(str(error).split())


def _sweep(args: argparse.Namespace) -> int:
    from fedsec.sweep import run_sweep

    try:
        epsilons = [float(e) for e in args.epsilons.split(",") if e.strip()]
        seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    except ValueError:
        print("fedsec: error: --epsilons and --seeds take comma-separated numbers", file=sys.stderr)
        return EXIT_CONFIG
    try:
        try:
            config = load_config(args.config, args.overrides)
        except ConfigError as error:
            if error.key != "dp.target_epsilon":
                raise
            # each run sets its own target; a placeholder lets a config without one validate
            config = load_config(args.config, ["dp.target_epsilon=1", *args.overrides])
        result = run_sweep(config, epsilons=epsilons, seeds=seeds, out=args.out,
                           progress=not args.quiet, force=args.force)
    except (ConfigError, FLError, DPError, OSError) as error:
        return _failure(error, "sweep")
    print(json.dumps(result))
    return 0


def _epsilon(args: argparse.Namespace) -> int:
    from fedsec.dp.accountants import epsilon

    try:
        value = epsilon(noise_multiplier=args.sigma, sample_rate=args.q, steps=args.steps,
                        delta=args.delta, mechanism=args.accountant)
    except DPError as error:
        return _failure(error, "privacy epsilon")
    if args.json:
        print(json.dumps({"epsilon": value, "delta": args.delta, "accountant": args.accountant}))
    else:
        print(f"epsilon = {value:.4f} at delta = {args.delta:g} ({args.accountant}: q = {args.q:g}, "
              f"sigma = {args.sigma:g}, {args.steps} steps)")
    return 0


def _run(args: argparse.Namespace) -> int:
    from fedsec.experiment import resume_experiment, run_experiment

    try:
        if args.resume and (args.config or args.overrides or args.out or args.force):
            raise ConfigError("--resume", "takes no CONFIG, --set, --out or --force")
        if args.resume:
            summary = resume_experiment(args.resume, progress=not args.quiet)
        else:
            config = load_config(args.config, args.overrides)
            summary = run_experiment(config, out=args.out, progress=not args.quiet, force=args.force)
    except (ConfigError, FLError, DPError, OSError) as error:
        return _failure(error, "run")
    stopped = summary.get("privacy", {}).get("stopped")
    if stopped:
        print(f"fedsec: {stopped}", file=sys.stderr)
    keys = ("final_accuracy", "best_accuracy", "rounds_run", "rounds_to_target", "stop_reason")
    line = {k: summary[k] for k in keys}
    if "privacy" in summary:
        line["epsilon"] = summary["privacy"]["epsilon"]
    print(json.dumps(line))
    if summary["stop_reason"] == "interrupted":
        print("fedsec: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    return 0


if __name__ == "__main__":
    sys.exit(main())
