#!/usr/bin/python3
"""minGPT's character-level recipe on the King James Bible, ringgrad against PyTorch 1.13, 2-rank
DDP on this host (scripts/bench-vs-pytorch.sh --only gpt runs it; so can this script alone).

Both sides train the same model (gpt-nano by default) with the same recipe: AdamW, lr 5e-4 (minGPT
chargpt's), weight decay 0.1 on the Linear weights only, betas (0.9, 0.95), gradient-norm clipping
at 1.0, linear warm-up (from 0.1 x lr) then cosine decay to 0 per step, per-rank batch 32 of blocks
of 128 characters, dropout 0.1 on the embeddings, the residuals and the attention probabilities
(minGPT's attn_pdrop: ours inside the fused attention, PyTorch's on the materialised matrix),
2 ranks x 1 compute thread, Gloo, and evaluation on the first --eval-samples non-overlapping
validation blocks after each epoch of --steps-per-epoch steps.
  ours     ringgrad-run --nproc-per-node 2 ringgrad-train --model M --dataset text ... --threads 1
           --workers 0 (batches made on the training thread, as PyTorch's side does)
  PyTorch  torch.multiprocessing.spawn of 2 ranks, DistributedDataParallel over Gloo, minGPT's
           model (examples/torch_models.py GPT) and configure_optimizers, a CharDataset like
           ringgrad's data/text.h (vocabulary: the sorted characters of the whole file; train: the
           first 90% of the characters, a sample at every offset; validation: non-overlapping
           blocks of the rest), DistributedSampler shuffling, torch.set_num_threads(1)
Reported per side: the validation loss after each epoch and the training tokens/s (all ranks'
tokens over the wall time of the training steps, evaluation and start-up excluded), the median of
--repeats alternating runs. The two sides draw different initial weights, orders and dropout masks,
so their losses agree statistically, not digit for digit.
"""
import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "examples"))
sys.path.insert(0, HERE)
from compare import cpu_name, isa_flags  # noqa: E402  (the CPU lines of the other comparisons)

VAL_FRACTION = 0.1


def lr_at(step, a):
    """ringgrad's --lr-schedule cosine with --warmup-epochs (layers/optim/lr_schedule.cpp), which
    is PyTorch's SequentialLR(LinearLR(start_factor=0.1, total_iters=warm),
    CosineAnnealingLR(T_max=total - warm)) stepped once per optimizer step, in closed form."""
    total = a.steps_per_epoch * a.epochs
    warm = int(math.floor(a.warmup_epochs * a.steps_per_epoch + 0.5))
    if step < warm:
        return a.lr * (0.1 + 0.9 * step / warm)
    t_max = max(1, total - warm)
    return a.lr * (1 + math.cos(math.pi * min(step - warm, t_max) / t_max)) / 2


def torch_rank(rank, a):
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data.distributed import DistributedSampler
    from torch_models import GPT

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=a.nproc)
    world = dist.get_world_size()
    # The CharDataset: ids of the whole file, split 90/10.
    with open(a.data_file, encoding="utf-8") as f:
        text = f.read()
    chars = sorted(set(text))
    stoi = {c: i for i, c in enumerate(chars)}
    ids = torch.tensor([stoi[c] for c in text], dtype=torch.long)
    n_train = int(math.floor(len(ids) * (1 - VAL_FRACTION) + 0.5))
    train_ids, val_ids = ids[:n_train], ids[n_train:]
    T = a.block_size
    n_train_samples = len(train_ids) - T
    n_val = min((len(val_ids) - 1) // T, a.eval_samples or len(val_ids))
    steps = torch.arange(T)

    torch.manual_seed(a.seed)  # the same initial weights on every rank (DDP broadcasts rank 0's)
    model = GPT(a.model, len(chars), T, embd_pdrop=0.1, resid_pdrop=0.1, attn_pdrop=0.1)
    torch.manual_seed(a.seed + 1 + rank)  # each rank its own dropout masks
    net = DistributedDataParallel(model)
    opt = model.configure_optimizers(a.lr, 0.1, betas=(0.9, 0.95))
    sampler = DistributedSampler(range(n_train_samples), num_replicas=world, rank=rank,
                                 shuffle=True, seed=a.seed)
    out = open(a.out, "w") if rank == 0 else None
    step = 0
    for epoch in range(1, a.epochs + 1):
        sampler.set_epoch(epoch)
        order = torch.tensor(list(sampler)[:a.steps_per_epoch * a.batch_size])
        model.train()
        loss_sum = torch.zeros(1, dtype=torch.float64)
        dist.barrier()
        t0 = time.perf_counter()
        for i in range(a.steps_per_epoch):
            offsets = order[i * a.batch_size:(i + 1) * a.batch_size].unsqueeze(1) + steps
            x, y = train_ids[offsets], train_ids[offsets + 1]
            for g in opt.param_groups:
                g["lr"] = lr_at(step, a)
            _, loss = net(x, y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            loss_sum += loss.item()
            step += 1
        seconds = time.perf_counter() - t0  # this rank's; rank 0's is reported
        # Evaluation: rank r takes validation blocks r, r + world, ...; sums over ranks.
        model.eval()
        val = torch.zeros(3, dtype=torch.float64)  # loss sum, tokens, train loss sum
        with torch.no_grad():
            blocks = torch.arange(rank, n_val, world)
            for b in blocks.split(256):
                offsets = (b * T).unsqueeze(1) + steps
                logits = model(val_ids[offsets])
                val[0] += F.cross_entropy(logits.reshape(-1, logits.size(-1)),
                                          val_ids[offsets + 1].reshape(-1), reduction="sum").item()
                val[1] += offsets.numel()
        val[2] = loss_sum[0]
        dist.all_reduce(val)
        if out:
            out.write(json.dumps({"epoch": epoch, "step": step, "val_loss": val[0].item() / val[1].item(),
                                  "train_loss": val[2].item() / (world * a.steps_per_epoch),
                                  "seconds": seconds,
                                  "tokens": a.steps_per_epoch * a.batch_size * T * world}) + "\n")
            out.flush()
    dist.destroy_process_group()


def run_torch(a, out):
    """One PyTorch run: this script again with --side torch, so every run starts fresh."""
    cmd = ["/usr/bin/python3", os.path.abspath(__file__), "--side", "torch", "--out", out] + \
        recipe_args(a)
    subprocess.run(cmd, check=True, env=dict(os.environ, OMP_NUM_THREADS="1",
                                             MASTER_ADDR="127.0.0.1", MASTER_PORT=str(a.port)))
    with open(out) as f:
        return [json.loads(line) for line in f]


def run_ours(a, out):
    build = a.build
    cmd = [os.path.join(build, "apps", "ringgrad-run"), "--nproc-per-node", str(a.nproc),
           "--master-port", "0", os.path.join(build, "apps", "ringgrad-train"),
           "--model", a.model, "--dataset", "text", "--data-file", a.data_file,
           "--block-size", str(a.block_size), "--batch-size", str(a.batch_size),
           "--optimizer", "adamw", "--lr", str(a.lr), "--weight-decay", "0.1",
           "--adam-beta2", "0.95", "--clip-grad-norm", "1", "--lr-schedule", "cosine",
           "--warmup-epochs", str(a.warmup_epochs), "--steps-per-epoch", str(a.steps_per_epoch),
           "--epochs", str(a.epochs), "--eval-samples", str(a.eval_samples),
           "--seed", str(a.seed), "--threads", "1", "--workers", "0", "--metrics", out]
    r = subprocess.run(cmd, env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True,
                       text=True)
    if r.returncode != 0:
        sys.exit(f"gpt_bench: failed ({r.returncode}): {' '.join(cmd)}\n{r.stdout}\n{r.stderr}")
    rows = []
    with open(out) as f:
        for line in f:
            j = json.loads(line)
            if j.get("type") == "epoch":
                rows.append({"epoch": j["epoch"], "step": j["step"], "val_loss": j["test_loss"],
                             "train_loss": j["train_loss"], "seconds": j["seconds"],
                             "tokens": j["tokens_per_s"] * j["seconds"]})
    return rows, cmd


def tokens_per_s(rows):
    return sum(r["tokens"] for r in rows) / sum(r["seconds"] for r in rows)


def recipe_args(a):
    return ["--model", a.model, "--data-file", a.data_file, "--block-size", str(a.block_size),
            "--batch-size", str(a.batch_size), "--lr", str(a.lr), "--warmup-epochs",
            str(a.warmup_epochs), "--steps-per-epoch", str(a.steps_per_epoch), "--epochs",
            str(a.epochs), "--eval-samples", str(a.eval_samples), "--seed", str(a.seed),
            "--nproc", str(a.nproc)]


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", default=os.path.join(ROOT, "build", "ci"), help="ringgrad build dir")
    p.add_argument("--model", default="gpt-nano", choices=["gpt-nano", "gpt-micro", "gpt-mini"])
    p.add_argument("--data-file", default=os.path.join(ROOT, "data", "kjv", "kjv.txt"),
                   help="UTF-8 text (scripts/get-data.sh kjv fetches the default)")
    p.add_argument("--block-size", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=32, help="per rank")
    p.add_argument("--lr", type=float, default=5e-4)
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--steps-per-epoch", type=int, default=100)
    p.add_argument("--warmup-epochs", type=float, default=0.5)
    p.add_argument("--eval-samples", type=int, default=256, help="validation blocks evaluated")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--nproc", type=int, default=2, help="ranks on this host")
    p.add_argument("--repeats", type=int, default=3, help="alternating runs per side")
    p.add_argument("--quick", action="store_true",
                   help="smoke test: 2 epochs of 5 steps, 32 validation blocks, 1 run per side")
    p.add_argument("--port", type=int, default=29531, help="PyTorch's MASTER_PORT")
    p.add_argument("--side", choices=["torch"], help=argparse.SUPPRESS)  # one PyTorch run
    p.add_argument("--out", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.side == "torch":
        import torch.multiprocessing as mp
        mp.spawn(torch_rank, args=(a,), nprocs=a.nproc, join=True)
        return
    if a.quick:
        a.epochs, a.steps_per_epoch, a.eval_samples, a.repeats, a.warmup_epochs = 2, 5, 32, 1, 0.4
    for f in ("ringgrad-run", "ringgrad-train"):
        if not os.access(os.path.join(a.build, "apps", f), os.X_OK):
            sys.exit(f"gpt_bench: {a.build}/apps/{f} is missing: build first "
                     f"(cmake --build {a.build} --target ringgrad-train ringgrad-run)")
    if not os.path.exists(a.data_file):
        sys.exit(f"gpt_bench: {a.data_file} is missing: scripts/get-data.sh kjv")
    print(f"CPU: {cpu_name()} ({os.cpu_count()} cores, best ISA {isa_flags()})")
    print(f"minGPT recipe: {a.model}, block {a.block_size}, batch {a.batch_size} per rank x "
          f"{a.nproc} ranks x 1 thread (Gloo), AdamW lr {a.lr:g} wd 0.1 (Linear weights) betas "
          f"(0.9, 0.95), clip 1.0, warm-up {a.warmup_epochs:g} epochs + cosine, dropout 0.1, "
          f"{a.epochs} epochs x {a.steps_per_epoch} steps, val loss on {a.eval_samples} blocks; "
          f"{a.repeats} alternating runs per side, medians", flush=True)
    ours, theirs = [], []
    with tempfile.TemporaryDirectory(prefix="rg_gpt_bench_") as tmp:
        for r in range(a.repeats):
            rows, cmd = run_ours(a, os.path.join(tmp, f"ours{r}.jsonl"))
            if r == 0:
                print("ours:", " ".join(cmd), flush=True)
            ours.append(rows)
            theirs.append(run_torch(a, os.path.join(tmp, f"torch{r}.jsonl")))
            # The 1-minute load average after the pair: above the 2 ranks' 2, something else ran.
            print(f"run {r + 1}: ours {tokens_per_s(ours[-1]):.0f} tok/s, PyTorch "
                  f"{tokens_per_s(theirs[-1]):.0f} tok/s (load average {os.getloadavg()[0]:.2f})",
                  flush=True)
    print(f"\n{'epoch':>5} | {'step':>6} | {'val loss ours':>13} | {'val loss PyTorch':>16}")
    for e in range(a.epochs):
        o = statistics.median(run[e]["val_loss"] for run in ours)
        t = statistics.median(run[e]["val_loss"] for run in theirs)
        print(f"{e + 1:>5} | {ours[0][e]['step']:>6} | {o:>13.4f} | {t:>16.4f}")
    o_rate = statistics.median(tokens_per_s(run) for run in ours)
    t_rate = statistics.median(tokens_per_s(run) for run in theirs)
    print(f"\ntraining tokens/s (all ranks): ours {o_rate:.0f}, PyTorch {t_rate:.0f}, "
          f"ratio {o_rate / t_rate:.2f}x (runs: ours {[round(tokens_per_s(r)) for r in ours]}, "
          f"PyTorch {[round(tokens_per_s(r)) for r in theirs]})")


if __name__ == "__main__":
    main()
