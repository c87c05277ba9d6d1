"""The privacy budget's per-round cost late in a long run, against the from-scratch computation.

Every round the budget asks for epsilon after the next round (its stop rule) and reports epsilon
and the RDP cross-check; the ledger of a run with one cost profile is one Gaussian event whose
step count grows every round. Before this change each of those numbers was recomputed from the
whole ledger (dp-accounting from scratch); now the PLD goes through the cached running engine
(:mod:`dp.analysis.pld_running`), the PRV through the bucketed engine
(:mod:`dp.analysis.prv_running`) and the RDP through the cached per-step series.

The workloads are the README default (DP-SGD, 7 steps a round) with each accountant, DP-SGD at
sigma = 1 and at q = 0.01 with 100 steps a round (each accountant), and the grid sigma in
{0.5, 1, 2} x q in {0.001, 0.01, 0.1} with one step a round (client-level noise: one Gaussian
release of the sum a round, q the share of clients sampled) with each accountant, and central
client-level noise with every client in every round (q = 1) at sigma = 1 and 5.

For each workload and each round r in 10, 100, 1,000 the benchmark brings a fresh budget's ledgers
to round r - 3, runs rounds r - 2, r - 1 and r as a run does (``before_round``, ``charge``,
``after_round``) and times the faster of rounds r - 1 and r (``new_s``; the first round after
the jump builds the engines: ``first_s``; for PRV, that build once a bucket spread over the
bucket's rounds is ``amortised_s``); the reference (``old_s``) is what the budget
computed per round before, timed in the same run: the PLD of the ledger after the next round and
the RDP of the ledger, from scratch. For PLD the dense running engine (``pld_running.SPARSE =
False``: what the budget ran before the sparse scan) is timed between two runs of the sparse one
(``dense_s``; ``new_s`` is the faster of the two sparse runs). ``epsilon`` and
``epsilon_from_scratch`` are the reported values both ways. ``round_s`` is the measured time of
one round of the README's default experiment (four hospitals, logistic regression, masking,
DP-SGD), the denominator of ``share_of_round``.

    python -m benchmarks.accountant [--rounds 10 100 1000] [--skip-round-time]

    python -m benchmarks.accountant --only grid_   # the workloads whose name contains grid_

Last stdout line (JSON): {"workloads": {name: {"profile": ..., "accountant": ..., "rounds":
{r: {"old_s", "old_cpu_s", "new_s", "new_cpu_s", "new_max_s", "first_s", "first_cpu_s",
"speedup", "epsilon", "epsilon_from_scratch", "difference"} (PRV also "rounds_per_bucket",
"amortised_s", "amortised_cpu_s"; PLD also "dense_s", "dense_cpu_s", "epsilon_dense",
"sparse_minus_dense")}}}, "round_s": ..., "share_of_round_at_max":
{name: new_s / round_s}, "dense_share_of_round_at_max": {PLD name: dense_s / round_s},
"slowest_at_max": [name, new_s], "load_average": [...]}.
"""

from __future__ import annotations

import argparse
import os
import time

from fedsec.dp.analysis import pld, pld_running, prv, prv_running, rdp
from fedsec.dp.ledger import GaussianEvent
from fedsec.fl_core.history import RoundRecord
from fedsec.protocols.privacy import PrivacyBudget

from benchmarks._common import emit, log

DELTA = 1e-5
ACCOUNTANTS = ("pld", "prv", "rdp")
WORKLOADS: dict[str, tuple[GaussianEvent, str, float]] = {}
for _name in ACCOUNTANTS:
    # the README default run taken to 1,000 rounds: sigma calibrated for epsilon 3 over 1,000 rounds
    WORKLOADS[f"readme_default_{_name}"] = (GaussianEvent(16.375, 16 / 114, 7), _name, 3.0)
    # DP-SGD at sigma 1, report only (no target): a long run's epsilon grows into the hundreds
    WORKLOADS[f"dpsgd_sigma1_{_name}"] = (GaussianEvent(1.0, 16 / 114, 7), _name, 0.0)
    # a lower sampling rate and 100 steps a round: 100,000 steps at round 1,000, the finest grid
    WORKLOADS[f"dpsgd_q001_{_name}"] = (GaussianEvent(1.0, 0.01, 100), _name, 0.0)
for _sigma in (0.5, 1.0, 2.0):
    for _q in (0.001, 0.01, 0.1):
        for _name in ACCOUNTANTS:  # client-level noise, one release a round, report only
            WORKLOADS[f"grid_s{_sigma:g}_q{_q:g}_{_name}"] = (GaussianEvent(_sigma, _q, 1), _name, 0.0)
for _sigma in (1.0, 5.0):
    for _name in ACCOUNTANTS:  # central client-level noise on every client's update: q = 1
        WORKLOADS[f"central_s{_sigma:g}_q1_{_name}"] = (GaussianEvent(_sigma, 1.0, 1), _name, 0.0)
OLD = {"pld": lambda events: pld.epsilon(events, DELTA, from_scratch=True),
       "prv": lambda events: prv.epsilon(events, DELTA, from_scratch=True),
       "rdp": lambda events: rdp.epsilon(events, DELTA, from_scratch=True)}


def _record(round_index: int) -> RoundRecord:
    return RoundRecord(round=round_index, accuracy=0.0, loss=0.0, train_loss=0.0, participants=4,
                       dropped=0, upload_bytes=0, seconds=0.0, update_norm=0.0)


def new_round(event: GaussianEvent, accountant: str, target: float, round_index: int
              ) -> tuple[float, float, float, float, float, float]:
    """(wall seconds, CPU seconds, slower wall seconds of one round at ``round_index``, the epsilon
    reported at round ``round_index``, wall and CPU seconds of the first round after the jump,
    which builds the engines) for a fresh budget brought there."""
    budget = PrivacyBudget(profiles=[[event]], delta=DELTA, target_epsilon=target,
                           accountant=accountant, unit="example",
                           noise_multiplier=event.noise_multiplier)
    for a in budget.accountants:
        for _ in range(max(round_index - 3, 0)):
            a.record(event)
    seconds, cpu = [], []
    for r in range(max(round_index - 2, 1), round_index + 1):
        record = _record(r)
        start, start_cpu = time.perf_counter(), time.process_time()
        budget.before_round(r)
        budget.charge(r)
        budget.after_round(record)
        seconds.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    timed = seconds[1:] or seconds
    fastest = timed.index(min(timed))
    return (min(timed), (cpu[1:] or cpu)[fastest], max(timed), float(record.metrics["epsilon"]),
            seconds[0], cpu[0])


def dense_round(event: GaussianEvent, target: float, round_index: int) -> tuple:
    """:func:`new_round` for the PLD with the sparse scan off: the dense running engine (an
    inverse FFT of the running power and a scan a query), the reference of the sparse scan."""
    pld_running._ENGINES.clear()
    pld_running.SPARSE = False
    try:
        return new_round(event, "pld", target, round_index)
    finally:
        pld_running.SPARSE = True
        pld_running._ENGINES.clear()


def rounds_per_bucket(event: GaussianEvent, round_index: int) -> float:
    """Rounds between two PRV bucket builds around ``round_index``: the bucket's step counts
    over the steps a round."""
    top = prv_running.bucket(event.steps * round_index)
    return (top - prv_running.bucket_floor(top) + 1) / event.steps


def old_round(event: GaussianEvent, accountant: str, target: float, round_index: int
              ) -> tuple[float, float, float]:
    """(seconds, epsilon) of what the budget computed for round ``round_index`` before: the
    epsilon after the round (its stop rule; the same ledger is then reported from the cache) and
    the RDP cross-check, each from the whole ledger: (wall s, CPU s, epsilon)."""
    ledger = [GaussianEvent(event.noise_multiplier, event.sample_rate, event.steps * round_index)]
    start, start_cpu = time.perf_counter(), time.process_time()
    value = OLD[accountant](ledger)
    OLD["rdp"](ledger)
    return time.perf_counter() - start, time.process_time() - start_cpu, float(value)


def round_time(rounds: int = 3) -> float:
    """Mean seconds of one round of the README's default experiment (rounds 2..)."""
    from fedsec.config import make_config
    from fedsec.experiment import build_experiment

    experiment = build_experiment(make_config({"rounds": rounds}))
    result = experiment.server.run()
    seconds = [r.seconds for r in result.records[1:]] or [result.records[0].seconds]
    return sum(seconds) / len(seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, nargs="+", default=[10, 100, 1000])
    parser.add_argument("--skip-round-time", action="store_true")
    parser.add_argument("--only", default="", help="run the workloads whose name contains this")
    args = parser.parse_args()
    out: dict = {"workloads": {}, "delta": DELTA, "load_average": list(os.getloadavg())}
    for name, (event, accountant, target) in WORKLOADS.items():
        if args.only not in name:
            continue
        rows = {}
        for r in args.rounds:
            new_s, new_cpu, new_max, eps, first_s, first_cpu = new_round(event, accountant, target, r)
            old_s, old_cpu, eps_old = old_round(event, accountant, target, r)
            if accountant == "pld":  # the dense running engine, then the sparse one again: interleaved
                dense = dense_round(event, target, r)
                again = new_round(event, accountant, target, r)
                if again[0] < new_s:
                    new_s, new_cpu = again[:2]
                new_max = max(new_max, again[2])
            rows[str(r)] = {"old_s": round(old_s, 4), "old_cpu_s": round(old_cpu, 4),
                            "new_s": round(new_s, 4), "new_cpu_s": round(new_cpu, 4),
                            "new_max_s": round(new_max, 4),
                            "first_s": round(first_s, 4), "first_cpu_s": round(first_cpu, 4),
                            "speedup": round(old_s / max(new_s, 1e-9), 1),
                            "epsilon": eps, "epsilon_from_scratch": eps_old,
                            "difference": eps - eps_old}
            if accountant == "pld":
                rows[str(r)].update({"dense_s": round(dense[0], 4), "dense_cpu_s": round(dense[1], 4),
                                     "epsilon_dense": dense[3], "sparse_minus_dense": eps - dense[3]})
            if accountant == "prv":  # a build once a bucket, spread over the bucket's rounds
                per = rounds_per_bucket(event, r)
                rows[str(r)]["rounds_per_bucket"] = round(per, 1)
                rows[str(r)]["amortised_s"] = round(new_s + max(first_s - new_s, 0) / per, 4)
                rows[str(r)]["amortised_cpu_s"] = round(new_cpu + max(first_cpu - new_cpu, 0) / per, 4)
            log(f"{name} round {r}: {rows[str(r)]}")
        out["workloads"][name] = {"profile": [event.noise_multiplier, event.sample_rate, event.steps],
                                  "accountant": accountant, "target_epsilon": target, "rounds": rows}
    if not args.skip_round_time:
        out["round_s"] = round(round_time(), 4)
        last = str(max(args.rounds))
        out["share_of_round_at_max"] = {
            name: round(w["rounds"][last]["new_s"] / out["round_s"], 4)
            for name, w in out["workloads"].items()}
        out["dense_share_of_round_at_max"] = {
            name: round(w["rounds"][last]["dense_s"] / out["round_s"], 4)
            for name, w in out["workloads"].items() if "dense_s" in w["rounds"][last]}
        log(f"round time of the default experiment: {out['round_s']} s")
    last = str(max(args.rounds))
    if out["workloads"]:
        slowest = max(out["workloads"], key=lambda n: out["workloads"][n]["rounds"][last]["new_s"])
        out["slowest_at_max"] = [slowest, out["workloads"][slowest]["rounds"][last]["new_s"]]
    out["load_average_end"] = list(os.getloadavg())
    emit(out)


if __name__ == "__main__":
    main()
