r"""Dense reference for HSA: the attention matrix :math:`\hat\Theta` and the energy :math:`\varphi`.

Written independently of the fast path (explicit leaf sets, exponentials of
each family's gate, one root-to-leaf walk per row) for small trees in tests and
debugging. Cost :math:`O(H L^2 \cdot \text{depth})` in Python loops: keep
``L`` below a few hundred.
"""

from __future__ import annotations

import torch
from torch import Tensor

from hiergraph.data.signal_hierarchy import as_hierarchy


class _Tree:
    """Children lists (in slot order), leaf sets and paths of a forest."""

    def __init__(self, hierarchy, leaf_mask: Tensor | None):
        hierarchy = as_hierarchy(hierarchy)  # (node arrays: a TreeIndex has none)
        parent = hierarchy.parent.tolist()
        slot = hierarchy.slot.tolist()
        is_leaf = hierarchy.is_leaf.tolist()
        n = len(parent)
        self.roots = [i for i in range(n) if parent[i] == i]
        self.parent = parent
        children = [[] for _ in range(n)]
        for c in sorted((c for c in range(n) if parent[c] != c), key=lambda c: slot[c]):
            children[parent[c]].append(c)
        self.children = children
        leaf_nodes = [i for i in range(n) if is_leaf[i]]
        self.leaf_of_node = {node: i for i, node in enumerate(leaf_nodes)}
        self.leaf_nodes = leaf_nodes
        valid = [True] * len(leaf_nodes) if leaf_mask is None else leaf_mask.tolist()
        self.valid = valid
        self.leaves_below = [[] for _ in range(n)]
        for node, i in self.leaf_of_node.items():
            if not valid[i]:
                continue
            a = node
            while True:
                self.leaves_below[a].append(i)
                if parent[a] == a:
                    break
                a = parent[a]

    def path(self, node: int) -> list[int]:
        """Nodes from the root down to ``node``."""
        out = [node]
        while self.parent[out[-1]] != out[-1]:
            out.append(self.parent[out[-1]])
        return out[::-1]


def _head_stats(tree, q, k, eps, tau, include_self, leaky_causal, size_bias=True):
    """Per node: leaf count, logits to siblings, and a = -phi (eq. 8), for one head."""
    n = [len(s) for s in tree.leaves_below]
    rho_q = [q[s].mean(0) if s else None for s in tree.leaves_below]
    rho_k = [k[s].mean(0) if s else None for s in tree.leaves_below]
    sib_logits = {}  # node -> {sibling: s(node, sibling)}
    for fam in tree.children:
        for c in fam:
            if n[c] == 0:
                continue
            keys = fam[: fam.index(c)] if leaky_causal else [b for b in fam if b != c]
            logits = {}
            for b in keys:
                if n[b] == 0:
                    continue
                s = tau * rho_q[c] @ rho_k[b]
                if size_bias:
                    s = s + torch.log(torch.tensor(float(n[b]), dtype=q.dtype))
                if eps is not None:
                    s = s + eps[c] @ eps[b]
                logits[b] = s
            sib_logits[c] = logits

    a = {}  # a(node) = -phi(node), children before their parents (no recursion: deep trees)
    for node in sorted(range(len(n)), key=lambda node: -len(tree.path(node))):
        if n[node] == 0:
            continue
        if node in tree.leaf_of_node:
            i = tree.leaf_of_node[node]
            if not include_self:
                a[node] = torch.tensor(float("-inf"), dtype=q.dtype)
                continue
            e = tau * q[i] @ k[i]
            a[node] = e + eps[node] @ eps[node] if eps is not None else e
            continue
        total = torch.zeros((), dtype=q.dtype)
        for c in tree.children[node]:
            if n[c] == 0:
                continue
            terms = [a[c], *sib_logits[c].values()]
            total = total + n[c] / n[node] * torch.logsumexp(torch.stack(terms), 0)
        a[node] = total
    return n, sib_logits, a


def _gate(a_node, logits):
    """(mu, 1 - mu, softmax over siblings), the exponentials shifted by the largest term
    (plain ones overflow float32 from logits of about 88 on)."""
    top = torch.stack([a_node, *logits.values()]).max()
    if top == float("-inf"):  # no self energy and no sibling: no mass moves
        return 0.0, 0.0, {}
    self_term = torch.exp(a_node - top)
    sib = {b: torch.exp(s - top) for b, s in logits.items()}
    z = sum(sib.values(), torch.zeros((), dtype=a_node.dtype))
    denom = self_term + z
    soft = {b: e / z for b, e in sib.items()} if z > 0 else {}
    return self_term / denom, z / denom, soft


def hierarchical_attention_matrix(
    q: Tensor,
    k: Tensor,
    hierarchy,
    *,
    pos_emb: Tensor | None = None,
    include_self: bool = False,
    leaky_causal: bool = False,
    leaf_mask: Tensor | None = None,
    scale: float | None = None,
    size_bias: bool = True,
) -> Tensor:
    r"""The dense HSA matrix :math:`\hat\Theta` (``[H, L, L]``); HSA returns :math:`\hat\Theta V`.

    Entry :math:`(i, j)` with :math:`A_t = \mathrm{ica}(i, j)` and
    :math:`A_{t+1} \ni i`, :math:`D \ni j` siblings:
    :math:`\hat\Theta_{ij} = \prod_{s=1}^{t}\mu(A_s)\,(1-\mu(A_{t+1}))\,
    \mathrm{softmax}_D\,s(A_{t+1},\cdot)\,/\,n(D)` (eq. 9–11 unrolled along Alg. 1–3);
    with ``include_self`` the diagonal is :math:`\prod_{s=1}^{m}\mu(A_s)`.
    Arguments are those of :func:`~hiergraph.ops.hierarchical_attention`, except that
    ``hierarchy`` cannot be a :class:`~hiergraph.plan.TreeIndex`.

    Args:
        q, k: ``[L, H, d]`` queries and keys in leaf order (``[L, d]`` is treated as one
            head).
        hierarchy: a :class:`~hiergraph.data.SignalHierarchy`, a PyG batch of them, or a
            graph with its community tree (its node arrays are read on the host).
        pos_emb: optional ``[N, c]``, ``[N, 1, c]`` or ``[N, H, c]`` position embedding
            :math:`\varepsilon` of every tree node (node order); siblings get the logit
            bias :math:`\varepsilon(C)^\top\varepsilon(B)`.
        include_self: give each leaf the self energy
            :math:`\tau q_i^\top k_i + \varepsilon_i^\top\varepsilon_i`; without it the
            diagonal is excluded.
        leaky_causal: a node attends only to its left siblings (lower ``slot``), the
            paper's sibling masking (App. G.1).
        leaf_mask: optional ``[L]`` bool, ``False`` for padding leaves: they are removed
            from all statistics and their rows are zero.
        scale: logit scale :math:`\tau`, default :math:`1/\sqrt{d}`.
        size_bias: keep the :math:`\log n(B)` term of the sibling logits; ``False`` drops
            it (an ablation).

    Returns:
        ``[H, L, L]`` (``[1, L, L]`` for 2-D inputs), in the dtype of ``q``.
    """
    if q.dim() == 2:
        q, k = q.unsqueeze(1), k.unsqueeze(1)
    num_leaves, heads, dim = q.shape
    tau = dim**-0.5 if scale is None else scale
    tree = _Tree(hierarchy, leaf_mask)
    out = q.new_zeros(heads, num_leaves, num_leaves)
    for h in range(heads):
        eps = None if pos_emb is None else _head(pos_emb, h)
        n, sib_logits, a = _head_stats(
            tree, q[:, h], k[:, h], eps, tau, include_self, leaky_causal, size_bias
        )
        for i, node in enumerate(tree.leaf_nodes):
            if not tree.valid[i]:
                continue
            mass = torch.ones((), dtype=q.dtype)
            for c in tree.path(node)[1:]:
                mu, one_minus_mu, soft = _gate(a[c], sib_logits[c])
                for b, p in soft.items():
                    out[h, i, tree.leaves_below[b]] += mass * one_minus_mu * p / n[b]
                mass = mass * mu
            if include_self:
                out[h, i, i] += mass
    return out


def hierarchy_energy(
    q: Tensor,
    k: Tensor,
    hierarchy,
    *,
    pos_emb: Tensor | None = None,
    include_self: bool = False,
    scale: float | None = None,
) -> Tensor:
    r"""Energy :math:`\varphi(R)` of every root (eq. 8 with the dot-product energy of eq. 16).

    Constants (the :math:`\sqrt d` of eq. 16) are dropped; they cancel in
    HSA. With :math:`V = K`, HSA satisfies
    :math:`\mathrm{out}_i = -\frac{|\ell(R)|}{\tau}\,\partial\varphi(R)/\partial q_i`
    (the gradient recurrence, eq. 9–11), which the tests check with autograd.

    Args:
        q, k: ``[L, H, d]`` queries and keys in leaf order (``[L, d]`` is treated as one
            head).
        hierarchy: a :class:`~hiergraph.data.SignalHierarchy`, a PyG batch of them, or a
            graph with its community tree, as in :func:`hierarchical_attention_matrix`.
        pos_emb: optional ``[N, c]``, ``[N, 1, c]`` or ``[N, H, c]`` position embedding
            :math:`\varepsilon` of every tree node (node order).
        include_self: give each leaf the self energy
            :math:`\tau q_i^\top k_i + \varepsilon_i^\top\varepsilon_i`; without it a
            leaf's :math:`a = -\varphi` is :math:`-\infty`.
        scale: logit scale :math:`\tau`, default :math:`1/\sqrt{d}`.

    Returns:
        ``[num_trees, H]``, the roots in node order.
    """
    if q.dim() == 2:
        q, k = q.unsqueeze(1), k.unsqueeze(1)
    num_leaves, heads, dim = q.shape
    tau = dim**-0.5 if scale is None else scale
    tree = _Tree(hierarchy, None)
    rows = []
    for h in range(heads):
        eps = None if pos_emb is None else _head(pos_emb, h)
        _, _, a = _head_stats(tree, q[:, h], k[:, h], eps, tau, include_self, False)
        rows.append(torch.stack([-a[r] for r in tree.roots]))
    return torch.stack(rows, dim=1)


def _head(pos_emb: Tensor, h: int) -> Tensor:
    """Head ``h``'s ``[N, c]`` embeddings of ``pos_emb`` ``[N, c]`` or ``[N, 1 | H, c]``
    (one head's rows are every head's)."""
    if pos_emb.dim() == 2:
        return pos_emb
    return pos_emb[:, h if pos_emb.size(1) > 1 else 0]
