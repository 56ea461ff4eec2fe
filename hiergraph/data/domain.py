"""Domain types of a family of sibling signals (Amizadeh et al., Sec. 2 and App. C)."""

from enum import IntEnum


class Domain(IntEnum):
    r"""The domain :math:`\Omega` on which the children of a node live.

    Every node of a :class:`~hiergraph.data.SignalHierarchy` stores the domain
    of the family it belongs to (that is, its *parent's* domain) in ``domain``,
    and its raw position in that domain in ``pos`` (a ``[2]`` integer pair):

    ========== ============================================ ==================
    member     meaning                                      ``pos`` of a child
    ========== ============================================ ==================
    NONE       no family (tree roots)                       ``(0, 0)``
    SET        unordered set, :math:`\varepsilon \equiv 0`  ``(0, 0)``
    GRID1D     1-D grid (tokens, sentences)                 ``(index, 0)``
    GRID2D     2-D grid (image patches)                     ``(row, col)``
    KEY_VALUE  distinguishable keys                         ``(key_id, 0)``
    GRAPH      nodes of a graph                             ``(node_id, 0)``
    ========== ============================================ ==================
    """

    NONE = 0
    SET = 1
    GRID1D = 2
    GRID2D = 3
    KEY_VALUE = 4
    GRAPH = 5

    @classmethod
    def parse(cls, value: "Domain | str | int") -> "Domain":
        """Accept a member, its name (case-insensitive, ``'1d'``/``'2d'`` too) or its value."""
        if isinstance(value, cls):
            return value
        if isinstance(value, str):
            key = value.strip().upper().replace("-", "_")
            key = {"1D": "GRID1D", "2D": "GRID2D", "KV": "KEY_VALUE", "KEYVALUE": "KEY_VALUE"}.get(
                key, key
            )
            if key in cls.__members__:
                return cls[key]
            raise ValueError(
                f"unknown domain {value!r}; expected one of "
                f"{[m.name.lower() for m in cls]} (or '1d', '2d', 'kv')"
            )
        if isinstance(value, int) and not isinstance(value, bool):
            return cls(value)
        raise TypeError(f"domain must be a Domain, str or int, got {type(value).__name__}")
