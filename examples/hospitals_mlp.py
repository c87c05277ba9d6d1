"""Three hospitals train your own MLP on their CSV files: pairwise masking + DP-SGD, epsilon per round.

    python examples/hospitals_mlp.py [--rounds 15] [--data DIR]
"""

import argparse
import tempfile
from pathlib import Path

import numpy as np
from sklearn.datasets import load_breast_cancer
from torch import nn

import fedsec

parser = argparse.ArgumentParser()
parser.add_argument("--rounds", type=int, default=15)
parser.add_argument("--data", type=Path, default=Path(tempfile.mkdtemp()))
args = parser.parse_args()

# Each hospital's export: 30 numeric columns and a 0/1 "malignant" column (here made from sklearn's set).
x, y = load_breast_cancer(return_X_y=True)
order = np.random.default_rng(0).permutation(len(y))
for k, rows in enumerate(np.split(order, [140, 280, 420])):  # hospital_3.csv: the test set
    np.savetxt(args.data / f"hospital_{k}.csv", np.c_[x[rows], 1 - y[rows]], delimiter=",", comments="",
               header=",".join([f"f{i}" for i in range(30)] + ["malignant"]))

def read(path):  # features, label
    table = np.loadtxt(path, delimiter=",", skiprows=1)
    return table[:, :-1], table[:, -1]

net = nn.Sequential(nn.Linear(30, 32), nn.ReLU(), nn.Linear(32, 1))
result = fedsec.Federation(
    model=net, clients=[read(args.data / f"hospital_{k}.csv") for k in range(3)],
    test=read(args.data / "hospital_3.csv"), secure="masking", standardize=True,
    dp=fedsec.DP(target_epsilon=3.0, delta=1e-5, max_grad_norm=1.0), rounds=args.rounds,
    batch_size=32, lr=0.5,
    callbacks=[lambda r: print(f"round {r['round']:2d}  accuracy {r['accuracy']:.3f}  "
                               f"AUROC {r['auroc']:.3f}  epsilon {r['epsilon']:.3f}")]).run()
print(f"final: accuracy {result.history[-1]['accuracy']:.3f}, epsilon {result.epsilon:.3f} "
      f"at delta {result.delta:g}; not covered by epsilon: {result.not_covered}")
