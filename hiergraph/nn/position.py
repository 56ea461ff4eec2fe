"""Position encoders for the families of a signal hierarchy (Amizadeh et al., Sec. 2 and
App. C: each family's domain type has its own position embedding)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from hiergraph._checks import check_ids, check_int, check_positive, described
from hiergraph._device import reads_values
from hiergraph._precision import accumulation_dtype
from hiergraph.data.domain import Domain
from hiergraph.data.signal_hierarchy import as_hierarchy

if TYPE_CHECKING:
    from torch_geometric.data import Batch

    from hiergraph.data.signal_hierarchy import SignalHierarchy


class LearnableFourierFeatures(nn.Module):
    r"""Learnable Fourier features (Li et al., NeurIPS 2021) of an ``m``-D position.

    .. math::
        r_x = \tfrac{1}{\sqrt{F}}\,[\cos(W_r x) \,\|\, \sin(W_r x)], \qquad
        \mathrm{PE}(x) = \mathrm{MLP}(r_x)

    with :math:`W_r \in \mathbb{R}^{F/2 \times m}` initialised from
    :math:`\mathcal{N}(0, \gamma^{-2})` and learned. :math:`W_r x` and the
    cosines are computed in float32 (float64 for a float64 module), also
    under autocast and for a half-precision module: positions in the
    thousands are not representable in bfloat16/float16.

    Args:
        pos_dim (int): ``m`` (1 for sequences, 2 for grids).
        out_channels (int): size of the embedding.
        num_features (int, optional): ``F`` (even). (default: :obj:`64`)
        hidden_channels (int, optional): width of the MLP. (default: :obj:`64`)
        gamma (float, optional): initial length scale in position units.
            (default: :obj:`10.0`)
    """

    def __init__(
        self,
        pos_dim: int,
        out_channels: int,
        num_features: int = 64,
        hidden_channels: int = 64,
        gamma: float = 10.0,
    ):
        super().__init__()
        sizes = dict(pos_dim=pos_dim, out_channels=out_channels, num_features=num_features,
                     hidden_channels=hidden_channels)  # fmt: skip
        for name, value in sizes.items():
            check_int(value, name)
        check_positive(gamma, "gamma")
        if num_features % 2:
            raise ValueError(f"num_features must be even, got {num_features}")
        self.pos_dim, self.out_channels, self.num_features = pos_dim, out_channels, num_features
        self.gamma = gamma
        self.freq = nn.Linear(pos_dim, num_features // 2, bias=False)
        self.mlp = nn.Sequential(
            nn.Linear(num_features, hidden_channels),
            nn.GELU(),
            nn.Linear(hidden_channels, out_channels),
        )
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.normal_(self.freq.weight, std=1.0 / self.gamma)
        for layer in self.mlp:
            if isinstance(layer, nn.Linear):
                layer.reset_parameters()

    def forward(self, pos: Tensor) -> Tensor:
        """``pos: [..., m]`` (any real or integer dtype) → ``[..., out_channels]``."""
        if not isinstance(pos, Tensor) or pos.dim() < 2 or pos.size(-1) != self.pos_dim:
            raise ValueError(  # (a matmul shape error)
                f"pos must be [..., n, pos_dim={self.pos_dim}], got {described(pos)}"
            )
        weight = self.freq.weight
        work = accumulation_dtype(weight.dtype)
        with torch.autocast(pos.device.type, enabled=False):
            proj = pos.to(work) @ weight.to(work).T
            feats = torch.cat([proj.cos(), proj.sin()], dim=-1) / math.sqrt(2 * proj.size(-1))
        return self.mlp(feats.to(weight.dtype))

    def __repr__(self) -> str:
        return (
            f"{self.__class__.__name__}({self.pos_dim}, {self.out_channels}, "
            f"num_features={self.num_features})"
        )


class FamilyPositionEncoder(nn.Module):
    r"""Position embedding :math:`\varepsilon_\Omega(u)` of every node in its parent's domain.

    Each node is embedded by the encoder of its family's
    :class:`~hiergraph.data.Domain`, from its raw ``pos``:

    * ``GRID1D`` / ``GRID2D``: :class:`LearnableFourierFeatures` of the
      1-D index / ``(row, col)``;
    * ``SET`` and roots (``NONE``): zero (no positional information);
    * ``KEY_VALUE``: a learned embedding per key id (``pos[:, 0]``);
    * ``GRAPH``: a linear map of the per-node spectral features
      ``hierarchy.graph_pe`` (``[N, k]``, e.g. Laplacian eigenvectors of the
      family's graph); zero if the hierarchy has none.

    On the CPU each encoder runs on the nodes of its domain only; on an
    accelerator, where finding those rows would synchronise with the host,
    each runs on all nodes and is kept where the domain matches.

    The sibling bias of HSA is :math:`\varepsilon(A)^\top\varepsilon(B)` (eq. 7);
    :class:`~hiergraph.nn.HierarchicalSelfAttention` projects these
    embeddings per layer and per domain type before using them.

    Args:
        channels (int): ``c``, the embedding size.
        num_keys (int, optional): size of the key vocabulary of key–value families.
            (default: :obj:`64`)
        graph_pe_dim (int, optional): ``k``, the size of ``graph_pe`` (0: no graph
            families; a hierarchy with ``graph_pe`` features is then refused, not encoded
            as zero). (default: :obj:`0`)
        domains (Iterable[Domain | str | int], optional): the domain types that get an
            encoder, among ``GRID1D``, ``GRID2D``, ``KEY_VALUE`` and ``GRAPH``; families of
            the others are embedded as zero, like sets. Naming only the domains the data
            has leaves no parameter without a gradient (which
            :class:`~torch.nn.parallel.DistributedDataParallel` refuses by default).
            ``GRAPH`` needs ``graph_pe_dim > 0``. (default: all four, ``GRAPH`` when
            ``graph_pe_dim > 0``)
    """

    def __init__(
        self,
        channels: int,
        num_keys: int = 64,
        graph_pe_dim: int = 0,
        domains: Iterable[Domain | str | int] | None = None,
    ):
        super().__init__()
        check_int(channels, "channels")
        check_int(num_keys, "num_keys")
        check_int(graph_pe_dim, "graph_pe_dim", minimum=0)
        self.channels, self.graph_pe_dim = channels, graph_pe_dim
        self.domains = _encoded_domains(domains, graph_pe_dim)
        self.grid1d = (
            LearnableFourierFeatures(1, channels) if Domain.GRID1D in self.domains else None
        )
        self.grid2d = (
            LearnableFourierFeatures(2, channels) if Domain.GRID2D in self.domains else None
        )
        self.keys = nn.Embedding(num_keys, channels) if Domain.KEY_VALUE in self.domains else None
        self.num_keys = num_keys
        self.graph = nn.Linear(graph_pe_dim, channels) if Domain.GRAPH in self.domains else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for encoder in (self.grid1d, self.grid2d, self.keys, self.graph):
            if encoder is not None:
                encoder.reset_parameters()

    def forward(self, hierarchy: SignalHierarchy | Batch) -> Tensor:
        """``[N, channels]`` embeddings of all nodes of ``hierarchy`` (a tree or a batch)."""
        hierarchy = as_hierarchy(hierarchy)
        domain, pos = hierarchy.domain, hierarchy.pos  # raw: exact key ids and indices
        out = next(self.parameters()).new_zeros(domain.numel(), self.channels)
        encoders = [
            (kind, fn, pos)
            for kind, fn in (
                (Domain.GRID1D, lambda p: self.grid1d(p[:, :1])),
                (Domain.GRID2D, self.grid2d),
                (Domain.KEY_VALUE, self._keys),
            )
            if kind in self.domains
        ]
        graph_pe = hierarchy.graph_pe if "graph_pe" in hierarchy else None
        if self.graph is None and graph_pe is not None and graph_pe.numel():
            raise ValueError(
                f"hierarchy has graph_pe {described(graph_pe)} but this encoder was built with "
                "no graph encoder, so its graph families would get no position: pass "
                "graph_pe_dim=graph_pe.size(1) (or delete hierarchy.graph_pe to go without)"
            )
        if self.graph is not None and graph_pe is not None:
            if graph_pe.shape != (domain.numel(), self.graph_pe_dim):  # (rows: an IndexError)
                raise ValueError(
                    f"hierarchy.graph_pe must be [num_nodes, graph_pe_dim] = [{domain.numel()}, "
                    f"{self.graph_pe_dim}] (graph_pe_dim of this encoder), got "
                    f"{tuple(graph_pe.shape)}"
                )
            encoders.append((Domain.GRAPH, self.graph, graph_pe.to(out.dtype)))
        by_rows = reads_values(domain)
        for kind, fn, inputs in encoders:
            if by_rows:  # only the rows of this kind (the host reads which they are)
                rows = (domain == int(kind)).nonzero().view(-1)
                if rows.numel():
                    out = out.index_copy(0, rows, fn(inputs.index_select(0, rows)))
            else:  # accelerator: every row, kept where the kind matches (no host sync)
                keep = (domain == int(kind))[:, None]
                out = torch.where(keep, fn(inputs.masked_fill(~keep, 0)), out)
        return out

    def _keys(self, pos: Tensor) -> Tensor:
        ids = pos[:, 0].long()
        check_ids(ids, self.num_keys, "key", "num_keys", device_assert=False)
        return self.keys(ids)

    def __repr__(self) -> str:
        chosen = ""
        if self.domains != _encoded_domains(None, self.graph_pe_dim):
            chosen = f", domains={[kind.name.lower() for kind in self.domains]}"
        return (
            f"{self.__class__.__name__}({self.channels}, num_keys={self.num_keys}, "
            f"graph_pe_dim={self.graph_pe_dim}{chosen})"
        )


def _encoded_domains(
    domains: Iterable[Domain | str | int] | None, graph_pe_dim: int
) -> tuple[Domain, ...]:
    """The domain types an encoder built with ``domains`` and ``graph_pe_dim`` embeds, in
    :class:`~hiergraph.data.Domain` order."""
    encodable = (Domain.GRID1D, Domain.GRID2D, Domain.KEY_VALUE, Domain.GRAPH)
    if domains is None:
        return encodable if graph_pe_dim else encodable[:-1]
    if isinstance(domains, (str, int, Domain)):
        domains = (domains,)
    chosen = {Domain.parse(kind) for kind in domains}
    if not chosen or not chosen <= set(encodable):
        raise ValueError(
            f"domains must name one or more of {[kind.name.lower() for kind in encodable]} "
            f"(the others have no position), got {sorted(kind.name.lower() for kind in chosen)}"
        )
    if (Domain.GRAPH in chosen) != bool(graph_pe_dim):
        raise ValueError(
            "a graph encoder needs graph_pe_dim > 0 and domains including 'graph', got "
            f"graph_pe_dim={graph_pe_dim} and domains {sorted(k.name.lower() for k in chosen)}"
        )
    return tuple(kind for kind in encodable if kind in chosen)
