"""A ``train`` job names its global model by SHA-256 instead of carrying it when the site holds
that model: the one its last completed ``evaluate`` job sent, which is where the next round
starts. A site then downloads one model a round instead of two.

Adversary: the coordinator alone. A site's held model lives in its own process's memory, which no
other party reaches. The coordinator may name any digest or none, with or without a body, before
or after any evaluation, after the site restarted, or in a job bundled with a stage. The sites are
the project's unmodified site code (``SiteJobs`` on a real ``Site``, ``SiteWork``, ``site.db``, the
audit log), as in ``test_bundled_jobs``.

Properties:

1. A site trains only from a model whose values are, bit for bit, the body of this job, or the
   body of its last completed ``evaluate`` job when the job names that body's SHA-256 and carries
   no body. It then trains exactly as a twin site sent that body.
2. A job naming a model the site does not hold is refused with ``model.unknown``. A malformed
   name, or a name together with a body, is refused with ``MalformedEnvelope``. Either way the
   refusal comes before the round is recorded in ``site.db`` (so nothing is charged), and a
   bundled stage is not run.
3. A hypothesis search over the coordinator's choices (jobs, bodies, names, order) finds no
   other outcome.
4. The coordinator names a model only to a site whose evaluation of it was answered and that has
   not accepted the plan again since. A federation that names models has the history and final
   model of one that always sends them.
"""

from __future__ import annotations

import csv
import hashlib
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedsec.config import loads_config
from fedsec.network import demo, pki
from fedsec.network.coordinator import Hub
from fedsec.network.envelope import decode, vector_bytes
from fedsec.network.party_audit import PartyAudit
from fedsec.network.site import load_identity
from tests.fedsec.network.resume_harness import Federation
from tests.fedsec.network.test_bundled_jobs import Party, bundle, first_stage

N = 3


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> demo.Deployment:
    return demo.prepare(tmp_path_factory.mktemp("named"), N, rounds=3, extra='[dp]\nmode = "none"\n')


def _models(length: int, count: int = 3) -> list[bytes]:
    rng = np.random.default_rng(7)
    return [vector_bytes(rng.normal(0.0, 0.1, size=length).astype(np.float32)) for _ in range(count)]


def _digest(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


def _train(round_index: int, body: bytes, **named: Any) -> tuple[dict[str, Any], bytes]:
    state = np.random.default_rng(round_index).bit_generator.state
    return ({"kind": "train", "round": round_index, "rng": state, "head": None, "noise_multiplier": None,
             **named}, body)


def _evaluate(round_index: int, body: bytes) -> tuple[dict[str, Any], bytes]:
    return {"kind": "evaluate", "round": round_index}, body


def _update(party: Party) -> tuple[bytes, int] | None:
    """The site's pending update (its values' bytes, its weight), or None."""
    pending = party.site.work.pending
    if pending is None or pending.purpose != "update":
        return None
    return np.asarray(pending.vector, dtype=np.float32).tobytes(), int(pending.weight)


def test_a_named_model_trains_exactly_as_the_model_sent(deployment, tmp_path):
    named, sent = Party(deployment, 0, tmp_path / "named"), Party(deployment, 0, tmp_path / "sent")
    try:
        model = _models(named.site.work.length)[0]
        for party in (named, sent):
            assert party.send(*_evaluate(1, model))[0]["ok"] is True
        assert named.send(*_train(2, b"", model=_digest(model)))[0]["ok"] is True
        assert sent.send(*_train(2, model))[0]["ok"] is True
        assert _update(named) is not None and _update(named) == _update(sent)
        assert named.records() == sent.records() == ([2], [])
        # training did not change the model held: the same name trains the same update again
        first = _update(named)
        assert named.send(*_train(2, b"", model=_digest(model)))[0]["ok"] is True
        assert _update(named) == first
    finally:
        named.close()
        sent.close()


def test_a_model_the_site_does_not_hold_is_refused_before_anything_is_recorded(deployment, tmp_path):
    party = Party(deployment, 1, tmp_path / "site")
    try:
        first, second, _ = _models(party.site.work.length)
        # no evaluation yet
        answer, _ = party.send(*_train(1, b"", model=_digest(first)))
        assert (answer["ok"], answer["reason"]) == (False, "model.unknown")
        assert party.records() == ([], []) and _update(party) is None
        # the evaluation was of another model
        assert party.send(*_evaluate(1, second))[0]["ok"] is True
        answer, _ = party.send(*_train(1, b"", model=_digest(first)))
        assert (answer["ok"], answer["reason"]) == (False, "model.unknown")
        assert party.records() == ([], [])
        # bundled with the update's first stage: refused, the stage is not run, no layer is set up
        stage = first_stage(deployment, party.config, purpose="update", round_index=1,
                            length=party.site.work.length)[0]
        header, body = bundle(_train(1, b"", model=_digest(first)), 1, "advertise keys", stage)
        answer, out = party.send(header, body)
        assert (answer["ok"], answer["reason"], out) == (False, "model.unknown", b"")
        assert party.jobs.layer is None and party.records() == ([], [])
        # the model held: trained
        assert party.send(*_train(1, b"", model=_digest(second)))[0]["ok"] is True
        assert party.records() == ([1], [])
    finally:
        party.close()
    # a restarted site (a new process over the same site.db) holds no model
    again = Party(deployment, 1, tmp_path / "site")
    try:
        answer, _ = again.send(*_train(2, b"", model=_digest(second)))
        assert (answer["ok"], answer["reason"]) == (False, "model.unknown")
        assert again.records() == ([1], [])
    finally:
        again.close()


def test_a_malformed_name_or_a_name_with_a_body_is_refused(deployment, tmp_path):
    party = Party(deployment, 2, tmp_path / "site")
    try:
        model = _models(party.site.work.length)[0]
        assert party.send(*_evaluate(1, model))[0]["ok"] is True
        good = _digest(model)
        for name, body in [(good, model),  # a name and a body: which one?
                           (good, model[:8]),
                           (good.upper(), b""), (good[:-1], b""), (good + "0", b""), ("", b""),
                           (int(good, 16), b""), ([good], b""), (True, b"")]:
            answer, _ = party.send(*_train(1, body, model=name))
            assert (answer["ok"], answer["reason"]) == (False, "MalformedEnvelope"), name
        assert party.records() == ([], []) and _update(party) is None
    finally:
        party.close()


# a coordinator's choice of body and of name for one job
BODIES = st.sampled_from(["model0", "model1", "model2", "empty", "short"])
NAMES = st.sampled_from([None, "model0", "model1", "model2", "random", "upper"])
JOBS = st.lists(st.one_of(st.tuples(st.just("evaluate"), BODIES, st.none(), st.integers(1, 3)),
                          st.tuples(st.just("train"), BODIES, NAMES, st.integers(1, 3))),
                min_size=1, max_size=6)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(jobs=JOBS)
def test_search_the_site_trains_only_from_a_model_it_was_sent(deployment, jobs):
    with tempfile.TemporaryDirectory() as root:
        site, twin = Party(deployment, 0, Path(root) / "site"), Party(deployment, 0, Path(root) / "twin")
        try:
            models = _models(site.site.work.length)
            bodies = {"model0": models[0], "model1": models[1], "model2": models[2], "empty": b"",
                      "short": models[0][:-4]}
            names = {"model0": _digest(models[0]), "model1": _digest(models[1]),
                     "model2": _digest(models[2]), "random": "0f" * 32, "upper": _digest(models[0]).upper()}
            held: bytes | None = None
            for kind, body_choice, name_choice, round_index in jobs:
                body = bodies[body_choice]
                before = (site.records(), _update(site))
                if kind == "evaluate":
                    answer, _ = site.send(*_evaluate(round_index, body))
                    assert answer["ok"] is (len(body) == len(models[0]))
                    if answer["ok"]:
                        held = body
                    continue
                named = {} if name_choice is None else {"model": names[name_choice]}
                # what the site may train from, or the refusal it must give
                if name_choice is None:
                    expected: bytes | str = body if len(body) == len(models[0]) else "MalformedEnvelope"
                elif name_choice == "upper" or body:
                    expected = "MalformedEnvelope"
                elif held is not None and names[name_choice] == _digest(held):
                    expected = held
                else:
                    expected = "model.unknown"
                answer, _ = site.send(*_train(round_index, body, **named))
                if isinstance(expected, str):
                    assert (answer["ok"], answer["reason"]) == (False, expected)
                    assert (site.records(), _update(site)) == before  # nothing recorded or trained
                    continue
                # the twin is sent the model the site may train from: both answer alike, train alike
                mirror, _ = twin.send(*_train(round_index, expected))
                assert answer["ok"] is mirror["ok"] and answer.get("reason") == mirror.get("reason")
                assert site.records() == twin.records()
                if answer["ok"]:
                    assert _update(site) == _update(twin) is not None
        finally:
            site.close()
            twin.close()


def _hub(d: demo.Deployment, out: Path) -> Hub:
    plan = d.plan.read_bytes()
    audit = PartyAudit(out, actor="coordinator", key=load_identity(d.coordinator.identity),
                       run_id=hashlib.sha256(plan).hexdigest()[:16])
    return Hub(config=loads_config(plan.decode()), plan_bytes=plan, trust=pki.Trust.load(d.ca),
               cert_pem=d.coordinator.cert.read_bytes(), key_pem=d.coordinator.key.read_bytes(),
               audit=audit, listen="127.0.0.1:0")


def test_the_coordinator_names_a_model_only_to_a_site_that_evaluated_it_since_it_joined(deployment, tmp_path):
    hub = _hub(deployment, tmp_path)
    try:
        a, b, c = hub.names
        hub.joins.update({a: 1, b: 1, c: 1})
        hub.evaluated([a, b], "11" * 32)
        assert hub.holds_model(a, "11" * 32) and hub.holds_model(b, "11" * 32)
        assert not hub.holds_model(c, "11" * 32)  # its evaluation was not answered
        assert not hub.holds_model(a, "22" * 32)  # another model
        hub.joins[b] = 2  # b accepted the plan again: a restarted site holds nothing
        assert not hub.holds_model(b, "11" * 32)
        hub.evaluated([b], "22" * 32)
        assert hub.holds_model(b, "22" * 32) and not hub.holds_model(b, "11" * 32)
    finally:
        hub.audit.close()


def _history(path: Path) -> list[dict[str, str]]:
    rows = list(csv.DictReader(open(path)))
    for row in rows:
        row.pop("seconds")
    return rows


@pytest.mark.slow
def test_a_federation_that_names_models_runs_as_one_that_sends_them(tmp_path, monkeypatch):
    """Four in-process sites under masking and reproducible DP-SGD (resume_harness): from round 2
    every train job names the model, with an empty body; history and final model equal a run whose
    coordinator always sends the model."""
    extra = "[dp]\nreproducible = true\naccountant = \"rdp\"\n"
    named = Federation(tmp_path / "named", rounds=3, extra=extra)
    seen: list[tuple[int, bool, int]] = []
    for site in named.sites.values():
        answer = site.answer

        def spy(payload: bytes, answer: Any = answer) -> bytes:
            header, body = decode(payload)
            if header.get("kind") == "train":
                seen.append((header["round"], "model" in header, len(body)))
            first = header.get("first") if header.get("kind") == "layer" else None
            if isinstance(first, dict) and first.get("kind") == "train":
                seen.append((first["round"], "model" in first, header["first_size"]))
            return answer(payload)

        site.answer = spy  # type: ignore[method-assign]
    try:
        summary = named.coordinator()
    finally:
        named.close()
    sent = Federation(tmp_path / "sent", rounds=3, extra=extra)
    try:
        monkeypatch.setattr(Hub, "holds_model", lambda self, name, digest: False)
        reference = sent.coordinator()
    finally:
        sent.close()
    assert summary is not None and reference is not None
    assert sorted(seen) == sorted([(1, False, 4 * named.sites["hospital-a"].work.length)] * 4 +
                                  [(r, True, 0) for r in (2, 3) for _ in range(4)])
    assert summary["model_sha256"] == reference["model_sha256"]
    history = _history(named.out / "history.csv")
    assert [row["status"] for row in history] == ["ok"] * 3 and all(row["accuracy"] for row in history)
    assert history == _history(sent.out / "history.csv")
