r"""The hierarchical key–value cache: strictly causal HSA decoded token by token (App. G.2).

:class:`HierarchicalKVCache` keeps the *right-skewed* sub-tree of a growing
signal hierarchy: the open ancestors of the latest token (the root path) and,
for each, the sufficient statistics of its *closed* children (mean key and
value, leaf count, position embedding, energy). A new token either continues
the current family or first closes families and then opens new ones
(``close`` / ``open`` of :meth:`HierarchicalKVCache.append`). Each step
attends, at every open level, to at most ``b`` closed siblings (one batched
attention for all levels, then two small ops per level for the energies), so
its cost and the cache size are :math:`O(b \log_b N)` for ``N`` tokens, against
:math:`O(N)` for :class:`~hiergraph.nn.FlatKVCache`. The outputs equal the strictly causal
full pass :func:`~hiergraph.ops.hsa.causal.causal_hierarchical_attention`
token by token; :meth:`HierarchicalKVCache.prefill` starts a cache with a whole prompt from
one such pass.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from hiergraph._autograd import records_grad
from hiergraph._device import host_tensor
from hiergraph._precision import accumulation_dtype
from hiergraph.nn._checks import check_cache_arguments, check_cache_inputs, check_int
from hiergraph.nn.kv_schedule import check_one_tree
from hiergraph.ops.hsa import native
from hiergraph.ops.hsa.causal import causal_statistics
from hiergraph.plan import CausalPlan


class HierarchicalKVCache:
    r"""Incremental strictly causal HSA, token by token (App. G.2 of the HSA paper).

    Holds the open nodes :math:`O_0` (root) :math:`\supset O_1 \supset \dots
    \supset O_{m-1}` of the latest leaf's path. For each, the closed children
    :math:`B` keep :math:`\rho_k(B), \varepsilon(B), \log n(B), n(B)` and
    :math:`\rho_v(B)`, and the node the sum :math:`\sum_B n(B)\,g(B)` that the
    energy of its open child needs; each path node :math:`A_s` keeps its prefix
    query sum and leaf count (see
    :func:`~hiergraph.ops.hsa.causal.causal_hierarchical_attention` for the
    formulas).

    **One step is a few fused tensor ops.** The attentions of all path nodes
    depend only on their prefix sums, not on the energies, so the queries of
    all levels are formed at once and *one* batched masked attention over the
    padded store of closed children (``[levels, H, capacity, d + c + 2]`` keys,
    an unused slot masked by a very negative :math:`\log n`) gives every
    level's :math:`\mathrm{lse}` and :math:`\vartheta`. The new leaf is stored
    as a closed child of its parent before the attention (it is one from the
    next step on), so the deepest level's softmax also covers the leaf's own
    energy: its :math:`\mathrm{lse}` is the leaf's :math:`g`, and its
    :math:`\vartheta` already mixes in the leaf's value. Only the energies of
    the inner path nodes are a recursion over the levels, two ops on
    ``[H]``-sized rows per level; the log gate products are one matrix
    product (a cumulative sum of :math:`\log\mu`, plus :math:`\log(1-\mu)`) and
    the output one batched product. The store is preallocated (capacities
    double when full) and indexed with host-side counts (no ``torch.cat`` of the
    store, no host synchronisation); the views a step needs are made once per
    depth and family width.

    **On the CPU it is one call.** The step after the host-side bookkeeping (families
    closed and opened, the leaf's slot) runs in the compiled kernel
    (:mod:`hiergraph.ops.hsa.native`): the same formulas on the same store, every level's
    softmax over exactly its closed children, about 3× faster than the tensor operations
    at 4 heads of 32 channels. Elsewhere, under ``torch.compile`` and where the kernel
    cannot be built, the tensor operations run.

    **Several sequences.** Heads never mix, so ``B`` sequences with the same events (one
    tree shape: samples drawn from one prompt, prompts of one length on window trees)
    decode as one cache of ``B * H`` heads: per step ``q, k [B, H, d]`` and ``v [B, H,
    d_v]`` reshaped to ``[B * H, ·]``, the new nodes' embeddings repeated per sequence
    (``pos_emb.repeat(1, B, 1)``), the output viewed back as ``[B, H, d_v]``. Sequences
    whose trees differ need a cache each.

    Args:
        heads, dim, dim_v: shapes of the per-token ``q, k [H, d]`` and ``v [H, d_v]``.
        pos_dim: size of the per-node position embeddings (0: none).
        scale: logit scale :math:`\tau`, default :math:`1/\sqrt{d}`.
        dtype, device: of the outputs (inputs are cast to ``dtype``). The statistics are
            stored in float32 for bfloat16 and float16 (float64 for float64): they are
            running sums, which stall in half precision (a bf16 store's outputs erred by
            32% after 8,192 tokens of a window tree).

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
        check_cache_arguments(heads, dim, dim_v, scale, dtype)
        check_int(pos_dim, "pos_dim", minimum=0)
        self.heads, self.dim, self.dim_v = heads, dim, dim if dim_v is None else dim_v
        self.pos_dim = pos_dim
        self.tau = dim**-0.5 if scale is None else scale
        self.dtype = dtype
        like = torch.empty(0, dtype=accumulation_dtype(dtype), device=device)  # the store's
        # the log n of an unused key slot: its weight exp(logit - max logit) underflows to 0,
        # and a level without closed children gets lse ~ _masked, so g = a and its gate
        # 1 - mu = sigmoid(lse - a) is 0 (finite, unlike -inf, which would give inf - inf)
        self._masked = torch.finfo(like.dtype).min / 4
        self._tau = like.new_full((), self.tau)
        self._zero = like.new_zeros(())
        self._leaf_tail = like.new_tensor([0.0, 1.0])  # log n, n
        self._qk_shape, self._v_shape = (heads, dim), (heads, self.dim_v)
        # per open node, root first: the leaf counts of its closed children (the latest
        # leaf, a closed child of its parent from its own step on, included), and their sum
        self._child_n: list[list[int]] = [[]]
        self._leaves = [0]
        self.num_tokens = 0
        self._alloc(like, levels=8, capacity=8)

    # ----------------------------------------------------------------- storage
    def _alloc(self, like: Tensor, levels: int, capacity: int) -> None:
        """(Re)allocate the store for ``levels`` open nodes of ``capacity`` closed children,
        keeping what the old one held.

        Open node ``j`` has path node ``A_{j+1}`` as open child. ``_keys[j]``,
        ``_values[j]``: its closed children ``[ρ_k, ε, log n, n]`` and ``[ρ_v, 1]``;
        ``_ng[j]``: their ``Σ n g``. Rows ``j`` of ``_query`` (``[τ ρ_q, ε, 1, 0]``),
        ``_prefix`` (``[τ Σq, n]``) and ``_g``: ``A_{j+1}``'s prefix at the latest token.
        Per-step rows: ``_lse_a`` (``[lse; a; lse]``: one subtraction gives ``[lse - a;
        a - lse]``, into ``_diff``), ``_gate_logs`` (``[-log mu; -log(1 - mu); log Σ
        e^{s - max s}]``) and ``_weight``."""
        h, d, dv, c = self.heads, self.dim, self.dim_v, self.pos_dim
        new = {
            "_keys": like.new_zeros((levels, h, capacity, d + c + 2)),
            "_values": like.new_ones((levels, h, capacity, dv + 1)),
            "_query": like.new_zeros((levels, h, d + c + 2)),
            "_prefix": like.new_ones((levels, h, d + 1)),
            "_ng": like.new_zeros((levels, h)),
            "_g": like.new_zeros((levels, h)),
            "_lse_a": like.new_zeros((3, levels, h)),
            "_diff": like.new_zeros((2, levels, h)),
            "_gate_logs": like.new_zeros((3, levels, h)),
            "_weight": like.new_zeros((levels, h)),
        }
        new["_keys"][..., -2] = self._masked
        new["_query"][..., -2] = 1.0
        new["_lse_a"][1] = self._masked
        for name, buffer in new.items():
            old = getattr(self, name, None)
            if old is not None:
                buffer[tuple(slice(0, size) for size in old.shape)] = old
            setattr(self, name, buffer)
        # rows of a that hold _masked (host-side), as the leaf's parent needs
        masked = getattr(self, "_a_masked", [])
        self._a_masked = masked + [True] * (levels - len(masked))
        self._rows = (
            self._lse_a[1].unbind(0),
            self._g.unbind(0),
            self._lse_a[0].unbind(0),
            self._ng.unbind(0),
        )
        # views by depth, by (depth, width) and by child slot, valid until the next
        # reallocation: a step takes no slices of its own
        self._by_depth: dict[int, tuple] = {}
        self._by_width: dict[tuple[int, int], tuple] = {}
        self._by_slot: dict[tuple[int, int], tuple] = {}

    def _depth_views(self, m: int) -> tuple:
        """The views of the store that a step whose leaf is at depth ``m`` reads and writes,
        in the order :meth:`_step` unpacks them (made once per depth)."""
        views = self._by_depth.get(m)
        if views is None:
            h, d, levels, weight = self.heads, self.dim, self._keys.size(0), self._weight[:m]
            # log weight_s = sum_{r<s} log mu_r + log(1 - mu_s) - log total_s: one product
            # with the rows [-log mu; -log(1 - mu); log total] of _gate_logs
            gates, ones = self._gate_logs.new_zeros((1, m, 3, levels)), self._g.new_ones((m, m))
            gates[0, :, 0, :m] = -ones.tril(-1)
            gates[0, :, 1, :m] = gates[0, :, 2, :m] = -ones.tril().triu()
            log_total = self._gate_logs[2, :m]
            views = self._by_depth[m] = (
                self._query[:m].view(m * h, -1, 1),
                self._query[:m, :, :d],
                self._prefix[:m, :, :d],
                self._prefix[:m, :, d:],  # n of A_1 .. A_m
                self._prefix[m - 1, :, :d],
                self._prefix[m - 1],
                self._prefix[: m - 1],
                self._prefix[: m - 1, :, d],
                self._ng[1:m],
                self._lse_a[1, : m - 1],
                self._lse_a[0::2, :m],  # [lse; lse]
                self._lse_a[:2, :m],  # [lse; a]
                self._lse_a[1:, :m],  # [a; lse]
                self._diff[:, :m],
                self._gate_logs[:2, :m],
                log_total,
                log_total.expand(2, m, h),
                gates.view(1, m, 3 * levels),
                self._gate_logs.view(1, 3 * levels, h),
                weight,
                weight[None],
                weight.T[:, None, :],
            )
        return views

    def _width_views(self, m: int, width: int) -> tuple:
        """The first ``width`` closed-child slots of ``m`` open nodes as batched keys and
        values ``[m * H, width, ·]``, and the buffers of their attention, in the order
        :meth:`_step` unpacks them (made once per ``(m, width)``)."""
        views = self._by_width.get((m, width))
        if views is None:
            if len(self._by_width) >= 256:  # a wide root: do not keep one per width
                self._by_width.clear()
            mh, h, dv = m * self.heads, self.heads, self.dim_v
            logits = self._keys.new_empty((m, h, width))
            weights = torch.empty_like(logits)
            max_logit = self._keys.new_empty((m, h, 1))
            theta = self._values.new_empty((m, h, dv + 1))  # [sum_B e^s rho_v, sum_B e^s]
            views = self._by_width[m, width] = (
                self._keys[:m, :, :width].reshape(mh, width, -1),
                self._values[:m, :, :width].reshape(mh, width, -1),
                logits,
                logits.view(mh, width, 1),
                max_logit,
                max_logit[..., 0],
                weights,
                weights.view(mh, 1, width),
                theta.view(mh, 1, -1),
                theta[..., dv],
                theta[..., :dv].transpose(0, 1),
            )
        return views

    def _slot_views(self, j: int, slot: int) -> tuple:
        """The parts of closed-child ``slot`` of open node ``j``, each ``[H, ·]``: the key's
        ``ρ_k``, ``ε``, ``log n``, ``n`` and ``[log n, n]``, the value ``[ρ_v, 1]`` and its
        ``ρ_v`` (made once per slot)."""
        views = self._by_slot.get((j, slot))
        if views is None:
            if len(self._by_slot) >= 256:
                self._by_slot.clear()
            key, d, value = self._keys[j, :, slot], self.dim, self._values[j, :, slot]
            views = self._by_slot[j, slot] = (
                key[:, :d], key[:, d:-2], key[:, -2], key[:, -1], key[:, -2:],
                value, value[:, : self.dim_v],
            )  # fmt: skip
        return views

    def _add_child(self, j: int, n: int) -> int:
        """Count a closed child of ``n`` leaves under open node ``j``; its slot (the store
        grows when full)."""
        slot = len(self._child_n[j])
        if slot == self._keys.size(2):
            self._alloc(self._keys, self._keys.size(0), 2 * slot)
        self._child_n[j].append(n)
        self._leaves[j] += n
        return slot

    def _complete(self, j: int) -> None:
        """Store the open child ``A_{j+1}`` of open node ``j``, complete now (its own open
        node ``j + 1`` is closed), as a closed child of ``j``."""
        d, n = self.dim, self._leaves[j + 1]
        key, eps, log_n, count, _, value, _ = self._slot_views(j, self._add_child(j, n))
        # its means: over its children, weighted by their leaf counts
        children = self._keys[j + 1, :, : len(self._child_n[j + 1])]
        weight = children[..., -1:].mT.mul(1.0 / n)  # [H, 1, children]
        torch.bmm(weight, children[..., :d], out=key[:, None])
        torch.bmm(weight, self._values[j + 1, :, : children.size(1)], out=value[:, None])
        if self.pos_dim:
            eps.copy_(self._query[j, :, d:-2])
        log_n.fill_(math.log(n))
        count.fill_(n)
        _, g_rows, _, ng_rows = self._rows
        ng_rows[j].add_(g_rows[j], alpha=n)  # its n g, with g at its last leaf

    @property
    def depth(self) -> int:
        """Depth of the latest leaf (number of open internal nodes)."""
        return len(self._child_n)

    @property
    def family_sizes(self) -> list[int]:
        """Number of closed children of each open node, the root first (the latest leaf is
        the open child of the deepest one)."""
        sizes = [len(children) for children in self._child_n]
        sizes[-1] -= self.num_tokens > 0
        return sizes

    def new_node_slots(self, close: int = 0, open: int = 0) -> list[tuple[int, int]]:  # noqa: A002
        """``(depth, slot)`` of the nodes an ``append(close=, open=)`` would create, top-down
        (the ``open`` new internal nodes, then the leaf): to compute their position embeddings.

        Children are numbered as they come, so ``slot`` is a node's rank ``0, 1, 2, …``
        among its siblings (equal to :attr:`SignalHierarchy.slot` when a family's slots
        have no gaps)."""
        self._check_event(close, open)
        if self.num_tokens == 0:
            top_depth, first_slot = 0, 0
        else:  # the latest leaf is counted already, a completed inner node not yet
            top_depth = self.depth - 1 - close
            first_slot = len(self._child_n[top_depth]) + (close > 0)
        return [(top_depth + 1 + j, first_slot if j == 0 else 0) for j in range(open + 1)]

    def _check_event(self, close: int, open: int) -> None:  # noqa: A002
        check_int(close, "close", minimum=0)
        check_int(open, "open", minimum=0)
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
            ``[H, d_v]``, without autograd history: the steps write into preallocated
            buffers, so ``append`` runs under :func:`torch.no_grad` (train with
            :func:`~hiergraph.ops.hsa.causal.causal_hierarchical_attention`).
        """
        if records_grad(q, k, v, pos_emb):
            with torch.no_grad():
                return self.append(q, k, v, close=close, open=open, pos_emb=pos_emb)
        self._check_step(q, k, v, close, open, pos_emb)
        work = self._keys.dtype
        if q.dtype != work or k.dtype != work or v.dtype != work:
            q, k, v = q.to(work), k.to(work), v.to(work)
        first, m = self._events(close, open)
        # the leaf is a closed child of A_{m-1} from here on: [k, eps, log 1, 1] and [v, 1]
        slot = self._add_child(m - 1, 1)
        key, key_eps, _, _, key_tail, _, value = self._slot_views(m - 1, slot)
        if pos_emb is not None:  # eps of the new nodes A_first .. A_m, the leaf last
            self._query[first - 1 : m, :, self.dim : -2] = pos_emb
            key_eps.copy_(pos_emb[-1])
        self.num_tokens += 1
        if self._native(q):  # the rest of the step in one call of the compiled kernel
            store = (self._keys, self._values, self._query, self._prefix, self._ng, self._g)
            widths = [len(children) for children in self._child_n]
            return self._output(native.kv_step(
                store, q, k, v, m=m, first=first, widths=widths, leaves=self._leaves, slot=slot,
                tau=self.tau,
            ))  # fmt: skip
        key.copy_(k)
        key_tail.copy_(self._leaf_tail)
        value.copy_(v)
        return self._output(self._step(q, first, m, close))

    def _check_step(self, q, k, v, close: int, open: int, pos_emb) -> None:  # noqa: A002
        """The checks of :meth:`append` (its fast test first: the shapes and dtypes)."""
        self._check_event(close, open)
        shapes = q.shape != self._qk_shape or k.shape != self._qk_shape or v.shape != self._v_shape
        if shapes or not (
            q.is_floating_point() and k.is_floating_point() and v.is_floating_point()
        ):
            check_cache_inputs(self, (), q, k, v)
        self._check_pos_emb(pos_emb, open + 1, "open + 1")

    def _check_pos_emb(self, pos_emb: Tensor | None, rows: int, what: str) -> None:
        """Raise unless ``pos_emb`` is ``[rows, heads, pos_dim]``, or ``None`` exactly when the
        cache has no position embeddings (``what`` names ``rows``)."""
        if (pos_emb is None) != (self.pos_dim == 0) or (
            pos_emb is not None and pos_emb.shape != (rows, self.heads, self.pos_dim)
        ):
            raise ValueError(
                f"pos_emb must be [{what} = {rows}, {self.heads}, {self.pos_dim}] (None when "
                "the cache was built with pos_dim=0), got "
                f"{None if pos_emb is None else tuple(pos_emb.shape)}"
            )

    def _events(self, close: int, open: int) -> tuple[int, int]:  # noqa: A002
        """Completes the ``close`` innermost open nodes and starts ``open`` new ones below
        the innermost that remains (host-side counts; the new nodes' rows of the store
        emptied); returns the depth of the first new node and that of the new leaf."""
        child_n, leaves = self._child_n, self._leaves
        if close:  # complete the `close` innermost open nodes (the latest leaf is stored)
            top = len(child_n) - 1
            for j in range(top - 1, top - close - 1, -1):
                self._complete(j)
            del child_n[top - close + 1 :], leaves[top - close + 1 :]
        first = len(child_n)  # depth of the first new node
        m = first + open  # depth of the new leaf
        if open:  # new empty open nodes at depths first .. m - 1
            if m > self._keys.size(0):
                self._alloc(self._keys, max(2 * self._keys.size(0), m), self._keys.size(2))
            self._ng[first:m].zero_()
            self._keys[first:m, :, :, -2].fill_(self._masked)
            child_n.extend([] for _ in range(open))
            leaves.extend([0] * open)
        return first, m

    def _step(self, q: Tensor, first: int, m: int, close: int) -> Tensor:
        """The output ``[H, d_v]`` of a step in tensor operations, the leaf (at depth ``m``,
        under the new nodes from depth ``first`` on, after ``close`` completions) stored."""
        d, leaves = self.dim, self._leaves
        # (the views after the last reallocation; path node A_s is row s - 1)
        (query, query_q, prefix_q, n, leaf_q, leaf, above, n_above, ng_below, a_inner, lse_twice,
         lse_a, a_lse, diff, softplus, log_total, log_total_twice, gates, gate_logs, weight,
         weight_row, weight_t) = self._depth_views(m)  # fmt: skip
        # prefix [tau sum q, n] of A_1 .. A_m: the leaf's [tau q, 1] is added to the rows
        # above it; A_first .. A_m are new
        if first < m:
            self._prefix[first - 1 : m, :, :d].copy_(q).mul_(self._tau)
            self._prefix[first - 1 : m, :, d].fill_(1.0)
            if first > 1:
                self._prefix[: first - 1].add_(leaf)
        else:  # (the common case, on the views of this depth)
            torch.mul(q, self._tau, out=leaf_q)
            if close:
                leaf[:, d].fill_(1.0)
            if m > 1:
                above.add_(leaf)
        torch.div(prefix_q, n, out=query_q)

        # one masked attention of every level's query over its closed children; the
        # deepest level's covers the leaf itself: its lse is the leaf's g
        width = max(map(len, self._child_n))
        (keys, values, logits, logits_col, max_logit, max_logit_row, weights, weights_row,
         theta_row, total, theta_t) = self._width_views(m, width)  # fmt: skip
        torch.bmm(keys, query, out=logits_col)
        torch.amax(logits, -1, keepdim=True, out=max_logit)
        torch.exp(torch.sub(logits, max_logit, out=weights), out=weights)
        torch.bmm(weights_row, values, out=theta_row)  # unnormalised, total weight last
        torch.log(total, out=log_total)
        torch.add(log_total_twice, max_logit_row, out=lse_twice)  # lse [m, H], twice

        # energies of the inner path nodes, bottom-up (the leaf's n g = its lse is added to
        # its parent's sum first): a_s = sum_ng_s / n_s + (n_{s+1} / n_s) g_{s+1},
        # g_s = logaddexp(a_s, lse_s)
        a_rows, g_rows, lse_rows, ng_rows = self._rows
        ng_rows[m - 1].add_(lse_rows[m - 1])
        if m > 1:
            torch.div(ng_below, n_above, out=a_inner)
            a_masked = self._a_masked
            n_node = leaves[m - 1]  # leaf counts of A_{i+1} (host-side)
            for i in range(m - 2, -1, -1):
                if i < m - 2:
                    n_child, n_node = n_node, n_node + leaves[i + 1]
                    a_rows[i].add_(g_rows[i + 1], alpha=n_child / n_node)
                torch.logaddexp(a_rows[i], lse_rows[i], out=g_rows[i])
                a_masked[i] = False
        if not self._a_masked[m - 1]:  # mu = 0 for the leaf's parent (theta mixes v in)
            a_rows[m - 1].fill_(self._masked)
            self._a_masked[m - 1] = True

        # gates: weight_s = prod_{r<s} mu_r (1 - mu_s) / total_s, mu_s = sigmoid(a_s - lse_s),
        # from -log mu = softplus(lse - a) and -log(1 - mu) = softplus(a - lse)
        torch.logaddexp(self._zero, torch.sub(lse_a, a_lse, out=diff), out=softplus)
        torch.exp(torch.bmm(gates, gate_logs, out=weight_row), out=weight_row)
        return torch.bmm(weight_t, theta_t).view(self.heads, self.dim_v)

    def _output(self, out: Tensor) -> Tensor:
        """A step's output, computed in the store's dtype, in the cache's."""
        return out if out.dtype == self.dtype else out.to(self.dtype)

    def prefill(
        self, q: Tensor, k: Tensor, v: Tensor, hierarchy, *, pos_emb: Tensor | None = None
    ) -> Tensor:
        r"""Start the cache with a prompt of ``T`` tokens at once; their outputs.

        The outputs and the cache afterwards are those of ``T`` calls of :meth:`append` with
        the events of :func:`append_schedule`, but computed by one strictly causal full pass
        (:func:`~hiergraph.ops.hsa.causal.causal_statistics`: on the CPU the compiled causal
        kernel of :func:`~hiergraph.ops.causal_hierarchical_attention`, elsewhere its edge
        lists), whose node statistics fill the store: for every node on the last token's
        root path, the sums of its prefix and its closed children's means, counts and
        energies :math:`g` at their last leaves.
        Decoding goes on with :meth:`append`: the events of token ``T`` onwards are the
        rows ``T, T + 1, …`` of the whole tree's :func:`append_schedule`.

        Args:
            q, k: ``[T, H, d]``; v: ``[T, H, d_v]``, the prompt's tokens in leaf order.
            hierarchy: the prompt's tree (one :class:`~hiergraph.data.SignalHierarchy`
                whose leaves are in depth-first order, every leaf below the root) or its
                :class:`~hiergraph.plan.CausalPlan`; ``T`` leaves.
            pos_emb: ``[N, H, c]`` embeddings of the tree's ``N`` nodes (node order);
                required iff ``pos_dim > 0``.

        Returns:
            ``[T, H, d_v]`` in the cache's dtype, without autograd history.

        Raises:
            ValueError: if the cache already holds tokens, or on shapes or trees
                :meth:`append` would not take.
        """
        if records_grad(q, k, v, pos_emb):
            with torch.no_grad():
                return self.prefill(q, k, v, hierarchy, pos_emb=pos_emb)
        if self.num_tokens:
            raise ValueError(
                f"prefill starts a cache, and this one holds {self.num_tokens} tokens already"
            )
        plan = CausalPlan.of(hierarchy)
        check_one_tree(plan)
        size = plan.num_leaves
        check_cache_inputs(self, (size,), q, k, v)
        self._check_pos_emb(pos_emb, plan.num_nodes, "num_nodes")
        device, work = self._keys.device, self._keys.dtype
        if plan.tree_index.device != device:  # (a copy: its cached views are built again)
            plan = plan.to(device)
        eps = None if pos_emb is None else pos_emb.to(device, work)
        out, sums, energy = causal_statistics(
            *(t.to(device, work) for t in (q, k, v)), plan, pos_emb=eps, scale=self.tau
        )
        # the last token's root path A_0 .. A_m and, per open node A_j, its closed children:
        # the left siblings of A_{j+1}, in order (for A_{m-1}, the last leaf too), as one list
        # of nodes with their open node `level` and `slot` (level-major)
        m = int(plan.leaf_depth[-1])
        path = plan.ancestors[-1, : m + 1]
        level, pair = (path[1:, None] == plan.sib_query[None, :]).nonzero(as_tuple=True)
        nodes = torch.cat([plan.sib_key[pair], path[-1:]])
        level = torch.cat([level, level.new_full((1,), m - 1)])
        level_of, counts = torch.stack([level, plan.count[nodes]]).tolist()
        widths = [level_of.count(j) for j in range(m)]
        starts = [sum(widths[:j]) for j in range(m)]
        self._child_n = [counts[start : start + w] for start, w in zip(starts, widths, strict=True)]
        self._leaves = [sum(n) for n in self._child_n]
        levels, capacity = self._keys.shape[0], self._keys.shape[2]
        if m > levels or max(widths) > capacity:
            self._alloc(self._keys, max(levels, m), max(capacity, max(widths)))
        slot = host_tensor([i - starts[j] for i, j in enumerate(level_of)], level.device)
        d, c, dv = self.dim, self.pos_dim, self.dim_v
        n = plan.count[nodes].to(work)
        mean = sums[nodes] / n[:, None, None]  # [K, H, d + d + d_v]
        self._keys[level, :, slot, :d] = mean[..., d : 2 * d]
        if c:
            self._keys[level, :, slot, d : d + c] = eps[nodes]
        self._keys[level, :, slot, -2] = n.log()[:, None]
        self._keys[level, :, slot, -1] = n[:, None]
        self._values[level, :, slot, :dv] = mean[..., 2 * d :]
        self._ng[:m] = self._ng.new_zeros(m, self.heads).index_add_(
            0, level, n[:, None] * energy[nodes]
        )
        inner = path[1:]  # A_1 .. A_m: rows 0 .. m - 1 of the path's statistics
        self._prefix[:m, :, :d] = self.tau * sums[inner, :, :d]
        self._prefix[:m, :, d] = plan.count[inner, None].to(work)
        if c:
            self._query[:m, :, d:-2] = eps[inner]
        self._g[:m] = energy[inner]
        self.num_tokens = size
        return out.to(self.dtype)

    def _native(self, q: Tensor) -> bool:
        """Whether the step runs in the compiled kernel (:mod:`hiergraph.ops.hsa.native`):
        on the CPU (the store is float32 or float64), outside ``torch.compile``, and the
        extension built (on the first such step)."""
        return (
            q.device.type == "cpu"
            and not torch.compiler.is_compiling()
            and native.extension() is not None
        )

    def nbytes(self) -> int:
        """Bytes of the live statistics (the right-skewed sub-tree): the closed children of
        the open nodes and the path nodes' prefix statistics; the preallocated store holds
        more."""
        child = self._keys.size(-1) + self._values.size(-1)
        path = self._query.size(-1) + self._prefix.size(-1) + 2
        live = sum(map(len, self._child_n)) * child + self.depth * path
        return live * self.heads * self._keys.element_size()
