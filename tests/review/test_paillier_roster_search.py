"""Review S5-1, fixed: a SEARCH over what a lying coordinator puts into a key-holder decryption.

Adversary: the coordinator, colluding with c = 1 roster site (hosp-y) and with two certified sites
OUTSIDE the plan's roster (hosp-o1, hosp-o2). It lies about the roster (to each honest site
separately, and to the key holder), picks which submissions go into a decryption request
(honest, colluders', each under any roster digest it likes), the spec it names and the roster
names it sends (the spec's, another's, reordered, with a name twice), across rounds, and restarts
the key holder between rounds with ``--sites`` absent, equal to the roster, or wider than it.

Honest parties, unmodified: the roster's sites hosp-a, hosp-b, hosp-x (the deployment's
``PaillierSite`` layer, each with its own copy of the plan: roster of 4, client-level DP, and a
site policy whose ``aggregation.min_corrupt = 0.25`` makes c = floor(0.25 x 4) = 1) and the key
holder (:class:`KeyHolderService` over its sqlite state, key threshold t = 3). Each honest site
adds a noise share of mu / (t - c) = mu / 2.

Claim: every sum the key holder decrypts holds >= mu of honest noise (>= 2 honest shares) or no
honest input at all (the colluders' own, under a roster of their own); every
other request is refused with the one typed refusal (:class:`DecryptionRefused` at the
coordinator) and a ``decrypt.refused`` event, with its reason, in the key holder's audit log.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pytest
from fedsec.dp import SecureRandom
from fedsec.protocols.encoding import encoder_for
from fedsec.protocols.errors import ClientAbort, MalformedMessage
from fedsec.protocols.paillier import DecryptionRefused, PaillierClient, PaillierServer
from fedsec.protocols.paillier.client import OTHER_ROSTER
from fedsec.protocols.paillier.messages import (
    REQUEST_DOMAIN,
    DecryptionRequest,
    DecryptionResult,
    Submission,
    decode,
    encode,
)
from fedsec.protocols.paillier.spec import roster_digest
from fedsec.protocols.wire import Writer
from fedsec.secagg.paillier import add_into, decode_batch, encode_batch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from fedsec.audit.log import read_events
from fedsec.config import make_config
from fedsec.network.client_noise import noise_context, noise_rule
from fedsec.network.keyholder import ANNOUNCE, DECRYPT, ENROL, REGISTER, KeyHolderService, encode_enrolment
from fedsec.network.keyholder_state import KeyHolderState
from fedsec.network.layers import SiteContext
from fedsec.network.layers import paillier as layer
from fedsec.network.pki import verify_peer
from fedsec.network.policy import SitePolicy
from tests.fedsec.network.conftest import enrol, study  # noqa: F401 - fixture
from tests.fedsec.network.keyholder_helpers import Caller, cert_identity, identity_path, load_identity

ROSTER = ("hosp-a", "hosp-b", "hosp-x", "hosp-y")
HONEST = ("hosp-a", "hosp-b", "hosp-x")
COLLUDERS = ("hosp-y", "hosp-o1", "hosp-o2")
IDS = {name: i for i, name in enumerate(ROSTER + ("hosp-o1", "hosp-o2"))}
CLAIMS = {"roster": ROSTER, "plus one": ROSTER + ("hosp-o1",), "plus two": ROSTER + ("hosp-o1", "hosp-o2"),
          "one swapped": ("hosp-a", "hosp-b", "hosp-y", "hosp-o1")}
"""Rosters the coordinator may claim (to a site, in a spec, in a request)."""
NAMES = {"as claimed": None, "as claimed, again": None, "reversed": "reversed", "a name twice": "twice",
         "the plan's": ROSTER, "plus one": CLAIMS["plus one"]}
"""Roster names a request may carry, relative to the roster its spec claims."""
SITES_FLAGS = (None, frozenset(ROSTER), frozenset(ROSTER + ("hosp-o1",)))
"""``--sites`` of a restarted key holder: absent, the roster, wider than the roster."""
T, LENGTH, MAX_WEIGHT, Z, CLIP = 3, 12, 4, 1.1, 0.5
ROUNDS = itertools.count(1)
"""The round each setup names (a fresh one each time: a site puts a contribution in one round only)."""


@dataclass
class World:
    study: Any
    state_dir: Any
    plan: Any
    rule: Any
    coordinator: Caller
    coordinator_key: Any
    certificate: str
    contexts: dict[str, SiteContext]
    colluders: dict[str, PaillierClient] = field(default_factory=dict)
    service: KeyHolderService | None = None

    def start(self, sites: frozenset[str] | None) -> KeyHolderService:
        """(Re)start the key holder over its state directory with ``--sites`` = ``sites``."""
        if self.service is not None:
            self.service.close()
        self.service = KeyHolderService(
            state=KeyHolderState(self.state_dir, threshold=T), sites=sites,
            identity=load_identity(identity_path(self.study.parties["auditor"])), name="auditor",
            trust=self.study.trust(), certificate=self.study.parties["auditor"].cert_pem)
        return self.service

    def call(self, topic: str, payload: bytes) -> bytes:
        return self.service.handle(self.coordinator, topic, payload)


def _plan():
    return make_config({"data.clients": len(ROSTER), "secure.aggregation": "paillier",
                        "secure.custody": "key_holder", "secure.threshold": T,
                        "federation.sites": list(ROSTER), "federation.keyholder": "127.0.0.1:1",
                        "federation.min_sites": 2, "dp.mode": "client", "dp.max_grad_norm": CLIP,
                        "dp.reproducible": False})


@pytest.fixture(scope="module")
def world(study, tmp_path_factory):  # noqa: F811
    for name in ("hosp-y", "hosp-o1", "hosp-o2"):
        study.parties[name] = enrol(study.ca_dir, tmp_path_factory.mktemp(name), name, "site")
    root = tmp_path_factory.mktemp("roster-search")
    config = _plan()
    rule = noise_rule(config, Z, LENGTH)
    trust = study.trust()
    contexts = {}
    for name in HONEST:
        (root / name).mkdir()
        contexts[name] = SiteContext(config=config, name=name, client_id=IDS[name], names=ROSTER,
                                     identity=load_identity(identity_path(study.parties[name])), trust=trust,
                                     state=root / name, client_noise=rule,
                                     policy=SitePolicy(min_corrupt=0.25))
    coordinator = study.parties["coordinator"]
    verified = verify_peer(coordinator.cert_pem, trust=trust, roles=("server",))
    caller = Caller("coordinator", verified.identity_key)
    w = World(study, root / "kh", config, rule, caller, load_identity(identity_path(coordinator)),
              study.parties["auditor"].cert_pem.decode(), contexts)
    w.start(None)
    layer.SITE_CLIENTS.clear()
    for name, client_id in IDS.items():  # the coordinator enrols every certified site it likes
        w.call(ENROL, encode_enrolment(client_id, study.parties[name].cert_pem))
    announcement = w.call(ANNOUNCE, b"")
    announcer = cert_identity(study.parties["auditor"].cert)
    for name in COLLUDERS:  # the colluders run the project's client, lying about their roster
        client = PaillierClient(IDS[name], identity=load_identity(identity_path(study.parties[name])),
                                announcer_identity=announcer)
        client.receive_welcome(w.call(REGISTER, client.receive_announcement(announcement)))
        w.colluders[name] = client
    yield w
    layer.SITE_CLIENTS.clear()
    w.service.close()


def _names(claimed: tuple[str, ...], how: Any) -> tuple[str, ...]:
    if how is None:
        return tuple(sorted(claimed))
    if how == "reversed":
        return tuple(sorted(claimed, reverse=True))
    if how == "twice":
        return tuple(sorted(claimed + claimed[:1]))
    return tuple(sorted(how))


def play(w: World, choose) -> str:
    """One aggregation under the adversary's choices (``choose(label, options)``), then its claim;
    returns the outcome (decrypted, or the key holder's logged reason)."""
    if choose("restart", (False, True)):
        w.start(choose("--sites", SITES_FLAGS))
    sequence = w.service.holder.last_sequence + 1
    try:
        return _play(w, choose, sequence)
    finally:  # whatever happened, the aggregation's number is spent (the next example gets a fresh one)
        if w.service.holder.last_sequence < sequence:
            spec = layer.round_spec(sequence=sequence, length=1, clients=1, word_bound=1, tagged=True)
            unsigned = DecryptionRequest(spec.to_bytes(), (), b"")
            w.call(DECRYPT, encode(replace(unsigned, signature=w.coordinator_key.sign(
                REQUEST_DOMAIN + unsigned.signed_part()))))


def _play(w: World, choose, sequence: int) -> str:
    clients = choose("announced contributions", (3, 4))
    noise = w.rule.shares(T, 1, SecureRandom())
    # the honest sites' own noise context (S6-1; what this search varies is the roster)
    context = noise_context(w.plan, w.rule, threshold=T, colluders=1)
    encoder = encoder_for("update", clients=clients, length=LENGTH, max_weight=MAX_WEIGHT,
                          clip=w.plan.secure.clip, bits=w.plan.secure.bits, noise=noise)
    specs = {claim: layer.round_spec(sequence=sequence, length=LENGTH, clients=clients,
                                     word_bound=encoder.word_bound, tagged=True, roster=roster_digest(names),
                                     context=context)
             for claim, names in CLAIMS.items()}
    setup = {"layer": "paillier", "custody": "key_holder", "purpose": "update", "round": next(ROUNDS),
             "clients": clients, "max_weight": MAX_WEIGHT, "announcement": w.call(ANNOUNCE, b"").hex(),
             "announcer": w.certificate}
    submissions: dict[str, tuple[str, bytes]] = {}
    honest_noise: dict[str, float] = {}
    for name in HONEST:
        claim = choose(f"{name} is told", ("roster", None, *CLAIMS))  # the plan's roster, twice as often
        if claim is None:
            continue
        site = layer.PaillierSite(w.contexts[name], setup=setup, vector=np.full(LENGTH, 0.05, np.float32),
                                  weight=1)
        registration = site.handle(layer.REGISTER, b"")
        welcome = w.call(REGISTER, registration) if registration else b""
        message = Writer().blob(welcome).blob(specs[claim].to_bytes()).getvalue()
        try:
            submissions[name] = (claim, site.handle(layer.SUBMIT, message))
        except ClientAbort as abort:  # an honest site submits only under its own plan's roster
            assert claim != "roster" and abort.reason == OTHER_ROSTER
            continue
        assert claim == "roster"
        honest_noise[name] = site.encoding.noise.variance
    for name in COLLUDERS:
        claim = choose(f"{name} submits under", (None, "roster", *CLAIMS))
        if claim is not None:
            words = np.zeros(specs[claim].length - 1, np.uint64)
            submissions[name] = (claim, w.colluders[name].submit(specs[claim].to_bytes(), words,
                                                                 roster=CLAIMS[claim], context=context))
    chosen = [n for n in sorted(submissions) if choose(f"{n} in the sum", (True, True, False))]
    claim = choose("the request's spec claims", tuple(CLAIMS))
    names = _names(CLAIMS[claim], choose("the request's names", tuple(NAMES.values())))
    spec = specs[claim]
    public = w.service.holder.public_key
    total = None
    for name in chosen:
        values = decode_batch(decode(submissions[name][1], Submission).batch, public, round_index=sequence,
                              count=spec.ciphertexts(public))
        if total is None:
            total = values
        else:
            add_into(total, values, public)
    batch = encode_batch(public, sequence, total) if total is not None else b""
    unsigned = DecryptionRequest(spec.to_bytes(), tuple(IDS[n] for n in chosen), batch, roster=names)
    signature = w.coordinator_key.sign(REQUEST_DOMAIN + unsigned.signed_part())
    request = encode(DecryptionRequest(unsigned.spec, unsigned.participants, batch, signature, names))
    reply = w.call(DECRYPT, request)
    try:
        decode(reply, DecryptionResult)
    except MalformedMessage:
        with pytest.raises(DecryptionRefused):  # the coordinator's typed error
            PaillierServer(public, spec, expected=[], threshold=T, identities={},
                           roster=CLAIMS[claim]).finish(reply)
        refused = [e for e in read_events(w.service.state.audit_path)
                   if e.action in ("decrypt.refused", "decrypt.served")][-1]
        assert refused.action == "decrypt.refused" and refused.round == sequence
        reason = refused.payload()["reason"]
        assert reason
        return f"refused: {reason.split(':')[0][:60]}"
    served = [e for e in read_events(w.service.state.audit_path) if e.action == "decrypt.served"][-1]
    assert served.round == sequence and len(chosen) >= T
    honest = set(chosen) & set(HONEST)
    if not honest:  # the colluders' own inputs, under a roster of their own: nothing honest in it
        assert served.payload()["roster_sha256"] == roster_digest(CLAIMS[claim]).hex()
        return f"decrypted {len(chosen)} (colluders only)"
    mu = w.rule.total_variance
    in_sum = sum(honest_noise[n] for n in honest)
    assert in_sum >= mu * (1 - 1e-12), (chosen, claim, names, in_sum / mu)
    assert set(chosen) <= set(ROSTER) and served.payload()["roster_sha256"] == roster_digest(ROSTER).hex()
    return f"decrypted {len(chosen)} ({len(honest)} honest)"


@pytest.mark.slow
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow])
@given(data=st.data())
def test_a_searching_coordinator_gets_mu_of_honest_noise_or_a_logged_refusal(world, data):
    event(play(world, lambda label, options: data.draw(st.sampled_from(options), label=label)))


def _script(**answers):
    """A fixed strategy: every choice not named takes its default (no restart, not told, not
    submitting, left out of the sum; the request's names as its spec claims)."""
    def choose(label, options):
        return answers.get(label, options[0] if label in ("restart", "--sites", "the request's spec claims",
                                                          "the request's names", "announced contributions")
                           else None if None in options else False)
    return choose


EVERY_HONEST = {f"{n} is told": "roster" for n in HONEST} | {f"{n} in the sum": True for n in HONEST}
CASES = {
    "the honest sum": (EVERY_HONEST | {"the request's spec claims": "roster"}, "served"),
    # S5-1 itself: two honest sites, the roster's colluder and an outsider tagged under the roster
    "an outsider under the plan's digest": (
        {"hosp-a is told": "roster", "hosp-a in the sum": True, "hosp-y submits under": "roster",
         "hosp-y in the sum": True, "hosp-o1 submits under": "roster", "hosp-o1 in the sum": True,
         "the request's spec claims": "roster"}, "outside the spec's roster"),
    "a wider roster named to the key holder": (
        {"hosp-a is told": "roster", "hosp-a in the sum": True, "hosp-b is told": "roster",
         "hosp-b in the sum": True, "hosp-o1 submits under": "plus one", "hosp-o1 in the sum": True,
         "the request's spec claims": "plus one"}, "tags"),
    "the plan's names with a wider digest": (
        {"hosp-a is told": "roster", "hosp-a in the sum": True, "hosp-b is told": "roster",
         "hosp-b in the sum": True, "hosp-o1 submits under": "roster", "hosp-o1 in the sum": True,
         "the request's spec claims": "plus one", "the request's names": ROSTER}, "do not hash"),
    "colluders alone, under a roster of their own": (
        {"hosp-y submits under": "plus two", "hosp-y in the sum": True, "hosp-o1 submits under": "plus two",
         "hosp-o1 in the sum": True, "hosp-o2 submits under": "plus two", "hosp-o2 in the sum": True,
         "the request's spec claims": "plus two"}, "served"),
    "after a restart with --sites wider than the roster": (
        {"restart": True, "--sites": SITES_FLAGS[2], "hosp-a is told": "roster", "hosp-a in the sum": True,
         "hosp-y submits under": "roster", "hosp-y in the sum": True, "hosp-o1 submits under": "roster",
         "hosp-o1 in the sum": True, "the request's spec claims": "roster"}, "outside the spec's roster"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_each_lie_is_refused_for_its_reason_and_the_honest_sum_is_served(world, case):
    answers, expected = CASES[case]
    # restarted (without --sites unless the case says) so an earlier test's --sites, which now
    # withdraws the outsiders' stored enrolments (S6-2), does not decide the case
    play(world, _script(**({"restart": True} | answers)))
    last = [e for e in read_events(world.service.state.audit_path)
            if e.action in ("decrypt.refused", "decrypt.served")][-1]
    if expected == "served":
        assert last.action == "decrypt.served" and len(last.payload()["contributors"]) == 3
    else:
        assert last.action == "decrypt.refused" and expected in last.payload()["reason"]
