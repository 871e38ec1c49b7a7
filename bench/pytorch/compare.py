#!/usr/bin/python3
"""Runs ringgrad and PyTorch 1.13 side by side and prints ratios (scripts/bench-vs-pytorch.sh).

Each configuration runs ours and PyTorch's alternately, --repeats times each, in this one process
tree; the figure of a side is the median of its runs and the ratio is ours / PyTorch's (higher is
better for img/s and bandwidth, lower for RSS). Configurations:
  train   ToyNet and ResNet-18 at batch 64, 1 and 2 threads, with the instruction set native and
          capped to AVX2 for both sides (OPENBLAS_CORETYPE=Haswell for OpenBLAS, which both use;
          ATEN_CPU_CAPABILITY=avx2 and DNNL/ONEDNN_MAX_CPU_ISA=AVX2 for PyTorch's own kernels and
          oneDNN; ringgrad's own kernels are compiled for the baseline x86-64, except its Winograd
          transforms, which use AVX2 + FMA at most, so the cap does not concern them)
  ddp     2 ranks x 1 thread on this host: ringgrad-run + ringgrad-bench train --ddp (Gloo) against
          mp.spawn + DistributedDataParallel (Gloo)
  busy    the 2-thread training runs again while another process keeps one core busy (the
          situation of a second job, or of a DDP rank's neighbour, on the same machine)
  allreduce  64 MiB f32 all-reduce, 2 and 4 ranks: our ring and shared memory against Gloo's own, all
          inside ringgrad-bench allreduce (same processes, same transport)
  overhead  the engine's own cost per op: add on one-element tensors, alone and with its backward
          (rg_micro_bench's overhead/* from C++ against bench/pytorch/op_overhead.py, through
          PyTorch's Python binding); ratio = PyTorch's time / ours (higher is better)
  gpt     not in the default list (5 to 15 minutes on 2 cores, by machine; --quick: under a
          minute): minGPT's character-level recipe on data/kjv/kjv.txt, 2-rank DDP, validation
          loss per epoch and training tokens/s of both sides (bench/pytorch/gpt_bench.py, which
          also runs alone with more options: --model, --epochs, --steps-per-epoch, --batch-size)
"""
import argparse
import itertools
import os
import platform
import re
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TORCH_BENCH = os.path.join(ROOT, "bench", "pytorch", "train_bench.py")
OVERHEAD_BENCH = os.path.join(ROOT, "bench", "pytorch", "op_overhead.py")
GPT_BENCH = os.path.join(ROOT, "bench", "pytorch", "gpt_bench.py")
SUMMARY = re.compile(r"median ([0-9.]+) img/s \| peak RSS ([0-9.]+) MB")
AVX2_ENV = {"OPENBLAS_CORETYPE": "Haswell", "ATEN_CPU_CAPABILITY": "avx2",
            "DNNL_MAX_CPU_ISA": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"}


def run(cmd, env_extra, timeout):
    env = dict(os.environ)
    # "native": each side's libraries choose their kernels themselves (an OPENBLAS_CORETYPE left in
    # the environment would cap both); the AVX2 runs set it again.
    env.pop("OPENBLAS_CORETYPE", None)
    env.update(env_extra)
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        raise RunFailed(f"failed ({r.returncode}): {' '.join(cmd)}\n{r.stdout}\n{r.stderr}")
    return r.stdout


class RunFailed(Exception):
    pass


def train_figures(out):
    m = SUMMARY.search(out)
    if not m:
        sys.exit(f"bench-vs-pytorch: no summary line in:\n{out}")
    return float(m.group(1)), float(m.group(2))


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def isa_flags():
    try:
        flags = open("/proc/cpuinfo").read()
    except OSError:
        return "?"
    return "avx512f" if " avx512f" in flags else ("avx2" if " avx2" in flags else "sse")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", default=os.path.join(ROOT, "build", "ci"), help="ringgrad build dir")
    p.add_argument("--repeats", type=int, default=3, help="runs per side and configuration")
    p.add_argument("--only", default="train,ddp,busy,allreduce,overhead",
                   help="comma list: train,ddp,busy,allreduce,overhead,gpt (gpt, 5 to 15 minutes, only "
                   "when named)")
    p.add_argument("--models", default="toynet,resnet18")
    p.add_argument("--threads", default="1,2")
    p.add_argument("--isa", default="native,avx2")
    p.add_argument("--amp", default="off",
                   help="train rows: off and/or bf16 (autocast; PyTorch 1.13 has no CPU f16)")
    p.add_argument("--quick", action="store_true", help="fewer and shorter windows (smoke test)")
    a = p.parse_args()
    bench = os.path.join(a.build, "apps", "ringgrad-bench")
    launcher = os.path.join(a.build, "apps", "ringgrad-run")
    for f in (bench, launcher):
        if not os.access(f, os.X_OK):
            sys.exit(f"bench-vs-pytorch: {f} is missing: build first (cmake --build {a.build})")
    only = a.only.split(",")
    print(f"CPU: {cpu_name()} ({os.cpu_count()} cores, best ISA {isa_flags()}); "
          f"{a.repeats} alternating runs per side, medians; ratio = ringgrad / PyTorch", flush=True)

    def windows(model):
        if a.quick:
            return ["--warmup", "1", "--windows", "1", "--window-steps", "2"]
        if model == "resnet18":
            return ["--warmup", "2", "--windows", "3", "--window-steps", "3"]
        return ["--warmup", "3", "--windows", "5", "--window-steps", "8"]

    rows = []

    def compare(label, ours_cmd, torch_cmd, env, timeout=900, busy=False):
        ours, theirs = [], []
        # A spinning process for the whole comparison, so both sides meet the same competition.
        spinner = subprocess.Popen(["/usr/bin/python3", "-c", "while True: pass"]) if busy else None
        try:
            for _ in range(a.repeats):
                ours.append(train_figures(run(ours_cmd, env, timeout)))
                try:
                    theirs.append(train_figures(run(torch_cmd, env, timeout)))
                except RunFailed as e:
                    # PyTorch cannot run every configuration (1.13's oneDNN has no bf16
                    # convolution below AVX-512): say so and go on with the next row.
                    last = [l for l in str(e).splitlines() if l.strip()][-1]
                    print(f"{label:<34} ours {statistics.median(x[0] for x in ours):8.1f} img/s  "
                          f"torch failed: {last}", flush=True)
                    return
        except RunFailed as e:
            sys.exit(f"bench-vs-pytorch: {e}")
        finally:
            if spinner:
                spinner.kill()
                spinner.wait()
        o_rate = statistics.median(x[0] for x in ours)
        t_rate = statistics.median(x[0] for x in theirs)
        o_rss = statistics.median(x[1] for x in ours)
        t_rss = statistics.median(x[1] for x in theirs)
        rows.append((label, o_rate, t_rate, o_rss, t_rss))
        print(f"{label:<34} ours {o_rate:8.1f} img/s  torch {t_rate:8.1f} img/s  "
              f"ratio {o_rate / t_rate:5.2f}x | RSS {o_rss:5.0f} / {t_rss:5.0f} MB "
              f"= {o_rss / t_rss:4.2f}x   (runs: ours {[round(x[0]) for x in ours]}, "
              f"torch {[round(x[0]) for x in theirs]})", flush=True)

    if "train" in only:
        for model in a.models.split(","):
            for isa in a.isa.split(","):
                env = AVX2_ENV if isa == "avx2" else {}
                for threads, amp in itertools.product(a.threads.split(","), a.amp.split(",")):
                    args = ["--model", model, "--batch-size", "64", "--threads", threads,
                            "--amp", amp] + windows(model)
                    compare(f"train {model} {threads}T {isa}{'' if amp == 'off' else ' ' + amp}",
                            [bench, "train"] + args,
                            ["/usr/bin/python3", TORCH_BENCH] + args,
                            dict(env, OMP_NUM_THREADS=threads))
    if "busy" in only:
        for model in a.models.split(","):
            args = ["--model", model, "--batch-size", "64", "--threads", "2"] + windows(model)
            compare(f"train {model} 2T, 1 core busy", [bench, "train"] + args,
                    ["/usr/bin/python3", TORCH_BENCH] + args, {"OMP_NUM_THREADS": "2"}, busy=True)
    if "ddp" in only:
        for model in a.models.split(","):
            args = ["--model", model, "--batch-size", "64", "--threads", "1"] + windows(model)
            compare(f"ddp {model} 2 ranks x 1T",
                    [launcher, "--nproc-per-node", "2", "--master-port", "0", bench, "train",
                     "--ddp"] + args,
                    ["/usr/bin/python3", TORCH_BENCH, "--ddp", "2"] + args,
                    {"OMP_NUM_THREADS": "1"})
    if "allreduce" in only:
        for n in (2, 4):
            runs = []
            for _ in range(a.repeats):
                out = run([launcher, "--nproc-per-node", str(n), "--master-port", "0", bench,
                           "allreduce", "--algorithms", "gloo-native", "gloo-ring", "gloo-shm",
                           "--min-bytes", "64M", "--max-bytes", "64M"], {"OMP_NUM_THREADS": "1"}, 900)
                runs.append(out)
            print(f"allreduce 64 MiB, {n} ranks (ringgrad-bench allreduce rows, {a.repeats} runs):")
            for out in runs:
                for line in out.splitlines():
                    if "gloo" in line and ("64" in line or "M" in line):
                        print("   ", line)
    if "overhead" in only:
        micro = os.path.join(a.build, "bench", "rg_micro_bench")
        if not os.access(micro, os.X_OK):
            sys.exit(f"bench-vs-pytorch: {micro} is missing: build it (RG_BUILD_BENCH=ON)")
        ours, theirs = {}, {}
        try:
            for _ in range(a.repeats):
                out = run([micro, "--benchmark_filter=^overhead/"], {}, 300)
                for m in re.finditer(r"^overhead/(\S+)/1/\S+\s+([0-9.]+) ns", out, re.M):
                    ours.setdefault(m.group(1), []).append(float(m.group(2)))
                out = run(["/usr/bin/python3", OVERHEAD_BENCH], {}, 300)
                for m in re.finditer(r"^(\S+) ([0-9.]+)$", out, re.M):
                    theirs.setdefault(m.group(1), []).append(float(m.group(2)))
        except RunFailed as e:
            sys.exit(f"bench-vs-pytorch: {e}")
        for op in ("add", "add+backward"):
            if op not in ours or op not in theirs:
                sys.exit(f"bench-vs-pytorch: no {op} figure (ours {ours}, torch {theirs})")
            o, t = statistics.median(ours[op]), statistics.median(theirs[op])
            print(f"{'overhead ' + op + ' (1 element)':<34} ours {o:8.0f} ns    torch {t:8.0f} ns"
                  f"    torch/ours {t / o:5.2f}x   (runs: ours {[round(x) for x in ours[op]]}, "
                  f"torch {[round(x) for x in theirs[op]]})", flush=True)
    if "gpt" in only:
        # Its own table (losses per epoch as well as rates): gpt_bench.py prints it.
        print("gpt: minGPT recipe on KJV, 2 ranks x 1T (bench/pytorch/gpt_bench.py)", flush=True)
        subprocess.run(["/usr/bin/python3", GPT_BENCH, "--build", a.build, "--repeats",
                        str(a.repeats)] + (["--quick"] if a.quick else []), check=True)


if __name__ == "__main__":
    main()
