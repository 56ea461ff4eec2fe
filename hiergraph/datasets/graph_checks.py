"""Checks of a loaded node-classification graph.

A processed cache or a folder of raw files can read without error and still hold no graph
of the dataset: features without a row per node, edges past the nodes, labels that are not
class ids, a test mask equal to the training mask. :func:`graph_problems` names what is
wrong, so that the loaders refuse such data by file instead of failing later, inside a
model, or training on it.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch_geometric.data import Data

from hiergraph._checks import holds_integers

#: The split masks a graph may hold: ``[N]`` or ``[N, S]`` for ``S`` splits, bool (or 0/1).
MASKS = ("train_mask", "val_mask", "test_mask")


def _shape(value) -> str:
    return f"{value.dtype} {tuple(value.shape)}" if isinstance(value, Tensor) else repr(value)


def graph_problems(data: Data, multi_label: bool = False, classes: int | None = None) -> list[str]:
    """What is wrong with ``data`` as a node-classification graph (nothing: ``[]``).

    Expected: float features ``x [N, F]``; ``edge_index`` int64 ``[2, E]`` with ids in
    ``[0, N)``; labels ``y`` with ``N`` rows, class ids (``[N]``, integer-valued, NaN for an
    unlabelled node; below ``classes`` if given) or, with ``multi_label``, ``[N, C]`` in
    ``{0, 1}``; masks
    (:data:`MASKS`, where present) ``[N]`` or ``[N, S]`` (``S`` splits), all of one shape,
    bool or integers in ``{0, 1}`` (the geom-gcn split files hold integers), the splits
    disjoint (per column).
    """
    x, problems = data.x, []
    if not isinstance(x, Tensor) or x.dim() != 2 or not x.is_floating_point():
        return [f"x must be float features [num_nodes, F], got {_shape(x)}"]
    n = x.size(0)
    edges = data.edge_index
    if not isinstance(edges, Tensor) or edges.dim() != 2 or edges.size(0) != 2:
        problems.append(f"edge_index must be [2, num_edges], got {_shape(edges)}")
    elif edges.dtype != torch.long:
        problems.append(f"edge_index must be int64, got {edges.dtype}")
    elif edges.numel():
        low, high = (int(i) for i in edges.aminmax())
        if low < 0 or high >= n:
            problems.append(f"the graph has node ids {low}..{high} for {n} nodes")
    problems += label_problems(data.y, n, multi_label, classes)
    masks = {key: data[key] for key in MASKS if key in data}
    for key, mask in masks.items():
        flags = isinstance(mask, Tensor) and (mask.dtype == torch.bool or holds_integers(mask))
        if not flags or mask.dim() not in (1, 2) or mask.size(0) != n:
            problems.append(f"{key} must be flags [{n}] or [{n}, S], got {_shape(mask)}")
        elif mask.dtype != torch.bool and bool(((mask != 0) & (mask != 1)).any()):
            problems.append(f"{key} holds values other than 0 and 1")
    if not problems and len({mask.shape for mask in masks.values()}) > 1:
        problems.append(f"the masks differ in shape: {[_shape(m) for m in masks.values()]}")
    if not problems:
        masks = {key: mask.bool() for key, mask in masks.items()}
        keys = list(masks)
        for i, first in enumerate(keys):
            for second in keys[i + 1 :]:
                if bool((masks[first] & masks[second]).any()):
                    problems.append(f"{first} and {second} share nodes")
    return problems


def label_problems(y, n: int, multi_label: bool = False, classes: int | None = None) -> list[str]:
    """What is wrong with labels ``y`` of ``n`` examples (nothing: ``[]``): class ids
    ``[n]`` (integer-valued, NaN for an unlabelled example, below ``classes`` if given), or
    with ``multi_label`` targets ``[n, C]`` in ``{0, 1}``."""
    numbers = isinstance(y, Tensor) and not y.is_complex() and y.dtype != torch.bool
    if not numbers or y.dim() != (2 if multi_label else 1) or y.size(0) != n:
        wanted = f"[{n}, C] multi-label targets" if multi_label else f"[{n}] class ids"
        return [f"y must be {wanted}, got {_shape(y)}"]
    if multi_label:
        return [] if bool(((y == 0) | (y == 1)).all()) else ["y holds targets other than 0 and 1"]
    labelled = y[~y.isnan()] if y.is_floating_point() else y
    fractional = labelled.is_floating_point() and bool((labelled != labelled.round()).any())
    if fractional or bool((labelled < 0).any()):
        return ["y holds labels that are not class ids (negative or fractional)"]
    if classes is not None and labelled.numel() and int(labelled.max()) >= classes:
        return [
            f"its labels span {int(labelled.min())}..{int(labelled.max())} for {classes} classes"
        ]
    return []
