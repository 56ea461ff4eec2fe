r"""H-matrix attention (H-Transformer-1D) in linear time and memory.

Zhu & Soricut, *H-Transformer-1D: Fast One-Dimensional Hierarchical Attention
for Sequences* (ACL 2021). The block layout is the paper's tri-diagonal +
overlap-correction construction (Sec. 5.2.1 and 5.2.3, eq. 16–23; the entries
that adjacent levels share are counted once, which the paper leaves to a
footnote), which is also the one of the authors' released code.

Coarsening levels
-----------------
With :math:`N_r` the block size ("numerical rank"), the sequence is padded to
:math:`L' = N_r 2^M` and coarsened :math:`M-1` times by pairs. At level
:math:`l` a coarse token :math:`I` stands for the fine tokens
:math:`\{i : \lfloor i/2^l \rfloor = I\}` and carries

.. math::
    \tilde q^{(l)}_I = \operatorname{mean}_{i \in I} q_i, \qquad
    \tilde k^{(l)}_J = \operatorname{mean}_{j \in J} k_j, \qquad
    \tilde v^{(l)}_J = \textstyle\sum_{j \in J} v_j, \qquad
    n^{(l)}_J = |J|

(means and counts over valid, i.e. non-padded, tokens; in causal mode
:math:`\tilde q^{(l)}_I = q_{I 2^l}`, the first token of the group, because a
mean would mix in future queries). Each level is cut into blocks of
:math:`N_r` coarse tokens, i.e. windows of :math:`N_r 2^l` fine tokens.

Implied attention matrix
------------------------
Every pair :math:`(i, j)` gets exactly one level :math:`l(i, j)`
(:func:`~hiergraph.ops.hmatrix_level_masks`) and the logit

.. math::
    \hat S_{ij} = \tilde q^{(l)}_{\lfloor i/2^l \rfloor}{}^\top
                  \tilde k^{(l)}_{\lfloor j/2^l \rfloor} / \sqrt d,
    \qquad l = l(i, j),

and the output is the row softmax :math:`Z = \operatorname{softmax}(\hat S) V`.
Level 0 is the block tri-diagonal: query block :math:`b` sees key blocks
:math:`b-1, b, b+1` exactly. At level :math:`l \ge 1` coarse query block
:math:`b` sees coarse key blocks :math:`b \pm 1`, minus the quarter that level
:math:`l-1` already covers (with :math:`h = N_r/2`, row :math:`r` and column
:math:`c` inside the block: drop :math:`r \ge h, c < h` on the right block and
:math:`r < h, c \ge h` on the left block). Causal mode keeps only keys
:math:`j \le i`: the lower triangle of the diagonal blocks and the left blocks.
Each far block of :math:`\hat S` is a piecewise-constant expansion of an
:math:`N_r \times N_r` coarse block, so it has rank :math:`\le N_r`.

:func:`~hiergraph.ops.hmatrix_attention` computes :math:`Z` without forming :math:`\hat S`:
per level, :math:`Y_l = \exp(\tilde S_l - \mu_l)\,\tilde V_l` and
:math:`R_l = \exp(\tilde S_l - \mu_l)\, n_l` on the coarse grid, then
coarse-to-fine :math:`\hat Y \leftarrow \mathrm{repeat}_2(\hat Y)\,
e^{\mathrm{repeat}_2(\mu_{l+1}) - \mu_l} + Y_l` (and the same for :math:`\hat R`),
and :math:`Z = \hat Y / \hat R`. The shift :math:`\mu_l` of a coarse row is the
running maximum of its logits over levels :math:`\ge l`, so every fine row is
shifted once, by its own maximum logit, across all levels: no overflow, no
underflow of a whole row, and :math:`\hat R \ge 1` for every row that has a key.
:func:`~hiergraph.ops.hmatrix_attention_dense` builds :math:`\operatorname{softmax}(\hat S)`
densely and is the reference the fast path is tested against.

The levels as a window hierarchy
--------------------------------
The coarse tokens of all levels are the nodes of a hopping-window hierarchy
over the (padded) sequence with branching factor 2 at every level: node
:math:`I` of level :math:`l` is the window :math:`[I 2^l, (I+1) 2^l)`, its
children are the two windows of level :math:`l-1` it is made of, and
:math:`\tilde q, \tilde k` are the mean leaf query/key below it while
:math:`\tilde v` is the leaf value sum. :func:`~hiergraph.data.hmatrix_window_hierarchy`
builds this tree as a ``SignalHierarchy`` (a PyG graph), on which
:func:`~hiergraph.nn.coarsen_leaves` reproduces the coarse tokens. A
level-:math:`l` block is the run of :math:`N_r` consecutive nodes covering
:math:`N_r 2^l` tokens. The fast path does not walk that graph: the tree is
implicit in the row index (node :math:`I` of level :math:`l` has children
:math:`2I, 2I+1`), so coarsening is a reshape-and-sum per level.

How H-matrix attention differs from HSA
---------------------------------------
Hierarchical Self-Attention (:func:`hiergraph.ops.hierarchical_attention`)
and H-matrix attention both use mean queries/keys of tree nodes for far
interactions, but they tie different blocks and normalise differently:

* **Tied blocks.** In HSA the tree is the model: for two sibling subtrees
  :math:`A, B`, every leaf of :math:`A` gives the *same* weight to every leaf
  of :math:`B`; the block :math:`A \times B` of the attention matrix is
  rank one, with logit :math:`\rho_q(A)^\top \rho_k(B)/\sqrt d + \log n(B)`.
  In H-matrix attention the tied blocks are :math:`2^l \times 2^l` tiles of
  an :math:`N_r 2^l`-wide off-diagonal block, so the block has rank
  :math:`\le N_r`, and the tiles shrink towards the diagonal (exact
  attention on the :math:`\ge N_r` nearest tokens on each side).
* **Normalisation.** HSA normalises per family: each node's softmax runs over
  its siblings, and per-node gates :math:`\mu` mix the levels along a root
  path, which makes the whole matrix the KL-optimal block-constrained
  projection of flat softmax attention. H-matrix attention has no gates: all
  levels' exponentials go into one row sum and the row is normalised once.
  It is a fixed low-rank approximation of the *logits*, not an optimal
  projection of the attention distribution.
* **Structure.** HSA runs on any signal hierarchy (``SignalHierarchy``);
  H-matrix attention assumes a 1-D sequence whose hierarchy is the implicit
  binary window tree above, so it needs no index tensors at all.

Modules
-------
:mod:`~hiergraph.ops.hmatrix.packed` holds the fast path (:func:`~hiergraph.ops.hmatrix_attention`),
:mod:`~hiergraph.ops.hmatrix.dense` the dense reference built from the closed form of
the level map, and :mod:`~hiergraph.ops.hmatrix.inputs` the checks of their inputs.
"""

from hiergraph.ops.hmatrix.dense import (
    hmatrix_attention_dense,
    hmatrix_attention_matrix,
    hmatrix_level_masks,
    hmatrix_logits,
)
from hiergraph.ops.hmatrix.packed import hmatrix_attention

__all__ = [
    "hmatrix_attention",
    "hmatrix_attention_dense",
    "hmatrix_attention_matrix",
    "hmatrix_level_masks",
    "hmatrix_logits",
]
