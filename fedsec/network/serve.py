"""The coordinator's run: the simulation's server loop over remote sites (``fedsec serve``).

It builds the experiment with :func:`fedsec.experiment.assemble_experiment` on *placeholder*
data (each site's number of records, the shape of a record: what the sites reported; no record
leaves a site), with the plan's secure layer as the protocol, the sites' training as the strategy
(:mod:`fedsec.network.remote`) and the federated evaluator over the network, and runs it with
:func:`fedsec.experiment.execute_experiment`, so its run directory is ``fedsec run``'s. Its own
audit log (``audit.db``, signed with the coordinator's identity key) is in the run directory.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fedsec import fl_core
from fedsec.audit.run import vector_sha256
from fedsec.checkpoint import Checkpoint, SavedState, generator_state
from fedsec.config import ExperimentConfig
from fedsec.errors import ConfigError
from fedsec.experiment import Experiment, assemble_experiment, execute_experiment
from fedsec.fl_core.history import RoundObserver, RoundRecord, TrainingResult
from fedsec.network.coordinator import Hub, Sent, SiteInfo
from fedsec.network.layers import LAYERS, CoordinatorContext
from fedsec.network.party_audit import PartyAudit
from fedsec.network.remote import RemoteEvaluator, RemoteRound, RemoteStrategy, remote_moments


class CoordinatorAudit(RoundObserver):
    """The coordinator's round events: outcome, epsilon (the run's and each site's), model digest."""

    def __init__(self, audit: PartyAudit, model_vector: Any) -> None:
        self.audit, self.model_vector = audit, model_vector

    def after_round(self, record: RoundRecord) -> None:
        details = {"status": record.status, "participants": record.participants, "dropped": record.dropped,
                   "upload_bytes": record.upload_bytes}
        for key in ("accuracy", "loss"):
            value = getattr(record, key)
            if isinstance(value, float) and np.isfinite(value):
                details[key] = value
        events = [("round", record.round, details)]
        if "epsilon" in record.metrics:
            events.append(("epsilon", record.round, {"epsilon": record.metrics["epsilon"]}))
        events.append(("model_released", record.round, {"sha256": vector_sha256(self.model_vector())}))
        self.audit.events(events)  # one commit for the round's events

    def on_finish(self, result: TrainingResult) -> None:
        self.audit.event("run_finished", details={"rounds_run": result.rounds_run,
                                                  "stop_reason": result.stop_reason})


class SiteLedgers:
    """Each site's own epsilon, charged for every round it trained in (what the site records)."""

    def __init__(self, experiment: Experiment, sites: Mapping[str, SiteInfo], audit: PartyAudit) -> None:
        from fedsec.protocols.privacy import PrivacyBudget

        self.audit, self.budgets = audit, {}
        privacy, p = experiment.privacy, experiment.config.dp
        if privacy is None:
            return
        for name, info in sites.items():
            # client level: every site's round is the run's one profile (the plan's Skellam event)
            profiles = ([privacy.trainer.events(info.n_train)] if privacy.trainer is not None
                        else privacy.budget.profiles)
            self.budgets[name] = PrivacyBudget(
                profiles=profiles, delta=p.delta, target_epsilon=0.0, accountant=p.accountant,
                unit=privacy.unit, noise_multiplier=privacy.noise_multiplier)

    def trained(self, round_index: int, names: list[str]) -> None:
        for name in names:
            budget = self.budgets.get(name)
            if budget is not None:
                budget.charge(round_index)
                self.audit.event("epsilon", round=round_index,
                                 details={"party": name, "epsilon": budget.spent})


def placeholder_data(config: ExperimentConfig, names: tuple[str, ...],
                     sites: Mapping[str, SiteInfo]) -> fl_core.FederatedDataset:
    """Zero records of each site's reported sizes and shape (a site that never joined: the
    smallest size reported, one test record), in roster order."""
    first = next(iter(sites.values()))
    shape, smallest = first.input_shape, min(s.n_train for s in sites.values())
    sizes = [sites[n].n_train if n in sites else smallest for n in names]
    tests = [sites[n].n_test if n in sites else 1 for n in names]
    clients = tuple(fl_core.ArrayDataset(np.zeros((k, *shape), np.float32), np.zeros(k, np.int64))
                    for k in sizes)
    test = fl_core.ArrayDataset(np.zeros((sum(tests), *shape), np.float32), np.zeros(sum(tests), np.int64))
    return fl_core.FederatedDataset(name="csv", clients=clients, test=test, n_classes=first.n_classes,
                                    input_shape=shape, standardize=False,
                                    info={"test_sizes": tests, "classes": list(config.data.classes)})


@dataclass(frozen=True)
class Posted:
    """A ``layer`` exchange posted and not yet collected: the hub's record of it and the other
    aggregation whose stage rode in it (None: none did)."""

    sent: Sent
    rider: Any


def build_coordinator(config: ExperimentConfig, hub: Hub, sites: Mapping[str, SiteInfo],
                      observers: list[RoundObserver]) -> tuple[Experiment, RemoteRound, SiteLedgers]:
    """The experiment a coordinator runs (see the module), drawing from the run generator as the
    simulation of the same plan does; its round protocol and the sites' ledgers."""
    from fedsec.site_data import EVALUATION_STREAM, statistics_error_bound

    deadline = config.federation.stage_timeout
    data = placeholder_data(config, hub.names, sites)
    rng = np.random.default_rng(config.seed)
    held: dict[str, Any] = {}

    def post(stage: str, messages: Mapping[int, bytes]) -> Posted:
        # another aggregation's stages that need no contribution ride in the same calls (the
        # evaluation's first two, in the update's first two: docs/deployment.md)
        rider, training = hub.rider, None
        if rider is not None and not rider.before_input:
            # at its input stage: it rides only with the next round's training (speculated during
            # this evaluation, docs/deployment.md), else it waits for its own round
            training = hub.rider_training() if hub.rider_training is not None else None
            rider = rider if training is not None else None
        also = None
        if rider is not None:
            second, outgoing = rider.outgoing()
            also = {hub.names[c]: ({"purpose": rider.purpose, "stage": second}, m)
                    for c, m in outgoing.items()}
        jobs = {hub.names[c]: ({"stage": stage, "purpose": hub.purpose}, m) for c, m in messages.items()}
        return Posted(hub.send("layer", hub.round, jobs, deadline, first=hub.take_bundle(), also=also,
                               also_train=training), rider)

    def collect(posted: Posted) -> dict[int, bytes]:
        answers = hub.receive(posted.sent)
        if posted.rider is not None:
            posted.rider.take({hub.names.index(n): body for n, body in hub.also_answers.items()})
        return {hub.names.index(n): body for n, (_, body) in answers.items()}

    def exchange(stage: str, messages: Mapping[int, bytes]) -> dict[int, bytes]:
        return collect(post(stage, messages))

    def protocol(config: ExperimentConfig, data: fl_core.FederatedDataset,
                 rng: np.random.Generator) -> RemoteRound:
        context = CoordinatorContext(config=config, rng=rng, names=hub.names, certificates=hub.certificates,
                                     peers=hub.peers, max_weight=max(len(c) for c in data.clients),
                                     exchange=exchange, identity=hub.identity, trust=hub.transport.trust,
                                     cert_path=hub.cert_path, key_path=hub.key_path,
                                     audit=hub.audit)
        layer = LAYERS[config.secure.aggregation][0](context)
        held["round"] = RemoteRound(layer=layer, hub=hub, strategy=None, deadline=deadline,  # type: ignore[arg-type]
                                    sequential_noise=config.dp.reproducible and config.dp.mode == "dpsgd",
                                    on_trained=lambda r, names: held["ledgers"].trained(r, names))
        held["round"].post, held["round"].collect = post, collect
        return held["round"]

    def strategy(inner: fl_core.Strategy) -> fl_core.Strategy:
        held["round"].strategy = RemoteStrategy(inner, data.clients)
        return held["round"].strategy

    def evaluator(config: ExperimentConfig, data: fl_core.FederatedDataset) -> RemoteEvaluator:
        # the simulation's evaluation_protocol: its own instance of the layer, its own generator
        layer = LAYERS[config.secure.aggregation][0](CoordinatorContext(
            config=config, rng=np.random.default_rng([config.seed, EVALUATION_STREAM]), names=hub.names,
            certificates=hub.certificates, peers=hub.peers, max_weight=max(len(c) for c in data.clients),
            exchange=exchange, identity=hub.identity, trust=hub.transport.trust, cert_path=hub.cert_path,
            key_path=hub.key_path, audit=hub.audit))
        held["evaluation"] = RemoteRound(layer=layer, hub=hub, strategy=None,  # type: ignore[arg-type]
                                         deadline=deadline, sequential_noise=False,
                                         on_trained=lambda r, names: None)
        s = config.secure
        bound = statistics_error_bound(s.aggregation, sites=len(hub.names),
                                       max_weight=max(len(c) for c in data.clients),
                                       length=_sums_length(data.n_classes), clip=s.clip, bits=s.bits)
        return RemoteEvaluator(hub=hub, deadline=deadline, protocol=held["evaluation"],
                               test_sizes=data.info["test_sizes"], n_classes=data.n_classes, max_error=bound)

    experiment = assemble_experiment(config, data, rng, observers=observers, protocol_factory=protocol,
                                     strategy_wrapper=strategy, evaluator_factory=evaluator)
    held["ledgers"] = SiteLedgers(experiment, sites, hub.audit)
    if experiment.privacy is not None:
        hub.noise_multiplier = float(experiment.privacy.noise_multiplier)
        held["round"].noise_multiplier = hub.noise_multiplier
        held["round"].on_released = experiment.privacy.budget.charge
    remote: RemoteRound = held["round"]
    remote.evaluation = held.get("evaluation")
    if remote.evaluation is not None:  # its calls carry the key stages of the next round's update
        remote.evaluation.update = remote
    return experiment, remote, held["ledgers"]


def _sums_length(n_classes: int) -> int:
    from fedsec.fl_core.federated_eval import sums_length

    return sums_length(n_classes)


def run_coordinator(config: ExperimentConfig, hub: Hub, out_dir: Path, *, say: Any = print,
                    checkpoint: Checkpoint | None = None) -> dict[str, Any]:
    """Wait for the roster, then run the plan to the end and write ``out_dir``; the summary.

    With ``checkpoint`` (``fedsec serve --resume``; ``out_dir`` is the folder it was read from)
    the roster, the federation's feature scaling and the coordinator's state come from it: no
    site is waited for (the ones still running go on polling; a restarted one accepts again) and
    the run continues after the checkpoint's round.

    Torch runs on one intra-op thread from here on, as in ``fedsec run`` (the simulation the
    history is compared with): the coordinator's model work (loading the released average into
    the model, reading it back for the sites' jobs, the checkpoint and the audit's digest) is on
    the critical path between two stages, and with torch's default of a thread per core each of
    those copies waited for an OpenMP thread that the eleven processes on the cores had pre-empted
    (measured under load: 16-59 ms of wall clock and 6-28 ms of CPU for one ``set_vector`` +
    ``get_vector`` of the 100k model, against 0.4 ms and 0.14 ms on one thread).

    Raises:
        RuntimeError: fewer than ``federation.min_sites`` sites accepted the plan in time.
        ConfigError: (key ``--resume``) the checkpoint lacks the coordinator's state.
    """
    import torch

    torch.set_num_threads(1)
    f = config.federation
    if checkpoint is None:
        sites = hub.wait_for_sites(f.join_timeout)
        hub.audit.event("roster", details={"joined": sorted(sites), "refused": dict(hub.refused)})
        if len(sites) < f.min_sites:
            raise RuntimeError(f"{len(sites)} of {len(hub.names)} sites accepted the plan within "
                               f"federation.join_timeout = {f.join_timeout:g} s; federation.min_sites is "
                               f"{f.min_sites}")
        say(f"{len(sites)} of {len(hub.names)} sites joined: {', '.join(sorted(sites))}")
    else:
        extra = checkpoint.meta.get("extra") or {}
        if HUB_STATE not in extra:
            raise ConfigError("--resume", "the checkpoint holds no coordinator state (not a serve run)")
        restore_hub(hub, extra[HUB_STATE])
        sites = dict(hub.sites)
        say(f"resuming after round {checkpoint.meta['round']} with the {len(sites)} sites of the run: "
            f"{', '.join(sorted(sites))}")
    observers: list[RoundObserver] = []
    experiment, remote, ledgers = build_coordinator(config, hub, sites, observers)
    server = experiment.server
    observers_audit = CoordinatorAudit(hub.audit, lambda: fl_core.get_vector(server.model))
    server.observers.append(observers_audit)
    if config.data.standardize and checkpoint is None:
        hub.round = 0
        _, _, upload = remote_moments(hub, server.protocol, features=int(np.prod(server.data.input_shape)),
                                      deadline=f.stage_timeout,
                                      sizes={n: s.n_train for n, s in sites.items()})
        server.setup_upload_bytes += upload
    layers = [r.layer for r in (remote, remote.evaluation) if r is not None]
    experiment.saved.extend(coordinator_state(hub, remote, ledgers, layers))

    def deployment(result: TrainingResult, out: Path | None) -> dict[str, Any]:
        protocol: dict[int, list[int]] = {}
        for layer in layers:
            for c, (up, down) in getattr(layer, "protocol_bytes", {}).items():
                totals = protocol.setdefault(c, [0, 0])
                totals[0] += up
                totals[1] += down
        return {"deployment": {
            "plan_sha256": hub.plan_sha256, "sites": sorted(sites), "refused": dict(hub.refused),
            "audit": "audit.db",
            "wire_bytes": {n: {"from_site": up, "to_site": down}
                           for n, (up, down) in sorted(hub.wire.items())},
            "protocol_bytes": {hub.names[c]: {"from_site": up, "to_site": down}
                               for c, (up, down) in sorted(protocol.items())}}}

    experiment.extras.append(deployment)
    summary = execute_experiment(experiment, out_dir, audit=False, checkpoints=True, checkpoint=checkpoint)
    remote.settle()  # a next round's first call posted ahead that the run did not begin
    hub.finish(summary)
    _drain(hub, set(sites))
    return summary


HUB_STATE = "deployment.hub"
"""The checkpoint's entry with the roster the run admitted, its plan and the feature scaling."""


def hub_state(hub: Hub) -> dict[str, Any]:
    """The checkpoint's :data:`HUB_STATE` entry (read back by :func:`restore_hub`): the plan's
    digest, the sites that accepted and what they reported, the feature scaling, and the
    certificate each site was admitted with (public; checked again at restore)."""
    return {"plan_sha256": hub.plan_sha256,
            "sites": {n: {"n_train": i.n_train, "n_test": i.n_test, "input_shape": list(i.input_shape),
                          "n_classes": i.n_classes} for n, i in sorted(hub.sites.items())},
            "standardization": hub.standardization.hex() if hub.standardization is not None else None,
            "certificates": {n: hub.certificates[n].decode() for n in sorted(hub.sites)
                             if n in hub.certificates}}


def restore_hub(hub: Hub, state: dict[str, Any]) -> None:
    """Put a checkpoint's roster, feature scaling and site certificates back into ``hub`` (a site
    that accepted again meanwhile keeps what it reported and presented now; a certificate that no
    longer passes the checks of a call, revoked or off the roster, is not put back).

    Raises:
        ConfigError: (key ``--resume``) the state is of another plan.
    """
    if state.get("plan_sha256") != hub.plan_sha256:
        raise ConfigError("--resume", "the checkpoint is of another plan")
    with hub._joined:
        for name, info in state["sites"].items():
            if name in hub.names and name not in hub.sites:
                hub.sites[name] = SiteInfo(name=name, client_id=hub.names.index(name),
                                           n_train=int(info["n_train"]), n_test=int(info["n_test"]),
                                           input_shape=tuple(int(v) for v in info["input_shape"]),
                                           n_classes=int(info["n_classes"]))
    if hub.standardization is None and state.get("standardization") is not None:
        hub.standardization = bytes.fromhex(state["standardization"])
    # each site's certificate as admitted before the restart, checked again (revocation list and
    # roster of now): a site the resumed run has not heard from yet is then a dropout of the stages
    # it misses, as in a run that never stopped, instead of a masked sum refused for want of its key
    certificates = state.get("certificates") or {}
    if not isinstance(certificates, dict):
        raise ConfigError("--resume", "the checkpoint's site certificates are not a name -> PEM table")
    for name, pem in certificates.items():
        if name in hub.sites and isinstance(pem, str):  # anything else: the site is admitted when it calls
            hub.transport.recall(name, pem.encode())


def coordinator_state(hub: Hub, remote: RemoteRound, ledgers: SiteLedgers,
                      layers: list[Any]) -> list[SavedState]:
    """What a coordinator's checkpoint holds besides the server loop's own (see
    docs/deployment.md, "Resume"): the roster and feature scaling, the reproducible noise
    stream's position, each site's epsilon as the coordinator counts it, the evaluation layer's
    generator, and the byte counters the summary reports."""

    def set_offset(value: Any) -> None:
        remote.noise_offset = int(value)

    def set_ledgers(value: Any) -> None:
        for name, state in value.items():
            if name in ledgers.budgets:
                ledgers.budgets[name].load_state_dict(state)

    def get_bytes() -> list[dict[str, list[int]]]:
        return [{str(c): list(v) for c, v in getattr(layer, "protocol_bytes", {}).items()}
                for layer in layers]

    def set_bytes(value: Any) -> None:
        for layer, counts in zip(layers, value, strict=True):
            if hasattr(layer, "protocol_bytes"):
                layer.protocol_bytes.update({int(c): [int(up), int(down)]
                                             for c, (up, down) in counts.items()})

    def get_wire() -> dict[str, list[int]]:
        return {n: list(v) for n, v in hub.wire.items()}

    def set_wire(value: Any) -> None:
        with hub.transport._count:
            for name, (up, down) in value.items():
                totals = hub.transport.wire.setdefault(name, [0, 0])
                totals[0] += int(up)
                totals[1] += int(down)

    saved = [SavedState(HUB_STATE, lambda: hub_state(hub), lambda value: restore_hub(hub, value)),
             SavedState("deployment.noise_offset", lambda: remote.noise_offset, set_offset),
             SavedState("deployment.site_ledgers",
                        lambda: {n: b.state_dict() for n, b in sorted(ledgers.budgets.items())}, set_ledgers),
             SavedState("deployment.protocol_bytes", get_bytes, set_bytes),
             SavedState("deployment.wire_bytes", get_wire, set_wire)]
    if remote.evaluation is not None:
        saved.append(generator_state("deployment.evaluation_rng", remote.evaluation.layer.context.rng))
    return saved


def _drain(hub: Hub, sites: set[str], timeout: float = 10.0) -> None:
    """Give the sites a moment to fetch the end-of-run job before the server stops."""
    end = time.monotonic() + timeout
    while time.monotonic() < end and any(hub.mailboxes.queued(n) for n in sites):
        time.sleep(0.1)
