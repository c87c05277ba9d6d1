"""Adversary: the coordinator alone, which may send any site any stage message again, out of order,
or after the aggregation finished (review finding S4-2: one setup answered a second submit stage, so
one contribution went into two decrypted sums).

The sites are the project's unmodified site layers (masking, Paillier under both custodies), built
from a setup as ``Site._jobs`` builds them. Around an honest aggregation by the project's own
coordinator layer, the adversary searches (hypothesis) for a replay: after each stage it re-sends to
sites it picks messages it sent them before (any stage: repeats, going back, the last stage again
after the aggregation closed). Property: every layer object answers each stage at most once and in
the layer's stage order, so no contribution-dependent reply (masked input, Paillier submission,
decryption share) is ever produced twice from one setup.
"""

from __future__ import annotations

import dataclasses
import json
import os

import numpy as np
import pytest
from fedsec.fl_core.aggregation import ClientUpdate
from fedsec.fl_core.errors import AggregationError
from fedsec.protocols.errors import ClientAbort, ProtocolAbort
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedsec.network import envelope
from fedsec.network.keyholder import load_identity
from fedsec.network.layers import LAYERS, split_first
from fedsec.network.layers.paillier_dealer import SHARE_FILE, deal
from tests.fedsec.network.conftest import study  # noqa: F401 - fixture
from tests.fedsec.network.keyholder_helpers import identity_path
from tests.fedsec.network.test_deploy_paillier_layer import (  # noqa: F401 - fixtures
    LENGTH,
    Sites,
    coordinator_context,
    fresh_site_memory,
    inputs,
    keyholder,
    plan,
    sites,
)

CONTRIBUTION_STAGES = {"masked input", "paillier/submit", "paillier/decrypt"}
SETTINGS = settings(max_examples=6, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


class Replayer:
    """Wraps the honest sites' exchange; after each stage, re-sends drawn earlier messages."""

    def __init__(self, forward, layers, data) -> None:
        self.forward, self.layers, self.data = forward, layers, data
        self.history: dict[int, list[tuple[str, bytes]]] = {}
        self.answered: dict[int, list[str]] = {}  # id(layer) -> stages it answered, in order
        self.stages: dict[int, tuple[str, ...]] = {}
        self.kept: list[object] = []  # every layer seen stays alive, so no id is reused

    def _record(self, layer, stage: str) -> None:
        self.kept.append(layer)
        self.answered.setdefault(id(layer), []).append(stage)
        self.stages[id(layer)] = layer.STAGES

    def exchange(self, stage, outgoing):
        for c, m in outgoing.items():
            body = split_first(m)[1] if m[:len(envelope.MAGIC)] == envelope.MAGIC else m
            self.history.setdefault(c, []).append((stage, body))
        replies = self.forward(stage, outgoing)
        for c in replies:
            self._record(self.layers[c], stage)
        self.replay()
        return replies

    def replay(self) -> None:
        chosen = self.data.draw(st.lists(st.sampled_from(sorted(self.history)), max_size=3), label="sites")
        for c in chosen:
            picks = self.data.draw(st.lists(st.integers(0, len(self.history[c]) - 1), min_size=1, max_size=3),
                                   label=f"replays to {c}")
            layer = self.layers.get(c)
            for k in picks if layer is not None else ():
                stage, body = self.history[c][k]
                try:
                    reply = layer.handle(stage, body)
                except ClientAbort:
                    continue
                if reply is not None:
                    self._record(layer, stage)

    def check(self) -> None:
        for key, answered in self.answered.items():
            order = [self.stages[key].index(s) for s in answered]
            assert order == sorted(set(order)), answered  # each stage once, in order
            assert sum(s in CONTRIBUTION_STAGES for s in answered) <= 2  # threshold: submit and decrypt


def _aggregate(coordinator, updates) -> None:
    try:
        coordinator.aggregate(1, updates, purpose="update")
    except (ProtocolAbort, AggregationError):  # a replay may abort the round: the secure outcome
        pass


@pytest.mark.slow
@SETTINGS
@given(data=st.data())
def test_paillier_key_holder_site_answers_each_stage_once(study, sites, keyholder, tmp_path, data):  # noqa: F811
    address, _ = keyholder
    base = plan("key_holder", address)
    config = dataclasses.replace(base, dp=dataclasses.replace(base.dp, reproducible=False))
    vectors, weights = inputs(1)
    side = Sites(study, config, sites, vectors, weights, tmp_path / f"sites-{os.urandom(4).hex()}")
    replayer = Replayer(side.exchange, side.layers, data)
    context = coordinator_context(study, config, side, 7)
    context.exchange = replayer.exchange
    for _ in range(2):  # a second aggregation: its stages may be replayed to the first one's layers
        _aggregate(LAYERS["paillier"][0](context), [ClientUpdate(c, np.zeros(LENGTH, np.float32), 1)
                                                     for c in range(4)])
        side.contexts = {c: dataclasses.replace(x, spent=set()) for c, x in side.contexts.items()}
    replayer.check()


@pytest.mark.slow
@settings(SETTINGS, max_examples=3)
@given(data=st.data())
def test_paillier_threshold_site_answers_each_stage_once(study, sites, tmp_path_factory, data):  # noqa: F811
    root = tmp_path_factory.mktemp("replay-threshold")
    base = plan("threshold")
    config = dataclasses.replace(base, dp=dataclasses.replace(base.dp, reproducible=False))
    auditor = study.parties["auditor"]
    shares, _ = deal(roster=list(sites), site_certificates={n: study.parties[n].cert_pem for n in sites},
                     threshold=3, trust=study.trust(), identity=load_identity(identity_path(auditor)),
                     dealer_certificate=auditor.cert_pem)
    for name, record in shares.items():
        directory = root / name
        directory.mkdir(parents=True)
        fd = os.open(directory / SHARE_FILE, os.O_WRONLY | os.O_CREAT, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(json.dumps(record))
    vectors, weights = inputs(1)
    side = Sites(study, config, sites, vectors, weights, root)
    replayer = Replayer(side.exchange, side.layers, data)
    context = coordinator_context(study, config, side, 7)
    context.exchange = replayer.exchange
    _aggregate(LAYERS["paillier"][0](context), [ClientUpdate(c, np.zeros(LENGTH, np.float32), 1)
                                                 for c in range(4)])
    replayer.check()
