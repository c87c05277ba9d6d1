"""The transport across OS processes: a probe server started with ``python -m`` and clients here."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from fedsec.network import probe
from fedsec.network.transport import TransportClient, TransportError

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def server_process(study):
    coordinator = study.parties["coordinator"]
    process = subprocess.Popen(
        [sys.executable, "-m", "fedsec.network.probe", "serve", "--ca", str(study.ca_dir / "ca.crt"),
         "--crl", str(study.ca_dir / "ca.crl"), "--cert", str(coordinator.cert),
         "--key", str(coordinator.key),
         "--roster", "hosp-a,hosp-revoked"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        line = process.stdout.readline()
        assert line.startswith("listening "), line
        yield process, int(line.split()[1])
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=5)


def test_probe_call_reports_the_certificate_identity(study, server_process, capsys):
    _, port = server_process
    site = study.parties["hosp-a"]
    probe.main(["call", f"127.0.0.1:{port}", "--ca", str(study.ca_dir / "ca.crt"), "--cert", str(site.cert),
                "--key", str(site.key), "--server", "coordinator", "--bytes", "10"])
    line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert line["ok"] is True and line["as"]["name"] == "hosp-a" and line["as"]["role"] == "site"


def test_a_server_in_another_process_admits_members_and_stops_on_sigterm(study, server_process):
    process, port = server_process
    site = study.parties["hosp-a"]
    assert probe.main(["call", f"127.0.0.1:{port}", "--ca", str(study.ca_dir / "ca.crt"), "--crl",
                       str(study.ca_dir / "ca.crl"), "--cert", str(site.cert), "--key", str(site.key),
                       "--server", "coordinator", "--bytes", "3000000"]) == 0
    for who, code in [("hosp-revoked", "UNAUTHENTICATED"), ("hosp-b", "PERMISSION_DENIED")]:
        party = study.parties[who]
        with TransportClient(address=f"127.0.0.1:{port}", trust=study.trust(), cert_path=party.cert,
                             key_path=party.key, server_name="coordinator", deadline=5) as client:
            with pytest.raises(TransportError) as caught:
                client.call("whoami", b"")
        assert caught.value.code == code
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=5) == 0
