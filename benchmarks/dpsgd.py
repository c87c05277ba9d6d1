"""DP-SGD against plain SGD: one epoch, one core, the same expected batch size.

Logistic regression on the breast-cancer training split and the small CNN on the digits
training split (each as one party's data). Plain: fedsec's SGD trainer (shuffled minibatches), on
its own copy of the model (without the DP-SGD clipper's forward hooks).
Private: ``dp.DPSGD`` (Poisson sampling, per-example clipping on the fast path, noise from AES-CTR)
with the loss DP-SGD clients train on (``per_example_classification_loss``: its derivative in
closed form).
Plain and private epochs alternate, --repeats times each: ``ratio`` is the fastest private
epoch over the fastest plain one, ``ratio_paired`` the median over the repeats of each private
epoch over the plain epoch just before it (robust to the load of a shared machine drifting).
``cpu_ratio`` and ``cpu_ratio_paired`` are the same on the thread's CPU time (everything runs on
the calling thread: one torch thread), which time spent waiting for a core on a shared machine
does not inflate. ``load`` is the one-minute load average before and after.

    python -m benchmarks.dpsgd [--batch-size 64] [--repeats 15]

Last stdout line (JSON): {"logreg": {"plain_s", "private_s", "ratio", "ratio_paired", "cpu_ratio",
"cpu_ratio_paired", "mode", "examples"}, "cnn": {...}, "batch_size": B, "load": [before, after]}.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
import torch
from fedsec.dp import DPSGD
from fedsec.fl_core import SGDTrainer, build_model, load_federated
from fedsec.fl_core.models import per_example_classification_loss as _loss

from benchmarks._common import emit, log


def measure(dataset: str, model_name: str, batch_size: int, repeats: int) -> dict:
    data = load_federated(dataset, n_clients=1, partition="iid", rng=np.random.default_rng(0))
    client = data.clients[0]
    model = build_model(model_name, input_shape=data.input_shape, n_classes=data.n_classes, seed=0)
    plain_model = build_model(model_name, input_shape=data.input_shape, n_classes=data.n_classes, seed=0)
    plain = SGDTrainer(epochs=1, batch_size=batch_size, lr=0.05)
    private = DPSGD(noise_multiplier=1.0, max_grad_norm=1.0, batch_size=batch_size, lr=0.05)
    x, y = torch.from_numpy(client.x), torch.from_numpy(client.y)
    rng = np.random.default_rng(0)
    plain.train(plain_model, client, rng=rng)
    private.train(model, x, y, _loss)  # warm-up: hooks, allocations
    plain_s, private_s, plain_cpu, private_cpu = [], [], [], []
    for _ in range(repeats):
        start, cpu = time.perf_counter(), time.thread_time()
        plain.train(plain_model, client, rng=rng)
        plain_s.append(time.perf_counter() - start)
        plain_cpu.append(time.thread_time() - cpu)
        start, cpu = time.perf_counter(), time.thread_time()
        private.train(model, x, y, _loss)
        private_s.append(time.perf_counter() - start)
        private_cpu.append(time.thread_time() - cpu)
    paired = sorted(b / a for a, b in zip(plain_s, private_s, strict=True))
    paired_cpu = sorted(b / a for a, b in zip(plain_cpu, private_cpu, strict=True))
    result = {"plain_s": round(min(plain_s), 5), "private_s": round(min(private_s), 5),
              "ratio": round(min(private_s) / min(plain_s), 3),
              "ratio_paired": round(paired[len(paired) // 2], 3),
              "cpu_ratio": round(min(private_cpu) / min(plain_cpu), 3),
              "cpu_ratio_paired": round(paired_cpu[len(paired_cpu) // 2], 3),
              "mode": private.clipper(model).mode, "examples": len(client)}
    log(f"{model_name} on {dataset}: {result}")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    torch.set_num_threads(1)
    before = round(os.getloadavg()[0], 2)
    logreg = measure("breast_cancer", "logreg", args.batch_size, args.repeats)
    cnn = measure("digits", "cnn", args.batch_size, args.repeats)
    emit({"logreg": logreg, "cnn": cnn, "batch_size": args.batch_size,
          "load": [before, round(os.getloadavg()[0], 2)]})


if __name__ == "__main__":
    main()
