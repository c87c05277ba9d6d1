"""[sim]: validated up front, one line naming the key; Ray missing or not starting is one line."""

from __future__ import annotations

import subprocess
import sys

import pytest

from fedsec.cli import main
from fedsec.config import make_config
from fedsec.errors import ConfigError


@pytest.mark.parametrize("values, key", [
    ({"sim.num_cpus": 2}, "sim.num_cpus"),
    ({"sim.address": "auto"}, "sim.address"),
    ({"sim.cpus_per_client": 0.5}, "sim.cpus_per_client"),
    ({"sim.backend": "dask"}, "sim.backend"),
    ({"sim.backend": "ray", "sim.address": "localhost:6379"}, "sim.address"),
    ({"sim.backend": "ray", "sim.address": "ray://"}, "sim.address"),
    ({"sim.backend": "ray", "sim.num_cpus": -1}, "sim.num_cpus"),
    ({"sim.backend": "ray", "sim.cpus_per_client": 0.0}, "sim.cpus_per_client"),
    ({"sim.backend": "ray", "sim.num_cpus": 2, "sim.cpus_per_client": 3.0}, "sim.cpus_per_client"),
    ({"sim.backend": "ray", "sim.address": "auto", "sim.num_cpus": 2}, "sim.num_cpus"),
    ({"sim.backend": "ray", "train.algorithm": "ditto", "dp.mode": "none"}, "sim.backend"),
])
def test_bad_sim_keys_are_refused_naming_the_key(values, key):
    with pytest.raises(ConfigError) as caught:
        make_config(values)
    assert caught.value.key == key


def test_good_sim_keys_round_trip_through_toml(tmp_path):
    config = make_config({"sim.backend": "ray", "sim.address": "ray://head.example:10001",
                          "sim.cpus_per_client": 0.5})
    path = tmp_path / "c.toml"
    path.write_text(config.to_toml())
    from fedsec.config import load_config

    assert load_config(path) == config
    assert make_config({}).sim.backend == "local"


def _run_without_ray(code: str) -> subprocess.CompletedProcess:
    prelude = "import sys; sys.modules['ray'] = None\n"  # `import ray` now fails, as when absent
    return subprocess.run([sys.executable, "-c", prelude + code], capture_output=True, text=True,
                          timeout=120)


def test_ray_missing_is_one_line_and_exit_2(tmp_path):
    out = tmp_path / "run"
    done = _run_without_ray("from fedsec.cli import main\n"
                            f"sys.exit(main(['run', '--set', 'sim.backend=ray', '--out', {str(out)!r}, "
                            "'--quiet']))")
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fedsec: error: sim.backend:")
    assert "pip install 'fedsec[ray]'" in lines[0] and "Traceback" not in done.stderr
    assert not out.exists()


def test_ray_missing_at_connect_is_a_config_error(monkeypatch):
    from fedsec.backends import connect, ray_available

    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` fails, as when it is absent
    assert not ray_available()
    with pytest.raises(ConfigError) as caught:
        connect()
    assert caught.value.key == "sim.backend" and "pip install 'fedsec[ray]'" in str(caught.value)


def test_ray_failing_to_start_is_one_line_and_exit_1(tmp_path, monkeypatch, capsys):
    import ray

    def refuse(**options):
        raise ConnectionError("Could not find any running Ray instance.\nPlease start one.")

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", refuse)
    out = tmp_path / "run"
    code = main(["run", "--set", "sim.backend=ray", "--set", "sim.address=auto", "--out", str(out),
                 "--quiet"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1
    assert err == ["fedsec: run failed: could not start or join the Ray cluster at 'auto': "
                   "ConnectionError: Could not find any running Ray instance. Please start one."]
    assert not out.exists()


@pytest.mark.parametrize("failures", [1, 2])
def test_a_local_ray_that_misses_its_start_up_is_started_once_more(monkeypatch, failures):
    """A local node that timed out registering (a loaded machine) is shut down and started again,
    once; a second failure is the one-line error. A cluster's address is never retried."""
    import ray

    from fedsec.backends import BackendError, connect
    from fedsec.backends.session import LOCAL_START_ATTEMPTS

    calls: list[dict] = []
    shutdowns: list[int] = []

    def start(**options):
        calls.append(options)
        if len(calls) <= failures:
            raise Exception("The current node timed out during startup. This could happen because some of "
                            "the raylet failed to startup or the GCS has become overloaded.")

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", start)
    monkeypatch.setattr(ray, "shutdown", lambda: shutdowns.append(1))
    if failures < LOCAL_START_ATTEMPTS:
        assert connect() is ray
    else:
        with pytest.raises(BackendError, match="could not start or join a local Ray: Exception: The current"):
            connect()
    assert len(calls) == min(failures + 1, LOCAL_START_ATTEMPTS) and len(shutdowns) == min(failures, 1)
    assert all(c["address"] == "local" for c in calls)
    calls.clear()
    with pytest.raises(BackendError):
        connect(address="auto")  # a cluster: tried once
    assert len(calls) == 1
