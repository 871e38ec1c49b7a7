#!/usr/bin/env python3
"""The cost of the distributed debug mode on `ringgrad-bench overlap`, as a ratio against a
baseline measured in the same run.

Three settings run alternately, `--repeats` times each, as 2-rank jobs under ringgrad-run:
  recorder off   RG_FLIGHT_RECORDER_SIZE=0 (no flight recorder; the baseline)
  OFF            the default: the flight recorder on, no cross-rank checks
  DETAIL         RG_DISTRIBUTED_DEBUG=DETAIL: every collective's fingerprint checked through the
                 store before it runs
It prints the median iteration time (overlapped rows, the bucket sizes given) of each setting
and its ratio to the baseline.

    python3 bench/debug_overhead.py [--build build/ci] [--model toynet] [--repeats 5]
"""
import argparse
import csv
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SETTINGS = [
    ("recorder off", {"RG_FLIGHT_RECORDER_SIZE": "0"}),
    ("OFF (recorder on)", {}),
    ("DETAIL", {"RG_DISTRIBUTED_DEBUG": "DETAIL"}),
]


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(ROOT, "build", "ci"))
    ap.add_argument("--model", default="toynet")
    ap.add_argument("--bucket-mb", default="1,25")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args()
    run = os.path.join(a.build, "apps", "ringgrad-run")
    bench = os.path.join(a.build, "apps", "ringgrad-bench")
    times = {name: [] for name, _ in SETTINGS}
    with tempfile.TemporaryDirectory() as work:
        for rep in range(a.repeats):
            for name, extra in SETTINGS:
                env = {k: v for k, v in os.environ.items()
                       if k not in ("RG_DISTRIBUTED_DEBUG", "RG_FLIGHT_RECORDER_SIZE")}
                env.update(extra)
                out = os.path.join(work, "rows.csv")
                r = subprocess.run([run, "--nproc-per-node", "2", "--master-port", "0", bench,
                                    "overlap", "--model", a.model, "--bucket-mb", a.bucket_mb,
                                    "--iters", str(a.iters), "--csv", out],
                                   env=env, capture_output=True, text=True)
                if r.returncode != 0:
                    sys.exit(f"{name}: ringgrad-bench overlap failed:\n{r.stdout}{r.stderr}")
                with open(out) as f:
                    rows = [row for row in csv.DictReader(f)
                            if row["overlap"] == "1" and row["bucket_mb"] != "single"]
                times[name].append(sum(float(row["iter_ms"]) for row in rows))
                print(f"# repeat {rep + 1} {name}: {times[name][-1]:.1f} ms", flush=True)
    base = statistics.median(times[SETTINGS[0][0]])
    print(f"\n{a.model}, 2 ranks, buckets {a.bucket_mb} MiB, overlapped: sum of the iteration "
          f"times, median of {a.repeats}")
    print(f"{'setting':<20} {'ms':>8} {'ratio':>7}")
    for name, _ in SETTINGS:
        m = statistics.median(times[name])
        print(f"{name:<20} {m:8.1f} {m / base:7.3f}")


if __name__ == "__main__":
    main()
