"""A linear map with one weight matrix per node type (modality)."""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch_geometric.nn import HeteroLinear, inits

from hiergraph._checks import check_bool, check_ids, check_int, holds_integers
from hiergraph._device import reads_values


class TypedLinear(nn.Module):
    r""":math:`y_i = W_{t_i} x_i + b_{t_i}` with a separate map for each type :math:`t_i`.

    With one type it is a plain :class:`torch.nn.Linear`; otherwise PyG's
    :class:`~torch_geometric.nn.HeteroLinear` (segment matmul when
    ``pyg-lib`` is installed) for :math:`W_{t_i} x_i`, and ``type_bias``
    ``[num_types, out_channels]`` gathered with ``index_select``: its backward
    adds the rows of a type in order, so a multi-threaded CPU backward is
    bitwise reproducible (``HeteroLinear``'s own ``bias[type_vec]`` adds them
    with unordered atomics). Initialised as ``HeteroLinear``'s bias. On an
    accelerator, where ``HeteroLinear`` would read the type boundaries on the
    host (a synchronisation), every type's map runs on all rows and is kept
    where the type matches (``num_types`` times the FLOPs, same weights).

    Args:
        in_channels (int): size of each input sample.
        out_channels (int): size of each output sample.
        num_types (int, optional): number of types; ``type_vec`` values lie in
            ``[0, num_types)``. (default: :obj:`1`)
        bias (bool, optional): learn an additive bias per type.
            (default: :obj:`True`)
    """

    def __init__(self, in_channels: int, out_channels: int, num_types: int = 1, bias: bool = True):
        super().__init__()
        check_int(in_channels, "in_channels")
        check_int(out_channels, "out_channels")
        check_int(num_types, "num_types")
        check_bool(bias, "bias")  # ("no" learned a bias)
        self.in_channels, self.out_channels, self.num_types = in_channels, out_channels, num_types
        self.register_parameter("type_bias", None)  # set below for several types with bias
        with torch.device("meta"):  # allocated, not initialised: reset_parameters() draws once
            if num_types == 1:
                self.lin = nn.Linear(in_channels, out_channels, bias=bias)
            else:
                self.lin = HeteroLinear(in_channels, out_channels, num_types, bias=False)
        self.lin.to_empty(device=torch.get_default_device())
        if num_types > 1 and bias:
            self.type_bias = nn.Parameter(torch.empty(num_types, out_channels))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        self.lin.reset_parameters()
        self._reset_type_bias()

    def _reset_type_bias(self) -> None:
        if self.type_bias is not None:  # as HeteroLinear's bias: U(-1/sqrt(in), 1/sqrt(in))
            inits.uniform(self.lin.in_channels, self.type_bias)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        old = prefix + "lin.bias"  # state dicts from when HeteroLinear held the bias
        if self.type_bias is not None and old in state_dict:
            state_dict[prefix + "type_bias"] = state_dict.pop(old)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def forward(self, x: Tensor, type_vec: Tensor | None = None) -> Tensor:
        r"""
        Args:
            x (torch.Tensor): ``[n, in_channels]``.
            type_vec (torch.Tensor, optional): ``[n]`` integer type of every row (needed
                for several types; with one type it is not read, so that a layer of one
                type serves hierarchies whose nodes carry types). (default: :obj:`None`)

        Returns:
            ``[n, out_channels]``.
        """
        if self.num_types == 1:  # one map for every row: type_vec is not read
            return self.lin(x)
        if type_vec is None:
            raise ValueError(f"this layer has {self.num_types} types: pass type_vec")
        if not isinstance(type_vec, Tensor) or not holds_integers(type_vec):
            raise TypeError(
                "type_vec must be an integer tensor of type ids, got "
                f"{type_vec.dtype if isinstance(type_vec, Tensor) else type(type_vec).__name__}"
            )
        if type_vec.shape != (x.size(0),):
            raise ValueError(
                f"type_vec must have shape [{x.size(0)}] (one type per row of x), "
                f"got {tuple(type_vec.shape)}"
            )
        # (out-of-range ids would match no type on an accelerator: silent zero rows)
        check_ids(type_vec, self.num_types, "type", "num_types")
        if reads_values(type_vec):  # HeteroLinear: row slices per type (bounds read on the host)
            out = self.lin(x, type_vec)
        else:  # accelerator: every type's map on all rows, kept where the type matches
            out = x.new_zeros(x.size(0), self.lin.out_channels)
            for t, weight in enumerate(self.lin.weight):
                out = torch.where((type_vec == t)[:, None], x @ weight, out)
        return (
            out if self.type_bias is None else out + self.type_bias.index_select(0, type_vec.long())
        )

    def __repr__(self) -> str:
        return (
            f"{self.__class__.__name__}({self.in_channels}, {self.out_channels}, "
            f"num_types={self.num_types})"
        )
