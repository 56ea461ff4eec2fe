r"""A causal language model on HSA: the Hierarchical Transformer *Decoder* (App. G).

Training runs the strictly causal full pass
(:func:`~hiergraph.ops.hsa.causal.causal_hierarchical_attention`) over a batch
of token trees; generation feeds one token at a time through per-layer
:class:`~hiergraph.nn.HierarchicalKVCache` s and gives the same outputs.
``attention='flat'`` is the same model on the one-level view of every tree
(standard causal softmax attention, with a :class:`~hiergraph.nn.FlatKVCache`),
the baseline of equal size.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch_geometric.utils import to_dense_batch

from hiergraph._checks import check_ids, described, holds_integers
from hiergraph._deprecation import renamed_arguments
from hiergraph._device import host_tensor
from hiergraph.nn._checks import check_int, check_probability
from hiergraph.nn._reset import reset
from hiergraph.nn.flat_kv_cache import FlatKVCache
from hiergraph.nn.hierarchical_kv_cache import HierarchicalKVCache
from hiergraph.nn.kv_schedule import check_one_tree
from hiergraph.ops.hsa.causal import causal_hierarchical_attention
from hiergraph.plan import CausalPlan

ATTENTION_MODES = ("hsa", "flat")


def fold_heads(x: Tensor) -> Tensor:
    """``[B, L, H, c]`` (``B`` sequences on the same tree) → ``[L, B * H, c]``: the sequences'
    heads side by side, sequence-major (heads never mix, so one op or cache serves them all)."""
    return x.transpose(0, 1).reshape(x.size(1), x.size(0) * x.size(2), x.size(3))


class CausalSelfAttention(nn.Module):
    r"""Multi-head strictly causal attention: hierarchical (HSA) or flat.

    .. math::
        q_i = \mathrm{LN}(W_Q x_i),\ k_i = \mathrm{LN}(W_K x_i),\ v_i = W_V x_i,\
        \varepsilon(A) = P\,e(A), \qquad
        \mathrm{out}_i = W_O \big\|_h \big(\hat\Theta^{c,h} V^h\big)_i

    with :math:`\hat\Theta^{c}` the causal HSA matrix over the tree
    (logit bias :math:`\varepsilon(A)^\top\varepsilon(B)` among siblings) or,
    for ``attention='flat'``, causal softmax of
    :math:`\tau q_i^\top k_j + \varepsilon_i^\top\varepsilon_j` over the
    tokens of each tree (:math:`\varepsilon` of the position in the tree).
    The LayerNorms have no affine parameters (Prop. 3.1 of the HSA paper).

    Args:
        channels: model width; ``heads`` must divide it.
        heads: attention heads.
        pos_channels: size of the incoming node embeddings :math:`e` (0: none).
        pos_head_channels: per-head size of :math:`\varepsilon` (default 16).
        attention: ``'hsa'`` or ``'flat'``.
    """

    def __init__(
        self,
        channels: int,
        heads: int = 4,
        pos_channels: int = 0,
        pos_head_channels: int = 16,
        attention: str = "hsa",
    ):
        super().__init__()
        if attention not in ATTENTION_MODES:
            raise ValueError(f"attention must be one of {ATTENTION_MODES}, got {attention!r}")
        check_int(channels, "channels")
        check_int(heads, "heads")
        check_int(pos_channels, "pos_channels", minimum=0)
        check_int(pos_head_channels, "pos_head_channels")
        if channels % heads:
            raise ValueError(f"heads={heads} must divide channels={channels}")
        self.channels, self.heads, self.head_channels = channels, heads, channels // heads
        self.attention = attention
        self.qkv = nn.Linear(channels, 3 * channels)
        self.norm = nn.LayerNorm(self.head_channels, elementwise_affine=False)
        self.pos_head_channels = pos_head_channels if pos_channels else 0
        self.pos = (
            nn.Linear(pos_channels, heads * pos_head_channels, bias=False) if pos_channels else None
        )
        self.out = nn.Linear(channels, channels)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        self.qkv.reset_parameters()
        self.out.reset_parameters()
        if self.pos is not None:
            self.pos.reset_parameters()

    def _project(self, x: Tensor, pos_emb: Tensor | None):
        q, k, v = self.qkv(x).view(*x.shape[:-1], 3, self.heads, self.head_channels).unbind(-3)
        eps = None
        if self.pos is not None and pos_emb is not None:
            eps = self.pos(pos_emb).view(*pos_emb.shape[:-1], self.heads, self.pos_head_channels)
        return self.norm(q), self.norm(k), v, eps

    def _augment(self, q: Tensor, k: Tensor, eps: Tensor | None, eps_q: Tensor | None = None):
        """Fold the position bias into the dot product: :math:`\\tau q'^\\top k' = \\tau
        q^\\top k + \\varepsilon_i^\\top\\varepsilon_j`."""
        if eps is None:
            return q, k
        tau = self.head_channels**-0.5
        eps_q = eps if eps_q is None else eps_q
        return torch.cat([q, eps_q / tau], -1), torch.cat([k, eps], -1)

    def forward(
        self, x: Tensor, plan: CausalPlan, pos_emb: Tensor | None, batch: Tensor, cache=None
    ):
        r"""Full causal pass.

        Args:
            x: ``[L, channels]`` token features in leaf order, or ``[B, L, channels]``: ``B``
                sequences on the same trees (their heads side by side, :func:`fold_heads`).
            plan: the :class:`~hiergraph.plan.CausalPlan` of the trees.
            pos_emb: ``[N, pos_channels]`` node embeddings (``hsa``), or
                ``[L, pos_channels]`` token-position embeddings (``flat``).
            batch: ``[L]`` tree of every token (``flat``: attention stays in a tree).
            cache: an empty cache of :meth:`new_cache` (for ``B`` sequences) that the pass
                fills with its tokens (a prompt; one tree), after which :meth:`step` goes on
                decoding.
        """
        q, k, v, eps = self._project(x, pos_emb)
        sequences = x.size(0) if x.dim() == 3 else None
        if sequences is not None:
            q, k, v = (fold_heads(t) for t in (q, k, v))
            eps = None if eps is None else eps.repeat(1, sequences, 1)
        heads = q.size(1)
        if self.attention == "hsa" and cache is not None:
            out = cache.prefill(q, k, v, plan, pos_emb=eps)
        elif self.attention == "hsa":
            out = causal_hierarchical_attention(q, k, v, plan, pos_emb=eps)
        else:
            qa, ka = self._augment(q, k, eps)
            if cache is not None:
                cache.extend(ka, v)
            dense = [to_dense_batch(t.flatten(1), batch)[0] for t in (qa, ka, v)]
            mask = to_dense_batch(v[:, 0, :1], batch)[1]
            b, t = mask.shape
            qd, kd, vd = (d.view(b, t, heads, -1).transpose(1, 2) for d in dense)
            causal = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
            attn_mask = (causal & mask[:, None, :])[:, None]
            out = F.scaled_dot_product_attention(
                qd, kd, vd, attn_mask=attn_mask, scale=self.head_channels**-0.5
            )
            out = out.transpose(1, 2).reshape(b * t, heads, -1)[mask.view(-1)]
        if sequences is not None:  # [L, B * H, d_h] -> [B, L, channels]
            return self.out(out.reshape(out.size(0), sequences, self.channels).transpose(0, 1))
        return self.out(out.reshape(x.size(0), self.channels))

    def step(self, x: Tensor, cache, pos_emb: Tensor | None, close: int = 0, open: int = 0):  # noqa: A002
        """One decoding step: ``x [channels]`` → ``[channels]`` (``[B, channels]``: ``B``
        sequences with the same events, in a cache of :meth:`new_cache` for ``B``);
        ``pos_emb`` holds the embeddings of the new nodes (``hsa``, ``[open + 1,
        pos_channels]``) or of the token's position (``flat``, ``[1, pos_channels]``)."""
        q, k, v, _ = self._project(x.view(-1, self.channels), None)  # [B, H, d_h]
        sequences = q.size(0)
        q, k, v = (t.reshape(sequences * self.heads, -1) for t in (q, k, v))
        eps = None
        if self.pos is not None:
            eps = self.pos(pos_emb).view(-1, self.heads, self.pos_head_channels)
            eps = eps.repeat(1, sequences, 1) if sequences > 1 else eps
        if self.attention == "hsa":
            out = cache.append(q, k, v, close=close, open=open, pos_emb=eps)
        else:
            qa, ka = self._augment(q, k, None if eps is None else eps[-1])
            out = cache.append(qa, ka, v)
        return self.out(out.reshape(x.shape))

    def new_cache(self, dtype=torch.float32, device=None, sequences: int = 1):
        """An empty cache for :meth:`step` and a prompt's :meth:`forward`, for ``sequences``
        sequences with the same events (their heads side by side)."""
        check_int(sequences, "sequences")
        heads = self.heads * sequences
        if self.attention == "hsa":
            return HierarchicalKVCache(
                heads, self.head_channels, pos_dim=self.pos_head_channels,
                dtype=dtype, device=device,
            )  # fmt: skip
        return FlatKVCache(
            heads, self.head_channels + self.pos_head_channels, self.head_channels,
            scale=self.head_channels**-0.5, dtype=dtype, device=device,
        )  # fmt: skip


class HTEDecoderLayer(nn.Module):
    r"""Pre-norm decoder block: ``x + Attn(LN x)``, then ``x + MLP(LN x)``.

    ``Attn`` is the strictly causal multi-head attention of :class:`HTEDecoder`
    (hierarchical or flat, queries and keys LayerNorm-ed per head without affine
    parameters), ``MLP`` is ``Linear → GELU → Linear``, and the two ``LN`` are affine.

    Args:
        channels: model width; ``heads`` must divide it.
        heads: attention heads.
        mlp_channels: MLP hidden size.
        pos_channels: size of the incoming node embeddings :math:`e`, projected per head
            to a 16-channel sibling bias :math:`\varepsilon` (0: no position bias).
        attention: ``'hsa'`` or ``'flat'``.
        dropout: dropout on the attention and MLP outputs before each residual sum, in
            :meth:`forward` only, not in :meth:`step` (default 0).
    """

    def __init__(
        self,
        channels: int,
        heads: int,
        mlp_channels: int,
        pos_channels: int,
        attention: str,
        dropout: float = 0.0,
    ):
        super().__init__()
        self.attn = CausalSelfAttention(channels, heads, pos_channels, attention=attention)
        self.norm1, self.norm2 = nn.LayerNorm(channels), nn.LayerNorm(channels)
        self.mlp = nn.Sequential(
            nn.Linear(channels, mlp_channels), nn.GELU(), nn.Linear(mlp_channels, channels)
        )
        self.dropout = nn.Dropout(dropout)

    def reset_parameters(self) -> None:
        for module in (self.attn, self.norm1, self.norm2, self.mlp):
            reset(module)

    def forward(self, x, plan, pos_emb, batch, cache=None):
        x = x + self.dropout(self.attn(self.norm1(x), plan, pos_emb, batch, cache))
        return x + self.dropout(self.mlp(self.norm2(x)))

    def step(self, x, cache, pos_emb, close, open):  # noqa: A002
        x = x + self.attn.step(self.norm1(x), cache, pos_emb, close, open)
        return x + self.mlp(self.norm2(x))


class HTEDecoder(nn.Module):
    r"""Causal language model over token hierarchies (HSA decoder, App. G of the HSA paper).

    Tokens are the leaves of a signal hierarchy (e.g. document → sentences →
    words → bytes) in depth-first order. Every node gets a learned embedding
    of its ``(depth, rank)``, ``rank`` its position ``0, 1, 2, …`` among its
    siblings in ``slot`` order (gaps in the slots are ignored, as in
    generation, where children are numbered as they come); each layer
    projects it per head into the sibling bias
    :math:`\varepsilon(A)^\top\varepsilon(B)`. Output logits are tied to the
    token embedding.

    ``attention='flat'`` is the baseline with exactly the same parameters:
    causal softmax over all previous tokens of the tree, with the embedding
    of ``(1, position)`` as :math:`\varepsilon` (slots run to ``max_slot``).

    Args:
        vocab_size: number of token ids.
        hidden_channels: model width (formerly ``channels``).
        num_layers: decoder blocks (at least one).
        heads: attention heads.
        mlp_channels: MLP hidden size (default ``4 * hidden_channels``).
        pos_channels: node embedding size (0: no position bias).
        max_depth: deepest tree level with its own embeddings.
        max_slot: ranks ``>= max_slot`` share the last embedding.
        attention: ``'hsa'`` or ``'flat'``.
        dropout: residual dropout.
    """

    @renamed_arguments(channels="hidden_channels")
    def __init__(
        self,
        vocab_size: int,
        hidden_channels: int = 128,
        num_layers: int = 2,
        heads: int = 4,
        mlp_channels: int | None = None,
        pos_channels: int = 32,
        max_depth: int = 4,
        max_slot: int = 512,
        attention: str = "hsa",
        dropout: float = 0.0,
    ):
        super().__init__()
        if attention not in ATTENTION_MODES:
            raise ValueError(f"attention must be one of {ATTENTION_MODES}, got {attention!r}")
        check_int(vocab_size, "vocab_size")
        check_int(hidden_channels, "hidden_channels")
        check_int(heads, "heads")
        check_int(pos_channels, "pos_channels", minimum=0)
        check_int(num_layers, "num_layers")  # (0: a step has no layer to run)
        check_int(mlp_channels, "mlp_channels", optional=True)
        # (positions below the root need a level: 0 built a model no tree could run)
        check_int(max_depth, "max_depth", minimum=1 if pos_channels else 0)
        check_int(max_slot, "max_slot")
        check_probability(dropout, "dropout")
        self.attention, self.max_depth, self.max_slot = attention, max_depth, max_slot
        self.embed = nn.Embedding(vocab_size, hidden_channels)
        self.pos = nn.Embedding((max_depth + 1) * max_slot, pos_channels) if pos_channels else None
        self.layers = nn.ModuleList(
            HTEDecoderLayer(
                hidden_channels,
                heads,
                mlp_channels or 4 * hidden_channels,
                pos_channels,
                attention,
                dropout,
            )
            for _ in range(num_layers)
        )
        self.norm = nn.LayerNorm(hidden_channels)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Token and node embeddings ~ N(0, 0.02²) (the tied output starts near uniform)."""
        nn.init.normal_(self.embed.weight, std=0.02)
        if self.pos is not None:
            nn.init.normal_(self.pos.weight, std=0.02)
        for layer in self.layers:
            layer.reset_parameters()
        self.norm.reset_parameters()

    def _node_embedding(self, depth: Tensor, slot: Tensor, max_depth: int) -> Tensor | None:
        """Embeddings of the nodes at ``depth``/``slot``; ``max_depth`` is ``depth``'s maximum,
        known on the host (no device read)."""
        if self.pos is None:
            return None
        if max_depth > self.max_depth:
            raise ValueError(
                f"tree depth {max_depth} exceeds max_depth={self.max_depth}; "
                "build the model with a larger max_depth"
            )
        return self.pos(depth * self.max_slot + slot.clamp(max=self.max_slot - 1))

    def forward(self, tokens: Tensor, hierarchy, plan: CausalPlan | None = None) -> Tensor:
        """``tokens [L]`` (integer ids of any integer dtype, in the leaf order of ``hierarchy``,
        a tree or a batch) → logits ``[L, V]``.

        ``plan``: the hierarchy's :class:`CausalPlan`, if already built.
        """
        _check_token_ids(tokens, "tokens")
        plan = plan or CausalPlan.of(hierarchy)
        if hierarchy.num_nodes != plan.tree_index.num_nodes:
            raise ValueError(
                f"plan is of a forest of {plan.tree_index.num_nodes} nodes, the hierarchy has "
                f"{hierarchy.num_nodes}: pass the hierarchy's own plan (or none)"
            )
        return self._layers(tokens, hierarchy, plan)

    @torch.no_grad()
    def prefill(self, tokens: Tensor, hierarchy, caches: list) -> Tensor:
        """Start empty caches of :meth:`new_cache` with a prompt: ``tokens [T]``, the leaves of
        ``hierarchy`` (one tree, e.g. :func:`~hiergraph.nn.from_schedule` of the prompt's
        events) → logits ``[T, V]``, those of :meth:`forward`, from one full pass per layer
        (:meth:`HierarchicalKVCache.prefill`, :meth:`FlatKVCache.extend`); :meth:`step` then
        decodes the next tokens. ``tokens [B, T]``: ``B`` prompts on the same tree, in caches
        of :meth:`new_cache` for ``B`` sequences → logits ``[B, T, V]`` (e.g. ``B`` copies of
        one prompt, to sample ``B`` continuations).

        Raises:
            ValueError: unless ``caches`` are one empty cache per layer for as many sequences
                as ``tokens`` has rows, and ``hierarchy`` is one tree with every leaf below
                its root.
        """
        _check_token_ids(tokens, "tokens")
        self._check_caches(caches, "prefill", empty=True)
        self._check_sequences(tokens.size(0) if tokens.dim() == 2 else 1, caches)
        plan = CausalPlan.of(hierarchy)
        check_one_tree(plan)  # (the flat cache would take any batch)
        return self._layers(tokens, hierarchy, plan, caches)

    def _embed(self, tokens: Tensor) -> Tensor:
        """The embeddings of token ids ``tokens`` (any shape, any integer dtype: bytes as
        ``uint8`` too), refused out of range."""
        check_ids(tokens, self.embed.num_embeddings, "token", "vocab_size", device_assert=False)
        return self.embed(tokens if tokens.dtype in (torch.int32, torch.int64) else tokens.long())

    def _check_caches(self, caches: Sequence, method: str, empty: bool = False) -> None:
        """Raise unless ``caches`` are one cache per layer holding as many tokens (none if
        ``empty``): checked before any is written (a step with a cache too few appended
        to the first ones, then failed)."""
        layers = len(self.layers)
        tokens = {cache.num_tokens for cache in caches} if isinstance(caches, Sequence) else None
        if tokens is None or len(caches) != layers or len(tokens) > 1 or empty and tokens != {0}:
            got = f"{len(caches)}" if tokens is not None else type(caches).__name__
            held = f" holding {sorted(tokens)} tokens" if tokens is not None and len(caches) else ""
            raise ValueError(
                f"{method} takes {layers} {'empty ' if empty else ''}caches, one per layer "
                f"(new_cache()), holding as many tokens; got {got}{held}"
            )

    def _check_sequences(self, sequences: int, caches: list) -> None:
        heads = self.layers[0].attn.heads
        if caches[0].heads != sequences * heads:
            raise ValueError(
                f"{sequences} sequence(s) need caches of new_cache(sequences={sequences}); "
                f"these hold {caches[0].heads // heads}"
            )

    def _layers(self, tokens: Tensor, hierarchy, plan: CausalPlan, caches=None) -> Tensor:
        """Logits ``[L, V]`` of the full pass (filling ``caches``, one per layer, if given;
        ``tokens [B, L]``: ``B`` sequences on the trees, logits ``[B, L, V]``)."""
        if tokens.dim() not in ((1, 2) if caches else (1,)) or tokens.size(-1) != plan.num_leaves:
            shapes = "[num_leaves]" + (" or [sequences, num_leaves]" if caches else "")
            raise ValueError(
                f"tokens must be {shapes} with num_leaves={plan.num_leaves}, got "
                f"{tuple(tokens.shape)}"
            )
        leaf_tree = plan.ancestors[:, 0]
        # the trees' leaves are consecutive: number the runs of equal roots 0, 1, 2, ...
        # (what unique_consecutive's inverse gives, without its host sync)
        batch = (torch.diff(leaf_tree, prepend=leaf_tree[:1]) != 0).long().cumsum(0)
        if self.attention == "hsa":
            # rank among siblings (the number of left siblings), not the raw slot: slots may
            # have gaps, and a cache numbers the children of a node 0, 1, 2, ... as they come
            pos_emb = self._node_embedding(hierarchy.depth, plan.sibling_rank, plan.max_depth)
        else:
            position = torch.arange(tokens.size(-1), device=tokens.device)
            position = position - plan.first_leaf[leaf_tree]
            pos_emb = self._node_embedding(torch.ones_like(position), position, 1)
        x = self._embed(tokens)
        for layer, cache in zip(self.layers, caches or [None] * len(self.layers), strict=True):
            x = layer(x, plan, pos_emb, batch, cache)
        return self.norm(x) @ self.embed.weight.T

    def new_cache(self, sequences: int = 1) -> list:
        """Empty per-layer caches for :meth:`step` and :meth:`prefill`, for ``sequences``
        sequences that grow the same tree (their heads side by side in one cache)."""
        like = self.embed.weight
        return [layer.attn.new_cache(like.dtype, like.device, sequences) for layer in self.layers]

    @torch.no_grad()
    def step(self, token, caches: list, close: int = 0, open: int = 0) -> Tensor:  # noqa: A002
        """Append one token (placed in the tree by ``close``/``open``, see
        :meth:`HierarchicalKVCache.append`; ignored by ``'flat'``) → next-token logits ``[V]``;
        ``token [B]`` (a tensor): one token of each of ``B`` sequences with the same events,
        in caches of :meth:`new_cache` for ``B`` → logits ``[B, V]``."""
        device = self.embed.weight.device
        sequences, vocab = 1, self.embed.num_embeddings
        if isinstance(token, Tensor):
            _check_token_ids(token, "token")
            if token.dim() > 1:
                raise ValueError(f"token must be an int or [B], got {tuple(token.shape)}")
            sequences = token.numel() if token.dim() else 1
        elif isinstance(token, bool) or not isinstance(token, int) or not 0 <= token < vocab:
            raise ValueError(
                f"token must be an id in [0, {vocab}) or a tensor of them, got {token!r}"
            )
        self._check_caches(caches, "step")
        self._check_sequences(sequences, caches)
        if self.attention == "hsa":
            slots = caches[0].new_node_slots(close, open)
            depth, slot = host_tensor(slots, device).T
            max_depth = max(d for d, _ in slots)
        else:
            depth = torch.ones(1, dtype=torch.long, device=device)
            slot = torch.full((1,), caches[0].num_tokens, dtype=torch.long, device=device)
            max_depth = 1
        pos_emb = self._node_embedding(depth, slot, max_depth)
        x = self.embed.weight[token] if isinstance(token, int) else self._embed(token)
        for layer, cache in zip(self.layers, caches, strict=True):
            x = layer.step(x, cache, pos_emb, close, open)
        return self.norm(x) @ self.embed.weight.T


def _check_token_ids(tokens, name: str) -> None:
    """Raise a ``TypeError`` unless ``tokens`` is a tensor of integers (token ids)."""
    if not isinstance(tokens, Tensor) or not holds_integers(tokens):
        raise TypeError(f"{name} must be an integer tensor of token ids, got {described(tokens)}")
