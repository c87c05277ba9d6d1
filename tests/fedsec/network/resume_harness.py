"""The project's coordinator (``run_coordinator``, its :class:`Hub`, checkpoints, ``--resume``) and
four honest sites in one process, with a crash the test places.

Only the gRPC hop and the mailboxes' threads are left out: :class:`DirectMailboxes` hands each job
the real :meth:`Hub.exchange` posts straight to the site, whose :class:`InProcessSite` answers it as
``Site._jobs`` does (train: ``start``, the rounds already trained re-charged, ``SiteState.contribute``,
``SiteWork.train``; ``layer``: ``SiteWork.contribution`` then the plan's site layer;
``evaluate``/``moments``/``standardize``; a job bundled with a stage first, then the stage), with
the project's unmodified :class:`SiteWork`,
:class:`SiteState` (``site.db``) and :class:`MaskingSite`.

A crash is the :class:`Crash` exception raised at the k-th job exchange of a round, either before
the jobs reach the sites or after they answered (the coordinator dies before it reads the answers). The
sites keep running (their memory and ``site.db`` survive), as a site process does while the
coordinator is down; the resumed coordinator is a new :class:`Hub` over the same run directory.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from fedsec.protocols.errors import ClientAbort

from fedsec.checkpoint import read_checkpoint
from fedsec.config import loads_config
from fedsec.network import demo, envelope, pki
from fedsec.network.coordinator import Hub, SiteInfo
from fedsec.network.errors import PolicyRefused
from fedsec.network.layers import LAYERS, SiteContext, split_first
from fedsec.network.party_audit import PartyAudit
from fedsec.network.serve import HUB_STATE, restore_hub, run_coordinator
from fedsec.network.site import bundled, load_identity
from fedsec.network.site_state import SiteState
from fedsec.network.site_work import SiteWork


class Crash(BaseException):
    """The coordinator's process dies here (nothing in the project catches a BaseException)."""


class InProcessSite:
    """One honest site answering jobs as ``Site._jobs`` does."""

    def __init__(self, d: demo.Deployment, k: int, plan: bytes) -> None:
        self.config = loads_config(plan.decode())
        self.sha = hashlib.sha256(plan).hexdigest()
        enrolled = d.sites[k]
        self.name = enrolled.name
        self.state = SiteState(d.state(k))
        self.state.accept(self.sha, plan.decode())
        self.work = SiteWork.load(self.config, name=self.name, path=d.data[k],
                                  record=self.state.record(self.sha))
        self.context = SiteContext(config=self.config, name=self.name, client_id=self.work.client_id,
                                   names=tuple(self.config.federation.sites),
                                   identity=load_identity(enrolled.identity), trust=pki.Trust.load(d.ca),
                                   sessions=self.state, state=d.state(k))
        self.layer: Any = None
        self.handed: list[tuple[str, int]] = []
        """Every (kind, round) this site's contribution went into an aggregation for."""

    def answer(self, payload: bytes) -> bytes:
        header, body = envelope.decode(payload)
        kind, job = header.get("kind"), header["job"]
        answer: dict[str, Any] = {"job": job, "ok": True}
        out = b""
        try:
            if kind == "layer" and "first" in header:  # a bundled train/evaluate job: run first
                first, first_body, body = bundled(header, body)
                self._work(first["kind"], {**first, "job": job}, first_body, answer)
            if kind == "layer":
                if body[:len(envelope.MAGIC)] == envelope.MAGIC:
                    setup, body = split_first(body)
                    pending = self.work.pending
                    vector, weight = self.work.contribution(setup.get("purpose"), setup.get("round"))
                    self.handed.append((pending.kind, pending.round))
                    self.layer = LAYERS[self.config.secure.aggregation][1](self.context, setup=setup,
                                                                           vector=vector, weight=weight)
                if self.layer is None:
                    raise ClientAbort("a stage message without a setup")
                out = self.layer.handle(str(header.get("stage")), body) or b""
            else:
                self._work(kind, header, body, answer)
        except ClientAbort as abort:
            answer, self.layer = {"job": job, "ok": False, "reason": abort.reason}, None
        except PolicyRefused as refusal:
            answer = {"job": job, "ok": False, "reason": refusal.rule}
        return envelope.encode(answer, out)

    def _work(self, kind: Any, header: dict[str, Any], body: bytes, answer: dict[str, Any]) -> None:
        if kind == "train":
            if self.work.strategy is None:
                self.work.start(noise_multiplier=header.get("noise_multiplier"))
                if self.work.privacy is not None:
                    for done in self.state.contributed(self.sha):
                        self.work.privacy.budget.charge(done)
            self.state.contribute(self.sha, header["round"], max_rounds=self.config.rounds)
            answer.update(self.work.train(header, body))
        elif kind in ("evaluate", "moments", "standardize"):
            getattr(self.work, kind)(header, body)
        else:
            raise envelope.MalformedEnvelope(f"unknown job kind {kind!r}")

    def close(self) -> None:
        self.state.close()


class DirectMailboxes:
    """The hub's mailboxes with the sites in this process (see the module); raises :class:`Crash`
    at ``crash = (round, k, after)``: the k-th job exchange (from 1) of that round, before the jobs
    reach the sites or, with ``after``, once they have answered."""

    def __init__(self, sites: dict[str, InProcessSite], *, crash: tuple[int, int, bool] | None,
                 log: list[tuple[str, int | None]]) -> None:
        self.sites, self.crash, self.log = sites, crash, log
        self.counts: dict[int | None, int] = {}
        self._next = 1

    def next_id(self) -> int:
        self._next += 1
        return self._next

    def send(self, jobs: dict[str, tuple[int, bytes]], deadline: float) -> dict[str, bytes]:
        """The sites answer at once (see :meth:`exchange`): the answers stand for the posted jobs."""
        return self.exchange(jobs, deadline)

    def collect(self, answers: dict[str, bytes]) -> dict[str, bytes]:
        return answers

    def exchange(self, jobs: dict[str, tuple[int, bytes]], deadline: float) -> dict[str, bytes]:
        first = envelope.decode(next(iter(jobs.values()))[1])[0] if jobs else {}
        round_index = first.get("round")
        self.counts[round_index] = self.counts.get(round_index, 0) + 1
        stage = str(first.get("kind")) + ("/" + str(first.get("stage")) if "stage" in first else "")
        if isinstance(first.get("first"), dict):  # a job bundled with the stage
            stage = f"{first['first'].get('kind')}+{stage}"
        if isinstance(first.get("also"), dict) and "train" in first["also"]:  # the next round's training
            stage = f"{stage}+train"
        self.log.append((stage, round_index))
        here = self.crash is not None and self.crash[:2] == (round_index, self.counts[round_index])
        if here and not self.crash[2]:
            raise Crash()
        answers = {name: self.sites[name].answer(payload) for name, (_, payload) in jobs.items()}
        if here:
            raise Crash()
        return answers

    def post(self, name: str, job: int, payload: bytes) -> None:
        pass  # the end-of-run job: nobody polls in this process

    def queued(self, name: str) -> int:
        return 0

    def clear(self, name: str) -> None:
        pass

    def close(self) -> None:
        pass


class Federation:
    """A plan, four in-process sites and the coordinator's run directory under ``root``."""

    def __init__(self, root: Path, *, rounds: int, extra: str) -> None:
        self.d = demo.prepare(root, 4, rounds=rounds, extra=extra, stage_timeout=5.0)
        self.plan = self.d.plan.read_bytes()
        self.config = loads_config(self.plan.decode())
        self.sites = {s.name: InProcessSite(self.d, k, self.plan) for k, s in enumerate(self.d.sites)}
        self.out = root / "run"
        self.out.mkdir()
        (self.out / "config.toml").write_text(self.config.to_toml())
        self.log: list[tuple[str, int | None]] = []

    def coordinator(self, *, crash: tuple[int, int, bool] | None = None,
                    resume: bool = False) -> dict[str, Any] | None:
        """Run (or resume) the coordinator, crashing at ``crash`` (see :class:`DirectMailboxes`);
        the summary, or None when it crashed."""
        d, trust = self.d, pki.Trust.load(self.d.ca)
        audit = PartyAudit(self.out, actor="coordinator", key=load_identity(d.coordinator.identity),
                           run_id=hashlib.sha256(self.plan).hexdigest()[:16])
        hub = Hub(config=self.config, plan_bytes=self.plan, trust=trust,
                  cert_pem=d.coordinator.cert.read_bytes(), key_pem=d.coordinator.key.read_bytes(),
                  audit=audit, listen="127.0.0.1:0")
        hub.mailboxes = DirectMailboxes(self.sites, crash=crash, log=self.log)  # type: ignore[assignment]
        if not resume:  # what the transport records when a site calls; these sites never call
            # through it, so a resumed coordinator knows their certificates from its checkpoint
            # only, as a real one does until each site calls again
            for s in d.sites:
                hub.transport.certificates[s.name] = s.cert.read_bytes()
                hub.transport.peers[s.name] = pki.verify_peer(s.cert.read_bytes(), trust=trust,
                                                              roles=("site",))
        checkpoint = None
        if resume:
            checkpoint = read_checkpoint(self.out)
            restore_hub(hub, checkpoint.meta["extra"][HUB_STATE])
            audit.event("resumed", round=int(checkpoint.meta["round"]))
        else:
            for site in self.sites.values():
                info = site.work.report()
                hub.sites[site.name] = SiteInfo(site.name, site.work.client_id, info["n_train"],
                                                info["n_test"], tuple(info["input_shape"]), info["n_classes"])
        try:
            return run_coordinator(self.config, hub, self.out, say=lambda text: None, checkpoint=checkpoint)
        except Crash:
            return None
        finally:
            audit.close()

    def close(self) -> None:
        for site in self.sites.values():
            site.close()
