#!/usr/bin/env python3
"""Validates ringgrad-bench scale against ringgrad-bench overlap under --sim-link.

For each model and rank count, one `ringgrad-bench overlap --sim-link ... --profile-out
P-{bucket}.json` run measures the DDP iterations (overlapped) per bucket cap and, between them,
compute-only iterations (DDP under no_sync) as a step profile per cap; `ringgrad-bench scale
--sim-link ... --gpus R` then predicts each cap's iteration from its profile alone. Profile and
measurement alternate iteration by iteration, so the load of this shared machine, which moves
compute times by tens of percent within seconds, hits both alike. "Cross" rows predict 4 ranks
from the 2-rank profile, which shows what 4 ranks sharing 2 cores do to compute (not to the
link).

  python3 bench/validate_scale_sim.py [--models toynet] [--sim-link 0.125,50] [--repeats 3]

Prints predicted vs measured iteration, communication and exposed communication with the
relative error of the iteration time, as a markdown table.
"""
import argparse
import csv
import itertools
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(cmd, env):
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"failed ({r.returncode}): {' '.join(cmd)}\n{r.stdout}\n{r.stderr}")
    return r.stdout


def read_csv(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build/ci"))
    ap.add_argument("--models", default="toynet")
    ap.add_argument("--sim-link", default="0.125,50",
                    help="GBPS,LATENCY_US (default: 1 Gb/s Ethernet with 50 us)")
    ap.add_argument("--buckets", default="1,5,25,single")
    ap.add_argument("--ranks", default="2,4")
    ap.add_argument("--iters", type=int, default=25)
    ap.add_argument("--stat", default="min",
                    help="overlap --stat: min (the fastest iteration, least disturbed by other "
                         "work on a shared machine) or median")
    ap.add_argument("--repeats", type=int, default=3,
                    help="overlap runs per setting; the medians of the per-run figures are shown")
    ap.add_argument("--threads", default="1",
                    help="RG_NUM_THREADS per rank (1: 2 ranks fill the 2 cores without "
                         "oversubscribing them)")
    ap.add_argument("--out", default="", help="also write the table as CSV here")
    a = ap.parse_args()
    bench = os.path.join(a.build, "apps/ringgrad-bench")
    launcher = os.path.join(a.build, "apps/ringgrad-run")
    env = dict(os.environ, RG_NUM_THREADS=a.threads)
    ranks = [int(r) for r in a.ranks.split(",")]
    tmp = tempfile.mkdtemp(prefix="rg_validate_scale_")
    rows = []
    for model in a.models.split(","):
        # per (ranks, bucket): lists over repeats of (pred iter, meas iter, pred comm, meas comm,
        # pred exposed, meas exposed, pred buckets, meas buckets)
        results = {}
        profiles = {}
        for rep in range(a.repeats):
            for n in ranks:
                tag = f"{model}-{n}-{rep}"
                meas_csv = os.path.join(tmp, f"overlap-{tag}.csv")
                prof = os.path.join(tmp, f"profile-{tag}-{{bucket}}.json")
                run([launcher, "--nproc-per-node", str(n), "--master-port", "0", bench, "overlap",
                     "--model", model, "--sim-link", a.sim_link, "--bucket-mb", a.buckets,
                     "--iters", str(a.iters), "--stat", a.stat, "--csv", meas_csv, "--profile-out", prof], env)
                profiles.setdefault(n, []).append(prof)
                measured = {r["bucket_mb"]: r for r in read_csv(meas_csv) if r["overlap"] == "1"}
                sources = [("same", prof)]
                if n != ranks[0]:
                    sources.append(("cross", profiles[ranks[0]][rep]))
                for (kind, source), bucket in itertools.product(sources, a.buckets.split(",")):
                    pred_csv = os.path.join(tmp, f"pred-{tag}-{kind}-{bucket}.csv")
                    run([bench, "scale", "--trace", source.replace("{bucket}", bucket),
                         "--sim-link", a.sim_link, "--gpus", str(n), "--bucket-mb", bucket,
                         "--csv", pred_csv], env)
                    for p in read_csv(pred_csv):
                        m = measured[p["bucket_mb"]]
                        results.setdefault((n, kind, p["bucket_mb"]), []).append(
                            (float(p["step_ms"]), float(m["iter_ms"]), float(p["comm_ms"]),
                             float(m["comm_ms"]), float(p["exposed_ms"]), float(m["exposed_ms"]),
                             int(p["buckets"]), int(m["buckets"])))
        for (n, kind, bucket), runs in results.items():
            med = [statistics.median(x[i] for x in runs) for i in range(8)]
            errs = [100 * (x[0] - x[1]) / x[1] for x in runs]
            rows.append({"model": model, "ranks": n,
                         "profile": f"{n} ranks" if kind == "same" else f"{ranks[0]} ranks",
                         "bucket_mb": bucket, "buckets": f"{med[6]:.0f}/{med[7]:.0f}",
                         "pred_iter_ms": med[0], "meas_iter_ms": med[1],
                         "iter_err_pct": statistics.median(errs),
                         "worst_err_pct": max(errs, key=abs),
                         "pred_comm_ms": med[2], "meas_comm_ms": med[3],
                         "pred_exposed_ms": med[4], "meas_exposed_ms": med[5]})
    rows.sort(key=lambda r: (r["model"], r["profile"] != f"{r['ranks']} ranks", r["ranks"],
                             r["bucket_mb"]))
    print(f"# sim-link {a.sim_link}, RG_NUM_THREADS={a.threads}, {a.repeats} runs x "
          f"{a.iters} iterations (--stat {a.stat}); medians over runs; buckets "
          "predicted/measured")
    print("| model | ranks | profile from | bucket MiB | buckets | predicted iter ms | "
          "measured iter ms | error (median, worst run) | predicted comm / exposed ms | "
          "measured comm / exposed ms |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {r['ranks']} | {r['profile']} | {r['bucket_mb']} | "
              f"{r['buckets']} | {r['pred_iter_ms']:.1f} | {r['meas_iter_ms']:.1f} | "
              f"{r['iter_err_pct']:+.1f}% ({r['worst_err_pct']:+.1f}%) | "
              f"{r['pred_comm_ms']:.1f} / {r['pred_exposed_ms']:.1f} | "
              f"{r['meas_comm_ms']:.1f} / {r['meas_exposed_ms']:.1f} |")
    if a.out:
        with open(a.out, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
            w.writeheader()
            w.writerows(rows)
        print(f"# wrote {a.out}")


if __name__ == "__main__":
    main()
