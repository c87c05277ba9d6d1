"""A job bundled with the first stage of an aggregation (one call instead of two) gets the site's
answers of today's two calls.

Adversary: the coordinator alone. It may bundle any ``train``/``evaluate`` job with any stage
message, with or without a setup, for any purpose and round; send a bundle twice; mismatch the
rounds of the job, the bundle and the setup; or lie about the bundled job's size. The sites are
the project's unmodified site code: :class:`~fedsec.network.site.SiteJobs` (what ``fedsec join``
runs for every job) on a real :class:`~fedsec.network.site.Site`, its ``SiteWork``, its durable
``site.db`` and audit log; only the gRPC hop is left out (the coordinator's certificate is set as the
one the site's handshake would have verified).

Properties: (1) an honest round with the bundles sums what the two-call round sums; (2) for every
sequence of messages the adversary searches (hypothesis), a site given bundles answers exactly as a
twin site given the same jobs unbundled (the first job, then, if that was not refused, the stage):
same ``ok``/reason for each, same durable records (rounds trained, contributions consumed); and no
contribution goes into two setups; (3) malformed bundles are refused before anything is trained.
"""

from __future__ import annotations

import io
import itertools
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fedsec.fl_core.aggregation import ClientUpdate
from fedsec.protocols.errors import ClientAbort, ProtocolAbort
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedsec.config import loads_config
from fedsec.network import demo, pki
from fedsec.network.envelope import vector_bytes
from fedsec.network.layers import CoordinatorContext, SiteContext, split_first
from fedsec.network.layers.masking import MaskingCoordinator, MaskingSite
from fedsec.network.party_audit import PartyAudit
from fedsec.network.policy import SitePolicy
from fedsec.network.site import Site, SiteJobs, SitePaths
from fedsec.network.site_state import SiteState
from fedsec.network.site_work import SiteWork

N = 3
RUN = "ab" * 32
"""The run id (a plan's SHA-256) the sites record their contributions under."""


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> demo.Deployment:
    return demo.prepare(tmp_path_factory.mktemp("bundle"), N, rounds=3, extra='[dp]\nmode = "none"\n')


class Party:
    """One honest site: the real ``Site`` and its ``SiteJobs``, state under ``state``."""

    def __init__(self, d: demo.Deployment, k: int, state: Path) -> None:
        enrolled = d.sites[k]
        paths = SitePaths(ca=d.ca, crl=None, cert=enrolled.cert, key=enrolled.key, identity=enrolled.identity,
                          data=d.data[k], state=state)
        self.site = Site(address="127.0.0.1:1", paths=paths, policy=SitePolicy(dp_required=False),
                         server_name="coordinator", out=io.StringIO())
        trust = self.site.trust
        # what the site's TLS handshake verifies before its first call
        self.site.client.server = pki.verify_peer(d.coordinator.cert.read_bytes(), trust=trust,
                                                  roles=("server",))
        config = loads_config(d.plan.read_text())
        self.config = config
        self.state = SiteState(state)
        self.state.accept(RUN, d.plan.read_text())
        self.site.audit = PartyAudit(state, actor=self.site.name, key=self.site.identity, run_id=RUN[:16])
        self.site.work = SiteWork.load(config, name=self.site.name, path=d.data[k],
                                       record=self.state.record(RUN))
        context = SiteContext(config=config, name=self.site.name, client_id=k,
                              names=tuple(config.federation.sites), identity=self.site.identity, trust=trust,
                              sessions=self.state, state=state, policy=self.site.policy)
        self.jobs = SiteJobs(self.site, context=context, sha=RUN, state=self.state)
        self.ids = itertools.count(1)

    def send(self, header: dict[str, Any], body: bytes) -> tuple[dict[str, Any], bytes]:
        """One job as the site's loop hands it to ``SiteJobs.run``."""
        job = next(self.ids)
        header = {**header, "job": job}
        round_index = header.get("round")
        if isinstance(round_index, bool) or not isinstance(round_index, int):  # as the site's loop
            round_index = None
        return self.jobs.run(job, header, body, round_index)

    def records(self) -> tuple[list[int], list[tuple[str, int]]]:
        """The durable records: rounds trained, contributions consumed."""
        used = [(kind, r) for kind in ("update", "evaluation") for r in range(0, 4)
                if self.state.used(RUN, kind, r)]
        return self.state.contributed(RUN), used

    def close(self) -> None:
        assert self.site.audit is not None
        self.site.audit.close()
        self.state.close()
        self.site.client.close()


def train_job(party: Party, round_index: int) -> tuple[dict[str, Any], bytes]:
    model = np.zeros(party.site.work.length, dtype=np.float32)
    state = np.random.default_rng(round_index).bit_generator.state
    return ({"kind": "train", "round": round_index, "rng": state, "head": None, "noise_multiplier": None},
            vector_bytes(model))


def evaluate_job(party: Party, round_index: int) -> tuple[dict[str, Any], bytes]:
    return {"kind": "evaluate", "round": round_index}, vector_bytes(np.zeros(party.site.work.length,
                                                                            dtype=np.float32))


def bundle(first: tuple[dict[str, Any], bytes], round_index: int, stage: str,
           message: bytes) -> tuple[dict[str, Any], bytes]:
    """A ``layer`` job carrying ``first`` as the coordinator's hub builds one."""
    header, body = first
    return ({"kind": "layer", "round": round_index, "stage": stage, "first": header, "first_size": len(body)},
            body + message)


def first_stage(d: demo.Deployment, config: Any, *, purpose: str, round_index: int,
                length: int) -> dict[int, bytes]:
    """The project's masking coordinator's first messages (setup + advertise keys) to the N sites."""
    captured: dict[int, bytes] = {}

    def exchange(stage: str, messages: dict[int, bytes]) -> dict[int, bytes]:
        if not captured:
            captured.update(messages)
        return {}

    peers = {s.name: pki.verify_peer(s.cert.read_bytes(), trust=pki.Trust.load(d.ca), roles=("site",))
             for s in d.sites}
    context = CoordinatorContext(config=config, rng=np.random.default_rng(),
                                 names=tuple(config.federation.sites),
                                 certificates={s.name: s.cert.read_bytes() for s in d.sites}, peers=peers,
                                 max_weight=1000, exchange=exchange)
    updates = [ClientUpdate(c, np.zeros(length, dtype=np.float32), 1.0) for c in range(N)]
    with pytest.raises(ProtocolAbort):
        MaskingCoordinator(context).aggregate(round_index, updates, purpose=purpose)
    return captured


def test_an_honest_bundled_round_sums_what_the_two_call_round_sums(deployment, tmp_path):
    """The project's coordinator layer over sites given train+first stage in one job."""
    groups = {way: [Party(deployment, k, tmp_path / way / str(k)) for k in range(N)]
              for way in ("one", "two")}
    try:
        results = {}
        for way, parties in groups.items():
            sent: list[str] = []

            def exchange(stage: str, messages: dict[int, bytes], parties=parties, way=way,
                         sent=sent) -> dict[int, bytes]:
                replies = {}
                for c, message in messages.items():
                    if way == "one" and not sent:
                        header, body = bundle(train_job(parties[c], 1), 1, stage, message)
                    else:
                        header, body = {"kind": "layer", "round": 1, "stage": stage}, message
                    answer, out = parties[c].send(header, body)
                    assert answer["ok"] is True, answer
                    replies[c] = out
                sent.append(stage)
                return replies

            if way == "two":
                for p in parties:
                    answer, _ = p.send(*train_job(p, 1))
                    assert answer["ok"] is True and answer["head"]["seq"] >= 1
            config = parties[0].config
            peers = {s.name: pki.verify_peer(s.cert.read_bytes(), trust=pki.Trust.load(deployment.ca),
                                             roles=("site",)) for s in deployment.sites}
            context = CoordinatorContext(config=config, rng=np.random.default_rng(0),
                                         names=tuple(config.federation.sites),
                                         certificates={s.name: s.cert.read_bytes() for s in deployment.sites},
                                         peers=peers, max_weight=1000, exchange=exchange)
            length = parties[0].site.work.length
            updates = [ClientUpdate(c, np.zeros(length, dtype=np.float32), 1.0) for c in range(N)]
            results[way] = MaskingCoordinator(context).aggregate(1, updates, purpose="update")
            assert [p.records() for p in parties] == [([1], [("update", 1)])] * N
        one, two = results["one"], results["two"]
        assert one.participants == two.participants == (0, 1, 2)
        assert one.total_weight == two.total_weight == sum(len(p.site.work.train_data) for p in groups["one"])
        # the same training (same model, generator state and records): the same sum up to rounding
        assert np.allclose(one.weighted_sum, two.weighted_sum, atol=1e-3 * one.total_weight)
    finally:
        for p in itertools.chain(*groups.values()):
            p.close()


def test_malformed_bundles_are_refused_before_anything_is_trained(deployment, tmp_path):
    party = Party(deployment, 0, tmp_path / "s")
    try:
        config = party.config
        stage = first_stage(deployment, config, purpose="update", round_index=1,
                            length=party.site.work.length)[0]
        header, body = bundle(train_job(party, 1), 1, "advertise keys", stage)
        cases = [
            {**header, "first": {**header["first"], "round": 2}},  # the bundled job names another round
            {**header, "round": 2},  # the bundle names another round than its job
            {**header, "round": True},  # == 1, but not a round: the site's events would lose it
            {**header, "round": 1.0},
            {**header, "first": {**header["first"], "round": 1.0}},
            {**header, "first": {**header["first"], "kind": "moments"}},  # not a train/evaluate job
            {**header, "first": {**header["first"], "kind": "layer"}},
            {**header, "first": {**header["first"], "job": 7}},  # a job id of its own
            {**header, "first": "train"},
            {**header, "first_size": len(body) + 1},  # past the body
            {**header, "first_size": -1},
            {**header, "first_size": True},
        ]
        for bad in cases:
            answer, out = party.send(bad, body)
            assert answer["ok"] is False and answer["reason"] == "MalformedEnvelope" and out == b""
        assert party.records() == ([], [])
        # a size that cuts the model short: the site refuses the vector before it records the
        # round (nothing was trained, nothing is charged) and the stage is not run
        answer, out = party.send({**header, "first_size": len(body) - len(stage) - 4}, body)
        assert answer["ok"] is False and out == b"" and party.records() == ([], [])
        assert party.jobs.layer is None
    finally:
        party.close()


STAGES = MaskingSite.STAGES


@st.composite
def moves(draw: st.DrawFn) -> tuple[Any, ...]:
    """One adversarial message: a bundle, or the unbundled jobs it is made of."""
    kind = draw(st.sampled_from(["train", "evaluate"]))
    job_round = draw(st.integers(1, 2))
    first_round = draw(st.sampled_from([job_round, job_round, 3 - job_round]))
    stage = draw(st.sampled_from([STAGES[0], STAGES[0], *STAGES[1:]]))
    setup = draw(st.booleans() | st.just(True))
    purpose = draw(st.sampled_from(["update", "statistics"]))
    setup_round = draw(st.integers(1, 2))
    return kind, job_round, first_round, stage, setup, purpose, setup_round


def outcome(answer: dict[str, Any], out: bytes) -> tuple[Any, ...]:
    return answer["ok"], answer.get("reason"), bool(out)


SETTINGS = settings(max_examples=12, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@pytest.mark.slow
@SETTINGS
@given(plays=st.lists(moves(), min_size=1, max_size=4))
def test_a_bundle_is_answered_as_its_two_jobs_one_after_the_other(deployment, tmp_path_factory, plays):
    root = tmp_path_factory.mktemp("play")
    bundled, twin = Party(deployment, 0, root / "a"), Party(deployment, 0, root / "b")
    try:
        length = bundled.site.work.length
        messages = {(p, r): first_stage(deployment, bundled.config, purpose=p, round_index=r,
                                        length=length)[0] for p in ("update", "statistics") for r in (1, 2)}
        answered: Counter[tuple[str, int]] = Counter()
        for kind, job_round, first_round, stage, with_setup, purpose, setup_round in plays:
            message = messages[(purpose, setup_round)]
            if not with_setup:
                message = split_first(message)[1]
            maker = train_job if kind == "train" else evaluate_job
            first_header, first_body = maker(bundled, first_round)
            header, body = bundle((first_header, first_body), job_round, stage, message)
            one = outcome(*bundled.send(header, body))
            # the twin: the first job alone, then (if it was not refused) the stage on its own
            if first_round != job_round:  # a bundle whose job names another round is refused whole
                assert one == (False, "MalformedEnvelope", False)
                continue
            alone = outcome(*twin.send(first_header, first_body))
            if alone[0]:
                alone = outcome(*twin.send({"kind": "layer", "round": job_round, "stage": stage}, message))
            assert one == alone
            assert bundled.records() == twin.records()
            if one[0] and with_setup:
                answered[(purpose, setup_round)] += 1
        # a contribution went into at most one setup: no two setups of one (purpose, round) answered
        assert all(count == 1 for count in answered.values())
    finally:
        bundled.close()
        twin.close()


def test_a_bundle_sent_twice_does_not_put_a_contribution_in_two_aggregations(deployment, tmp_path):
    party = Party(deployment, 0, tmp_path / "s")
    try:
        stage = first_stage(deployment, party.config, purpose="update", round_index=1,
                            length=party.site.work.length)[0]
        job = bundle(train_job(party, 1), 1, "advertise keys", stage)
        answer, out = party.send(*job)
        assert answer["ok"] is True and out and answer["head"]["seq"] >= 1
        answer, out = party.send(*job)
        assert (answer["ok"], answer["reason"], out) == (False, "rounds.replayed", b"")
        assert party.records() == ([1], [("update", 1)])
        with pytest.raises(ClientAbort):  # nothing pending is left for another setup
            party.site.work.contribution("update", 1)
    finally:
        party.close()
