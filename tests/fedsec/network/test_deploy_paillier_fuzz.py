"""Adversary: a coordinator sending a site any setup and any stage message (key-holder custody).
A site never crashes and never submits under a spec its own encoder does not give: it refuses
with ``ClientAbort`` or a ``ValueError`` (what the site framework turns into a refused job)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from fedsec.protocols.errors import ClientAbort
from fedsec.protocols.paillier import RoundSpec
from fedsec.protocols.paillier.messages import Submission, decode
from fedsec.protocols.paillier.spec import roster_digest
from fedsec.protocols.wire import Writer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedsec.config import make_config
from fedsec.network.keyholder import (
    ANNOUNCE,
    ENROL,
    REGISTER,
    KeyHolderService,
    encode_enrolment,
    load_identity,
)
from fedsec.network.keyholder_state import KeyHolderState
from fedsec.network.layers import SiteContext
from fedsec.network.layers import paillier as layer
from fedsec.network.pki import verify_peer
from tests.fedsec.network.keyholder_helpers import identity_path

NAMES = ("hosp-a", "hosp-b")
LENGTH = 6


@pytest.fixture(scope="module")
def world(study, tmp_path_factory):
    auditor = study.parties["auditor"]
    service = KeyHolderService(state=KeyHolderState(tmp_path_factory.mktemp("kh"), threshold=2),
                               identity=load_identity(identity_path(auditor)), name="auditor",
                               trust=study.trust(),
                               certificate=auditor.cert_pem)
    coordinator = verify_peer(study.parties["coordinator"].cert_pem, trust=study.trust(), roles=("server",))
    service.handle(coordinator, ENROL, encode_enrolment(0, study.parties["hosp-a"].cert_pem))
    config = make_config({"data.clients": 2, "secure.aggregation": "paillier", "secure.custody": "key_holder",
                          "federation.sites": list(NAMES), "federation.keyholder": "127.0.0.1:1",
                          "federation.min_sites": 2, "dp.mode": "dpsgd", "dp.reproducible": True})
    context = SiteContext(config=config, name="hosp-a", client_id=0, names=NAMES,
                          identity=load_identity(identity_path(study.parties["hosp-a"])), trust=study.trust())
    setup = {"layer": "paillier", "custody": "key_holder", "purpose": "update", "round": 1, "clients": 2,
             "max_weight": 10, "announcement": service.handle(coordinator, ANNOUNCE, b"").hex(),
             "announcer": auditor.cert_pem.decode(), "seed": 5}
    yield service, coordinator, context, setup
    service.close()


JSON = st.recursive(st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.text(max_size=8)
                    | st.floats(allow_nan=False), lambda inner: st.lists(inner, max_size=3), max_leaves=5)
FIELDS = ("layer", "custody", "purpose", "round", "clients", "max_weight", "announcement", "announcer",
          "seed")


def valid_spec(sequence: int, clients: int = 2, max_weight: int = 10, purpose: str = "update") -> RoundSpec:
    from fedsec.protocols.encoding import encoder_for

    encoder = encoder_for(purpose, clients=clients, length=LENGTH, max_weight=max_weight, clip=1.0, bits=16)
    return layer.round_spec(sequence=sequence, length=LENGTH, clients=clients, word_bound=encoder.word_bound,
                            tagged=True, roster=roster_digest(NAMES))


def test_the_honest_setup_and_spec_give_a_submission(world):
    """The search below starts from a setup that works (so its refusals are the lies' doing)."""
    service, coordinator, context, valid = world
    layer.SITE_CLIENTS.clear()
    context.spent.clear()  # a fresh site process (each example hands the layer the same contribution)
    site = layer.PaillierSite(context, setup=valid, vector=np.zeros(LENGTH, np.float32), weight=3)
    welcome = service.handle(coordinator, REGISTER, site.handle(layer.REGISTER, b""))
    raw = valid_spec(1).to_bytes()
    reply = site.handle(layer.SUBMIT, Writer().blob(welcome).blob(raw).getvalue())
    assert decode(reply, Submission).spec_digest == RoundSpec.from_bytes(raw).digest


@pytest.mark.slow
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(changes=st.dictionaries(st.sampled_from(FIELDS), JSON, max_size=3),
       flips=st.lists(st.tuples(st.integers(0, 10_000), st.integers(1, 255)), max_size=2),
       spec_change=st.sampled_from(["none", "word_bound", "length", "clients", "flag", "garbage",
                                    "sequence", "roster"]),
       weight=st.integers(1, 12), data=st.data())
def test_a_lying_coordinator_gets_a_refusal_or_a_submission_under_the_sites_own_encoding(
        world, changes, flips, spec_change, weight, data):
    service, coordinator, context, valid = world
    layer.SITE_CLIENTS.clear()
    context.spent.clear()  # a fresh site process (each example hands the layer the same contribution)
    setup = {**valid, **changes}
    announcement = bytearray(bytes.fromhex(valid["announcement"]))
    for position, xor in flips:
        announcement[position % len(announcement)] ^= xor
    if flips and "announcement" not in changes:
        setup["announcement"] = bytes(announcement).hex()
    vector = np.linspace(-1, 1, LENGTH).astype(np.float32)
    try:
        site = layer.PaillierSite(context, setup=setup, vector=vector, weight=weight)
        registration = site.handle(layer.REGISTER, data.draw(st.binary(max_size=8)))
        welcome = service.handle(coordinator, REGISTER, registration)
        spec = valid_spec(data.draw(st.integers(1, 5)))
        raw = spec.to_bytes()
        if spec_change == "word_bound":
            raw = RoundSpec(spec.sequence, spec.length, spec.slot_bits + 1, spec.word_bound * 2 + 1,
                            spec.max_contributions, True, spec.roster).to_bytes()
        elif spec_change == "length":
            raw = valid_spec(spec.sequence).to_bytes()[:-33] + b"\x00" + spec.roster
        elif spec_change == "clients":
            raw = valid_spec(spec.sequence, clients=3).to_bytes()
        elif spec_change == "flag":
            raw = raw[:-33] + b"\x07" + spec.roster
        elif spec_change == "roster":
            raw = replace(spec, roster=roster_digest(NAMES + ("hosp-c",))).to_bytes()
        elif spec_change == "garbage":
            raw = data.draw(st.binary(max_size=64))
        elif spec_change == "sequence":
            raw = valid_spec(2**62).to_bytes()
        reply = site.handle(layer.SUBMIT, Writer().blob(welcome).blob(raw).getvalue())
    except (ClientAbort, ValueError):
        return
    submission = decode(reply, Submission)
    assert submission.client_id == 0 and submission.spec_digest == RoundSpec.from_bytes(raw).digest
    spec = RoundSpec.from_bytes(raw)
    assert spec == valid_spec(spec.sequence, clients=setup["clients"], max_weight=setup["max_weight"],
                              purpose=setup["purpose"])
    assert 1 <= weight <= setup["max_weight"] and setup["announcer"] == valid["announcer"]
