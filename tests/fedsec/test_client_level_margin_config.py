"""A client-level DP run whose threshold does not exceed the colluders it tolerates is refused
before it starts: shares of mu / (t - c) need t - c >= 1 (docs/privacy.md section 4)."""

from __future__ import annotations

import pytest

from fedsec.cli import main
from fedsec.config import honest_margin, make_config
from fedsec.errors import ConfigError

PAILLIER_20 = {"data.clients": 20, "dp.mode": "client", "secure.aggregation": "paillier",
               "secure.threshold": 2}
HARARY_88 = {"data.clients": 88, "dp.mode": "client", "data.dataset": "synthetic", "data.samples": 1000,
             "secure.graph": "harary", "secure.active": False, "secure.corrupt": 0.45}


@pytest.mark.parametrize("values, t, c", [(PAILLIER_20, 2, 2), (HARARY_88, 39, 39)])
def test_no_honest_share_is_a_config_error_naming_the_threshold(values, t, c):
    with pytest.raises(ConfigError) as caught:
        make_config(values)
    assert caught.value.key == "secure.threshold"
    message = str(caught.value)
    assert f"above the {c} tolerated colluders" in message and f"threshold is {t}" in message
    # the same plan without client-level noise runs: only the noise rule needs t - c >= 1
    make_config({**values, "dp.mode": "dpsgd"})


def test_the_margin_at_the_default_and_at_20_sites():
    """(t, c) of the README's default run (4 clients, corrupt 0.1: c = 0, shares unchanged), of
    10 and of 20 clients: the shares grow by t / (t - c) = 1, 6 / 5 and 11 / 9; Paillier's
    default threshold likewise."""
    default = make_config({"dp.mode": "client"})
    assert default.data.clients == 4 and honest_margin(default.secure, 4) == (2, 0)
    assert honest_margin(make_config({"dp.mode": "client", "data.clients": 10}).secure, 10) == (6, 1)
    assert honest_margin(make_config({"dp.mode": "client", "data.clients": 20}).secure, 20) == (11, 2)
    paillier = make_config({"dp.mode": "client", "data.clients": 20, "secure.aggregation": "paillier"})
    assert honest_margin(paillier.secure, 20) == (11, 2)


def test_the_cli_exits_2_with_one_line(tmp_path, capsys):
    out = tmp_path / "run"
    args = [f"--set={k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in PAILLIER_20.items()]
    assert main(["run", *args, "--out", str(out), "--quiet"]) == 2
    assert not out.exists()
    err = capsys.readouterr().err.strip()
    assert err.startswith("fedsec: error: secure.threshold:") and "\n" not in err
