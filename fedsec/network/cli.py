"""The ``fedsec ca`` and ``fedsec site`` subcommands (enrolment and site policy).

Exit codes as everywhere in ``fedsec``: 0 done, 1 failure at run time (a file that cannot be
read or written), 2 a bad argument or a refused request (one line naming the reason), 3 the site's
policy refused the plan.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
from pathlib import Path

from cryptography.hazmat.primitives import serialization

from fedsec.network import pki
from fedsec.network.errors import EnrolmentError, PolicyRefused

EXIT_FAILED = 1
EXIT_BAD = 2
EXIT_REFUSED = 3
PASSPHRASE_ENV = "FEDSEC_CA_PASSPHRASE"
COMMANDS = ("ca", "site", "serve", "join", "demo", "keyholder", "deal")
"""The ``fedsec`` commands this package serves."""


def register(commands: argparse._SubParsersAction) -> None:
    """Add ``ca`` (init, sign, revoke) and ``site`` (init, check) to the ``fedsec`` parser."""
    ca = commands.add_parser("ca", help="the study's certificate authority (enrolment)",
                             description="A small CA for one study: a self-signed ECDSA P-256 root "
                             "that signs the parties' requests and keeps their revocation list.")
    ca_tools = ca.add_subparsers(dest="tool", required=True, metavar="TOOL")
    init = ca_tools.add_parser("init", help="create the root (ca.crt, ca.key) in CA_DIR")
    init.add_argument("ca_dir", metavar="CA_DIR")
    init.add_argument("--name", required=True, help="the study's name")
    init.add_argument("--days", type=int, default=pki.CA_DAYS, help="root validity (default: %(default)s)")
    sign = ca_tools.add_parser("sign", help="check a party's CSR and issue its certificate")
    sign.add_argument("ca_dir", metavar="CA_DIR")
    sign.add_argument("csr", metavar="CSR")
    sign.add_argument("--out", required=True, metavar="CERT", help="certificate file to write (new)")
    sign.add_argument("--days", type=int, default=pki.DEFAULT_DAYS, help="validity (default: %(default)s)")
    revoke = ca_tools.add_parser("revoke", help="add a certificate to CA_DIR/ca.crl")
    revoke.add_argument("ca_dir", metavar="CA_DIR")
    revoke.add_argument("cert", metavar="CERT")
    for parser, handler in ((init, _ca_init), (sign, _ca_sign), (revoke, _ca_revoke)):
        parser.add_argument("--passphrase-file", metavar="FILE",
                            help=f"the CA key's passphrase (first line of FILE; or set {PASSPHRASE_ENV}; "
                                 f"neither: the key is stored unencrypted, mode 0600)")
        parser.set_defaults(network_handler=handler)
    site = commands.add_parser("site", help="a party's keys, request and policy",
                               description="Make a party's keys and certificate request; check a "
                               "plan against the site's policy.")
    site_tools = site.add_subparsers(dest="tool", required=True, metavar="TOOL")
    site_init = site_tools.add_parser("init", help="write NAME.key, NAME.identity.key and NAME.csr")
    site_init.add_argument("site_dir", metavar="SITE_DIR")
    site_init.add_argument("--name", required=True, help="the party's name (a-z, 0-9, '-')")
    site_init.add_argument("--role", required=True, choices=pki.ROLES)
    site_init.set_defaults(network_handler=_site_init)
    check = site_tools.add_parser(
        "check", help="check a plan against SITE.toml (exit 3 if refused)",
        description="Check the plan (an experiment TOML) against the site's policy and, with "
        "--state, against its lifetime epsilon ledger (read only: nothing is reserved).")
    check.add_argument("plan", metavar="PLAN")
    check.add_argument("--policy", required=True, metavar="SITE.toml")
    check.add_argument("--state", metavar="DIR", help="the site's state directory (its ledger)")
    check.add_argument("--name", metavar="SITE", help="this site's certificate name (aggregation.peers "
                       "admits it besides the listed peers)")
    check.set_defaults(network_handler=_site_check)
    from fedsec.network import deploy_cli, keyholder_cli

    deploy_cli.register(commands)
    keyholder_cli.register(commands)


def run(args: argparse.Namespace) -> int:
    """Run the subcommand ``args`` selected; returns the exit code."""
    try:
        return args.network_handler(args)
    except EnrolmentError as error:
        print(f"fedsec: error: {error}", file=sys.stderr)
        return EXIT_BAD
    except PolicyRefused as error:
        print(f"fedsec: refused by policy: {error}", file=sys.stderr)
        return EXIT_REFUSED
    except ValueError as error:
        print(f"fedsec: error: {' '.join(str(error).split())}", file=sys.stderr)
        return EXIT_BAD
    except OSError as error:
        detail = f"{error.strerror}: {error.filename}" if error.filename else str(error)
        command = " ".join(filter(None, (args.command, getattr(args, "tool", None))))
        print(f"fedsec: {command} failed: {detail}", file=sys.stderr)
        return EXIT_FAILED


def _passphrase(args: argparse.Namespace) -> bytes | None:
    if args.passphrase_file:
        lines = Path(args.passphrase_file).read_bytes().splitlines()
        return lines[0] if lines else b""
    value = os.environ.get(PASSPHRASE_ENV)
    return None if value is None else value.encode()


def _ca_init(args: argparse.Namespace) -> int:
    cert = pki.init_ca(args.ca_dir, name=args.name, passphrase=_passphrase(args), days=args.days)
    print(f"created root {cert.subject.rfc4514_string()} (key {pki.fingerprint(cert.public_key())}), "
          f"valid until {cert.not_valid_after_utc:%Y-%m-%d}; wrote {Path(args.ca_dir) / 'ca.crt'} and "
          f"{Path(args.ca_dir) / 'ca.key'} (mode 0600)")
    return 0


def _ca_sign(args: argparse.Namespace) -> int:
    out = Path(args.out)
    if out.exists():
        raise EnrolmentError("exists", f"{out} exists; refusing to overwrite it")
    signed = pki.sign_request(args.ca_dir, Path(args.csr).read_bytes(), days=args.days,
                              passphrase=_passphrase(args))
    out.write_bytes(signed.certificate.public_bytes(serialization.Encoding.PEM))
    print(f"signed {signed.certificate.subject.rfc4514_string()}: name {signed.name}, role {signed.role}, "
          f"key {signed.fingerprint}, identity key {signed.identity_fingerprint}, serial "
          f"{signed.certificate.serial_number:x}, valid until "
          f"{signed.certificate.not_valid_after_utc:%Y-%m-%d}; wrote {out}")
    return 0


def _ca_revoke(args: argparse.Namespace) -> int:
    cert_pem = Path(args.cert).read_bytes()
    crl = pki.revoke(args.ca_dir, cert_pem, passphrase=_passphrase(args))
    print(f"revoked {Path(args.cert).name}; {Path(args.ca_dir) / 'ca.crl'} lists {len(crl)} certificate(s): "
          f"copy it to every server")
    return 0


def _site_init(args: argparse.Namespace) -> int:
    csr = pki.init_site(args.site_dir, name=args.name, role=args.role)
    directory = Path(args.site_dir)
    print(f"wrote {directory / (args.name + '.key')} and {directory / (args.name + '.identity.key')} "
          f"(mode 0600; they never leave this machine) and {directory / (args.name + '.csr')} "
          f"(send it to the CA); key {pki.fingerprint(csr.public_key())}")
    return 0


def _site_check(args: argparse.Namespace) -> int:
    from fedsec.config import load_config
    from fedsec.errors import ConfigError
    from fedsec.network.ledger import EpsilonLedger
    from fedsec.network.policy import admit_plan, check_plan, load_policy, plan_facts

    policy = load_policy(args.policy)
    plan_bytes = Path(args.plan).read_bytes()
    try:
        facts = plan_facts(load_config(args.plan))
    except ConfigError as error:
        raise ValueError(str(error)) from None
    run_id = hashlib.sha256(plan_bytes).hexdigest()
    if args.state:
        with EpsilonLedger(args.state, lifetime_cap=policy.max_epsilon_lifetime) as ledger:
            admit_plan(policy, facts, ledger=ledger, run_id=run_id, dry_run=True, name=args.name)
            spent = ledger.spent()
        ledger_text = f"; ledger: {spent:g} of {policy.max_epsilon_lifetime:g} spent"
    else:
        check_plan(policy, facts, name=args.name)
        ledger_text = ""
    print(f"plan sha256 {run_id} accepted by {policy.source} ({facts.aggregation}, {facts.sites_per_round} "
          f"sites a round, threshold {facts.threshold}, epsilon {facts.epsilon:g}, {facts.model}, "
          f"{facts.rounds} rounds){ledger_text}")
    return 0
