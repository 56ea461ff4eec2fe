"""``hiergraph.nn._reset.reset``: every parameter of a module, user-given ones included."""

from __future__ import annotations

import torch
from torch import nn

from hiergraph.nn._reset import reset


class Holder(nn.Module):
    """No ``reset_parameters`` of its own: a parameter of a child and attention's own."""

    def __init__(self):
        super().__init__()
        self.mha = nn.MultiheadAttention(8, 2, batch_first=True)
        self.lin = nn.Linear(8, 8)


class Own(nn.Module):
    """Its own ``reset_parameters``, which is what runs."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.empty(3))
        self.reset_parameters()

    def reset_parameters(self):
        nn.init.ones_(self.w)


def test_every_parameter_is_drawn_again():
    module = nn.Sequential(Holder(), Own(), nn.ReLU())
    with torch.no_grad():
        for p in module.parameters():
            p.fill_(7.0)
    reset(module)
    for name, p in module.named_parameters():
        assert not (p == 7.0).all(), name  # MultiheadAttention's in_proj_weight too
    assert (module[1].w == 1.0).all()
    reset(None)  # (a missing part)
