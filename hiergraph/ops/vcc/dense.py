r"""Dense reference of VCC for one small sequence: explicit :math:`S`, :math:`S^\dagger`, :math:`D`.

The ragged tree form (:mod:`hiergraph.ops.vcc.layer`, :mod:`hiergraph.ops.vcc.segment_tree`)
and the padded form (:mod:`hiergraph.ops.vcc.padded`) are tested against these in float64.
Notation of Zeng et al., Sec. 3.2–3.3 and App. 6.2 (eq. 9, 42, 54).
"""

from __future__ import annotations

import torch
from torch import Tensor

from hiergraph._checks import check_int, holds_integers
from hiergraph.ops.vcc.layer import LayerFn


def compression_matrices(
    count: Tensor, num_vip: int, dtype=torch.float64
) -> tuple[Tensor, Tensor, Tensor]:
    r"""Explicit :math:`S`, :math:`S^\dagger` and :math:`\log D` for one sequence.

    The non-VIP tokens ``0 .. n_c - 1`` are cut into consecutive segments of sizes
    ``count`` (the partition :math:`\mathcal{J}` in token order). Row :math:`j`
    of :math:`S_c` is :math:`b_j` with entries :math:`1/s_j` on segment :math:`j`
    (eq. 22); :math:`S = \mathrm{blockdiag}(I_{n_p}, S_c)` (eq. 9);
    :math:`S^\dagger = \mathrm{blockdiag}(I, S_c^\top D)` (Claim 6.3).

    Args:
        count: 1-D integer tensor of the segment sizes :math:`s_j`, each ``>= 1``.
        num_vip: :math:`n_p`, the number of VIP rows, ``>= 0``.
        dtype: the dtype of the three matrices (default: ``torch.float64``).

    Returns:
        ``S`` ``[r, n]``, ``S_pinv`` ``[n, r]``, ``log_d`` ``[r]`` (0 for VIP rows),
        with ``r = num_vip + len(count)`` and ``n = num_vip + count.sum()``, on the CPU.
    """
    if not isinstance(count, Tensor) or count.dim() != 1 or not holds_integers(count):
        raise TypeError(  # (2.5 was truncated to 2)
            f"count must be a 1-D integer tensor of segment sizes, got "
            f"{f'{count.dtype} {tuple(count.shape)}' if isinstance(count, Tensor) else count!r}"
        )
    check_int(num_vip, "num_vip", minimum=0)
    count = count.to(torch.long).cpu()
    if bool((count < 1).any()):
        raise ValueError(f"every segment needs a token: count must be >= 1, got {count.tolist()}")
    num_rows, n_c = count.numel(), int(count.sum())
    with torch.device("cpu"):  # (whatever the default device)
        seg = torch.arange(num_rows).repeat_interleave(count)
        s_c = torch.zeros(num_rows, n_c, dtype=dtype)
        s_c[seg, torch.arange(n_c)] = 1.0 / count[seg].to(dtype)
        s = torch.block_diag(torch.eye(num_vip, dtype=dtype), s_c)
        d = torch.cat([torch.ones(num_vip, dtype=dtype), count.to(dtype)])
    return s, s.T * d, d.log()


def vcc_layer_dense(layer_fn: LayerFn, x: Tensor, num_vip: int, count: Tensor) -> Tensor:
    r""":math:`X_{\text{new}} = S^\dagger \gamma(S X) + X` (eq. 7) with explicit matrices.

    Args:
        layer_fn: ``(z [1, r, d], key_bias [1, r]) -> z + gamma(z)``.
        x: ``[n, d]`` one sequence with its ``num_vip`` VIP rows first.
        num_vip: :math:`n_p`, the number of VIP rows at the start of ``x``.
        count: 1-D integer tensor of the sizes of the segments of the non-VIP rows, in
            order, summing to ``n - num_vip``.

    Returns:
        ``[n, d]``.
    """
    s, s_pinv, log_d = compression_matrices(count, num_vip, x.dtype)
    sx = s.to(x.device) @ x
    gamma = layer_fn(sx[None], log_d.to(x.device)[None])[0] - sx
    return s_pinv.to(x.device) @ gamma + x
