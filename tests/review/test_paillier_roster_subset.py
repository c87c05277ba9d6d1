"""Review S6-3 (session 6, second review; fixed by ``client_noise.site_population``): the
coordinator shrinks the roster it shows honest sites to lower their colluder count c.

A site sizes its client-level share mu / (t - c) with c = floor(corrupt x roster), the roster being
its plan's ``federation.sites``: a list the coordinator writes. ``aggregation.peers`` (the S6-2
fix) only keeps names OUT of that roster; it does not stop the coordinator from showing a SUBSET
of the study. The corrupt fraction is then taken of the subset, which holds the coordinator's
colluders, so the honest sites assume fewer colluders than the study actually holds.

Adversary: the coordinator, colluding with ONE site (hosp-s1) of a study of ten (hosp-a, hosp-b,
hosp-x, hosp-s1..hosp-s7) whose plan assumes the Paillier layer's ``secure.corrupt = 0.1``:
floor(0.1 x 10) = 1 colluder, exactly what the adversary has. The key holder runs with ``--sites``
= the study from the start (the strongest setting); the honest sites hosp-a and hosp-b pin
``aggregation.peers`` to the other nine (what ``fedsec demo deploy`` writes). Under the study's
plan (c = 1, t = 3) a sum of three holds >= 2 honest shares of mu / 2 = mu. The coordinator instead
shows hosp-a and hosp-b a plan identical but for ``federation.sites`` = the first nine study sites
(all pinned peers, so both join checks admit it; same epsilon, so the same ledger charge): now
c = floor(0.1 x 9) = 0 and both add shares of mu / 3. The key holder sees three contributors
(hosp-a, hosp-b and the colluder hosp-s1) enrolled under names of the spec's roster, all on
``--sites``, and decrypts: the sum holds 2 mu / 3 of honest noise against one colluder, the number
the study's plan promised to tolerate. (Masking has the same rule: c = corrupt_count(ring, corrupt,
population = max(roster, ring)) with the coordinator's roster.)

Honest parties, unmodified: the sites' join check (``check_plan`` with the pinned policy), their
``PaillierSite`` layer (key-holder custody, client level) and the real :class:`KeyHolderService`
(threshold 3, ``--sites`` = the study) over its sqlite state. The colluder runs the project's
``PaillierClient``; the coordinator the project's ``PaillierServer``.
"""

from __future__ import annotations

import numpy as np
from fedsec.protocols.errors import ClientAbort, MalformedMessage
from fedsec.protocols.paillier import DecryptionRefused, PaillierClient, PaillierServer
from fedsec.protocols.paillier.spec import roster_digest
from fedsec.protocols.wire import Writer

from fedsec.network.client_noise import noise_context, noise_rule, site_colluders
from fedsec.network.errors import PolicyRefused
from fedsec.network.keyholder import ANNOUNCE, DECRYPT, ENROL, REGISTER, KeyHolderService, encode_enrolment
from fedsec.network.keyholder_state import KeyHolderState
from fedsec.network.layers import SiteContext
from fedsec.network.layers import paillier as layer
from fedsec.network.pki import verify_peer
from fedsec.network.policy import SitePolicy, check_plan
from tests.fedsec.network.conftest import enrol, study  # noqa: F401 - fixture
from tests.fedsec.network.keyholder_helpers import (
    Caller,
    cert_identity,
    client_level_keyholder_plan,
    identity_path,
    load_identity,
)

ADDED = tuple(f"hosp-s{k}" for k in range(1, 8))
STUDY = ("hosp-a", "hosp-b", "hosp-x", *ADDED)
SHOWN = STUDY[:-1]
"""The subset of the study shown to hosp-a and hosp-b (ids as in the study: a prefix)."""
HONEST, COLLUDER = ("hosp-a", "hosp-b"), "hosp-s1"
IDS = {name: k for k, name in enumerate(STUDY)}
T, LENGTH, CLIP, Z = 3, 12, 0.5, 1.1


def _plan(sites: tuple[str, ...]):
    return client_level_keyholder_plan(sites, threshold=T, clip=CLIP)


def test_a_subset_roster_lowers_the_colluders_the_honest_sites_assume(study, tmp_path):  # noqa: F811
    for name in ADDED:
        study.parties[name] = enrol(study.ca_dir, tmp_path / name, name, "site")
    trust = study.trust()
    plan, shown = _plan(STUDY), _plan(SHOWN)
    policies = {n: SitePolicy(peers=tuple(p for p in STUDY if p != n)) for n in HONEST}
    assert site_colluders(plan, roster=len(STUDY), policy=policies["hosp-a"]) == 1  # the study's promise
    assert site_colluders(shown, roster=len(SHOWN), policy=policies["hosp-a"]) == 1  # pinned: the study's c
    for name in HONEST:
        check_plan(policies[name], plan, min_sites=3, name=name)
        try:  # each honest site's own join check on the subset plan
            check_plan(policies[name], shown, min_sites=3, name=name)
        except PolicyRefused:
            return  # the secure outcome: the subset plan is refused at join
    service = KeyHolderService(
        state=KeyHolderState(tmp_path / "kh", threshold=T), sites=frozenset(STUDY),
        identity=load_identity(identity_path(study.parties["auditor"])), name="auditor",
        trust=trust, certificate=study.parties["auditor"].cert_pem)
    coordinator = study.parties["coordinator"]
    verified = verify_peer(coordinator.cert_pem, trust=trust, roles=("server",))
    caller = Caller("coordinator", verified.identity_key)
    call = lambda topic, payload: service.handle(caller, topic, payload)  # noqa: E731
    layer.SITE_CLIENTS.clear()
    try:
        for name, client_id in IDS.items():
            call(ENROL, encode_enrolment(client_id, study.parties[name].cert_pem))
        announcement = call(ANNOUNCE, b"")
        announcer = cert_identity(study.parties["auditor"].cert)
        colluder = PaillierClient(IDS[COLLUDER], announcer_identity=announcer,
                                  identity=load_identity(identity_path(study.parties[COLLUDER])))
        colluder.receive_welcome(call(REGISTER, colluder.receive_announcement(announcement)))
        rule = noise_rule(shown, Z, LENGTH)
        setup = {"layer": "paillier", "custody": "key_holder", "purpose": "update", "round": 1,
                 "clients": T, "max_weight": 1, "announcement": announcement.hex(),
                 "announcer": study.parties["auditor"].cert_pem.decode()}
        sites = {}
        for name in HONEST:
            (tmp_path / f"state-{name}").mkdir()
            context = SiteContext(config=shown, name=name, client_id=IDS[name], names=SHOWN,
                                  identity=load_identity(identity_path(study.parties[name])), trust=trust,
                                  state=tmp_path / f"state-{name}", client_noise=rule, policy=policies[name])
            try:
                sites[name] = layer.PaillierSite(context, setup=setup, weight=1,
                                                 vector=np.full(LENGTH, 0.05, np.float32))
            except ClientAbort:
                return  # the secure outcome: the site refuses the aggregation
        c = site_colluders(shown, roster=len(SHOWN), policy=policies["hosp-a"])
        spec = layer.round_spec(sequence=service.holder.last_sequence + 1, length=LENGTH, clients=T,
                                word_bound=sites["hosp-a"].encoding.encoder.word_bound, tagged=True,
                                roster=roster_digest(SHOWN),
                                context=noise_context(shown, rule, threshold=T, colluders=c))
        members = [*HONEST, COLLUDER]
        server = PaillierServer(service.holder.public_key, spec, expected=[IDS[n] for n in members],
                                threshold=T,
                                identities={IDS[n]: load_identity(identity_path(study.parties[n])).public
                                            for n in members},
                                identity=load_identity(identity_path(coordinator)), roster=SHOWN)
        try:
            for name, site in sites.items():
                registration = site.handle(layer.REGISTER, b"")
                welcome = call(REGISTER, registration) if registration else b""
                server.receive(IDS[name], site.handle(layer.SUBMIT,
                                                      Writer().blob(welcome).blob(spec.to_bytes()).getvalue()))
        except ClientAbort:
            return  # the secure outcome: an honest site refuses to submit
        server.receive(IDS[COLLUDER], colluder.submit(spec.to_bytes(), np.zeros(spec.length - 1, np.uint64),
                                                      roster=SHOWN, context=spec.context))
        try:
            server.finish(call(DECRYPT, server.decryption_request()))
        except (DecryptionRefused, MalformedMessage):
            return  # the secure outcome: nothing decrypted
        honest = sum(site.encoding.noise.variance for site in sites.values())
        mu = rule.total_variance
        assert honest >= mu * (1 - 1e-9), (
            f"one colluder (the study's floor(0.1 x 10) = 1) and {honest / mu:.3f} mu of honest noise")
    finally:
        layer.SITE_CLIENTS.clear()
        service.close()


def test_masking_takes_c_of_the_pinned_study_too():
    """The same rule at a masking site: a ring of 3 out of a roster of 9 shown to a site that pinned
    the study of 10 keeps the study's one colluder (0 with the coordinator's roster alone)."""
    shown = _plan(SHOWN)
    pinned = SitePolicy(peers=tuple(p for p in STUDY if p != "hosp-a"))
    assert site_colluders(shown, roster=len(SHOWN), ring=3) == 0  # what the coordinator's roster gives
    assert site_colluders(shown, roster=len(SHOWN), policy=pinned, ring=3) == 1
    assert site_colluders(shown, roster=len(SHOWN), policy=SitePolicy(), ring=3) == 0  # no peers: the plan's
