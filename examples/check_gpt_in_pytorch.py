#!/usr/bin/python3
"""ringgrad's GPT and minGPT's in PyTorch (torch_models.GPT) are the same function of the same
weights, in both directions (the oracle test tests/apps/gpt_torch_test.cpp runs both):

    check_gpt_in_pytorch.py from-ringgrad DIR [--tie]
        DIR/gpt.safetensors is the state_dict ringgrad saved (nn::save_weights), DIR/gpt_io.safetensors
        holds "idx" (int64 [B, T]), "targets" (int64 [B, T]) and ringgrad's "logits" [B, T, V] and
        "loss" (the mean cross-entropy, a scalar or [1]). Loads the weights STRICTLY (any missing,
        unexpected or misshaped tensor fails) into the PyTorch GPT and compares its logits and
        loss with ringgrad's. Exit status 0 when they agree, 1 otherwise.
    check_gpt_in_pytorch.py to-ringgrad DIR [--tie] [--seed S] [--model gpt-nano] [--vocab V]
            [--block T]
        Initialises the PyTorch GPT with torch.manual_seed(S) (minGPT's init), writes its
        state_dict to DIR/gpt.safetensors (with --tie both lm_head.weight and
        transformer.wte.weight, as PyTorch's state_dict lists both) and DIR/gpt_io.safetensors with
        "idx" and PyTorch's "logits" for ringgrad to load (nn::load_weights, strict) and compare.

The model size follows from the file (from-ringgrad) or --model; f32, eval mode (dropout off).
Needs only torch; the safetensors files are read and written in plain Python (safetensors_io.py).
"""
import argparse
import os
import sys

import torch

from safetensors_io import load_safetensors, save_safetensors  # same directory
from torch_models import GPT, GPT_CONFIGS  # same directory

# Float32 on two implementations: the same sums in other orders, through 3 to 6 blocks.
ATOL = 1e-5
RTOL = 1e-5


def model_type_of(state):
    """The GPT_CONFIGS name whose depth and width the state_dict has."""
    n_layer = len({k.split(".")[2] for k in state if k.startswith("transformer.h.")})
    n_embd = state["transformer.wte.weight"].shape[1]
    for name, (layers, _, embd) in GPT_CONFIGS.items():
        if (layers, embd) == (n_layer, n_embd):
            return name
    sys.exit(f"check_gpt_in_pytorch: no GPT size has {n_layer} layers of width {n_embd}")


def from_ringgrad(a):
    state = load_safetensors(os.path.join(a.dir, "gpt.safetensors"))
    io = load_safetensors(os.path.join(a.dir, "gpt_io.safetensors"))
    vocab, _ = state["transformer.wte.weight"].shape
    block = state["transformer.wpe.weight"].shape[0]
    model_type = model_type_of(state)
    model = GPT(model_type, vocab, block, tie_weights=a.tie)
    model.load_state_dict(state, strict=True)  # every name and shape must match
    model.eval()
    with torch.no_grad():
        logits, loss = model(io["idx"], io["targets"])
    diff = (logits - io["logits"]).abs().max().item()
    loss_diff = abs(loss.item() - io["loss"].reshape(-1)[0].item())
    ok = torch.allclose(logits, io["logits"], atol=ATOL, rtol=RTOL) and loss_diff <= ATOL
    print(f"check_gpt_in_pytorch from-ringgrad: {model_type}{' tied' if a.tie else ''}, "
          f"{len(state)} tensors loaded strictly; PyTorch {torch.__version__} logits vs "
          f"ringgrad's: max |diff| {diff:.3g}, loss {loss.item():.6f} vs "
          f"{io['loss'].reshape(-1)[0].item():.6f} (tolerance atol {ATOL:g} + rtol {RTOL:g}): "
          f"{'ok' if ok else 'MISMATCH'}")
    return 0 if ok else 1


def to_ringgrad(a):
    torch.manual_seed(a.seed)
    model = GPT(a.model, a.vocab, a.block, tie_weights=a.tie)
    model.eval()
    idx = torch.randint(0, a.vocab, (2, a.block))
    with torch.no_grad():
        logits = model(idx)
    state = model.state_dict()
    save_safetensors(dict(state), os.path.join(a.dir, "gpt.safetensors"))
    save_safetensors({"idx": idx, "logits": logits}, os.path.join(a.dir, "gpt_io.safetensors"))
    print(f"check_gpt_in_pytorch to-ringgrad: {a.model}{' tied' if a.tie else ''} (seed "
          f"{a.seed}), {len(state)} tensors and the logits of idx {list(idx.shape)} written to "
          f"{a.dir}")
    return 0


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("direction", choices=["from-ringgrad", "to-ringgrad"])
    p.add_argument("dir")
    p.add_argument("--tie", action="store_true", help="the head's weight is the embedding's")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--model", default="gpt-nano", choices=sorted(GPT_CONFIGS))
    p.add_argument("--vocab", type=int, default=11)
    p.add_argument("--block", type=int, default=16)
    a = p.parse_args()
    return from_ringgrad(a) if a.direction == "from-ringgrad" else to_ringgrad(a)


if __name__ == "__main__":
    sys.exit(main())
