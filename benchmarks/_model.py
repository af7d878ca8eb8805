"""The benchmark's model and data, shared by the seamguard, torchrun and torchft runs.

Same construction as examples/train_ddp.py (which the seamguard run uses directly), so
all three train the same network on the same samples in the same order.
"""

from __future__ import annotations

import torch


def make_data(n: int, dim: int, classes: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, dim, generator=g)
    w = torch.randn(dim, classes, generator=g)
    return x, (x @ w).argmax(dim=1)


def make_model(dim: int, hidden: int, layers: int, dropout: float, seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    blocks = [torch.nn.Linear(dim, hidden), torch.nn.ReLU(), torch.nn.Dropout(dropout)]
    for _ in range(layers - 1):
        blocks += [torch.nn.Linear(hidden, hidden), torch.nn.ReLU()]
    return torch.nn.Sequential(*blocks, torch.nn.Linear(hidden, 10))
