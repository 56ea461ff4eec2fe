r"""Maps from :math:`\mathbb{R}^d` to the Poincaré half-space of cone attention: the
paper's ξ (:func:`xi_map`, sigmoid, penumbral) and ψ (:func:`psi_map`, exp, umbral); each
returns ``(horizontal [..., d-1], height [...])``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

#: Upper clamp on the log-height of :func:`~hiergraph.ops.cone.psi_map`; ``exp(20) ~ 4.9e8`` keeps
#: squared horizontal distances far from float32 overflow.
MAX_LOG_HEIGHT = 20.0

HalfSpaceMap = Callable[[Tensor], tuple[Tensor, Tensor]]


def xi_map(x: Tensor, r: float = 1.0) -> tuple[Tensor, Tensor]:
    r"""The paper's ξ map (eq. 11) onto the half-space below a light source at height ``r``.

    .. math::
        \xi(x)_d = r\,\sigma(x_d) \in (0, r), \qquad \xi(x)_{:-1} = x_{:-1}\, \xi(x)_d.

    Args:
        x: ``[..., d]`` with ``d >= 2``; the last coordinate becomes the height.
        r: light-source height (the paper's ``h``; 1 in its experiments).

    Returns:
        ``(horizontal [..., d-1], height [...])``.
    """
    height = r * torch.sigmoid(x[..., -1])
    return x[..., :-1] * height.unsqueeze(-1), height


def psi_map(
    x: Tensor, height_scale: float | None = 1.0, max_log_height: float = MAX_LOG_HEIGHT
) -> tuple[Tensor, Tensor]:
    r"""The paper's ψ map (eq. 10) onto the half-space, with an optional height temperature.

    .. math::
        \psi(x)_d = \exp\!\big(\min(c\,x_d,\ L)\big) > 0, \qquad
        \psi(x)_{:-1} = x_{:-1}\, \psi(x)_d,

    with ``c = height_scale`` and ``L = max_log_height``. Horizontal coordinates saturate at
    ``±finfo.max / 2``, so that differences of two of them are finite (an overflow to
    infinity made the distance of a point to itself ``inf - inf``, NaN): a point that far
    lies at an infinite distance from the others, not at none.

    Args:
        x: ``[..., d]`` with ``d >= 2``; the last coordinate becomes the height.
        height_scale: height temperature ``c``, 1 as in the paper by default; ``None`` means
            ``1/d``, as in the authors' code.
        max_log_height: upper clamp ``L`` on the log-height ``c x_d``, guarding float32
            overflow; :data:`MAX_LOG_HEIGHT` by default.

    Returns:
        ``(horizontal [..., d-1], height [...])``.
    """
    c = 1.0 / x.size(-1) if height_scale is None else height_scale
    height = torch.exp((c * x[..., -1]).clamp_max(max_log_height))
    limit = torch.finfo(height.dtype).max / 2
    return (x[..., :-1] * height.unsqueeze(-1)).clamp(-limit, limit), height
