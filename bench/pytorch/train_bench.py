#!/usr/bin/python3
"""PyTorch's side of ringgrad-bench train (scripts/bench-vs-pytorch.sh, the GPU kit's `run`): the
same models (ToyNet, ResNet-18 with the CIFAR stem, minGPT's gpt-nano/micro/mini from
examples/torch_models.py), the same synthetic batches' shapes (gpt-*: random token ids, B x T),
the same optimizer (SGD with momentum 0.9; gpt-*: minGPT's AdamW, lr 5e-4, betas (0.9, 0.95),
weight decay 0.1 on the Linear weights), the same warm-up and timed windows, and the same summary
line:
    median X img/s | peak RSS Y MB                  (tok/s for gpt-*)
With --device cuda: the model and the four batches on the GPU, torch.cuda.synchronize() at each
window's ends (the rate between timestamps after warm-up), eager mode with PyTorch's default
settings (cuDNN's TF32 on, matmul TF32 off), --amp bf16 as torch.autocast('cuda', bfloat16),
--channels-last for the CNNs; the summary line adds "| peak device memory Z MB"
(torch.cuda.max_memory_allocated). --json FILE writes the figures as one JSON object.
With --ddp N: N processes started by torch.multiprocessing.spawn (the mp.spawn recipe; Debian's
torch.distributed.run fails on Python 3.11), DistributedDataParallel over Gloo, and rank 0 reports
the whole job's img/s. Needs only Debian's python3-torch on the CPU."""
import argparse
import json
import os
import resource
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

# The models, written once for PyTorch with ringgrad's module names.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples"))
from torch_models import GPT, ResNet18, ToyNet  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model", default="toynet",
                   choices=["toynet", "resnet18", "gpt-nano", "gpt-micro", "gpt-mini"])
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--block-size", type=int, default=128, help="gpt-*: tokens per sample")
    p.add_argument("--vocab-size", type=int, default=65, help="gpt-*: random ids in [0, N)")
    p.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N")
    p.add_argument("--amp", default="off", choices=["off", "bf16", "f16"],
                   help="torch.autocast(device, bfloat16) of forward and loss (1.13 has no CPU "
                        "f16; f16 on CUDA with a GradScaler)")
    p.add_argument("--channels-last", action="store_true",
                   help="CNNs: model and inputs in torch.channels_last")
    p.add_argument("--cudnn-benchmark", action="store_true",
                   help="torch.backends.cudnn.benchmark = True (time convolution algorithms)")
    p.add_argument("--json", default="", metavar="FILE", help="also write the figures as JSON")
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--windows", type=int, default=5)
    p.add_argument("--window-steps", type=int, default=10)
    p.add_argument("--ddp", type=int, default=0, metavar="N", help="N ranks with DDP over Gloo")
    p.add_argument("--master-port", type=int, default=29517)
    a = p.parse_args()
    if a.ddp and a.device != "cpu":
        p.error("--ddp runs over Gloo on the CPU: drop --device")
    if a.amp == "f16" and a.device == "cpu":
        p.error("--amp f16 needs --device cuda")
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
    device = torch.device(a.device)
    cuda = device.type == "cuda"
    if cuda and device.index is None:
        # PyTorch 2.x's set_device refuses a device without an index ("cuda"); 1.13 took it.
        device = torch.device("cuda", rank % torch.cuda.device_count())
    if cuda:
        torch.cuda.set_device(device)
        torch.backends.cudnn.benchmark = a.cudnn_benchmark
    torch.manual_seed(7 + rank)
    gpt = a.model.startswith("gpt-")
    if gpt:
        model = GPT(a.model, a.vocab_size, a.block_size)
    else:
        shape = (1, 28, 28) if a.model == "toynet" else (3, 32, 32)
        model = ToyNet() if a.model == "toynet" else ResNet18()
    memory_format = torch.channels_last if a.channels_last and not gpt else torch.contiguous_format
    model = model.to(device, memory_format=memory_format)
    model.train()
    net = nn.parallel.DistributedDataParallel(model) if a.ddp else model
    if gpt:
        opt = model.configure_optimizers(5e-4, 0.1, betas=(0.9, 0.95))
        batches = [(torch.randint(0, a.vocab_size, (a.batch_size, a.block_size), device=device),
                    torch.randint(0, a.vocab_size, (a.batch_size, a.block_size), device=device))
                   for _ in range(4)]
    else:
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        batches = [(torch.randn(a.batch_size, *shape).to(device, memory_format=memory_format),
                    torch.randint(0, 10, (a.batch_size,)).to(device)) for _ in range(4)]
    amp_dtype = torch.float16 if a.amp == "f16" else torch.bfloat16
    scaler = None
    if cuda:  # torch.amp.GradScaler from 2.3; torch.cuda.amp's before (deprecated since)
        scaler = (torch.amp.GradScaler("cuda", enabled=a.amp == "f16")
                  if hasattr(torch.amp, "GradScaler") else
                  torch.cuda.amp.GradScaler(enabled=a.amp == "f16"))

    def step(i):
        x, y = batches[i % 4]
        with torch.autocast(device.type, dtype=amp_dtype, enabled=a.amp != "off"):
            out = net(x)
            loss = (F.cross_entropy(out.view(-1, out.size(-1)), y.view(-1)) if gpt
                    else F.cross_entropy(out, y))
        opt.zero_grad()
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        else:
            loss.backward()
            opt.step()

    def sync():
        if cuda:
            torch.cuda.synchronize(device)

    unit = "tok/s" if gpt else "img/s"
    per_sample = a.block_size if gpt else 1
    if rank == 0:
        where = (f" device={device} ({torch.cuda.get_device_name(device)})"
                 f"{' channels_last' if a.channels_last else ''}" if cuda else "")
        print(f"pytorch train: model={a.model} amp={a.amp} batch={a.batch_size} threads="
              f"{torch.get_num_threads()} torch={torch.__version__}{where}"
              f"{f' ddp=gloo world={world}' if a.ddp else ''}", flush=True)
    for i in range(a.warmup):
        step(i)
    sync()
    rates = []
    for w in range(a.windows):
        if a.ddp:
            torch.distributed.barrier()
        t0 = time.perf_counter()
        for i in range(a.window_steps):
            step(i)
        sync()
        s = time.perf_counter() - t0
        rates.append(a.window_steps * a.batch_size * per_sample * world / s)
        if rank == 0:
            print(f"{w:>8} {s:>10.3f} {rates[-1]:>10.1f}", flush=True)
    median = sorted(rates)[len(rates) // 2]
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    figures = {"tool": "pytorch", "torch": torch.__version__, "model": a.model,
               "device": str(device), "amp": a.amp, "channels_last": a.channels_last,
               "batch_size": a.batch_size, "unit": unit, "warmup": a.warmup,
               "window_steps": a.window_steps, "rates": rates, "median": median,
               "params": sum(p.numel() for p in model.parameters()), "peak_rss_mb": rss_mb}
    if gpt:
        figures["block_size"] = a.block_size
    if cuda:
        figures["device_name"] = torch.cuda.get_device_name(device)
        figures["peak_device_mb"] = torch.cuda.max_memory_allocated(device) / 2**20
        figures["peak_reserved_mb"] = torch.cuda.max_memory_reserved(device) / 2**20
    if rank == 0:
        device_mem = f" | peak device memory {figures['peak_device_mb']:.0f} MB" if cuda else ""
        print(f"median {median:.1f} {unit} | peak RSS {rss_mb:.0f} MB{device_mem}", flush=True)
        if a.json:
            with open(a.json, "w") as f:
                f.write(json.dumps(figures) + "\n")
    if a.ddp:
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
