#!/usr/bin/env python3
"""The table of faults injected into the distributed debug mode's tests, with the time each took
to be detected and the message shown.

It runs the fault tests as ctest does (ringgrad-run over the test executables) at 2 and 3 ranks,
on CPU Gloo and on the emulated NCCL (RG_TEST_BACKEND=nccl), and the end-to-end stopped-rank test,
and prints one row per test: backend, ranks, test, the test's time (the fault is injected at its
start, so this bounds the time to detection) and the first message rank 0 (or, for a receive,
rank 1) printed.

    python3 bench/debug_fault_table.py [--build build/ci]
"""
import argparse
import os
import re
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

JOBS = [
    # (backend, executable, filter)
    ("gloo", "rg_dist_tests", "DetailTest.*:DdpDiagnostics.*:Consistency.AWeight*:Consistency.AGrad*"),
    ("nccl (emulated)", "rg_emu_dist_collectives_tests", "DetailTest.*"),
    ("nccl (emulated)", "rg_emu_dist_tests",
     "DdpDiagnostics.*:Consistency.AWeight*:Consistency.AGrad*"),
]


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(ROOT, "build", "ci"))
    a = ap.parse_args()
    run = os.path.join(a.build, "apps", "ringgrad-run")
    rows = []
    for backend, exe, filt in JOBS:
        for ranks in (2, 3):
            env = dict(os.environ)
            if backend.startswith("nccl"):
                env["RG_TEST_BACKEND"] = "nccl"
                env["RG_EMU_DEVICES"] = str(ranks)  # one emulated GPU per rank
            r = subprocess.run([run, "--nproc-per-node", str(ranks), "--master-port", "0",
                                os.path.join(a.build, "tests", exe), f"--gtest_filter={filt}"],
                               env=env, capture_output=True, text=True, timeout=600)
            current = {}   # rank -> the test it runs
            messages = {}  # (test, rank) -> the first message that rank printed in it
            for line in (r.stdout + r.stderr).splitlines():
                m = re.match(r"\[rank (\d+)\] (.*)", line)
                if not m:
                    continue
                rank, text = int(m.group(1)), m.group(2)
                start = re.match(r"\[ RUN      \] (\S+)", text)
                if start:
                    current[rank] = start.group(1)
                    continue
                if text.startswith("detected after") or text.startswith("message: "):
                    messages.setdefault((current.get(rank), rank),
                                        re.sub(r"^(detected after [0-9.]+ s|message): ", "", text))
                done = re.match(r"\[ +(OK|FAILED) +\] (\S+) \((\d+) ms\)", text)
                if done and rank == 0:
                    test = done.group(2)
                    message = messages.get((test, 0)) or messages.get((test, 1)) or "-"
                    rows.append((backend, ranks, test, int(done.group(3)), done.group(1),
                                 message))
    print("| backend | ranks | test | ms | result | message |")
    print("|---|---|---|---|---|---|")
    for backend, ranks, test, ms, result, message in rows:
        print(f"| {backend} | {ranks} | {test} | {ms} | {result} | {message} |")


if __name__ == "__main__":
    main()
