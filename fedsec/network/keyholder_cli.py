"""``fedsec keyholder``: run the Paillier key holder until SIGTERM or Ctrl-C.

Exit codes: 0 stopped by SIGTERM, 130 by Ctrl-C (SIGINT), 1 a runtime failure (the address is
taken, a file cannot be read), 2 a bad argument, certificate or state directory (one line naming
it). Once it listens it prints one line, ``keyholder NAME listening PORT key KEY_ID ...``.
"""

from __future__ import annotations

import argparse
import signal
import threading
from pathlib import Path

EXIT_INTERRUPTED = 130


def register(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add ``keyholder`` to the ``fedsec`` parser."""
    parser = commands.add_parser(
        "keyholder", help="run the Paillier key holder (key-holder custody)",
        description="Hold the federation's only Paillier decryption key and decrypt authenticated "
        "aggregates for the coordinator alone. State (key, burned sequence numbers, enrolments, "
        "audit.db) lives in --state and survives a crash. Stops on SIGTERM (exit 0) or Ctrl-C (130).")
    parser.add_argument("--ca", required=True, metavar="CA_CERT", help="the study's ca.crt")
    parser.add_argument("--crl", metavar="CRL", help="the study's ca.crl (default: ca.crl beside CA_CERT; "
                        "re-read when it changes)")
    parser.add_argument("--cert", required=True, metavar="CERT", help="this key holder's certificate")
    parser.add_argument("--key", required=True, metavar="KEY", help="its TLS key (NAME.key)")
    parser.add_argument("--identity", metavar="FILE", help="its Ed25519 identity key (default: "
                        "NAME.identity.key beside KEY)")
    parser.add_argument("--listen", required=True, metavar="HOST:PORT", help="port 0: any free one")
    parser.add_argument("--state", required=True, metavar="DIR", help="state directory (created 0700)")
    parser.add_argument("--coordinator", required=True, metavar="NAME",
                        help="the only party admitted: the coordinator's certificate name (role server)")
    parser.add_argument("--sites", metavar="NAMES", help="comma-separated site names it enrols "
                        "(default: any site certified by the root and not revoked)")
    parser.add_argument("--threshold", type=int, metavar="T", help="fewest contributions a decrypted sum "
                        "holds, >= 2; required when the state directory has no key yet")
    parser.add_argument("--key-bits", type=int, default=2048, choices=(2048, 3072),
                        help="Paillier modulus size of a new key (default: %(default)s)")
    parser.set_defaults(network_handler=run)
    deal = commands.add_parser(
        "deal", help="threshold custody's key ceremony (the auditor, offline)",
        description="Draw a Paillier key, split it t-of-N among the plan's roster and write one share "
        "file per site (NAME.share, mode 0600: hand it to that site, which keeps it as "
        "STATE_DIR/paillier.share) and dealing.json (public). Signed with this key holder certificate's "
        "identity key (role keyholder, name federation.keyholder_name). Nothing is kept.")
    deal.add_argument("plan", metavar="PLAN.toml", help="the deployment plan (roster, threshold)")
    deal.add_argument("--sites", required=True, nargs="+", metavar="CERT",
                      help="every roster site's certificate")
    deal.add_argument("--ca", required=True, metavar="CA_CERT")
    deal.add_argument("--crl", metavar="CRL", help="default: ca.crl beside CA_CERT")
    deal.add_argument("--cert", required=True, metavar="CERT", help="the dealer's (key holder) certificate")
    deal.add_argument("--identity", required=True, metavar="FILE", help="its Ed25519 identity key")
    deal.add_argument("--out", required=True, metavar="DIR", help="where the share files go (new files only)")
    deal.add_argument("--key-bits", type=int, default=2048, choices=(2048, 3072))
    deal.set_defaults(network_handler=run_deal)


def _identity_path(args: argparse.Namespace) -> Path:
    if args.identity:
        return Path(args.identity)
    key = Path(args.key)
    stem = key.name[: -len(".key")] if key.name.endswith(".key") else key.name
    return key.with_name(f"{stem}.identity.key")


def run(args: argparse.Namespace) -> int:
    """Serve until a signal; returns the exit code."""
    from fedsec.network.errors import PeerRejected
    from fedsec.network.heap import keep_freed_memory
    from fedsec.network.keyholder import KeyHolderService, OneThread, load_identity, raw_identity
    from fedsec.network.keyholder_state import KeyHolderState
    from fedsec.network.pki import Trust, check_name, verify_peer
    from fedsec.network.transport import TransportServer

    check_name(args.coordinator)
    sites = None if args.sites is None else frozenset(check_name(n) for n in args.sites.split(",") if n)
    crl = Path(args.crl) if args.crl else Path(args.ca).with_name("ca.crl")
    trust = Trust.load(args.ca, crl)
    cert_pem = Path(args.cert).read_bytes()
    try:
        me = verify_peer(cert_pem, trust=trust, roles=("keyholder",))
    except PeerRejected as error:
        raise ValueError(f"cert: {args.cert} is not a valid key holder certificate of this study "
                         f"({error.reason})") from None
    identity = load_identity(_identity_path(args))
    if identity.public != raw_identity(me.identity_key):
        raise ValueError(f"identity: {_identity_path(args)} is not the identity key in {args.cert}")
    keep_freed_memory()

    def build() -> KeyHolderService:
        state = KeyHolderState(args.state, threshold=args.threshold, key_bits=args.key_bits)
        return KeyHolderService(state=state, identity=identity, name=me.name, trust=trust, sites=sites,
                                certificate=cert_pem)

    runner = OneThread(build)
    service = runner.service
    try:
        server = TransportServer(trust=trust, cert_pem=cert_pem, key_pem=Path(args.key).read_bytes(),
                                 handler=runner.handle, roster={args.coordinator}, roles=("server",),
                                 listen=args.listen)
    except BaseException:
        runner.close()
        raise
    stop, received = threading.Event(), []
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda number, _frame: (received.append(number), stop.set()))
    port = server.start()
    facts = service.started
    print(f"keyholder {me.name} listening {port} key {facts['key_id']} threshold {facts['threshold']} "
          f"epoch {facts['epoch']} bits {facts['key_bits']} last_sequence {facts['last_sequence']} "
          f"({'new key' if facts['new_key'] else 'key loaded'}; state {args.state})", flush=True)
    stop.wait()
    server.stop(2.0)
    runner.close()
    return EXIT_INTERRUPTED if received and received[0] == signal.SIGINT else 0


def run_deal(args: argparse.Namespace) -> int:
    """``fedsec deal``: write the share files; returns the exit code."""
    import json

    from fedsec.config import load_config
    from fedsec.errors import ConfigError
    from fedsec.network.errors import PeerRejected
    from fedsec.network.keyholder import load_identity, raw_identity
    from fedsec.network.layers.paillier import plan_threshold
    from fedsec.network.layers.paillier_dealer import deal, write_new
    from fedsec.network.pki import Trust, verify_peer

    try:
        config = load_config(args.plan)
    except ConfigError as error:
        raise ValueError(str(error)) from None
    f = config.federation
    if config.secure.aggregation != "paillier" or config.secure.custody != "threshold":
        raise ValueError("secure.custody: the plan does not use Paillier with threshold custody")
    if not f.sites:
        raise ValueError("federation.sites: the plan lists no roster")
    crl = Path(args.crl) if args.crl else Path(args.ca).with_name("ca.crl")
    trust = Trust.load(args.ca, crl)
    cert_pem = Path(args.cert).read_bytes()
    try:
        me = verify_peer(cert_pem, trust=trust, roles=("keyholder",), roster={f.keyholder_name})
    except PeerRejected as error:
        raise ValueError(f"cert: {args.cert} is not the plan's key holder {f.keyholder_name!r} "
                         f"({error.reason})") from None
    identity = load_identity(args.identity)
    if identity.public != raw_identity(me.identity_key):
        raise ValueError(f"identity: {args.identity} is not the identity key in {args.cert}")
    certificates = {}
    for path in args.sites:
        pem = Path(path).read_bytes()
        try:
            certificates[verify_peer(pem, trust=trust, roles=("site",)).name] = pem
        except PeerRejected as error:
            raise ValueError(f"sites: {path} does not verify ({error.reason})") from None
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if (out / "dealing.json").exists() or any((out / f"{n}.share").exists() for n in f.sites):
        raise ValueError(f"out: {out} already holds a dealing; refusing to overwrite it")
    threshold = plan_threshold(config, len(f.sites))
    shares, public = deal(roster=list(f.sites), site_certificates=certificates, threshold=threshold,
                          trust=trust, identity=identity, dealer_certificate=cert_pem, key_bits=args.key_bits)
    for name, record in shares.items():
        write_new(out / f"{name}.share", json.dumps(record, sort_keys=True) + "\n", 0o600)
    write_new(out / "dealing.json", json.dumps(public, sort_keys=True, indent=1) + "\n", 0o644)
    print(f"dealt key {public['key_id']} {threshold}-of-{len(f.sites)} to {', '.join(f.sites)}; wrote "
          f"{len(shares)} share files (mode 0600; each goes to its site as STATE_DIR/paillier.share) and "
          f"{out / 'dealing.json'}")
    return 0
