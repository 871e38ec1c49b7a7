#!/usr/bin/python3
"""Loads the weights that resnet18_cifar wrote into a plain PyTorch ResNet-18 and checks that
PyTorch computes the same eval-mode output for the same input.

    python3 check_resnet18_in_pytorch.py OUT_DIR

OUT_DIR holds resnet18.safetensors (the state_dict) and resnet18_io.safetensors ("input",
"output"). The model is torchvision's ResNet-18 with the CIFAR stem (3x3 conv, stride 1, no max
pool), written out in torch_models.py so that only torch is needed, with ringgrad's module names
(layers/models/resnet.cpp): load_state_dict(strict=True) fails on any missing, unexpected or
misshaped tensor. The safetensors files are read in plain Python (the `safetensors` package is not
needed): an 8-byte little-endian header length, a JSON header, then the raw tensor bytes.

Exit status 0 when the outputs agree within the tolerance, 1 otherwise.
"""
import os
import sys

import torch

from safetensors_io import load_safetensors  # plain-Python safetensors (same directory)
from torch_models import ResNet18  # ringgrad's ResNet-18 in plain PyTorch (same directory)

# Float32 results of the same network on two implementations differ by rounding only (the
# convolutions sum in different orders); 20 layers of it stay far below this.
ATOL = 1e-4
RTOL = 1e-4


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else "."
    state = load_safetensors(os.path.join(out_dir, "resnet18.safetensors"))
    io = load_safetensors(os.path.join(out_dir, "resnet18_io.safetensors"))

    model = ResNet18(num_classes=io["output"].shape[1])
    model.load_state_dict(state, strict=True)  # every name and shape must match
    model.eval()
    with torch.no_grad():
        ours = model(io["input"])
    expected = io["output"]
    max_diff = (ours - expected).abs().max().item()
    ok = torch.allclose(ours, expected, atol=ATOL, rtol=RTOL)
    print(f"check_resnet18_in_pytorch: {len(state)} tensors loaded strictly; PyTorch "
          f"{torch.__version__} output vs ringgrad's: max |diff| {max_diff:.3g} "
          f"(tolerance atol {ATOL:g} + rtol {RTOL:g}): {'ok' if ok else 'MISMATCH'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
