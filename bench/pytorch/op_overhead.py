#!/usr/bin/python3
"""PyTorch's cost per op on one-element CPU tensors (the reference of bench/pytorch/compare.py's
`overhead` rows; ringgrad's are rg_micro_bench's overhead/* benchmarks, measured from C++).

Prints `add NS` and `add+backward NS`: the best of 3 timeit repeats of torch.add(a, b), and of
torch.add on tensors requiring gradients followed by backward(). Both go through PyTorch's Python
binding (an empty Python call costs about 16 ns on a 2-core EPYC; the binding's argument parsing
is part of what a PyTorch user pays per op).
"""
import timeit

import torch

torch.set_num_threads(2)
a, b = torch.rand(1), torch.rand(1)
ag, bg = torch.rand(1, requires_grad=True), torch.rand(1, requires_grad=True)


def add_backward():
    torch.add(ag, bg).backward()


n = 300000
add = min(timeit.repeat(lambda: torch.add(a, b), number=n, repeat=3)) / n
backward = min(timeit.repeat(add_backward, number=n // 5, repeat=3)) / (n // 5)
print(f"add {add * 1e9:.0f}")
print(f"add+backward {backward * 1e9:.0f}")
