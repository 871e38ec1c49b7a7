#!/usr/bin/env python3
"""Fault cases of ringgrad-run + ringgrad-train --snapshot, timed.

Each case runs a small job (ToyNet on a 192-sample MNIST-format set that the script writes, 3
epochs, a snapshot every 4 steps) twice: uninterrupted, and with one fault (RG_TEST_FAULT kill -9
of a rank at a step, during evaluation or before a snapshot write; SIGSTOP of a rank; a worker
failing on the second of two launchers acting as nodes). It prints, per case: the time from the
fault to the launcher's report (detect), from the report to the restarted job's first step
(resume), and whether the final snapshot equals the uninterrupted run's byte for byte.

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

    def train_args(ranks, snapshot):
        return [train, "--model", "toynet", "--dataset", "mnist", "--data-dir", data, "--epochs",
                "3", "--batch-size", str(192 // ranks // 6), "--test-batch-size", "64",
                "--workers", "0", "--seed", "5", "--optimizer", "adamw", "--lr-schedule", "cosine",
                "--snapshot", snapshot, "--snapshot-every", "4"]

    def launch(ranks, snapshot, nodes=1, extra=()):
        if nodes == 1:
            return [[run, "--nproc-per-node", str(ranks), "--master-port", "0",
                     "--max-restarts", "1", *extra, *train_args(ranks, snapshot)]]
        port = str(free_port())
        return [[run, "--nnodes", str(nodes), "--node-rank", str(n), "--nproc-per-node",
                 str(ranks // nodes), "--master-port", port, "--max-restarts", "1", *extra,
                 *train_args(ranks, snapshot)] for n in range(nodes)]

    def reference(ranks):
        path = os.path.join(work, f"clean{ranks}.safetensors")
        if not os.path.exists(path):
            Job(launch(ranks, path), base_env).wait()
        return open(path, "rb").read()

    cases = [
        ("kill -9 rank 1 after step 10", 2, 1, "step:10:1", None),
        ("kill -9 rank 3 after step 13", 4, 1, "step:13:3", None),
        ("kill -9 rank 0 after step 6", 4, 1, "step:6:0", None),
        ("kill -9 rank 1 in evaluation of epoch 2", 2, 1, "eval:2:1", None),
        ("kill -9 rank 0 before writing snapshot 8", 2, 1, "snapshot:8:0", None),
        ("SIGSTOP rank 1 (heartbeat 2 s)", 2, 1, None, "stop"),
        ("kill -9 rank 3 after step 9, 2 nodes x 2", 4, 2, "step:9:3", None),
    ]
    print(f"{'case':<44} {'ranks':>5} {'nodes':>5} {'detect s':>9} {'resume s':>9} identical")
    for name, ranks, nodes, fault, action in cases:
        ref = reference(ranks)
        path = os.path.join(work, "faulted.safetensors")
        if os.path.exists(path):
            os.remove(path)
        env = dict(base_env)
        if fault:
            env["RG_TEST_FAULT"] = fault
        extra = ("--heartbeat-timeout-s", "2") if action == "stop" else ()
        if nodes > 1:
            env["RG_STORE_TOKEN"] = "fault-cases"
        job = Job(launch(ranks, path, nodes, extra), env)
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


if __name__ == "__main__":
    main()
