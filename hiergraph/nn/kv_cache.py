r"""Key–value caches for autoregressive decoding: hierarchical (HSA, App. G.2) and flat.

:class:`HierarchicalKVCache` keeps the *right-skewed* sub-tree of a growing
signal hierarchy: the open ancestors of the latest token (the root path) and,
for each, the sufficient statistics of its *closed* children (mean key and
value, leaf count, position embedding, energy). A new token either continues
the current family or first closes families and then opens new ones
(``close`` / ``open`` of :meth:`HierarchicalKVCache.append`). Each step
attends, at every open level, to at most ``b`` closed siblings, so its cost
and the cache size are :math:`O(b \log_b N)` for ``N`` tokens, against
:math:`O(N)` for :class:`FlatKVCache`. The outputs equal the strictly causal
full pass :func:`~hiergraph.ops.hsa_causal.causal_hierarchical_attention`
token by token.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from hiergraph.plan import CausalPlan


def append_schedule(hierarchy) -> Tensor:
    r"""The ``(close, open)`` arguments that grow ``hierarchy`` leaf by leaf in a cache.

    For leaves :math:`i-1, i` of depths :math:`m_{i-1}, m_i` whose lowest
    common ancestor has depth :math:`t`: ``close`` :math:`= m_{i-1}-1-t` open
    internal nodes are completed and ``open`` :math:`= m_i-1-t` new internal
    nodes are started (the first leaf opens :math:`m_0-1` nodes below the root).

    Args:
        hierarchy: one :class:`~hiergraph.data.SignalHierarchy` (leaves in
            depth-first order, every leaf below the root), or its
            :class:`~hiergraph.plan.CausalPlan`.

    Returns:
        ``[L, 2]`` long tensor of ``(close, open)`` per leaf.
    """
    plan = CausalPlan.of(hierarchy)
    depth, anc = plan.leaf_depth, plan.ancestors
    if plan.num_leaves and int(depth.min()) < 1:
        raise ValueError("a cache needs every leaf below a root; a one-leaf tree has none")
    same = (anc[1:] == anc[:-1]) & (anc[1:] >= 0)
    lca = torch.cumprod(same.long(), 1).sum(1) - 1
    if bool((lca < 0).any()):
        raise ValueError("append_schedule takes one tree; decode the trees of a batch separately")
    close = torch.cat([depth.new_zeros(1), depth[:-1] - 1 - lca])
    open_ = torch.cat([depth[:1] - 1, depth[1:] - 1 - lca])
    return torch.stack([close, open_], 1)


def _check_shapes(cache, lead: tuple[int, ...], q: Tensor | None, k: Tensor, v: Tensor) -> None:
    """Raise a ``ValueError`` unless ``q, k`` are ``[*lead, heads, dim]`` and ``v`` is
    ``[*lead, heads, dim_v]`` for the ``heads, dim, dim_v`` of ``cache``; ``lead`` is ``()``
    or ``(T,)``, and ``q`` may be ``None``."""
    token = [f"T={t}" for t in lead]
    for name, x, (last, size) in (
        ("q", q, ("dim", cache.dim)),
        ("k", k, ("dim", cache.dim)),
        ("v", v, ("dim_v", cache.dim_v)),
    ):
        if x is not None and x.shape != (*lead, cache.heads, size):
            want = ", ".join([*token, f"heads={cache.heads}", f"{last}={size}"])
            raise ValueError(f"{name} must be [{want}], got {tuple(x.shape)}")


class _Level:
    """One open node: its closed children (keys) and the latest prefix stats of its open child.

    Keys are stored augmented, ``[rho_k, eps, log n]`` (``[H, capacity, d + c + 1]``), so that
    one matrix product with ``[tau rho_q, eps_q, 1]`` gives the family logits.
    """

    def __init__(self, heads, dim, dim_v, pos_dim, like: Tensor, capacity: int = 8):
        self.dim, self.pos_dim = dim, pos_dim
        self.count = 0
        self.keys = like.new_empty((heads, capacity, dim + pos_dim + 1))
        self.values = like.new_empty((heads, capacity, dim_v))
        self.sums = like.new_zeros((heads, 2 * dim + dim_v))  # [sum q, sum k, sum v]
        self.sum_ng = like.new_zeros((heads,))
        self.n = 0
        self.open_child = None  # (sums, n, g, eps) of the open child's prefix

    def close_open_child(self) -> None:
        sums, n, g, eps = self.open_child
        c, d = self.count, self.dim
        if c == self.keys.size(1):
            self.keys = torch.cat([self.keys, torch.empty_like(self.keys)], 1)
            self.values = torch.cat([self.values, torch.empty_like(self.values)], 1)
        self.keys[:, c, :d] = sums[:, d : 2 * d] / n
        if eps is not None:
            self.keys[:, c, d:-1] = eps
        self.keys[:, c, -1] = math.log(n)
        self.values[:, c] = sums[:, 2 * d :] / n
        self.count = c + 1
        self.sums = self.sums + sums
        self.sum_ng = self.sum_ng + n * g
        self.n += n
        self.open_child = None

    def attend(self, query: Tensor) -> tuple[Tensor, Tensor]:
        """Softmax of the augmented ``query [H, d + c + 1]`` over the closed children:
        ``lse [H]`` and ``theta [H, d_v]``; call only when ``count > 0``."""
        c = self.count
        logits = torch.bmm(self.keys[:, :c], query[:, :, None]).squeeze(-1)
        lse = torch.logsumexp(logits, -1)
        weights = torch.exp(logits - lse[:, None])
        return lse, torch.bmm(weights[:, None], self.values[:, :c]).squeeze(1)

    def nbytes(self) -> int:
        """Bytes of the live statistics (closed children and running sums)."""
        live = self.count * (self.keys[:, 0].numel() + self.values[:, 0].numel())
        return (live + self.sums.numel() + self.sum_ng.numel()) * self.sums.element_size()


class HierarchicalKVCache:
    r"""Incremental strictly causal HSA for one sequence (App. G.2 of the HSA paper).

    Holds the open nodes :math:`O_0` (root) :math:`\supset O_1 \supset \dots
    \supset O_{m-1}` of the latest leaf's path. For each, the closed children
    :math:`B` keep :math:`\rho_k(B), \rho_v(B), \log n(B), \varepsilon(B)`
    and the running sums :math:`\sum_B \Sigma_q(B)`, :math:`\sum_B n(B)`,
    :math:`\sum_B n(B)\,g(B)` that the prefix statistics of the open child
    need (see :func:`~hiergraph.ops.hsa_causal.causal_hierarchical_attention`
    for the formulas). :meth:`append` computes the new leaf's prefix
    statistics along its path, bottom-up, each an attention over the closed
    children of one level, then the gates top-down.

    Args:
        heads, dim, dim_v: shapes of the per-token ``q, k [H, d]`` and ``v [H, d_v]``.
        pos_dim: size of the per-node position embeddings (0: none).
        scale: logit scale :math:`\tau`, default :math:`1/\sqrt{d}`.
        dtype, device: of the stored statistics.

    Example::

        cache = HierarchicalKVCache(heads=4, dim=32, dim_v=32)
        for (q, k, v), (close, open_) in zip(tokens, append_schedule(tree).tolist()):
            out = cache.append(q, k, v, close=close, open=open_)   # [4, 32]
    """

    def __init__(
        self,
        heads: int,
        dim: int,
        dim_v: int | None = None,
        pos_dim: int = 0,
        scale: float | None = None,
        dtype: torch.dtype = torch.float32,
        device=None,
    ):
        self.heads, self.dim, self.dim_v = heads, dim, dim if dim_v is None else dim_v
        self.pos_dim = pos_dim
        self.tau = dim**-0.5 if scale is None else scale
        self._like = torch.empty(0, dtype=dtype, device=device)
        self._one = torch.ones(heads, 1, dtype=dtype, device=device)
        self.levels = [self._new_level()]
        self.num_tokens = 0

    def _new_level(self) -> _Level:
        return _Level(self.heads, self.dim, self.dim_v, self.pos_dim, self._like)

    @property
    def depth(self) -> int:
        """Depth of the latest leaf (number of open internal nodes)."""
        return len(self.levels)

    def new_node_slots(self, close: int = 0, open: int = 0) -> list[tuple[int, int]]:  # noqa: A002
        """``(depth, slot)`` of the nodes an ``append(close=, open=)`` would create, top-down
        (the ``open`` new internal nodes, then the leaf): to compute their position embeddings.

        Children are numbered as they come, so ``slot`` is a node's rank ``0, 1, 2, …``
        among its siblings (equal to :attr:`SignalHierarchy.slot` when a family's slots
        have no gaps)."""
        self._check_event(close, open)
        if self.num_tokens == 0:
            top_depth, first_slot = 0, 0
        else:
            top_depth = self.depth - 1 - close
            first_slot = self.levels[top_depth].count + 1
        return [(top_depth + 1 + j, first_slot if j == 0 else 0) for j in range(open + 1)]

    def _check_event(self, close: int, open: int) -> None:  # noqa: A002
        if close < 0 or open < 0:
            raise ValueError(f"close and open must be >= 0, got close={close}, open={open}")
        if self.num_tokens == 0 and close:
            raise ValueError("the first token cannot close families: pass close=0")
        if self.num_tokens and close > self.depth - 1:
            raise ValueError(
                f"close={close} but only {self.depth - 1} families below the root are open; "
                "the root is never closed"
            )

    def append(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        *,
        close: int = 0,
        open: int = 0,  # noqa: A002
        pos_emb: Tensor | None = None,
    ) -> Tensor:
        r"""Add one token and return its causal HSA output.

        Args:
            q, k: ``[H, d]``; v: ``[H, d_v]``.
            close: number of open internal nodes (innermost first) completed
                before this token; the previous token's family is always
                completed when ``close >= 1``.
            open: number of new internal nodes started below the innermost
                remaining open node; the token is the first child of the
                deepest one (``open = 0``: it continues the current family).
            pos_emb: ``[open + 1, H, c]`` embeddings of the new nodes,
                top-down (the leaf last); required iff ``pos_dim > 0``.

        Returns:
            ``[H, d_v]``.
        """
        self._check_event(close, open)
        _check_shapes(self, (), q, k, v)
        if (pos_emb is None) != (self.pos_dim == 0) or (
            pos_emb is not None and pos_emb.shape != (open + 1, self.heads, self.pos_dim)
        ):
            raise ValueError(
                f"pos_emb must be [open + 1 = {open + 1}, {self.heads}, {self.pos_dim}] "
                "(None when the cache was built with pos_dim=0), got "
                f"{None if pos_emb is None else tuple(pos_emb.shape)}"
            )
        levels, d, tau = self.levels, self.dim, self.tau
        if self.num_tokens:
            levels[-1].close_open_child()
            for _ in range(close):
                levels.pop()
                levels[-1].close_open_child()
        new_eps = [None] * (open + 1) if pos_emb is None else list(pos_emb.unbind(0))
        first_new = len(levels)  # depth of the first new node
        for _ in range(open):
            levels.append(self._new_level())
        m = len(levels)  # depth of the new leaf

        # bottom-up: prefix statistics of the path nodes A_m (the leaf) .. A_1
        eps = new_eps[-1]
        sums, n = torch.cat([q, k, v], -1), 1
        a = tau * (q * k).sum(-1)
        if eps is not None:
            a = a + (eps * eps).sum(-1)
        path, g = [], None
        for s in range(m, 0, -1):
            if s < m:  # extend the child's prefix by the closed children of level s
                level, child_n = levels[s], n
                sums, n = sums + level.sums, n + level.n
                a = (level.sum_ng + child_n * g) / n
                eps = new_eps[s - first_new] if s >= first_new else levels[s - 1].open_child[3]
            family = levels[s - 1]
            if family.count:
                query = [tau * sums[:, :d] / n, self._one]
                if eps is not None:
                    query.insert(1, eps)
                lse, theta = family.attend(torch.cat(query, -1))
                g = torch.logaddexp(a, lse)
                path.append((a - lse, theta))
            else:  # no left sibling: mu = 1, nothing to attend to at this level
                g = a
                path.append(None)
            family.open_child = (sums, n, g, eps)

        # top-down: gates along the root path (log mu = logsigmoid(a - lse))
        u, out = None, None
        for gate in reversed(path):
            if gate is None:
                continue
            diff, theta = gate
            weight = F.logsigmoid(-diff) if u is None else u + F.logsigmoid(-diff)
            term = torch.exp(weight)[:, None] * theta
            out = term if out is None else out + term
            u = F.logsigmoid(diff) if u is None else u + F.logsigmoid(diff)
        self.num_tokens += 1
        if u is None:
            return v.clone()
        return out + torch.exp(u)[:, None] * v

    def nbytes(self) -> int:
        """Bytes of the cached statistics (the right-skewed sub-tree)."""
        return sum(level.nbytes() for level in self.levels)


class FlatKVCache:
    r"""A standard key–value cache: causal softmax attention over all previous tokens.

    :math:`\mathrm{out}_i = \sum_{j \le i} \mathrm{softmax}_j(\tau q_i^\top k_j)\,v_j`
    with :math:`O(N)` time per token and :math:`O(N)` memory.

    Args:
        heads, dim, dim_v, scale, dtype, device: as in :class:`HierarchicalKVCache`.
        capacity: initial number of token slots (doubled when full).
    """

    def __init__(
        self,
        heads: int,
        dim: int,
        dim_v: int | None = None,
        scale: float | None = None,
        dtype: torch.dtype = torch.float32,
        device=None,
        capacity: int = 1024,
    ):
        dim_v = dim if dim_v is None else dim_v
        self.heads, self.dim, self.dim_v = heads, dim, dim_v
        self.tau = dim**-0.5 if scale is None else scale
        self.keys = torch.empty((heads, capacity, dim), dtype=dtype, device=device)
        self.values = torch.empty((heads, capacity, dim_v), dtype=dtype, device=device)
        self.num_tokens = 0

    def extend(self, k: Tensor, v: Tensor) -> None:
        """Store the keys ``[T, H, d]`` and values ``[T, H, d_v]`` of ``T`` tokens (a prompt).

        Raises:
            ValueError: if the shapes do not match the cache's ``heads, dim, dim_v``.
        """
        _check_shapes(self, k.shape[:1], None, k, v)
        self._store(k, v)

    def _store(self, k: Tensor, v: Tensor) -> None:
        """:meth:`extend` without its check."""
        n, t = self.num_tokens, k.size(0)
        if n + t > self.keys.size(1):  # at least double: amortised O(1) per token
            size = max(2 * self.keys.size(1), n + t)
            self.keys, self.values = _grown(self.keys, size), _grown(self.values, size)
        self.keys[:, n : n + t] = k.transpose(0, 1)
        self.values[:, n : n + t] = v.transpose(0, 1)
        self.num_tokens = n + t

    def append(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """``q, k: [H, d]``, ``v: [H, d_v]`` → ``[H, d_v]``.

        Raises:
            ValueError: if the shapes do not match the cache's ``heads, dim, dim_v``.
        """
        _check_shapes(self, (), q, k, v)
        self._store(k[None], v[None])
        n = self.num_tokens - 1
        keys, values = self.keys[:, : n + 1], self.values[:, : n + 1]
        weights = torch.softmax(self.tau * torch.einsum("hd,hnd->hn", q, keys), -1)
        return torch.einsum("hn,hnd->hd", weights, values)

    def nbytes(self) -> int:
        """Bytes of the cached keys and values (the used part)."""
        per_token = self.keys[:, 0].numel() + self.values[:, 0].numel()
        return self.num_tokens * per_token * self.keys.element_size()


def _grown(buffer: Tensor, size: int) -> Tensor:
    """``buffer`` ``[H, S, c]`` with its token axis grown to ``size`` slots (new slots unset)."""
    out = buffer.new_empty(buffer.size(0), size, buffer.size(2))
    out[:, : buffer.size(1)] = buffer
    return out
