"""``fedsec join``: a hospital's process. It dials the coordinator, checks the plan against its own
policy and ledger before touching its data, validates its CSV file against the plan's schema, and
then works the jobs the coordinator posts (train, evaluate, feature statistics, the secure layer's
stages) until the run ends.

Order of a site's first calls, and what stops it:

1. ``plan``: the plan's bytes; its SHA-256 is printed. A plan that does not parse, that does not
   list this site, or that the site's ``SITE.toml`` or lifetime ledger refuses: the site sends
   ``refuse`` with the rule and exits 3. Its data file has not been opened.
2. its CSV file against the plan's schema: a bad file exits 2 naming file, row and column, and
   nothing is sent.
3. the ledger reserves the run's epsilon (``BEGIN IMMEDIATE``, on disk), the plan is recorded in
   ``site.db``, and ``accept`` tells the coordinator its sizes (public under the plan's unit).
4. with its first training job, the noise multiplier the coordinator calibrated (from every
   site's size): the site recomputes its own epsilon over the plan's rounds with it and refuses
   (``dp.noise``, exit 3) one that would exceed the plan's ``dp.target_epsilon`` (under
   ``dp.mode = "client"`` with the client-level accountant; the site then clips each update,
   weights it 1 and its layer adds a noise share: :mod:`fedsec.network.client_noise`).

Every train job is recorded in ``site.db`` before the site trains (more rounds than the plan's,
or a round whose update already went into an aggregation, is refused; a round whose update no
setup consumed is trained again for a resumed coordinator, charged once, at most
``MAX_TRAININGS`` times a round), and its epsilon is entered in the audit log. Under DP a training
that fails is a zero update answered like any other (the answer says nothing about the records);
any other error of a job (``ValueError``, ``ArithmeticError``, ``RuntimeError``) is a recorded
refusal, never the end of the process. Each pending
contribution (update, evaluation sums, feature moments) goes into at most one aggregation: the
first layer setup naming it consumes it in ``site.db`` (see :mod:`fedsec.network.site_work`), and
the layer is given the site's policy, whose ``min_sites``/``min_threshold``/``min_corrupt`` it
enforces at every aggregation. SIGTERM ends
the process with exit 0 and Ctrl-C with 130, each after a ``disconnect`` event.
"""

from __future__ import annotations

import dataclasses
import hashlib
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from fedsec.config import ExperimentConfig, loads_config
from fedsec.errors import ConfigError
from fedsec.network import envelope
from fedsec.network.errors import PeerRejected, PolicyRefused
from fedsec.network.framing import Payload
from fedsec.network.layers import LAYERS, SiteContext, SiteLayer, split_first
from fedsec.network.ledger import EpsilonLedger
from fedsec.network.party_audit import SQLITE_INT, PartyAudit, identity_fingerprint
from fedsec.network.pki import Trust, verify_peer
from fedsec.network.policy import SitePolicy, admit_plan
from fedsec.network.site_state import SiteState
from fedsec.network.transport import TransportClient, TransportError
from fedsec.protocols.errors import ClientAbort
from fedsec.secagg.keys import SigningKey

EXIT_OK, EXIT_FAILED, EXIT_BAD, EXIT_REFUSED, EXIT_INTERRUPTED = 0, 1, 2, 3, 130
RETRY_SECONDS = 60.0
"""How long a site keeps redialling a coordinator that is unreachable before it gives up."""


class Terminated(Exception):
    """SIGTERM: stop cleanly (exit 0)."""


def deployment_problem(config: ExperimentConfig) -> tuple[str, str] | None:
    """``(key, why)`` when a plan cannot be deployed; None when it can."""
    if not config.federation.sites:
        return "federation.sites", "a deployment plan lists the roster of site names"
    if config.data.dataset != "csv":
        return "data.dataset", "a deployment plan reads each site's CSV file: set it to 'csv'"
    if not config.data.columns:
        return "data.columns", "a deployment plan lists the feature columns (each site checks its file)"
    if config.secure.aggregation not in LAYERS:
        return "secure.aggregation", f"deployed layers: {', '.join(LAYERS)}"
    if config.train.algorithm not in ("fedavg", "fedprox", "fedsgd"):
        return "train.algorithm", "deployed: fedavg, fedprox, fedsgd"
    return None


@dataclass
class SitePaths:
    """Where a site's credentials, data and state are."""

    ca: Path
    crl: Path | None
    cert: Path
    key: Path
    identity: Path
    data: Path
    state: Path


def load_identity(path: Path) -> SigningKey:
    """The Ed25519 identity key written by ``fedsec site init`` (PEM, PKCS#8)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519

    key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    if not isinstance(key, ed25519.Ed25519PrivateKey):
        raise ValueError(f"{path}: not an Ed25519 identity key")
    raw = serialization.Encoding.Raw
    return SigningKey(key.private_bytes(raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()),
                      key.public_key().public_bytes(raw, serialization.PublicFormat.Raw))


class Site:
    """One hospital's run (see the module). ``out`` receives the lines a person reads."""

    def __init__(self, *, address: str, paths: SitePaths, policy: SitePolicy, server_name: str,
                 poll_wait: float = 2.0, out: Any = sys.stdout) -> None:
        self.address, self.paths, self.policy = address, paths, policy
        self.server_name, self.poll_wait, self.out = server_name, poll_wait, out
        self.trust = Trust.load(paths.ca, paths.crl)
        self.identity = load_identity(paths.identity)
        me = verify_peer(paths.cert.read_bytes(), trust=self.trust, roles=("site",))
        if me.identity_key.public_bytes_raw() != self.identity.public:
            raise ValueError(f"{paths.identity}: not the identity key of {paths.cert}")
        self.name = me.name
        self.client = TransportClient(address=address, trust=self.trust, cert_path=paths.cert,
                                      key_path=paths.key, server_name=server_name)
        self.audit: PartyAudit | None = None
        self.work: Any = None

    def say(self, text: str) -> None:
        print(text, file=self.out, flush=True)

    def call(self, topic: str, payload: bytes, *, round_index: int | None = None,
             deadline: float | None = None, record: bool = True) -> bytes:
        """One call, redialling for up to :data:`RETRY_SECONDS` while the coordinator is
        unreachable; recorded in the audit log (both messages)."""
        end = time.monotonic() + RETRY_SECONDS
        payload = Payload(payload)  # hashed once: for the framing, then for the audit row
        while True:
            try:
                reply = self.client.call(topic, payload, deadline=deadline)
                break
            except TransportError as error:
                if error.code not in ("UNAVAILABLE", "DEADLINE_EXCEEDED") or time.monotonic() > end:
                    raise
                time.sleep(1.0)
        if record and self.audit is not None:
            self.audit.sent_then_received(self.server_name, topic, payload, reply, round=round_index)
        return reply

    def run(self) -> int:
        """The whole life of the site in one run; returns the exit code."""
        previous = signal.signal(signal.SIGTERM, _terminate)
        try:
            return self._run()
        except Terminated:
            self._event("disconnect", {"reason": "SIGTERM"})
            return EXIT_OK
        except KeyboardInterrupt:
            self._event("disconnect", {"reason": "interrupted"})
            return EXIT_INTERRUPTED
        finally:
            signal.signal(signal.SIGTERM, previous)
            self.client.close()
            if self.audit is not None:
                self.audit.close()

    def _event(self, action: str, details: dict[str, Any], round_index: int | None = None) -> None:
        if self.audit is not None:
            self.audit.event(action, round=round_index, details=details)

    def _run(self) -> int:
        from fedsec.network.site_work import SiteWork

        try:
            reply = self.call("plan", b"", record=False)
        except (TransportError, PeerRejected) as error:
            self.say(f"fedsec join: cannot reach the coordinator at {self.address}: {error}")
            return EXIT_FAILED
        header, plan = envelope.decode(reply)
        sha = hashlib.sha256(plan).hexdigest()
        self.paths.state.mkdir(parents=True, exist_ok=True)
        self.audit = PartyAudit(self.paths.state, actor=self.name, key=self.identity, run_id=sha[:16],
                                certificate=self.paths.cert.read_bytes())
        self._event("connect", {"server": self.server_name, "address": self.address})
        self.audit.sent_then_received(self.server_name, "plan", b"", reply)
        self.say(f"plan sha256 {sha} from {self.server_name} at {self.address}")
        self._event("plan_received", {"sha256": sha, "size": len(plan)})
        ledger = EpsilonLedger(self.paths.state, lifetime_cap=self.policy.max_epsilon_lifetime)
        try:
            config = self._check(plan, sha, ledger)
        except PolicyRefused as refusal:
            self.say(f"refused: {refusal.rule}: {refusal}")
            self._event("plan_refused", {"sha256": sha, "rule": refusal.rule})
            self.call("refuse", envelope.encode({"sha256": sha, "rule": refusal.rule}))
            ledger.close()
            return EXIT_REFUSED
        from fedsec.fl_core.csv_data import SiteDataError

        try:
            self.work = SiteWork.load(config, name=self.name, path=self.paths.data)
        except SiteDataError as error:
            self.say(f"fedsec join: {error}")
            self._event("data_refused", {"file": error.file, "row": error.row, "column": error.column})
            ledger.close()
            return EXIT_BAD
        try:
            total = admit_plan(self.policy, config, ledger=ledger, run_id=sha,
                               min_sites=config.federation.min_sites, name=self.name).epsilon
        except PolicyRefused as refusal:
            self.say(f"refused: {refusal.rule}: {refusal}")
            self._event("plan_refused", {"sha256": sha, "rule": refusal.rule})
            self.call("refuse", envelope.encode({"sha256": sha, "rule": refusal.rule}))
            return EXIT_REFUSED
        finally:
            ledger.close()
        state = SiteState(self.paths.state)
        state.accept(sha, plan.decode())
        self.work.record = state.record(sha)
        self._event("plan_accepted", {"sha256": sha, "epsilon_reserved": total})
        accepted = self.call("accept", envelope.encode({"sha256": sha, **self.work.report()}))
        answer, _ = envelope.decode(accepted)
        self._ack(answer.get("head"), None)
        self.say(f"accepted as client {self.work.client_id} of {len(config.federation.sites)}; "
                 f"{self.work.report()['n_train']} training and {self.work.report()['n_test']} test records")
        return self._jobs(config, sha, state)

    def _ack(self, head: Any, round_index: int | None) -> None:
        """Acknowledge the coordinator's head only if it is its server's log (name and identity key
        of the certificate it dialled, a row >= 1 and not below one acknowledged before); else
        record ``head_refused`` (``fedsec audit reconcile`` lists it)."""
        assert self.audit is not None and self.client.server is not None
        problem = self.audit.ack_checked(head, actor=self.server_name, round=round_index,
                                         fingerprint=identity_fingerprint(self.client.server.identity_key))
        if problem is not None:
            self._event("head_refused", {"from": self.server_name, "reason": problem}, round_index)

    def _check(self, plan: bytes, sha: str, ledger: EpsilonLedger) -> ExperimentConfig:
        try:
            config = loads_config(plan.decode())
        except (ConfigError, UnicodeDecodeError) as error:
            raise PolicyRefused("plan.invalid", str(error)) from None
        problem = deployment_problem(config)
        if problem is not None:
            raise PolicyRefused("plan.invalid", f"{problem[0]}: {problem[1]}")
        if self.name not in config.federation.sites:
            raise PolicyRefused("federation.sites", f"the plan's roster does not list {self.name}")
        if config.federation.server != self.server_name:
            raise PolicyRefused("federation.server", f"the plan names {config.federation.server!r} as its "
                                                     f"coordinator, this site dialled {self.server_name!r}")
        admit_plan(self.policy, config, ledger=ledger, run_id=sha, min_sites=config.federation.min_sites,
                   dry_run=True, name=self.name)
        if self.policy.peers is None:
            self.say("warning: this site's policy sets no aggregation.peers: the coordinator's plan chooses "
                     "whom this site is summed with")
        return config

    def _jobs(self, config: ExperimentConfig, sha: str, state: SiteState) -> int:
        context = SiteContext(config=config, name=self.name, client_id=self.work.client_id,
                              names=tuple(config.federation.sites), identity=self.identity, trust=self.trust,
                              sessions=state, state=self.paths.state, policy=self.policy)
        jobs = SiteJobs(self, context=context, sha=sha, state=state)
        following: bytes | None = None
        assert self.audit is not None
        while True:
            polled = following is None
            reply = (self.call("poll", b"", deadline=self.poll_wait + 30.0, record=False) if following is None
                     else following)
            following = None
            header, body = envelope.decode(reply)
            kind = header.get("kind")
            if kind == "wait":
                continue
            job, round_index = envelope.field(header, "job", int), header.get("round")
            if (isinstance(round_index, bool) or not isinstance(round_index, int)
                    or not 0 <= round_index < SQLITE_INT):
                round_index = None  # not a round its audit log can file under (review 11, R11-1)
            if polled:
                self.audit.sent_then_received(self.server_name, "poll", b"", reply, round=round_index)
            if kind == "done":
                self.say(f"the run is over: {header.get('summary')}")
                self._event("run_finished", {"summary": header.get("summary")})
                return EXIT_OK
            try:
                answer, out = jobs.run(job, header, body, round_index)
            except Leave as leave:
                return leave.code
            # the reply to an answer is the next job (or "wait"): one call per stage
            following = self.call("answer", envelope.encode(answer, out), round_index=round_index,
                                  deadline=self.poll_wait + 30.0)


class Leave(Exception):
    """The site leaves the run with exit code ``code`` (a refusal it already sent and recorded)."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


class SiteJobs:
    """What a site does with one job (``run``): the code of ``fedsec join`` for every job kind.

    A ``layer`` job may carry a *bundled first job* (``header["first"]``, a ``train`` or
    ``evaluate`` job's header, whose body is the first ``header["first_size"]`` bytes of the job's
    body): the coordinator sends the job that makes a contribution together with the first stage
    of the aggregation that sums it, one call instead of two. The site runs it exactly as the two
    jobs one after the other (the first job, then the stage, through the same code, with the same
    checks and records); if the first job is refused the stage is not run and the answer is that
    refusal. The answer carries both parts' fields (the training's ``head``) and the stage's reply.

    The site holds at most one layer per purpose (``update``, ``statistics``), each with its own
    setup, session and stage order (:meth:`SiteLayer.handle`); a ``layer`` job names the one its
    stage message is for in ``header["purpose"]`` (absent: the purpose of the setup it carries, or
    the only layer held). It may carry a second stage message for the *other* purpose's layer
    (``header["also"] = {purpose, stage, size}``, the last ``size`` bytes of the body): the two
    parts are answered one after the other, each under its own layer's rules, and each succeeds
    or is refused on its own; the answer's ``also = {ok, size[, reason]}`` says how the second
    went, and its reply is the last ``size`` bytes of the answer's body. The second part may carry
    the next round's ``train`` job before an update layer's input stage (``also.train``, its body
    the part's first ``also.train_size`` bytes: the training speculated during the round before's
    evaluation, docs/deployment.md): the site runs it as a ``train`` job (same checks, records and
    ledger) only when it holds an update layer of that round set up without its input and the
    stage is that input stage, then the stage; a refusal of either refuses the second part alone,
    and the report carries the training's fields (its ``head``). A setup for statistics
    that names no pending contribution sets a layer up without one (when the layer can take it
    late, :attr:`SiteLayer.INPUT_STAGE`): the contribution (an ``evaluate`` job's sums, which may
    travel bundled with that stage) is consumed in ``site.db`` at that stage, before the stage's
    reply is computed; the stage without one is refused.
    """

    BUNDLED = ("train", "evaluate")
    """Job kinds a ``layer`` job may carry as its first job."""
    PURPOSES = ("update", "statistics")

    def __init__(self, site: Site, *, context: SiteContext, sha: str, state: SiteState) -> None:
        self.site, self.context, self.sha, self.state = site, context, sha, state
        self.layers: dict[str, SiteLayer] = {}
        """The layer of each purpose in flight (at most one each)."""
        self.site_layer = LAYERS[context.config.secure.aggregation][1]

    @property
    def layer(self) -> SiteLayer | None:
        """A layer in flight (the update's first), or None when none is."""
        return self.layers.get("update", self.layers.get("statistics"))

    def run(self, job: int, header: dict[str, Any], body: bytes,
            round_index: int | None) -> tuple[dict[str, Any], bytes]:
        """The answer (header fields, body) to one job; raises :class:`Leave` when the site leaves."""
        kind = header.get("kind")
        answer: dict[str, Any] = {"job": job, "ok": True}
        out = b""
        also: SecondPart | None = None
        purpose = header.get("purpose") if kind == "layer" else None
        try:
            if kind == "layer" and "also" in header:
                also, body = second_part(header, body)
            if kind == "layer" and "first" in header:
                first, first_body, body = bundled(header, body)
                kind = first["kind"]
                answer.update(self.work(kind, {**first, "job": job}, first_body, round_index))
                kind = "layer"
            fields, out = self.one(kind, header, body, round_index)
            answer.update(fields)
        except ClientAbort as abort:
            reason = _short(abort.reason)
            answer, out = {"job": job, "ok": False, "reason": reason}, b""
            self._drop(purpose)
            self.site._event("abort", {"kind": kind, "reason": reason}, round_index)
        except PolicyRefused as refusal:
            answer, out = {"job": job, "ok": False, "reason": refusal.rule}, b""
            self.site._event("job_refused", {"kind": kind, "rule": refusal.rule}, round_index)
        except (ValueError, ArithmeticError, RuntimeError) as error:  # e.g. torch on a crafted job
            answer, out = {"job": job, "ok": False, "reason": type(error).__name__}, b""
            self.site._event("job_failed", {"kind": kind, "error": type(error).__name__}, round_index)
        if also is not None:
            report, extra = self._second(also, job, round_index)
            answer["also"] = report
            out += extra
        return answer, out

    def _second(self, also: SecondPart, job: int, round_index: int | None) -> tuple[dict[str, Any], bytes]:
        """The second stage message of a ``layer`` job, for the other purpose's layer, after its
        ``train`` job when it carries one (the next round's training, see the class): its report
        (``{ok, size[, reason]}``, with the training's fields) and its reply."""
        fields: dict[str, Any] = {}
        purpose = also.purpose
        try:
            if also.train is not None:
                train, train_body = also.train
                layer = self.layers.get(purpose)
                if (purpose != "update" or layer is None or also.stage != layer.INPUT_STAGE
                        or layer.vector is not None or train["round"] != layer.setup.get("round")):
                    raise ClientAbort(TRAIN_NOT_FOR_LAYER)  # filed under the job's round (R11-2)
                # the training's events are of its round: its layer's, a round of the plan
                round_index = train["round"]
                fields = self.work("train", {**train, "job": job}, train_body, round_index)
            out = self.stage(purpose, also.stage, also.message)
        except ClientAbort as abort:
            reason = _short(abort.reason)
            self._drop(purpose)
            self.site._event("abort", {"kind": "layer", "purpose": purpose, "reason": reason}, round_index)
            return {"ok": False, "reason": reason, "size": 0}, b""
        except PolicyRefused as refusal:
            self._drop(purpose)
            self.site._event("job_refused", {"kind": "train", "rule": refusal.rule}, round_index)
            return {"ok": False, "reason": refusal.rule, "size": 0}, b""
        except (ValueError, ArithmeticError, RuntimeError) as error:
            self._drop(purpose)
            self.site._event("job_failed", {"kind": "layer", "purpose": purpose,
                                            "error": type(error).__name__}, round_index)
            return {"ok": False, "reason": type(error).__name__, "size": 0}, b""
        return {**fields, "ok": True, "size": len(out)}, out

    def _drop(self, purpose: Any) -> None:
        """An abort: the layer the part was for is gone (every layer when the part named none)."""
        if purpose in self.layers:
            del self.layers[purpose]
        elif purpose is None:
            self.layers.clear()

    def one(self, kind: Any, header: dict[str, Any], body: bytes,
            round_index: int | None) -> tuple[dict[str, Any], bytes]:
        """One job of ``kind`` (no bundle): the answer's extra fields and its body."""
        if kind == "layer":
            return {}, self.stage(header.get("purpose"), str(header.get("stage")), body)
        return self.work(kind, header, body, round_index), b""

    def stage(self, purpose: Any, stage: str, body: bytes) -> bytes:
        """One stage message for the layer of ``purpose`` (None: the setup's, or the only layer
        held); a setup (the first message) replaces that purpose's layer. ClientAbort to refuse."""
        if purpose is not None and purpose not in self.PURPOSES:
            raise ClientAbort("a stage message for no purpose this site sums")
        if body[:len(envelope.MAGIC)] == envelope.MAGIC:
            setup, body = split_first(body)
            named = setup.get("purpose")
            if named not in self.PURPOSES or (purpose is not None and named != purpose):
                raise ClientAbort("the setup's purpose is not the one its stage message names")
            purpose = named
            self.layers.pop(purpose, None)
            self.layers[purpose] = self._set_up(setup)
        elif purpose is None:
            if len(self.layers) != 1:
                raise ClientAbort("a stage message without a setup")
            purpose = next(iter(self.layers))
        layer = self.layers.get(purpose)
        if layer is None:
            raise ClientAbort("a stage message without a setup")
        work, setup = self.site.work, layer.setup

        def supply() -> tuple[Any, int]:  # a late input: of the layer's purpose and length only
            return work.contribution(setup.get("purpose"), setup.get("round"),
                                     kind=LATE_KIND[setup["purpose"]], length=layer.length)

        try:
            out = layer.handle(stage, body, supply=supply) or b""
        except ClientAbort:
            self.layers.pop(purpose, None)
            raise
        if layer.closed:  # its last stage answered: a later stage needs a new setup
            self.layers.pop(purpose, None)
        return out

    def _set_up(self, setup: dict[str, Any]) -> SiteLayer:
        """The layer a setup names, with the pending contribution it names (consumed now), or,
        when none is pending for it and the layer takes its input late, without it: an
        evaluation's sums (the barrier cut) or a training's update (its keys agreed during the
        round before), given at the layer's input stage."""
        work = self.site.work
        purpose, round_index = setup.get("purpose"), setup.get("round")
        pending = work.pending
        named = pending is not None and pending.purpose == purpose and pending.round == round_index
        if not named and purpose in self.PURPOSES and self.site_layer.INPUT_STAGE is not None:
            refused = self.state.late_setup(self.sha, round_index, max_rounds=self.context.config.rounds,
                                            kind=LATE_KIND[purpose])
            if refused is not None:  # before any key is drawn or session row written (review 8b)
                raise ClientAbort(refused)
            length = work.evaluation_length if purpose == "statistics" else work.length
            return self.site_layer(self.context, setup=setup, vector=None, weight=0, length=length)
        vector, weight = work.contribution(purpose, round_index)
        return self.site_layer(self.context, setup=setup, vector=vector, weight=weight)

    def work(self, kind: Any, header: dict[str, Any], body: bytes,
             round_index: int | None) -> dict[str, Any]:
        """A ``train``, ``evaluate``, ``moments`` or ``standardize`` job: the answer's extra fields."""
        site, state, sha = self.site, self.state, self.sha
        work = site.work
        assert site.audit is not None
        if kind == "train":
            config = self.context.config
            if work.strategy is None:
                try:
                    work.start(noise_multiplier=header.get("noise_multiplier"))
                except PolicyRefused as refusal:
                    site.say(f"refused: {refusal.rule}: {refusal}")
                    site._event("plan_refused", {"sha256": sha, "rule": refusal.rule})
                    site.call("refuse", envelope.encode({"sha256": sha, "rule": refusal.rule}))
                    raise Leave(EXIT_REFUSED) from None
                self.context.client_noise = work.client_noise
                if work.privacy is not None:  # a restarted site: the rounds it trained
                    for done in state.contributed(sha):
                        work.privacy.budget.charge(done)
            site._ack(header.get("head"), round_index)
            train_round = envelope.field(header, "round", int)
            inputs = work.train_inputs(header, body)  # a malformed job: refused before it is recorded
            again = train_round in state.contributed(sha)
            count = state.contribute(sha, train_round, max_rounds=config.rounds)
            answer = work.train(header, body, inputs=inputs)
            site._event("contribution", {"count": count, **({"retrain": True} if again else {})},
                        round_index)
            if work.epsilon is not None:
                site._event("epsilon", {"epsilon": work.epsilon}, round_index)
            answer["head"] = site.audit.head()
            return answer
        if kind in ("evaluate", "moments", "standardize"):
            getattr(work, kind)(header, body)
            return {}
        raise envelope.MalformedEnvelope(f"unknown job kind {kind!r}")


LATE_KIND = {"statistics": "evaluation", "update": "update"}
"""The contribution a layer of each purpose takes when it is set up before its input."""
TRAIN_NOT_FOR_LAYER = "a training carried with a stage message that is not its update's input stage"
REASON_CHARS = 200
"""A refusal's reason is cut to this many characters in the answer and the site's audit event (a
reason may quote a value the coordinator sent)."""


def _short(reason: Any) -> str:
    return str(reason)[:REASON_CHARS]


def bundled(header: dict[str, Any], body: bytes) -> tuple[dict[str, Any], bytes, bytes]:
    """``(first job's header, its body, the stage's body)`` of a ``layer`` job carrying a first job
    (see :class:`SiteJobs`); ``MalformedEnvelope`` for a first job that is not a JSON object of a
    kind in :attr:`SiteJobs.BUNDLED` whose round is the job's (both integers: ``True`` or ``1.0``
    would pass ``==`` and leave the site's events without a round), or a size outside the body."""
    first, size = header.get("first"), header.get("first_size")
    if not isinstance(first, dict) or first.get("kind") not in SiteJobs.BUNDLED:
        raise envelope.MalformedEnvelope("a bundled first job must be a train or evaluate job")
    rounds = (first.get("round"), header.get("round"))
    if any(type(r) is not int for r in rounds) or rounds[0] != rounds[1] or "job" in first:
        raise envelope.MalformedEnvelope("a bundled first job names another round or job")
    if isinstance(size, bool) or not isinstance(size, int) or not 0 <= size <= len(body):
        raise envelope.MalformedEnvelope("a bundled first job's size is outside the job's body")
    return first, body[:size], body[size:]


class SecondPart(NamedTuple):
    """A ``layer`` job's second stage message (see :class:`SiteJobs`): the other purpose's layer,
    its stage and message, and the ``train`` job it carries (its header and body), if any."""

    purpose: str
    stage: str
    message: bytes
    train: tuple[dict[str, Any], bytes] | None


def second_part(header: dict[str, Any], body: bytes) -> tuple[SecondPart, bytes]:
    """``(the second part, the rest of the body)`` of a ``layer`` job carrying a second stage
    message (see :class:`SiteJobs`); ``MalformedEnvelope`` for an ``also`` that is not
    ``{purpose, stage, size}`` with a purpose the site sums other than the job's own, a string
    stage, and a size within the body, or that carries a training (``train`` and ``train_size``,
    the first ``train_size`` bytes of the part) that is not a ``train`` job's header with an
    integer round and no job number, or whose size leaves no stage message."""
    also = header.get("also")
    keys = {"purpose", "stage", "size"}
    if not isinstance(also, dict) or set(also) not in (keys, keys | {"train", "train_size"}):
        raise envelope.MalformedEnvelope("a second stage message must be {purpose, stage, size[, train, "
                                         "train_size]}")
    purpose, stage, size = also["purpose"], also["stage"], also["size"]
    if (purpose not in SiteJobs.PURPOSES or purpose == header.get("purpose") or "purpose" not in header
            or not isinstance(stage, str)):
        raise envelope.MalformedEnvelope("a second stage message must be for the other purpose")
    if isinstance(size, bool) or not isinstance(size, int) or not 0 < size <= len(body):
        raise envelope.MalformedEnvelope("a second stage message's size is outside the job's body")
    part, rest = body[len(body) - size:], body[:len(body) - size]
    train = None
    if "train" in also:
        first, first_size = also["train"], also["train_size"]
        if (not isinstance(first, dict) or first.get("kind") != "train" or type(first.get("round")) is not int
                or "job" in first):
            raise envelope.MalformedEnvelope("a second part's training must be a train job of a round")
        if isinstance(first_size, bool) or not isinstance(first_size, int) or not 0 <= first_size < size:
            raise envelope.MalformedEnvelope("a second part's training size is outside the part")
        train, part = (first, part[:first_size]), part[first_size:]
    return SecondPart(purpose, stage, part, train), rest


def _terminate(signum: int, frame: Any) -> None:
    raise Terminated()


def with_noise(config: ExperimentConfig, sigma: float) -> ExperimentConfig:
    """The plan with the coordinator's calibrated noise multiplier filled in."""
    return dataclasses.replace(config, dp=dataclasses.replace(config.dp, noise_multiplier=float(sigma)))



