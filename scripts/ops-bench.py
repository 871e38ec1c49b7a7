#!/usr/bin/env python3
"""Runs rg_op_table_bench (bench/op_table_bench.cpp: for every op-table entry and CPU dtype, the
forward and the forward + backward on the entry's largest sample) and records the median real time
per call of each benchmark, with the CPU, the thread count and the commands, in
docs/ops-bench.json. rg_ops_doc takes the time column of docs/ops.md from that file;
`cmake --build build/ci --target ops-bench` runs this script and then rewrites docs/ops.md.

The benchmarks run one op at a time. On a shared machine other processes steal the cores that the
op's threads wait for: before each op the script waits for the machine to be idle, and it runs the
op again (up to --tries times, then gives up) when other processes used more than --max-other of a
CPU during the run (CPU time of the whole machine from /proc/stat, less the benchmark's own).

With --ops NAME,... only those ops are measured; the other figures are kept from --out, and the
file lists the partial run (date, ops, command) under "partial_runs", each new figure with its date.

Usage: scripts/ops-bench.py [--bench build/ci/bench/rg_op_table_bench] [--out docs/ops-bench.json]
                            [--repetitions 3] [--min-time SECONDS] [--tries 8] [--max-other 0.1]
                            [--ops NAME,...]
"""
import argparse
import datetime
import json
import os
import pathlib
import resource
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
NS_PER_UNIT = {"ns": 1.0, "us": 1e3, "ms": 1e6, "s": 1e9}
TICK = os.sysconf("SC_CLK_TCK")


def shown(path):
    """A path as typed from the source tree's root."""
    return os.path.relpath(pathlib.Path(path).resolve(), ROOT)


def cpu_name():
    """/proc/cpuinfo's model name, with family and model (some hypervisors shorten the name)."""
    fields = {}
    for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    return "{} (family {}, model {}; {} CPUs)".format(
        fields.get("model name", "unknown CPU"), fields.get("cpu family", "?"),
        fields.get("model", "?"), os.cpu_count())


def machine_cpu_seconds():
    """CPU seconds every process has used since boot (/proc/stat: all but idle and iowait)."""
    ticks = [int(v) for v in pathlib.Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
    return (sum(ticks) - ticks[3] - ticks[4]) / TICK


def children_cpu_seconds():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def wait_until_idle(max_other, seconds=5, give_up=600):
    """Until the machine used less than max_other of a CPU in each of `seconds` seconds."""
    idle, start = 0, time.monotonic()
    while idle < seconds and time.monotonic() - start < give_up:
        before = machine_cpu_seconds()
        time.sleep(1)
        idle = idle + 1 if machine_cpu_seconds() - before < max_other else 0


def run_undisturbed(command, args, what):
    """command's stdout, from a run during which other processes used at most --max-other CPUs."""
    for attempt in range(1, args.tries + 1):
        wait_until_idle(args.max_other)
        machine, mine, start = machine_cpu_seconds(), children_cpu_seconds(), time.monotonic()
        run = subprocess.run(command, stdout=subprocess.PIPE, check=True)
        wall = time.monotonic() - start
        other = (machine_cpu_seconds() - machine) - (children_cpu_seconds() - mine)
        if other <= args.max_other * wall:
            return run.stdout
        print(f"  {what}: other processes used {other / wall:.2f} CPUs during try {attempt}",
              file=sys.stderr)
    sys.exit(f"ops-bench: {what}: no undisturbed run in {args.tries} tries; try again later")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bench", default=str(ROOT / "build/ci/bench/rg_op_table_bench"))
    parser.add_argument("--out", default=str(ROOT / "docs/ops-bench.json"))
    parser.add_argument("--repetitions", type=int, default=3)
    parser.add_argument("--min-time", type=float, help="seconds per repetition (default: 0.5)")
    parser.add_argument("--tries", type=int, default=8)
    parser.add_argument("--max-other", type=float, default=0.1)
    parser.add_argument("--ops", help="comma-separated op names: measure only these, keep the rest")
    args = parser.parse_args()

    flags = ["--benchmark_format=json", f"--benchmark_repetitions={args.repetitions}",
             "--benchmark_report_aggregates_only=true"]
    if args.min_time is not None:
        flags.append(f"--benchmark_min_time={args.min_time}")
    names = subprocess.run([args.bench, "--benchmark_list_tests"], stdout=subprocess.PIPE,
                           check=True, text=True).stdout.split()
    ops = list(dict.fromkeys(name.split("/")[1] for name in names))
    previous = {}
    if args.ops:
        wanted = args.ops.split(",")
        unknown = [op for op in wanted if op not in ops]
        if unknown:
            sys.exit(f"ops-bench: --ops: no benchmarks for {', '.join(unknown)}")
        ops = wanted
        previous = json.loads(pathlib.Path(args.out).read_text())
    print(f"running {shown(args.bench)}: {len(ops)} ops", file=sys.stderr)

    today = datetime.date.today().isoformat()
    figures, context = {}, {}
    for op in ops:
        report = json.loads(run_undisturbed(
            [args.bench, f"--benchmark_filter=^op/{op}/"] + flags, args, op))
        context = report["context"]
        for b in report["benchmarks"]:
            if b.get("error_occurred"):
                sys.exit(f"ops-bench: {b['name']}: {b.get('error_message')}")
            if b.get("aggregate_name", "median") != "median":
                continue
            figures[b["run_name"]] = {
                "ns": round(b["real_time"] * NS_PER_UNIT[b["time_unit"]], 1),
                "sample": b.get("label", ""),
            }
            if args.ops:
                figures[b["run_name"]]["date"] = today

    options = [("--repetitions", args.repetitions, 3), ("--min-time", args.min_time, None),
               ("--tries", args.tries, 8), ("--max-other", args.max_other, 0.1)]
    command = " ".join(["scripts/ops-bench.py", "--bench", shown(args.bench)] +
                       [f"{flag} {value}" for flag, value, default in options if value != default])
    out = {
        "cpu": cpu_name(),
        "rg_threads": context.get("rg_threads", "?"),
        "blas_core": context.get("blas_core", "?"),
        "date": today,
        "command": command,
        "bench_command": " ".join([shown(args.bench), "--benchmark_filter=^op/<name>/"] + flags),
        "statistic": f"median real time per call of {args.repetitions} repetitions",
    }
    if args.ops:
        # The full run's description stays; this run is listed after the earlier partial ones.
        for key in out:
            out[key] = previous.get(key, out[key])
        out["partial_runs"] = previous.get("partial_runs", []) + [
            {"date": today, "ops": args.ops, "command": command + f" --ops {args.ops}",
             "cpu": cpu_name(), "rg_threads": context.get("rg_threads", "?")}]
        kept = {k: v for k, v in previous.get("figures", {}).items()
                if k.split("/")[1] not in ops}
        figures = {**kept, **figures}
    # One line per benchmark, so that a new measurement reads as a diff of figures.
    lines = [f" {json.dumps(k, ensure_ascii=False)}: {json.dumps(v, ensure_ascii=False)}"
             for k, v in out.items()]
    lines.append(' "figures": {\n' + ",\n".join(
        f"  {json.dumps(k, ensure_ascii=False)}: {json.dumps(v, ensure_ascii=False)}"
        for k, v in sorted(figures.items())) + "\n }")
    pathlib.Path(args.out).write_text("{\n" + ",\n".join(lines) + "\n}\n")
    print(f"wrote {shown(args.out)}: {len(figures)} benchmarks on {out['cpu']}", file=sys.stderr)


if __name__ == "__main__":
    main()
