"""Cost of reading and validating a site's CSV file, against numpy's own parser in the same run.

    python -m benchmarks.csv_data [--rows 200000] [--columns 30] [--repeats 3]

Writes a file of ``--rows`` rows of ``--columns`` float features and a 0/1 label, then times
(median of ``--repeats``, interleaved) ``fl_core.csv_data.read_site_csv`` (chunked parse plus
every schema check) and the reference ``numpy.loadtxt`` (parse only, no checks). Also times one
site's ``local_evaluation`` of a logistic model on the rows. The last line is one JSON object:
seconds of each, rows per second, and the ratio read_site_csv / loadtxt.
"""

from __future__ import annotations

import argparse
import csv
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks._common import emit, log


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--columns", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    from fedsec.fl_core.csv_data import CsvSchema, read_site_csv
    from fedsec.fl_core.federated_eval import local_evaluation

    from fedsec import fl_core

    rng = np.random.default_rng(0)
    root = Path(tempfile.mkdtemp(prefix="fedsec-csv-bench-"))
    path = root / "site.csv"
    names = [f"f{i}" for i in range(args.columns)]
    x = rng.normal(size=(args.rows, args.columns))
    y = (x[:, 0] > 0).astype(int)
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow([*names, "label"])
        writer.writerows([*map(repr, row), int(label)] for row, label in zip(x.tolist(), y, strict=True))
    schema = CsvSchema(label="label", classes=[0, 1], features=names)
    times: dict[str, list[float]] = {"read_site_csv": [], "loadtxt": []}
    try:
        for i in range(args.repeats):
            start = time.perf_counter()
            records, _ = read_site_csv(path, schema)
            times["read_site_csv"].append(time.perf_counter() - start)
            start = time.perf_counter()
            reference = np.loadtxt(path, delimiter=",", skiprows=1, dtype=np.float64)
            times["loadtxt"].append(time.perf_counter() - start)
            log(f"repeat {i}: read_site_csv {times['read_site_csv'][-1]:.3f} s, "
                f"loadtxt {times['loadtxt'][-1]:.3f} s")
        assert np.array_equal(records.x, reference[:, :-1].astype(np.float32))
        model = fl_core.build_model("logreg", input_shape=(args.columns,), n_classes=2, seed=0)
        start = time.perf_counter()
        local_evaluation(model, records, n_classes=2)
        evaluation = time.perf_counter() - start
    finally:
        shutil.rmtree(root, ignore_errors=True)
    ours, numpy_time = statistics.median(times["read_site_csv"]), statistics.median(times["loadtxt"])
    emit({"rows": args.rows, "columns": args.columns, "read_site_csv_s": round(ours, 4),
          "loadtxt_s": round(numpy_time, 4), "ratio": round(ours / numpy_time, 3),
          "rows_per_s": round(args.rows / ours), "local_evaluation_s": round(evaluation, 4)})


if __name__ == "__main__":
    main()
