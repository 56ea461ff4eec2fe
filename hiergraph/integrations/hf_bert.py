r"""Zero-shot HSA inside pretrained Hugging Face BERT/RoBERTa-family encoders.

:func:`inject_hsa` swaps the self-attention of chosen layers for
Hierarchical Self-Attention over a fixed hopping-window hierarchy (or over
hierarchies the caller passes, e.g. from sentence boundaries,
:func:`hsa_hierarchies`), reusing each layer's own per-head
:math:`q, k, v` projections and output projection, with no training
(Amizadeh et al., Sec. 4.3, App. L). Per head and example,

.. math::
    \mathrm{out} = \hat\Theta V, \qquad
    \hat\Theta = \arg\min_{\Theta \in \mathcal{B}} \sum_i
        D_\mathrm{KL}\big(\theta_{i\cdot} \,\|\,
        \mathrm{softmax}_j(q_i^\top k_j / \sqrt{d})\big)

over the block-constrained row-stochastic matrices :math:`\mathcal{B}` of the
hierarchy: the KL-closest hierarchical approximation of the layer's own
softmax attention (Thm. 3.2; diagonal included through the self energy of
App. G.1). The padding mask is
honoured (padding tokens are not in any tree; their rows are 0). With
``hubs=g`` each replaced layer lifts the :math:`g` keys with the largest
root-level score to leaves under the root (:mod:`~hiergraph.integrations.hubs`).
:func:`remove_hsa` restores the original modules; the weights are shared, never
copied, so the restored model is bit-identical.

Works with any model whose layers are ``<encoder>.layer[i].attention.self``
with ``query``/``key``/``value`` linears (``BertModel``, ``RobertaModel``, their
task heads, a sentence-transformers ``Transformer`` module's ``auto_model``).
Requires ``transformers`` (the ``hf`` extra) only to build such a model;
this module itself imports nothing from it.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager

import torch
from torch import Tensor, nn
from torch_geometric.data import Batch
from torch_geometric.data.data import BaseData

from hiergraph._checks import check_bool, check_int
from hiergraph._deprecation import renamed_arguments
from hiergraph.data.signal_hierarchy import SignalHierarchy, as_long
from hiergraph.data.windows import check_branching
from hiergraph.integrations.hub_windows import padded_hub_window_hsa
from hiergraph.integrations.padded_attention import (
    padded_block_attention,
    padded_hsa,
    padded_window_hsa,
    valid_token_mask,
)

METHODS = ("hsa", "hsa_no_size_bias", "block")


class _Hierarchies:
    """Hierarchies shared by the replaced layers of one model: the caller's (``given``), or
    window trees over the valid tokens, with ``hubs`` of each layer's own keys under the
    root when ``hubs > 0``; both run on the padded batch (:func:`padded_window_hsa`,
    :func:`padded_hub_window_hsa`)."""

    def __init__(self, branching: tuple[int, ...], hubs: int):
        self.branching, self.hubs = branching, hubs
        self.given: Batch | None = None


class HSASelfAttention(nn.Module):
    r"""Drop-in for a transformers ``*SelfAttention`` module (same ``query``/``key``/
    ``value`` submodules, so the ``state_dict`` keys and weights are unchanged).

    ``forward(hidden_states, attention_mask=None, ...)`` returns
    ``(context [B, T, hidden], None)``: attention weights are never materialised.
    Attention dropout is not applied (zero-shot inference).

    It has no parameters of its own: ``query``, ``key`` and ``value`` are the
    pretrained layer's, so it has no ``reset_parameters()`` (zero-shot use keeps
    the pretrained weights).

    Args:
        attention (torch.nn.Module): the module it replaces (kept for
            :func:`remove_hsa`).
        method (str): ``'hsa'``; ``'hsa_no_size_bias'`` (HSA without the
            :math:`\log n(B)` sibling bias, a baseline); ``'block'`` (softmax
            inside blocks of ``block_size`` tokens, a baseline).
        include_self (bool): the BERT-style diagonal in HSA (the self energy of
            App. G.1).
        block_size (int or None): tokens per block for ``method='block'`` (formerly
            ``block``).
        hierarchies (_Hierarchies): the hierarchy source shared by the model's
            replaced layers (built by :func:`inject_hsa`).

    Raises:
        ValueError: if ``attention`` is causal (``is_causal`` or ``is_decoder``, e.g. a
            BERT built with ``is_decoder=True``): HSA here is bidirectional, and under
            SDPA such a layer may get no mask at all (only ``is_causal``), so it would
            silently attend to future tokens.
    """

    @renamed_arguments(block="block_size")
    def __init__(
        self,
        attention: nn.Module,
        method: str,
        include_self: bool,
        block_size: int | None,
        hierarchies: _Hierarchies,
    ):
        super().__init__()
        _refuse_causal(attention)
        self.query, self.key, self.value = attention.query, attention.key, attention.value
        self.heads = attention.num_attention_heads
        self.head_dim = attention.attention_head_size
        self.scale = getattr(attention, "scaling", self.head_dim**-0.5)
        self.method, self.include_self, self.block_size = method, include_self, block_size
        self.hierarchies = hierarchies
        self.__dict__["original"] = attention  # not a submodule: no duplicate parameters

    def forward(
        self, hidden_states: Tensor, attention_mask: Tensor | None = None, *args, **kwargs
    ) -> tuple[Tensor, None]:
        r"""
        Args:
            hidden_states (torch.Tensor): ``[B, T, hidden]``.
            attention_mask (torch.Tensor, optional): the mask transformers passes
                (1 or ``True`` = attend, or additive); only key padding is allowed
                (:func:`~hiergraph.integrations.valid_token_mask`).
                (default: :obj:`None`, no padding)
            *args: the rest of transformers' call (ignored; a KV cache or
                cross-attention input raises).
            **kwargs: as ``*args``.

        Returns:
            ``(context [B, T, hidden], None)``.
        """
        # (transformers 5 passes a KV cache as ``cache``: one given was left empty)
        if any(
            kwargs.get(k) is not None for k in ("past_key_values", "cache", "encoder_hidden_states")
        ):
            raise ValueError(
                "HSA layers are encoder self-attention only: no KV cache, no cross-attention"
            )
        batch, length, _ = hidden_states.shape
        q, k, v = (
            proj(hidden_states).view(batch, length, self.heads, -1).transpose(1, 2)
            for proj in (self.query, self.key, self.value)
        )
        token_mask = valid_token_mask(attention_mask, batch, length).to(q.device)
        if self.method == "block":
            out = padded_block_attention(q, k, v, token_mask, self.block_size, self.scale)
        else:
            options = dict(
                include_self=self.include_self, size_bias=self.method == "hsa", scale=self.scale
            )
            h = self.hierarchies
            if h.given is not None:
                out = padded_hsa(q, k, v, token_mask, h.given.to(q.device), **options)
            elif h.hubs:
                out = padded_hub_window_hsa(q, k, v, token_mask, h.branching, h.hubs, **options)
            else:
                out = padded_window_hsa(q, k, v, token_mask, h.branching, **options)
        return out.reshape(batch, length, -1), None

    def __repr__(self) -> str:
        h = self.hierarchies
        detail = (
            f"block_size={self.block_size}"
            if self.method == "block"
            else f"branching={h.branching}, hubs={h.hubs}"
        )
        return f"{self.__class__.__name__}(method={self.method!r}, heads={self.heads}, {detail})"


def encoder_layers(model: nn.Module) -> nn.ModuleList:
    """The transformer layers of a BERT/RoBERTa-family model (or its task/sentence wrapper).

    Args:
        model (torch.nn.Module): a Hugging Face BERT/RoBERTa-family model with an
            ``encoder.layer`` list, a task model whose ``base_model`` has one, or a
            sentence-transformers ``Transformer`` module whose ``auto_model`` has one.

    Returns:
        The ``encoder.layer`` :class:`~torch.nn.ModuleList` (the model's own, not a copy).

    Raises:
        TypeError: if none of these has an ``encoder.layer`` list.
    """
    return _encoder_owner(model).encoder.layer


def _encoder_owner(model: nn.Module) -> nn.Module:
    """The module of ``model`` whose ``encoder.layer`` lists its transformer layers: the
    model itself, its ``base_model`` (a task wrapper) or its ``auto_model`` (a
    sentence-transformers one)."""
    for candidate in (
        model,
        getattr(model, "base_model", None),
        getattr(model, "auto_model", None),
    ):
        layers = getattr(getattr(candidate, "encoder", None), "layer", None)
        if isinstance(layers, nn.ModuleList):
            return candidate
    raise TypeError(
        f"{type(model).__name__} has no `encoder.layer` list: pass a Hugging Face BERT/RoBERTa-"
        "family model (BertModel, RobertaModel, a *ForSequenceClassification, or a "
        "sentence-transformers Transformer's `auto_model`)"
    )


def interleaved_layers(num_layers: int, count: int) -> list[int]:
    """The last ``count`` layers of every other layer, ending at the last one (the paper's
    interleaving, §4.3): ``interleaved_layers(6, 2) == [3, 5]``.

    Args:
        num_layers (int): layers of the model, ``>= 1``.
        count (int): layers to pick, in ``[1, (num_layers + 1) // 2]``.

    Returns:
        The ``count`` layer indices, ascending.
    """
    check_int(num_layers, "num_layers")  # (6.0 gave float indices, count=1.5 a range error)
    check_int(count, "count")
    if not 1 <= count <= (num_layers + 1) // 2:
        raise ValueError(f"count must be in [1, {(num_layers + 1) // 2}], got {count}")
    return sorted(num_layers - 1 - 2 * i for i in range(count))


@renamed_arguments(block="block_size")
def inject_hsa(
    model: nn.Module,
    layers: Sequence[int],
    branching: Sequence[int] = (2, 4, 8, 16),
    include_self: bool = True,
    method: str = "hsa",
    block_size: int | None = None,
    hubs: int = 0,
) -> nn.Module:
    r"""Replace the self-attention of ``layers`` by HSA (in place; returns ``model``).

    Args:
        model (torch.nn.Module): a Hugging Face BERT/RoBERTa-family encoder (see
            module docstring).
        layers (Sequence[int]): layer indices (negative counts from the end), e.g.
            :func:`interleaved_layers`.
        branching (Sequence[int], optional): bottom-up window sizes of the fixed
            hierarchy (:func:`~hiergraph.data.window_hierarchy`); ``()`` is one flat
            family, i.e. exactly the original softmax attention.
            (default: :obj:`(2, 4, 8, 16)`)
        include_self (bool, optional): include the diagonal, as BERT's softmax does
            (the self energy of App. G.1). (default: :obj:`True`)
        method (str, optional): ``'hsa'`` or one of the baselines
            ``'hsa_no_size_bias'``, ``'block'``. (default: :obj:`"hsa"`)
        block_size (int, optional): tokens per block for ``'block'`` (formerly
            ``block``). (default: :obj:`None`, i.e. ``branching[0]``: the leaf windows)
        hubs (int, optional): lift each example's :obj:`hubs` best keys by the
            root-level score, chosen per layer from its own q, k, to leaves under the
            root (:mod:`~hiergraph.integrations.hubs`); 0 keeps the fixed windows.
            (default: :obj:`0`)

    Raises:
        ValueError: for bad arguments, a layer that already has HSA, a causal
            (decoder, ``is_decoder=True``) layer, or a model whose attention masks are not
            those of ``attn_implementation`` ``'eager'`` or ``'sdpa'``; nothing is replaced
            then.
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    branching = check_branching(branching)
    check_bool(include_self, "include_self")
    if method == "block":
        if block_size is None:
            block_size = branching[0] if branching else None
        if block_size is None:
            raise ValueError("method='block' needs block_size >= 1 (or a non-empty branching)")
        check_int(block_size, "block_size")
    all_layers = encoder_layers(model)
    config = getattr(_encoder_owner(model), "config", None)
    implementation = getattr(config, "_attn_implementation", None)
    if implementation not in (None, "eager", "sdpa"):  # (a flex BlockMask failed deep inside)
        raise ValueError(
            f"inject_hsa reads the attention masks of attn_implementation 'eager' or 'sdpa'; "
            f"this model uses {implementation!r}: load it with attn_implementation='sdpa'"
        )
    n = len(all_layers)
    chosen = sorted({i % n for i in _check_layers(layers, n)})
    if isinstance(hubs, bool) or not isinstance(hubs, int) or hubs < 0:
        raise ValueError(f"hubs must be an int >= 0, got {hubs!r}")
    if hubs and method == "block":
        raise ValueError("hubs apply to the HSA methods, not method='block'")
    hierarchies = _Hierarchies(branching, hubs)
    replacements = []  # all built before any is assigned: a refused layer replaces nothing
    for i in chosen:
        attention = all_layers[i].attention.self
        if isinstance(attention, HSASelfAttention):
            raise ValueError(f"layer {i} already has HSA; call remove_hsa(model) first")
        try:
            replacements.append(
                HSASelfAttention(attention, method, include_self, block_size, hierarchies)
            )
        except ValueError as error:
            raise ValueError(f"layer {i}: {error}") from None
    for i, replacement in zip(chosen, replacements, strict=True):
        all_layers[i].attention.self = replacement
    if model not in _OUTPUT_GUARDS:  # on the wrapper and on the encoder's own model, which
        # a caller may run alone (``wrapper.bert(...)``: the wrapper's hook never ran)
        owners = {id(m): m for m in (model, _encoder_owner(model))}.values()
        _OUTPUT_GUARDS[model] = [
            m.register_forward_pre_hook(_refuse_attention_outputs, with_kwargs=True) for m in owners
        ]
    return model


def remove_hsa(model: nn.Module) -> nn.Module:
    """Restore every replaced self-attention module (in place; returns ``model``).

    Args:
        model (torch.nn.Module): a model given to :func:`inject_hsa` (one without HSA
            layers is returned unchanged).
    """
    for layer in encoder_layers(model):
        if isinstance(layer.attention.self, HSASelfAttention):
            layer.attention.self = layer.attention.self.original
    for guard in _OUTPUT_GUARDS.pop(model, ()):
        guard.remove()
    return model


#: the forward pre-hooks of every model with HSA layers (:func:`_refuse_attention_outputs`)
_OUTPUT_GUARDS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _refuse_attention_outputs(model: nn.Module, args: tuple, kwargs: dict) -> None:
    """Raise where a forward asks for attention weights: transformers records them from its
    own attention classes, so it would leave the HSA layers out of ``attentions`` and every
    later layer's weights would sit at the wrong index."""
    if kwargs.get("output_attentions") or getattr(
        getattr(model, "config", None), "output_attentions", False
    ):
        raise ValueError(
            "output_attentions: the HSA layers of inject_hsa have no attention matrix, and "
            "transformers would leave them out of `attentions` (shifting the layer indices); "
            "call without it, or remove_hsa(model) first"
        )


@contextmanager
def hsa_hierarchies(
    model: nn.Module, hierarchies: Iterable[SignalHierarchy] | Batch
) -> Iterator[None]:
    """Use the caller's hierarchies (e.g. from sentence boundaries,
    :func:`sentence_hierarchy`) instead of the fixed windows, inside the ``with`` block.

    Args:
        model (torch.nn.Module): a model with HSA layers (:func:`inject_hsa`).
        hierarchies (Iterable[SignalHierarchy] or Batch): a list (or any iterable) of
            :class:`~hiergraph.data.SignalHierarchy` (or their PyG batch), one per
            example with valid tokens, in batch order; example ``b``'s leaves are
            its valid (non-padding) tokens in order.
    """
    layers = [m for m in model.modules() if isinstance(m, HSASelfAttention)]
    if not layers:
        raise ValueError("the model has no HSA layers; call inject_hsa(model, ...) first")
    shared = {id(m.hierarchies): m.hierarchies for m in layers if m.method != "block"}
    if not shared:  # (the block was a silent no-op)
        raise ValueError("the model's HSA layers are method='block', which takes no hierarchies")
    batch = hierarchies if isinstance(hierarchies, Batch) else _batch_of(hierarchies)
    for h in shared.values():
        h.given = batch
    try:
        yield
    finally:
        for h in shared.values():
            h.given = None


def _batch_of(hierarchies) -> Batch:
    """The PyG batch of hierarchies (a list, tuple or any iterable, read once), refused
    unless they are one or more :class:`~hiergraph.data.SignalHierarchy` (a single hierarchy
    was read as the list of its attributes, an empty list failed inside PyG's collation)."""
    single = isinstance(hierarchies, SignalHierarchy)
    one_object = isinstance(hierarchies, BaseData | str | bytes)  # (iterable, but no list)
    if one_object or not isinstance(hierarchies, Iterable):
        raise TypeError(
            "hierarchies must be a list of SignalHierarchy, one per example with valid tokens, "
            f"or their Batch; got {type(hierarchies).__name__}"
            + (" (wrap one hierarchy in a list)" if single else "")
        )
    hierarchies = list(hierarchies)
    if not hierarchies:
        raise ValueError("hierarchies is empty: give one per example with valid tokens")
    for i, h in enumerate(hierarchies):
        if not isinstance(h, SignalHierarchy):
            raise TypeError(f"hierarchies[{i}] must be a SignalHierarchy, got {type(h).__name__}")
    return Batch.from_data_list(hierarchies)


def sentence_hierarchy(sentence_lengths: Sequence[int] | Tensor) -> SignalHierarchy:
    """Root → sentences → tokens over ``sum(sentence_lengths)`` tokens (a
    :class:`~hiergraph.data.SignalHierarchy`).

    Args:
        sentence_lengths (Sequence[int] or torch.Tensor): tokens per sentence, in order,
            each ``>= 1`` (at least one sentence); special tokens count in a sentence,
            e.g. ``[CLS]`` joins the first sentence and ``[SEP]`` the last.

    Returns:
        The tree, on the CPU; its leaves ``0 .. sum(sentence_lengths) - 1`` are the
        tokens, in order.
    """
    sizes = as_long(sentence_lengths, "sentence_lengths").cpu()
    if sizes.dim() != 1 or sizes.numel() == 0 or bool((sizes < 1).any()):
        raise ValueError(f"sentence_lengths must be positive ints, got {sizes.tolist()}")
    tokens, sentences = int(sizes.sum()), sizes.numel()
    token_parent = tokens + torch.arange(sentences).repeat_interleave(sizes)
    sentence_parent = torch.full((sentences,), tokens + sentences)
    parent = torch.cat([token_parent, sentence_parent, torch.tensor([-1])])
    return SignalHierarchy.from_parent(parent)


def _refuse_causal(attention: nn.Module) -> None:
    """The rule :func:`~hiergraph.integrations.padded_attention.valid_token_mask` applies to
    causal masks, applied to the module: decoder layers (``is_causal``/``is_decoder``) may get
    ``attention_mask=None`` with ``is_causal`` under SDPA, which no mask check can see."""
    if getattr(attention, "is_causal", False) or getattr(attention, "is_decoder", False):
        raise ValueError(
            "this attention module is causal (a decoder, is_decoder=True): HSA replaces "
            "attention under a key padding mask only (every query of an example attends to "
            "the same keys). Use HSA on encoder layers, or the causal HSA op."
        )


def _check_layers(layers: Sequence[int], n: int) -> list[int]:
    layers = list(layers)
    if not layers:
        raise ValueError("layers is empty: name at least one layer index")
    bad = [i for i in layers if isinstance(i, bool) or not isinstance(i, int) or not -n <= i < n]
    if bad:
        raise ValueError(
            f"layer indices must be ints in [-{n}, {n}) for this {n}-layer model: {bad}"
        )
    return layers
