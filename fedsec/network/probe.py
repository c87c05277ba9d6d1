"""A connectivity check for a deployment: a mutual-TLS echo server and its client.

Before a federation runs, each hospital's IT department can check that its certificate is
admitted and that a model-sized payload crosses its firewall:

    coordinator$ python -m fedsec.network.probe serve --ca ca.crt --crl ca.crl \\
                     --cert coordinator.crt --key coordinator.key --listen 0.0.0.0:7443 --roster hosp-a,hosp-b
    hospital$    python -m fedsec.network.probe call HOST:7443 --ca ca.crt --cert hosp-a.crt \\
                     --key hosp-a.key --server coordinator --bytes 40000000

The server answers ``whoami`` with the caller's name, role and key fingerprint as its certificate
states them, and ``echo`` with the payload itself. ``serve`` prints ``listening PORT`` once ready
and stops cleanly on SIGTERM or Ctrl-C. ``call`` prints one JSON line.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from fedsec.network.errors import MalformedFrame, PeerRejected
from fedsec.network.pki import Peer, Trust
from fedsec.network.transport import TransportClient, TransportError, TransportServer


def probe_handler(peer: Peer, topic: str, payload: bytes) -> bytes:
    """``whoami``: the caller as its certificate says; ``echo``: the payload back."""
    if topic == "whoami":
        return json.dumps({"name": peer.name, "role": peer.role, "fingerprint": peer.fingerprint}).encode()
    if topic == "echo":
        return payload
    raise ValueError(f"unknown topic {topic!r}")


def _serve(args: argparse.Namespace) -> int:
    trust = Trust.load(args.ca, args.crl)
    roster = None if args.roster is None else {n for n in args.roster.split(",") if n}
    server = TransportServer(trust=trust, cert_pem=Path(args.cert).read_bytes(),
                             key_pem=Path(args.key).read_bytes(), handler=probe_handler, roster=roster,
                             roles=tuple(args.roles.split(",")), listen=args.listen)
    port = server.start()
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    print(f"listening {port}", flush=True)
    stop.wait()
    server.stop(1.0)
    return 0


def _call(args: argparse.Namespace) -> int:
    trust = Trust.load(args.ca, args.crl)
    payload = os.urandom(args.bytes)
    with TransportClient(address=args.address, trust=trust, cert_path=args.cert, key_path=args.key,
                         server_name=args.server, server_role=args.server_role, deadline=args.deadline) as c:
        try:
            me = json.loads(c.call("whoami", b""))
            start = time.perf_counter()
            echoed = c.call("echo", payload)
            seconds = time.perf_counter() - start
        except (TransportError, PeerRejected, MalformedFrame) as error:
            print(json.dumps({"ok": False, "error": str(error)}))
            return 1
    ok = hashlib.sha256(echoed).digest() == hashlib.sha256(payload).digest()
    print(json.dumps({"ok": ok, "as": me, "bytes": args.bytes, "round_trip_s": seconds}))
    return 0 if ok else 1


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fedsec.network.probe",
                                     description=__doc__.split("\n")[0])
    tools = parser.add_subparsers(dest="tool", required=True)
    serve = tools.add_parser("serve", help="run the echo server")
    call = tools.add_parser("call", help="call an echo server")
    call.add_argument("address", metavar="HOST:PORT")
    for p in (serve, call):
        p.add_argument("--ca", required=True, help="the study's ca.crt")
        p.add_argument("--crl", help="the study's ca.crl (re-read when it changes)")
        p.add_argument("--cert", required=True)
        p.add_argument("--key", required=True)
    serve.add_argument("--listen", default="127.0.0.1:0", help="HOST:PORT (port 0: any free one)")
    serve.add_argument("--roster", help="comma-separated names admitted (default: any enrolled)")
    serve.add_argument("--roles", default="site,keyholder", help="client roles admitted")
    call.add_argument("--server", required=True, help="the server's certificate name")
    call.add_argument("--server-role", default="server", choices=("server", "keyholder"))
    call.add_argument("--bytes", type=int, default=1 << 20, help="echo payload size")
    call.add_argument("--deadline", type=float, default=60.0, help="seconds per call")
    args = parser.parse_args(argv)
    return _serve(args) if args.tool == "serve" else _call(args)


if __name__ == "__main__":
    sys.exit(main())
