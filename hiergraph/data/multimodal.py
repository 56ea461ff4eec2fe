r"""Multimodal records as signal hierarchies: a key–value root over modality sub-trees.

A record such as a news item or a clip-art file is a *key–value* signal
(Amizadeh et al., App. C; the news records of Sec. 4.2): its keys are the field
names and each value is a signal of its own:

* an **image** ``[C, H, W]`` becomes a 2-D grid of ``p × p`` patch leaves
  (raw patch pixels, ``C·p²`` features each). Optionally the patches are
  grouped ``g × g`` under coarser grid nodes, a 2-level patch pyramid:
  image → patch groups → patches. A linear map of the patch pixels is
  exactly a stride-``p`` ``p × p`` convolution, i.e. a ViT-style patch stem;
* a **sequence** ``[T, F]`` (the token vectors of a text field) becomes a
  1-D grid of ``T`` leaves;
* a **vector** ``[F]`` (a pooled embedding, a feature vector) becomes one
  leaf directly under the root, next to the other sub-trees.

.. code-block:: text

    root (key–value: pos = key id of each field)
     ├── image (2-D grid) ── [group (2-D grid)] ── patch leaves
     ├── title (1-D grid) ── token leaves
     └── description (1-D grid) ── token leaves

Any field may be missing (``None`` or zero tokens): it is left out of the
key–value family, and the other keys keep their ids, so records with
different fields batch together. Leaves of different widths are zero-padded
to the widest field (:attr:`MultimodalSchema.in_channels`); each field has
a node type (default: its own), so a per-type input projection
(:class:`~hiergraph.nn.TypedLinear`, ``num_node_types`` of
:class:`~hiergraph.nn.HierarchicalTransformerEncoder`) gives every modality
its own linear map, and the padding adds nothing to it:
:math:`W_t [x; 0] = W_t^{(:, :F_t)} x`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from hiergraph._checks import as_int, check_int
from hiergraph._runs import rank_within
from hiergraph.data.domain import Domain
from hiergraph.data.signal_hierarchy import SignalHierarchy


@dataclass(frozen=True)
class ImageField:
    """An image field: ``[channels, H, W]`` → a 2-D grid of ``patch_size²`` patch leaves.

    Args:
        name: the record key.
        channels: image channels ``C``.
        patch_size: patch side ``p``; ``H`` and ``W`` must be multiples of it.
        group_size: if set, ``g × g`` neighbouring patches are grouped under a
            coarser 2-D grid node (the last row/column of groups may be partial).
    """

    name: str
    channels: int = 3
    patch_size: int = 8
    group_size: int | None = None

    @property
    def leaf_channels(self) -> int:
        return self.channels * self.patch_size**2

    def __post_init__(self):
        check_int(self.channels, "channels")
        check_int(self.patch_size, "patch_size")
        if self.group_size is not None:
            check_int(self.group_size, "group_size")


@dataclass(frozen=True)
class _ChannelField:
    """A field whose leaves carry its ``channels`` features as they are."""

    name: str
    channels: int

    @property
    def leaf_channels(self) -> int:
        return self.channels

    def __post_init__(self):
        check_int(self.channels, "channels")


@dataclass(frozen=True)
class SequenceField(_ChannelField):
    """A sequence field (text tokens): ``[T, channels]`` → a 1-D grid of ``T`` leaves.

    Args:
        name: the record key.
        channels: features per token ``F`` (the width of its leaves); a sequence of
            ``T = 0`` tokens counts as missing.
    """


@dataclass(frozen=True)
class VectorField(_ChannelField):
    """A vector field: ``[channels]`` → one leaf directly under the root.

    Args:
        name: the record key.
        channels: the length ``F`` of the vector (the width of its leaf).
    """


Field = ImageField | SequenceField | VectorField


class MultimodalSchema:
    r"""The fixed set of fields of a multimodal record (shared by every record of a dataset).

    Field ``i`` has key id ``i`` (its position :math:`\varepsilon_{kv}(i)` in
    the root's key–value family) and node type ``node_types[i]`` (default
    ``i``: every field gets its own input projection; give equal types to
    share one, e.g. two text fields embedded the same way).

    Example::

        schema = MultimodalSchema([ImageField("image", patch_size=8),
                                   SequenceField("title", 384),
                                   SequenceField("description", 384)])
        h = schema.build({"image": torch.rand(3, 32, 32),
                          "title": torch.randn(4, 384),
                          "description": None})        # missing field
        h.x.shape        # [16 + 4, 384]: patches (192 wide) zero-padded
        h.node_type      # 0 for patches, 1 for title tokens

    Args:
        fields: the fields, in key order.
        node_types: optional node type of each field.
    """

    def __init__(self, fields: Sequence[Field], node_types: Sequence[int] | None = None):
        fields = list(fields)
        if not fields:
            raise ValueError("a MultimodalSchema needs at least one field")
        for f in fields:
            if not isinstance(f, (ImageField, SequenceField, VectorField)):
                raise TypeError(
                    f"fields must be ImageField, SequenceField or VectorField, got "
                    f"{type(f).__name__}"
                )
        names = [f.name for f in fields]
        if len(set(names)) != len(names):
            raise ValueError(f"field names must be distinct, got {names}")
        if node_types is None:
            node_types = range(len(fields))
        node_types = [as_int(t, "each node type") for t in node_types]  # (0.9 was 0)
        if len(node_types) != len(fields) or min(node_types) < 0:
            raise ValueError(
                f"node_types must give one non-negative type per field ({len(fields)}), "
                f"got {node_types}"
            )
        by_type: dict[int, int] = {}
        for f, t in zip(fields, node_types, strict=True):
            if by_type.setdefault(t, f.leaf_channels) != f.leaf_channels:
                raise ValueError(
                    f"fields sharing node type {t} must have the same leaf width; "
                    f"{f.name!r} has {f.leaf_channels}, another has {by_type[t]}"
                )
        self.fields = fields
        self.node_types = node_types
        self.keys = {name: i for i, name in enumerate(names)}

    @property
    def in_channels(self) -> int:
        """Width of ``x``: the widest leaf of any field."""
        return max(f.leaf_channels for f in self.fields)

    @property
    def num_node_types(self) -> int:
        return max(self.node_types) + 1

    def build(self, record: Mapping[str, Tensor | None]) -> SignalHierarchy:
        """The hierarchy of one record; see :func:`multimodal_hierarchy`."""
        return multimodal_hierarchy(record, self)

    def __repr__(self) -> str:
        return f"MultimodalSchema({self.fields}, node_types={self.node_types})"


def image_patches(image: Tensor, patch_size: int) -> tuple[Tensor, Tensor]:
    r"""Cut ``[C, H, W]`` into non-overlapping ``p × p`` patches, row-major.

    Returns ``(patches [P, C·p²], grid [P, 2])`` with ``P = (H/p)(W/p)``;
    ``patches[i]`` is the patch at ``(row, col) = grid[i]``, flattened as
    ``(C, p, p)``.

    Args:
        image: ``[C, H, W]`` image.
        patch_size: patch side ``p``, a positive int.

    Raises:
        ValueError: if ``image`` is not a 3-D tensor or ``H``, ``W`` are not positive
            multiples of ``p``.
    """
    if not isinstance(image, Tensor) or image.dim() != 3:
        shape = tuple(image.shape) if isinstance(image, Tensor) else type(image).__name__
        raise ValueError(f"an image must be a [C, H, W] tensor, got {shape}")
    c, h, w = image.shape
    p = patch_size
    check_int(p, "patch_size")
    if h % p or w % p or h == 0 or w == 0:
        raise ValueError(
            f"image size {h}x{w} is not a positive multiple of patch_size={p}; "
            "resize or pad the image first"
        )
    rows, cols = h // p, w // p
    patches = image.reshape(c, rows, p, cols, p).permute(1, 3, 0, 2, 4).reshape(rows * cols, -1)
    grid = torch.stack(
        torch.meshgrid(torch.arange(rows), torch.arange(cols), indexing="ij"), -1
    ).reshape(-1, 2)
    return patches, grid


def multimodal_hierarchy(
    record: Mapping[str, Tensor | None], schema: MultimodalSchema
) -> SignalHierarchy:
    r"""A multimodal record as a signal hierarchy with a key–value root.

    Node layout (leaves first, as in every :class:`SignalHierarchy`): the
    leaves of the present fields in schema order (image patches row-major,
    tokens in order, vectors), then the internal nodes in depth-first
    pre-order: the root, then per field its node and (for grouped images)
    its group nodes.

    Per-node attributes besides the usual ones (``parent``, ``slot``,
    ``depth``, ``domain``, ``pos``): ``node_type`` (the field's node type,
    ``0`` for the root) and ``modality`` (``[N]`` key id of the field a node
    belongs to, ``-1`` for the root).

    Args:
        record: field name → ``[C, H, W]`` image, ``[T, F]`` sequence,
            ``[F]`` vector, or ``None`` (missing). Fields of the schema that
            are absent from the mapping are missing too.
        schema: the fields.

    Returns:
        a :class:`SignalHierarchy` with ``x`` ``[L, schema.in_channels]``, of
        the dtype that :func:`torch.promote_types` gives over the present
        fields and :func:`torch.get_default_dtype` (a ``float64`` field makes
        all of ``x`` ``float64``, whatever the field order; integer fields
        become floats).

    Raises:
        ValueError: an unknown field, a tensor of the wrong shape or width,
            non-finite values, or a record with every field missing.
        TypeError: a value that is not a tensor (or ``None``).
    """
    if not isinstance(record, Mapping):
        raise TypeError(f"record must be a mapping field name -> tensor, got {type(record)}")
    unknown = [k for k in record if k not in schema.keys]
    if unknown:
        raise ValueError(f"unknown field(s) {unknown}; the schema has {list(schema.keys)}")
    parts = []
    for key, field in enumerate(schema.fields):
        value = record.get(field.name)
        if value is None:
            continue
        if not isinstance(value, Tensor):
            raise TypeError(
                f"field {field.name!r} must be a torch.Tensor or None, got {type(value).__name__}"
            )
        part = _field_part(field, value)
        if part is not None:
            parts.append((key, schema.node_types[key], part))
    if not parts:
        raise ValueError(
            "every field of the record is missing; a tree needs at least one leaf "
            "(drop the record instead)"
        )
    return _assemble(parts, schema.in_channels)


@dataclass
class _Part:
    """The sub-tree of one field, numbered locally: leaves ``0..L-1``, internal ``0..I-1``.

    ``leaf_parent``/``inner_parent`` are local internal ids, ``-1`` = the root.
    """

    x: Tensor
    leaf_parent: Tensor
    leaf_slot: Tensor
    leaf_pos: Tensor
    leaf_domain: Domain
    inner_parent: Tensor
    inner_slot: Tensor
    inner_pos: Tensor
    inner_domain: Tensor
    inner_depth: Tensor


def _field_part(field: Field, value: Tensor) -> _Part | None:
    """The sub-tree of one present field (``None`` for an empty sequence)."""
    if value.is_complex():  # (it would turn the tree's x complex)
        raise TypeError(f"field {field.name!r} must be real, got {value.dtype}")
    if value.is_floating_point() and not torch.isfinite(value).all():
        raise ValueError(f"field {field.name!r} has non-finite values (NaN/Inf)")
    empty = torch.zeros(0, dtype=torch.long)
    if isinstance(field, ImageField):
        if value.dim() != 3 or value.size(0) != field.channels:
            raise ValueError(
                f"image field {field.name!r} must be [{field.channels}, H, W], "
                f"got {tuple(value.shape)}"
            )
        patches, grid = image_patches(value, field.patch_size)
        cols = value.size(2) // field.patch_size
        g = field.group_size
        if g is None:  # image node (local 0) -> patches
            return _Part(
                x=patches,
                leaf_parent=torch.zeros(len(grid), dtype=torch.long),
                leaf_slot=grid[:, 0] * cols + grid[:, 1],
                leaf_pos=grid,
                leaf_domain=Domain.GRID2D,
                inner_parent=torch.tensor([-1]),
                inner_slot=torch.tensor([0]),
                inner_pos=torch.zeros(1, 2, dtype=torch.long),
                inner_domain=torch.tensor([int(Domain.KEY_VALUE)]),
                inner_depth=torch.tensor([1]),
            )
        # image node (local 0) -> groups (local 1..G, row-major) -> patches
        group_cols = -(-cols // g)
        group_rows = -(-(value.size(1) // field.patch_size) // g)
        group_of = (grid[:, 0] // g) * group_cols + grid[:, 1] // g
        within = grid % g
        num_groups = group_rows * group_cols
        group_grid = torch.stack(
            torch.meshgrid(torch.arange(group_rows), torch.arange(group_cols), indexing="ij"), -1
        ).reshape(-1, 2)
        return _Part(
            x=patches,
            leaf_parent=1 + group_of,
            leaf_slot=rank_within(group_of, num_groups),
            leaf_pos=within,
            leaf_domain=Domain.GRID2D,
            inner_parent=torch.cat([torch.tensor([-1]), torch.zeros(num_groups, dtype=torch.long)]),
            inner_slot=torch.cat([torch.tensor([0]), torch.arange(num_groups)]),
            inner_pos=torch.cat([torch.zeros(1, 2, dtype=torch.long), group_grid]),
            inner_domain=torch.tensor([int(Domain.KEY_VALUE)] + [int(Domain.GRID2D)] * num_groups),
            inner_depth=torch.tensor([1] + [2] * num_groups),
        )
    if isinstance(field, SequenceField):
        if value.dim() != 2 or value.size(1) != field.channels:
            raise ValueError(
                f"sequence field {field.name!r} must be [T, {field.channels}], "
                f"got {tuple(value.shape)}"
            )
        t = value.size(0)
        if t == 0:
            return None
        steps = torch.arange(t)
        return _Part(
            x=value,
            leaf_parent=torch.zeros(t, dtype=torch.long),
            leaf_slot=steps,
            leaf_pos=torch.stack([steps, torch.zeros_like(steps)], 1),
            leaf_domain=Domain.GRID1D,
            inner_parent=torch.tensor([-1]),
            inner_slot=torch.tensor([0]),
            inner_pos=torch.zeros(1, 2, dtype=torch.long),
            inner_domain=torch.tensor([int(Domain.KEY_VALUE)]),
            inner_depth=torch.tensor([1]),
        )
    if value.shape != (field.channels,):
        raise ValueError(
            f"vector field {field.name!r} must be [{field.channels}], got {tuple(value.shape)}"
        )
    return _Part(
        x=value.unsqueeze(0),
        leaf_parent=torch.tensor([-1]),
        leaf_slot=torch.tensor([0]),
        leaf_pos=torch.zeros(1, 2, dtype=torch.long),
        leaf_domain=Domain.KEY_VALUE,
        inner_parent=empty,
        inner_slot=empty,
        inner_pos=empty.view(0, 2),
        inner_domain=empty,
        inner_depth=empty,
    )


def _assemble(parts: list[tuple[int, int, _Part]], width: int) -> SignalHierarchy:
    """Number the parts' nodes globally (leaves first, then DFS pre-order) and build the tree."""
    num_leaves = sum(p.x.size(0) for _, _, p in parts)
    root = num_leaves
    dtype = torch.get_default_dtype()
    for _, _, p in parts:  # one dtype for x: no field is silently rounded
        dtype = torch.promote_types(dtype, p.x.dtype)
    leaves: dict[str, list[Tensor]] = {k: [] for k in _COLUMNS}
    inner: dict[str, list[Tensor]] = {k: [] for k in _COLUMNS}
    xs, offset = [], root + 1  # global id of the part's first internal node
    for slot, (key, node_type, p) in enumerate(parts):
        xs.append(torch.nn.functional.pad(p.x.to(dtype), (0, width - p.x.size(1))))
        depth_of = torch.cat([torch.zeros(1, dtype=torch.long), p.inner_depth])  # local id + 1
        for cols, parent, local_slot, pos, domain, depth in (
            (
                leaves,
                p.leaf_parent,
                p.leaf_slot,
                p.leaf_pos,
                torch.full_like(p.leaf_parent, int(p.leaf_domain)),
                depth_of[p.leaf_parent + 1] + 1,
            ),
            (inner, p.inner_parent, p.inner_slot, p.inner_pos, p.inner_domain, p.inner_depth),
        ):
            top = parent < 0  # children of the root sit at this field's key
            pos = pos.clone()
            pos[top] = torch.tensor([key, 0])
            cols["parent"].append(torch.where(top, root, offset + parent))
            cols["slot"].append(torch.where(top, slot, local_slot))
            cols["pos"].append(pos)
            cols["domain"].append(domain)
            cols["depth"].append(depth)
            cols["node_type"].append(torch.full_like(parent, node_type))
            cols["modality"].append(torch.full_like(parent, key))
        offset += p.inner_parent.numel()
    root_row = {
        "parent": [root],
        "slot": [0],
        "pos": [[0, 0]],
        "domain": [int(Domain.NONE)],
        "depth": [0],
        "node_type": [0],
        "modality": [-1],
    }
    column = {k: torch.cat([*leaves[k], torch.tensor(root_row[k]), *inner[k]]) for k in _COLUMNS}
    is_leaf = torch.zeros(offset, dtype=torch.bool)
    is_leaf[:num_leaves] = True
    modality = column.pop("modality")
    h = SignalHierarchy._assemble(is_leaf=is_leaf, x=torch.cat(xs), **column)
    h.modality = modality
    return h


_COLUMNS = ("parent", "slot", "pos", "domain", "depth", "node_type", "modality")
