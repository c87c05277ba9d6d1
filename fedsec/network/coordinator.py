"""``fedsec serve``: the coordinator of a deployed federation (a gRPC server the sites dial).

Calls a site makes (one framed request, one reply each; :mod:`fedsec.network.transport`):

==========  =========================================  ===========================================
topic       request                                    reply
==========  =========================================  ===========================================
``plan``    nothing                                    the plan's bytes (its SHA-256 in the header)
``refuse``  ``{sha256, rule}``                         nothing (the site leaves)
``accept``  ``{sha256, n_train, n_test, input_shape,   ``{client_id, head}``
            n_classes}``
``poll``    nothing                                    the site's next job, or ``wait`` after
                                                       ``poll_wait`` seconds with none
``answer``  ``{job, ok, ...}`` + body                  the next job, as ``poll`` (one call per stage)
==========  =========================================  ===========================================

The peer's name is the one in its verified certificate (never a field it sends); its client id
is its position on the plan's roster. What a site reports in ``accept`` (its numbers of training
and test records, its data's shape) is what the plan's privacy unit takes as public (sizes; the
public weight bound). Jobs (:mod:`fedsec.network.jobs`) carry the global model, the round's
training seed, and the secure layer's stage messages.
"""

from __future__ import annotations

import hashlib
import json
import math
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from fedsec.config import ExperimentConfig
from fedsec.network import envelope
from fedsec.network.errors import PeerRejected
from fedsec.network.framing import Payload
from fedsec.network.mailbox import Mailboxes, Posted
from fedsec.network.party_audit import PartyAudit
from fedsec.network.pki import Peer, Trust, verify_peer
from fedsec.network.transport import DEFAULT_READ_DEADLINE, TransportServer
from fedsec.secagg.keys import SigningKey

POLL_WAIT = 2.0
"""Seconds a ``poll`` call is held open when the site has no job."""


@dataclass
class Bundle:
    """Jobs that travel with the first stage of the next aggregation (one call instead of two).

    ``jobs``: ``{site: (header, body)}`` of ``kind`` (``train`` or ``evaluate``). The next
    :meth:`Hub.exchange` given this bundle sends each of its sites that site's job as the ``first``
    job of the stage's ``layer`` job (see :class:`fedsec.network.site.SiteJobs`) and then calls
    ``done(answers, refusals)`` with the answers that said ``ok`` (``{site: (header, body)}``: the
    first job and the stage both done) and the refusals' reasons (``{site: reason}``); ``sent`` is
    True from then on.
    """

    kind: str
    jobs: Mapping[str, tuple[dict[str, Any], bytes]]
    done: Callable[[dict[str, tuple[dict[str, Any], bytes]], dict[str, str]], None]
    sent: bool = False
    round_index: int | None = None
    """The round its jobs are of (None: the exchange's). A ``train`` bundle that travels with the
    second stage message (:meth:`Hub.exchange`'s ``also_train``) is of the next round."""

    def carried(self, name: str, round_index: int | None) -> tuple[dict[str, Any], bytes]:
        """``name``'s job as it travels inside a job of ``round_index``: its header, with its kind
        and round, and its body."""
        header, body = self.jobs[name]
        own = self.round_index if self.round_index is not None else round_index
        return {"kind": self.kind, "round": own, **header}, body


@dataclass(frozen=True)
class Sent:
    """An exchange posted by :meth:`Hub.send`, for :meth:`Hub.receive`: what was asked, of whom."""

    kind: str
    round_index: int | None
    jobs: dict[str, tuple[dict[str, Any], bytes]]
    first: Bundle | None
    also: dict[str, tuple[dict[str, Any], bytes]]
    also_train: Bundle | None
    posted: dict[str, tuple[int, bytes]]
    """Each site's job as posted (its id and payload)."""
    alone: set[str]
    """Sites given only the second stage message, as a job of its own."""
    joins: dict[str, int]
    """Each site's join count when it was posted."""
    stage: str
    mail: Posted


@dataclass(frozen=True)
class SiteInfo:
    """A site that accepted the plan, with what it reported."""

    name: str
    client_id: int
    n_train: int
    n_test: int
    input_shape: tuple[int, ...]
    n_classes: int


class _RecordingServer(TransportServer):
    """A transport server that keeps each admitted peer's certificate (PEM), to relay it, and
    counts the bytes of the gRPC messages (framing headers and chunks) each peer sends and gets:
    what crosses the wire inside TLS and HTTP/2, whose own overhead is not counted."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.certificates: dict[str, bytes] = {}
        self.peers: dict[str, Peer] = {}
        self.wire: dict[str, list[int]] = {}
        """``name -> [bytes received from it, bytes sent to it]``."""
        self._local = threading.local()
        self._count = threading.Lock()

    def admit(self, context: grpc.ServicerContext) -> Peer:
        peer = super().admit(context)
        if self.peers.get(peer.name) is not peer:  # a new or another certificate: keep its PEM
            self.certificates[peer.name] = context.auth_context()["x509_pem_cert"][0]
            self.peers[peer.name] = peer
        self._local.peer = peer.name
        return peer

    def recall(self, name: str, pem: bytes) -> bool:
        """Put back the certificate ``name`` was admitted with before a restart (a resumed
        coordinator's checkpoint), checked again as a call would be: the root, validity, role
        ``site``, the revocation list and the roster. False, and nothing recorded, when it fails
        those checks or names another party; the site is then admitted when it calls again."""
        try:
            peer = verify_peer(pem, trust=self.trust, roles=("site",), roster=self.roster)
        except PeerRejected:
            return False
        if peer.name != name:
            return False
        # a site that called since the restart keeps what it presented (setdefault: one step, so a
        # call admitted meanwhile is never overwritten)
        if self.peers.setdefault(name, peer) is peer:
            self.certificates.setdefault(name, pem)
        return True

    def _exchange(self, requests: Iterator[bytes], context: grpc.ServicerContext) -> Iterator[bytes]:
        self._local.peer = None
        up = [0]
        down = 0
        try:
            for chunk in super()._exchange(self._counted(requests, up), context):
                down += len(chunk)
                yield chunk
        finally:
            self._add(up[0], down)

    def _call(self, requests: Iterator[bytes], context: grpc.ServicerContext) -> bytes:
        self._local.peer = None
        up = [0]
        reply = b""
        try:
            reply = super()._call(self._counted(requests, up), context)
            return reply
        finally:
            self._add(up[0], len(reply))

    @staticmethod
    def _counted(requests: Iterator[bytes], up: list[int]) -> Iterator[bytes]:
        for chunk in requests:
            up[0] += len(chunk)
            yield chunk

    def _add(self, up: int, down: int) -> None:
        name = self._local.peer
        if name is not None:
            with self._count:
                totals = self.wire.setdefault(name, [0, 0])
                totals[0] += up
                totals[1] += down


class Hub:
    """The coordinator's network side: admits sites, serves the plan, queues jobs, logs messages.

    Args:
        config: the plan; ``plan_bytes`` its file's bytes (what every site is shown the SHA-256 of).
        trust, cert_pem, key_pem: the study's root and this coordinator's certificate and TLS key.
        audit: the coordinator's audit log.
        listen: ``HOST:PORT``.
        poll_wait: seconds an empty poll is held.
        read_deadline: seconds a site's request may take to arrive; a site that misses it is a
            dropout (recorded) until it polls again.
    """

    def __init__(self, *, config: ExperimentConfig, plan_bytes: bytes, trust: Trust, cert_pem: bytes,
                 key_pem: bytes, audit: PartyAudit, listen: str, poll_wait: float = POLL_WAIT,
                 read_deadline: float = DEFAULT_READ_DEADLINE) -> None:
        self.config, self.plan_bytes = config, plan_bytes
        self.plan_sha256 = hashlib.sha256(plan_bytes).hexdigest()
        self.names = tuple(config.federation.sites)
        self.audit, self.poll_wait = audit, poll_wait
        self.mailboxes = Mailboxes(self.names)
        self.sites: dict[str, SiteInfo] = {}
        self.refused: dict[str, str] = {}
        self.noise_multiplier: float | None = None
        self.job_rounds: dict[int, int | None] = {}
        self.round: int | None = None
        self.absent: set[str] = set()
        self.standardization: bytes | None = None
        """The federation's feature mean and spread once computed (sent again to a restarted site)."""
        self.refusals: dict[str, str] = {}
        """The reasons of the sites that refused a job of the last :meth:`exchange`."""
        self.joins: dict[str, int] = {}
        """How many times each site accepted the plan (a restarted site accepts again)."""
        self.models: dict[str, tuple[str, int]] = {}
        """Each site's last answered ``evaluate`` job's model (SHA-256 hex of its body) and the
        site's join count then: the model the site holds (see :meth:`holds_model`)."""
        """Sites that missed a deadline and have not polled since: dropouts without waiting."""
        """The round of the aggregation in flight (for the audit of the layer's messages)."""
        self.identity: SigningKey | None = None
        self.cert_path: Path | None = None
        self.key_path: Path | None = None
        """This coordinator's identity key and certificate and TLS key files, for a layer that dials
        another party (the Paillier key holder); set by ``fedsec serve``."""
        self.bundle: Bundle | None = None
        """Jobs for the next ``layer`` exchange to carry (set by the round, taken by :meth:`take_bundle`)."""
        self.purpose: str | None = None
        """The purpose of the aggregation in flight (what each ``layer`` job names)."""
        self.rider: Any = None
        """Another aggregation whose stages that do not depend on the sites' contributions travel in
        the calls of the one in flight (a :class:`~fedsec.network.layers.masking.MaskedSession`,
        set by :class:`~fedsec.network.remote.RemoteRound` for an update's round)."""
        self.also_answers: dict[str, bytes] = {}
        """The replies of the second stage messages of the last :meth:`exchange` (``also``)."""
        self.also_reports: dict[str, dict[str, Any]] = {}
        self.also_refusals: dict[str, str] = {}
        """The reports (the fields of a training carried with it) and the refusals' reasons of the
        second stage messages of the last :meth:`exchange`."""
        self.rider_training: Callable[[], Bundle | None] | None = None
        """Set with :attr:`rider` by the evaluation's round: called when the rider is at its input
        stage for the next round's ``train`` jobs to carry with it (None: the rider waits)."""
        self._joined = threading.Condition()
        self.transport = _RecordingServer(trust=trust, cert_pem=cert_pem, key_pem=key_pem,
                                          handler=self.handle, roster=frozenset(self.names), roles=("site",),
                                          listen=listen, read_deadline=read_deadline,
                                          on_slow=self._slow)

    @property
    def certificates(self) -> Mapping[str, bytes]:
        return self.transport.certificates

    @property
    def peers(self) -> Mapping[str, Peer]:
        return self.transport.peers

    @property
    def wire(self) -> Mapping[str, list[int]]:
        return self.transport.wire

    def start(self) -> int:
        return self.transport.start()

    def stop(self) -> None:
        self.mailboxes.close()
        self.transport.stop(grace=1.0)

    def wait_for_sites(self, timeout: float) -> dict[str, SiteInfo]:
        """Block until every roster site accepted or refused, or ``timeout`` seconds passed;
        returns the sites that accepted."""
        end = time.monotonic() + timeout
        with self._joined:
            while len(self.sites) + len(self.refused) < len(self.names):
                left = end - time.monotonic()
                if left <= 0:
                    break
                self._joined.wait(min(left, 1.0))
            return dict(self.sites)

    def _slow(self, peer: Peer) -> None:
        """A site's request missed the read deadline: a dropout until it polls again (recorded)."""
        self.absent.add(peer.name)
        self.audit.event("dropout", round=self.round, stage="transport",
                         details={"site": peer.name, "reason": f"request not complete within "
                                                               f"{self.transport.read_deadline:g} s"})

    def handle(self, peer: Peer, topic: str, payload: bytes) -> bytes:
        """One call of an admitted site (see the module's table)."""
        round_index: int | None = None
        if topic == "plan":
            reply = envelope.encode({"sha256": self.plan_sha256, "server": self.config.federation.server},
                                    self.plan_bytes)
        elif topic == "refuse":
            header, _ = envelope.decode(payload)
            rule = str(header.get("rule", ""))[:200]
            with self._joined:
                self.refused[peer.name] = rule
                self._joined.notify_all()
            self.audit.event("plan_refused_by_site", details={"site": peer.name, "rule": rule})
            reply = b""
        elif topic == "accept":
            reply = self._accept(peer, payload)
        elif topic == "poll":
            if peer.name not in self.sites:
                raise ValueError("poll before accepting the plan")
            self.absent.discard(peer.name)
            job = self.mailboxes.poll(peer.name, self.poll_wait)
            if job is None:
                return envelope.encode({"kind": "wait"})
            round_index = self.job_rounds.get(job[0])
            reply = job[1]
        elif topic == "answer":
            header, _ = envelope.decode(payload)
            job = envelope.field(header, "job", int)
            round_index = self.job_rounds.get(job)
            if not self.mailboxes.answer(peer.name, job, payload):
                # withdrawn after its deadline, or a job of an earlier incarnation of this coordinator
                self.audit.event("answer_ignored", round=round_index,
                                 details={"site": peer.name, "job": job})
            self.absent.discard(peer.name)
            following = self.mailboxes.poll(peer.name, self.poll_wait)
            reply = following[1] if following is not None else envelope.encode({"kind": "wait"})
        else:
            raise ValueError(f"unknown topic {topic!r}")
        reply = Payload(reply)  # hashed once: for the audit row, then for the framing
        self.audit.received_then_sent(peer.name, topic, payload, reply, round=round_index)
        return reply

    def _accept(self, peer: Peer, payload: bytes) -> bytes:
        header, _ = envelope.decode(payload)
        if header.get("sha256") != self.plan_sha256:
            raise ValueError("accepted a plan other than this one")
        shape = header.get("input_shape")
        if (not isinstance(shape, list) or not shape or
                any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in shape)):
            raise ValueError("input_shape is not a list of positive integers")
        info = SiteInfo(peer.name, self.names.index(peer.name), envelope.field(header, "n_train", int),
                        envelope.field(header, "n_test", int), tuple(shape),
                        envelope.field(header, "n_classes", int))
        if info.n_train < 1 or info.n_test < 1:
            raise ValueError("a site needs training and test records")
        # checked against the plan (its columns and classes fix both), never against another site:
        # a site accepting first with a bogus shape cannot lock the honest ones out
        expected = ((len(self.config.data.columns),), len(self.config.data.classes))
        if (info.input_shape, info.n_classes) != expected:
            raise ValueError("the site's data shape differs from the plan's data.columns/data.classes")
        with self._joined:
            rejoined = peer.name in self.sites
            self.sites[peer.name] = info
            self.joins[peer.name] = self.joins.get(peer.name, 0) + 1
            self.absent.discard(peer.name)
            self._joined.notify_all()
        self.mailboxes.clear(peer.name)
        if rejoined and self.standardization is not None:
            # a restarted site has lost the federation's feature scaling: it gets it first
            self.mailboxes.post(peer.name, *self.job("standardize", 0, {}, self.standardization))
        self.audit.event("site_rejoined" if rejoined else "site_joined",
                         details={"site": peer.name, "fingerprint": peer.fingerprint, "n_train": info.n_train,
                                  "n_test": info.n_test})
        return envelope.encode({"client_id": info.client_id, "head": self.audit.head()})

    def evaluated(self, names: Iterable[str], digest: str) -> None:
        """The sites ``names`` answered an ``evaluate`` job whose model body has SHA-256 ``digest``."""
        for name in names:
            self.models[name] = (digest, self.joins.get(name, 0))

    def holds_model(self, name: str, digest: str) -> bool:
        """Whether the site holds the model of SHA-256 ``digest`` (its last answered evaluation's,
        and it has not accepted the plan again since: a restarted site holds none), so that a
        ``train`` job may name it instead of sending it."""
        return self.models.get(name) == (digest, self.joins.get(name, 0))

    def take_bundle(self) -> Bundle | None:
        """The bundle waiting for the next ``layer`` exchange (then none waits)."""
        bundle, self.bundle = self.bundle, None
        return bundle

    def job(self, kind: str, round_index: int | None, header: dict[str, Any] | None = None,
            body: bytes = b"") -> tuple[int, bytes]:
        """A new job (its id and payload) of ``kind`` for ``round_index``."""
        number = self.mailboxes.next_id()
        self.job_rounds[number] = round_index
        return number, envelope.encode({"job": number, "kind": kind, "round": round_index, **(header or {})},
                                       body)

    def exchange(self, kind: str, round_index: int | None, jobs: Mapping[str, tuple[dict[str, Any], bytes]],
                 deadline: float, *, first: Bundle | None = None,
                 also: Mapping[str, tuple[dict[str, Any], bytes]] | None = None,
                 also_train: Bundle | None = None) -> dict[str, tuple[dict[str, Any], bytes]]:
        """:meth:`send` then :meth:`receive`: the answers that say ``ok`` (see :meth:`send`)."""
        return self.receive(self.send(kind, round_index, jobs, deadline, first=first, also=also,
                                      also_train=also_train))

    def send(self, kind: str, round_index: int | None, jobs: Mapping[str, tuple[dict[str, Any], bytes]],
             deadline: float, *, first: Bundle | None = None,
             also: Mapping[str, tuple[dict[str, Any], bytes]] | None = None,
             also_train: Bundle | None = None) -> Sent:
        """Post ``{site: (header, body)}`` jobs of ``kind``; the answers ``{site: (header, body)}``
        that arrived within ``deadline`` seconds and say ``ok`` (the others are dropouts, recorded).
        With ``first`` (a ``layer`` exchange), each of its sites gets its first job bundled with
        its stage message (see :class:`Bundle`). With ``also`` (a ``layer`` exchange:
        ``{site: ({purpose, stage}, message)}``, another aggregation's stage), each of its sites
        gets that message in the same call, as its job's second part, or as a ``layer`` job of its
        own when ``jobs`` has none for it (see :class:`~fedsec.network.site.SiteJobs`); the replies
        that came back ok are in :attr:`also_answers`, the others are recorded dropouts. With
        ``also_train`` (a ``train`` bundle of its own round), each of its sites gets its job before
        its ``also`` message, in the same part (the next round's training, speculated: see
        :class:`~fedsec.network.site.SiteJobs`); ``done`` is then called with the parts that came
        back ok (their reports: the training's fields) and the refusals of the others.

        Nothing is waited for: :meth:`receive` waits for the answers (until ``deadline`` seconds
        after now) and returns ``{site: (header, body)}`` of those that say ``ok``; the others are
        dropouts, recorded."""
        also = dict(also or {})
        trained_with = also_train.jobs if also_train is not None else {}
        ready = {name for name in set(jobs) | set(also) if name in self.sites and name not in self.absent}
        joins = dict(self.joins)
        posted, alone = {}, set()
        for name in [*jobs, *(n for n in also if n not in jobs)]:
            if name not in ready:
                continue
            if name not in jobs:  # only the other aggregation's stage: a layer job of its own
                alone.add(name)
                second_header, second = also[name]
                if name in trained_with:  # its training first, as a bundled first job of its round
                    assert also_train is not None
                    train, train_body = also_train.carried(name, round_index)
                    posted[name] = self.job(kind, train["round"], {
                        **second_header, "first": train, "first_size": len(train_body)},
                        train_body + second)
                else:
                    posted[name] = self.job(kind, round_index, second_header, second)
                continue
            header, body = jobs[name]
            if first is not None and name in first.jobs:
                first_header, first_body = first.carried(name, round_index)
                header = {**header, "first": first_header, "first_size": len(first_body)}
                body = first_body + body
            if name in also:
                second_header, second = also[name]
                if name in trained_with:
                    assert also_train is not None
                    train, train_body = also_train.carried(name, round_index)
                    second_header = {**second_header, "train": train, "train_size": len(train_body)}
                    second = train_body + second
                header = {**header, "also": {**second_header, "size": len(second)}}
                body = body + second
            posted[name] = self.job(kind, round_index, header, body)
        stage = kind if first is None else f"{first.kind}+{kind}"
        return Sent(kind, round_index, dict(jobs), first, also, also_train, posted, alone, joins, stage,
                    self.mailboxes.send(posted, deadline))

    def receive(self, sent: Sent) -> dict[str, tuple[dict[str, Any], bytes]]:
        """The answers to the jobs :meth:`send` posted (see there), waiting for them until its
        deadline; sets :attr:`refusals` and the second parts' :attr:`also_answers`,
        :attr:`also_reports` and :attr:`also_refusals`, and calls the bundles' ``done``."""
        kind, round_index, jobs, first, also = sent.kind, sent.round_index, sent.jobs, sent.first, sent.also
        also_train, posted, alone = sent.also_train, sent.posted, sent.alone
        joins, stage = sent.joins, sent.stage
        trained_with = also_train.jobs if also_train is not None else {}
        answers = self.mailboxes.collect(sent.mail)
        good: dict[str, tuple[dict[str, Any], bytes]] = {}
        self.refusals, self.also_answers, self.also_reports, self.also_refusals = {}, {}, {}, {}
        for name in also:
            if name in answers and name not in alone:  # a speculated training's part: of its round
                self._second(name, answers, also_train.round_index if also_train is not None
                             and name in trained_with else round_index, also[name][0])
        for name in (*jobs, *sorted(alone)):
            if name not in answers:
                reason = "no answer before the deadline" if name in posted else "not connected"
                if name in posted and self.joins.get(name) == joins.get(name):
                    self.absent.add(name)  # not if it reconnected meanwhile (its job was withdrawn)
                self.audit.event("dropout", round=round_index, stage=stage,
                                 details={"site": name, "reason": reason})
                continue
            try:
                header, body = envelope.decode(answers[name])
            except envelope.MalformedEnvelope:
                header, body = {"ok": False, "reason": "malformed answer"}, b""
            if header.get("ok") is not True:
                reason = str(header.get("reason", "refused"))[:200]
                if name not in alone:
                    self.refusals[name] = reason
                else:
                    self.also_refusals[name] = reason
                self.audit.event("dropout", round=round_index, stage=stage if name not in alone else
                                 f"{kind}/{also[name][0].get('purpose')}",
                                 details={"site": name, "reason": reason})
                continue
            if name in alone:
                self.also_answers[name], self.also_reports[name] = body, header
            else:
                good[name] = (header, body)
        if first is not None:
            first.sent = True
            first.done({name: answer for name, answer in good.items() if name in first.jobs},
                       dict(self.refusals))
        if also_train is not None:
            also_train.sent = True
            also_train.done({name: (self.also_reports[name], b"") for name in self.also_answers
                             if name in trained_with},
                            {name: why for name, why in self.also_refusals.items() if name in trained_with})
        return good

    def _second(self, name: str, answers: dict[str, bytes], round_index: int | None,
                second: dict[str, Any]) -> None:
        """Split a two-part answer: the second part's reply into :attr:`also_answers` (or its
        refusal, a recorded dropout of that aggregation); the first part stays in ``answers``."""
        stage = f"layer/{second.get('purpose')}"
        try:
            header, body = envelope.decode(answers[name])
            report = header.get("also")
            size = report.get("size") if isinstance(report, dict) else None
            if isinstance(size, bool) or not isinstance(size, int) or not 0 <= size <= len(body):
                raise envelope.MalformedEnvelope("the answer's second part is malformed")
        except envelope.MalformedEnvelope:
            self.audit.event("dropout", round=round_index, stage=stage,
                             details={"site": name, "reason": "malformed answer"})
            return
        if report.get("ok") is not True:
            reason = str(report.get("reason", "refused"))[:200]
            self.also_refusals[name] = reason
            self.audit.event("dropout", round=round_index, stage=stage,
                             details={"site": name, "reason": reason})
        else:
            self.also_answers[name], self.also_reports[name] = body[len(body) - size:], report
        answers[name] = envelope.encode(header, body[:len(body) - size])

    def finish(self, summary: dict[str, Any]) -> None:
        """Tell every site the run is over (with the released model's digest)."""
        keys = ("rounds_run", "stop_reason", "model_sha256", "final_accuracy", "epsilon")
        # a last round without metrics (its evaluation aborted) has NaN accuracy: sent as null
        text = json.dumps({k: (None if isinstance(v, float) and not math.isfinite(v) else v)
                           for k in keys for v in (summary.get(k),)}, default=str)
        for name in self.sites:
            self.mailboxes.post(name, *self.job("done", None, {"summary": json.loads(text)}))


def plan_sha256(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()
