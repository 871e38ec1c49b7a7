#!/usr/bin/env python3
"""Fault cases of ringgrad-run + ringgrad-train --snapshot, timed.

Each case runs a small job (ToyNet on a 192-sample MNIST-format set that the script writes, 3
epochs, a snapshot every 4 steps) twice: uninterrupted, and with one fault (RG_TEST_FAULT kill -9
of a rank at a step, during evaluation, before or half-way through a snapshot write, with
PowerSGD; SIGSTOP of a rank; a worker failing on the second of two launchers acting as nodes). It
prints, per case: the time from the fault to the launcher's report (detect), from the report to
the restarted job's first step (resume), and whether the final snapshot equals the uninterrupted
run's byte for byte. The last case stops a 2-rank job for good and resumes its snapshot with 3
ranks (another world size cannot be byte-identical): there "resume" is from the new command's
start to its first step, and "identical" says whether every sample of the interrupted epoch was
trained on exactly once (from RG_TEST_SAMPLE_LOG).

    python3 bench/fault_cases.py [--build build/ci]
"""
import argparse
import os
import random
import re
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def write_small_mnist(d, n_train=192, n_test=64, seed=1):
    rnd = random.Random(seed)
    os.makedirs(d, exist_ok=True)
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        images = bytearray()
        labels = bytearray()
        for i in range(n):
            c = i % 10
            labels.append(c)
            for p in range(784):
                row = p // 28
                v = 200 if 2 * c + 4 <= row < 2 * c + 6 else rnd.randrange(60)
                images.append(v)
        with open(os.path.join(d, f"{prefix}-images-idx3-ubyte"), "wb") as f:
            f.write(struct.pack(">IIII", 2051, n, 28, 28) + bytes(images))
        with open(os.path.join(d, f"{prefix}-labels-idx1-ubyte"), "wb") as f:
            f.write(struct.pack(">II", 2049, n) + bytes(labels))


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


class Job:
    """Launchers started together; every output line is stamped with time.monotonic()."""

    def __init__(self, cmds, env):
        self.lines = []  # (t, node, text)
        self.procs = []
        self.lock = threading.Lock()
        for node, cmd in enumerate(cmds):
            p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 text=True)
            self.procs.append(p)
            threading.Thread(target=self._read, args=(node, p), daemon=True).start()

    def _read(self, node, p):
        for line in p.stdout:
            with self.lock:
                self.lines.append((time.monotonic(), node, line.rstrip("\n")))

    def wait(self, timeout=300):
        codes = [p.wait(timeout=timeout) for p in self.procs]
        time.sleep(0.1)
        return codes

    def first(self, pattern, after=0.0):
        with self.lock:
            for t, _, text in self.lines:
                if t >= after and re.search(pattern, text):
                    return t
        return None


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(ROOT, "build", "ci"))
    a = ap.parse_args()
    run = os.path.join(a.build, "apps", "ringgrad-run")
    train = os.path.join(a.build, "apps", "ringgrad-train")
    work = tempfile.mkdtemp(prefix="rg_faults_")
    data = os.path.join(work, "mnist")
    write_small_mnist(data)
    base_env = {k: v for k, v in os.environ.items()
                if not k.startswith(("RANK", "WORLD_SIZE", "MASTER_", "RG_TEST_FAULT"))}
    base_env["RG_NUM_THREADS"] = "1"

    def train_args(ranks, snapshot, train_extra=(), batch=None):
        return [train, "--model", "toynet", "--dataset", "mnist", "--data-dir", data, "--epochs",
                "3", "--batch-size", str(batch or 192 // ranks // 6), "--test-batch-size", "64",
                "--workers", "0", "--seed", "5", "--optimizer", "adamw", "--lr-schedule", "cosine",
                "--snapshot", snapshot, "--snapshot-every", "4", *train_extra]

    def launch(ranks, snapshot, nodes=1, extra=(), train_extra=(), restarts=1, batch=None):
        if nodes == 1:
            return [[run, "--nproc-per-node", str(ranks), "--master-port", "0",
                     "--max-restarts", str(restarts), *extra,
                     *train_args(ranks, snapshot, train_extra, batch)]]
        port = str(free_port())
        return [[run, "--nnodes", str(nodes), "--node-rank", str(n), "--nproc-per-node",
                 str(ranks // nodes), "--master-port", port, "--max-restarts", "1", *extra,
                 *train_args(ranks, snapshot, train_extra)] for n in range(nodes)]

    def reference(ranks, train_extra=()):
        path = os.path.join(work, f"clean{ranks}{''.join(train_extra)}.safetensors")
        if not os.path.exists(path):
            Job(launch(ranks, path, train_extra=train_extra), base_env).wait()
        return open(path, "rb").read()

    def elastic_case():
        """2 ranks killed after step 9 without a restart, then the snapshot resumed by 3."""
        path = os.path.join(work, "elastic.safetensors")
        logs = [os.path.join(work, "elastic_log_a"), os.path.join(work, "elastic_log_b")]
        for d in logs:
            os.makedirs(d, exist_ok=True)
        env = dict(base_env, RG_TEST_FAULT="step:9:1", RG_TEST_SAMPLE_LOG=logs[0])
        job = Job(launch(2, path, restarts=0, batch=16), env)
        job.wait()
        report = job.first(r"was killed by|exited with code")
        with job.lock:
            before = [t for t, _, x in job.lines if report and t < report]
        detect = report - before[-1] if before and report else None
        start = time.monotonic()
        job = Job(launch(3, path, restarts=0, batch=16),
                  dict(base_env, RG_TEST_SAMPLE_LOG=logs[1]))
        codes = job.wait()
        first_step = job.first(r"epoch \d+ step \d+/")
        seen = {}
        for d, last_step in ((logs[0], 8), (logs[1], None)):
            for name in os.listdir(d):
                for line in open(os.path.join(d, name)):
                    epoch, step, *samples = map(int, line.split())
                    if epoch == 2 and (last_step is None or step <= last_step):
                        for i in samples:
                            seen[i] = seen.get(i, 0) + 1
        once = len(seen) == 192 and all(n == 1 for n in seen.values()) and codes == [0]
        return detect, (first_step - start) if first_step else None, once

    cases = [
        ("kill -9 rank 1 after step 10", 2, 1, "step:10:1", None),
        ("kill -9 rank 3 after step 13", 4, 1, "step:13:3", None),
        ("kill -9 rank 0 after step 6", 4, 1, "step:6:0", None),
        ("kill -9 rank 1 in evaluation of epoch 2", 2, 1, "eval:2:1", None),
        ("kill -9 rank 0 before writing snapshot 8", 2, 1, "snapshot:8:0", None),
        ("kill -9 rank 0 half-way writing snapshot 8", 2, 1, "snapshot-write:8:0", None),
        ("kill -9 rank 1 after step 10, PowerSGD", 2, 1, "step:10:1", "powersgd"),
        ("SIGSTOP rank 1 (heartbeat 2 s)", 2, 1, None, "stop"),
        ("kill -9 rank 3 after step 9, 2 nodes x 2", 4, 2, "step:9:3", None),
    ]
    print(f"{'case':<44} {'ranks':>5} {'nodes':>5} {'detect s':>9} {'resume s':>9} identical")
    powersgd = ("--comm-hook", "powersgd", "--powersgd-start-iter", "2")
    for name, ranks, nodes, fault, action in cases:
        train_extra = powersgd if action == "powersgd" else ()
        ref = reference(ranks, train_extra)
        path = os.path.join(work, "faulted.safetensors")
        if os.path.exists(path):
            os.remove(path)
        env = dict(base_env)
        if fault:
            env["RG_TEST_FAULT"] = fault
        extra = ("--heartbeat-timeout-s", "2") if action == "stop" else ()
        if nodes > 1:
            env["RG_STORE_TOKEN"] = "fault-cases"
        job = Job(launch(ranks, path, nodes, extra, train_extra), env)
        fault_t = None
        if action == "stop":
            # The rank's pid: the newest ringgrad-train child with RANK=1 in its environment.
            deadline = time.monotonic() + 30
            while fault_t is None and time.monotonic() < deadline:
                if job.first(r"epoch 1 step 2/"):
                    out = subprocess.run(["pgrep", "-f", "ringgrad-train"], text=True,
                                         capture_output=True).stdout.split()
                    for pid in out:
                        try:
                            env_text = open(f"/proc/{pid}/environ", "rb").read()
                        except OSError:
                            continue
                        if b"\0RANK=1\0" in b"\0" + env_text:
                            os.kill(int(pid), signal.SIGSTOP)
                            fault_t = time.monotonic()
                            break
                time.sleep(0.05)
        codes = job.wait()
        report = job.first(r"was killed by|sent no heartbeat|exited with code")
        if fault_t is None:
            # An in-process kill: the last line the job printed before the report bounds it.
            with job.lock:
                before = [t for t, _, x in job.lines if report and t < report]
            fault_t = before[-1] if before else report
        restart = job.first(r"restarting the workers")
        resumed = job.first(r"step 1/|resumed from|epoch \d+ step \d+/", after=restart or 0)
        same = os.path.exists(path) and open(path, "rb").read() == ref and all(c == 0 for c in codes)
        detect = f"{report - fault_t:9.2f}" if report and fault_t else "        -"
        resume = f"{resumed - restart:9.2f}" if resumed and restart else "        -"
        print(f"{name:<44} {ranks:>5} {nodes:>5} {detect} {resume} {'yes' if same else 'NO'}",
              flush=True)
    detect, resume, once = elastic_case()
    detect = f"{detect:9.2f}" if detect is not None else "        -"
    resume = f"{resume:9.2f}" if resume is not None else "        -"
    print(f"{'kill -9 rank 1 after step 9, resumed by 3':<44} {'2->3':>5} {1:>5} {detect} {resume} "
          f"{'each sample once' if once else 'NO'}", flush=True)


if __name__ == "__main__":
    main()
