#!/usr/bin/python3
"""PyTorch's side of ringgrad-bench train (scripts/bench-vs-pytorch.sh): the same models (ToyNet,
ResNet-18 with the CIFAR stem), the same synthetic batches' shapes, SGD with momentum 0.9, the
same warm-up and timed windows, and the same summary line:
    median X img/s | peak RSS Y MB
With --ddp N: N processes started by torch.multiprocessing.spawn (the mp.spawn recipe; Debian's
torch.distributed.run fails on Python 3.11), DistributedDataParallel over Gloo, and rank 0 reports
the whole job's img/s. Needs only Debian's python3-torch."""
import argparse
import os
import resource
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

# The models, written once for PyTorch with ringgrad's module names.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples"))
from torch_models import ResNet18, ToyNet  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model", default="toynet", choices=["toynet", "resnet18"])
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--amp", default="off", choices=["off", "bf16"],
                   help="torch.autocast('cpu', bfloat16) of forward and loss (1.13 has no CPU f16)")
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--windows", type=int, default=5)
    p.add_argument("--window-steps", type=int, default=10)
    p.add_argument("--ddp", type=int, default=0, metavar="N", help="N ranks with DDP over Gloo")
    p.add_argument("--master-port", type=int, default=29517)
    a = p.parse_args()
    if a.ddp:
        import torch.multiprocessing as mp
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ["MASTER_PORT"] = str(a.master_port)
        mp.spawn(train, args=(a,), nprocs=a.ddp, join=True)
    else:
        train(0, a)


def train(rank, a):
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    world = 1
    if a.ddp:
        import torch.distributed as dist
        dist.init_process_group("gloo", rank=rank, world_size=a.ddp)
        world = dist.get_world_size()
    torch.manual_seed(7 + rank)
    shape = (1, 28, 28) if a.model == "toynet" else (3, 32, 32)
    model = ToyNet() if a.model == "toynet" else ResNet18()
    model.train()
    net = nn.parallel.DistributedDataParallel(model) if a.ddp else model
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    batches = [(torch.randn(a.batch_size, *shape), torch.randint(0, 10, (a.batch_size,)))
               for _ in range(4)]

    def step(i):
        x, y = batches[i % 4]
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.amp == "bf16"):
            loss = F.cross_entropy(net(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()

    if rank == 0:
        print(f"pytorch train: model={a.model} amp={a.amp} batch={a.batch_size} threads="
              f"{torch.get_num_threads()} torch={torch.__version__}"
              f"{f' ddp=gloo world={world}' if a.ddp else ''}", flush=True)
    for i in range(a.warmup):
        step(i)
    rates = []
    for w in range(a.windows):
        if a.ddp:
            torch.distributed.barrier()
        t0 = time.perf_counter()
        for i in range(a.window_steps):
            step(i)
        s = time.perf_counter() - t0
        rates.append(a.window_steps * a.batch_size * world / s)
        if rank == 0:
            print(f"{w:>8} {s:>10.3f} {rates[-1]:>10.1f}", flush=True)
    rates.sort()
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    if rank == 0:
        print(f"median {rates[len(rates) // 2]:.1f} img/s | peak RSS {rss_mb:.0f} MB", flush=True)
    if a.ddp:
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
