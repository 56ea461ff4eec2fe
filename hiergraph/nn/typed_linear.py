"""A linear map with one weight matrix per node type (modality)."""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch_geometric.nn import HeteroLinear


class TypedLinear(nn.Module):
    r""":math:`y_i = W_{t_i} x_i + b_{t_i}` with a separate map for each type :math:`t_i`.

    With one type it is a plain :class:`torch.nn.Linear`; otherwise PyG's
    :class:`~torch_geometric.nn.HeteroLinear` (segment matmul when
    ``pyg-lib`` is installed).

    Args:
        in_channels, out_channels: feature sizes.
        num_types: number of types; ``type_vec`` values lie in ``[0, num_types)``.
        bias: learn an additive bias per type.
    """

    def __init__(self, in_channels: int, out_channels: int, num_types: int = 1, bias: bool = True):
        super().__init__()
        if num_types < 1:
            raise ValueError(f"num_types must be >= 1, got {num_types}")
        self.num_types = num_types
        if num_types == 1:
            self.lin = nn.Linear(in_channels, out_channels, bias=bias)
        else:
            self.lin = HeteroLinear(in_channels, out_channels, num_types, bias=bias)

    def reset_parameters(self) -> None:
        self.lin.reset_parameters()

    def forward(self, x: Tensor, type_vec: Tensor | None = None) -> Tensor:
        """``x: [n, in_channels]``, ``type_vec: [n]`` → ``[n, out_channels]``."""
        if self.num_types == 1:
            return self.lin(x)
        if type_vec is None:
            raise ValueError(f"this layer has {self.num_types} types: pass type_vec")
        if type_vec.shape != (x.size(0),):
            raise ValueError(
                f"type_vec must have shape [{x.size(0)}] (one type per row of x), "
                f"got {tuple(type_vec.shape)}"
            )
        if type_vec.numel():
            low, high = torch.stack(torch.aminmax(type_vec)).tolist()  # one host read
            if low < 0 or high >= self.num_types:
                raise ValueError(
                    f"type ids span {low}..{high}; they must lie in [0, num_types = "
                    f"{self.num_types})"
                )
        return self.lin(x, type_vec)
