// Hierarchical self-attention over an equal-fanout forest, forward and backward, as one
// CPU kernel (hiergraph.ops.hsa.native builds and calls it).
//
// The forest (b_1, ..., b_D) holds trees of b_1 ... b_D consecutive leaves; every (tree,
// head) is one task, which runs the two passes of hiergraph.ops.hsa.uniform_fused (the
// notation of its docstring: node rows are the sums of their leaves' rows) over that
// tree's rows in place: the leaves' q, k, v (and the output, the gradients) are rows of
// [L, H, d] tensors with any row and head strides, read once per pass and never copied to
// a heads-first layout. A family's logits, weights and products live in a few kilobytes;
// the forward keeps, per task, the node sums above the leaves, the weights P, lse and
// the energies (`saved`), from which the backward recomputes the gates and the masses.
//
// Without gradients the forward also takes a leaf mask (masked leaves count 0: they drop out
// of every key set, node mean and energy, and their outputs are 0) and can stop between the
// passes (`up`, `down`): the roots' energies and pooled rows go to a family above the roots
// (hiergraph.ops.hsa.lifted), which hands back the mass and the output every root starts
// the top-down pass from.
#include <ATen/Dispatch.h>
#include <ATen/core/Tensor.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <numeric>
#include <optional>
#include <vector>

#include "family_ops.h"
#include "tensors.h"
#include "vector_ops.h"

namespace {

using hiergraph::axpy;
using hiergraph::combine;
using hiergraph::dot;
using hiergraph::gram;
using hiergraph::keyless_row;
using hiergraph::normalized_exp;

// Rows of one head: at the leaves, the input's own memory (row stride `stride`; with an
// `index`, row i is the input's row index[i], and a negative entry a padding slot read as
// the row `zeros`, which a write through it leaves 0); above them, node sums in a
// contiguous buffer.
template <typename T>
struct Rows {
  T* data;
  int64_t stride;
  const int64_t* index = nullptr;
  T* zeros = nullptr;
  T* operator[](int64_t i) const {
    if (!index) return data + i * stride;
    return index[i] < 0 ? zeros : data + index[i] * stride;
  }
};

// A tree whose nodes of depth d have b_{d+1} children (`fanout`), and `extra` more leaves
// (hubs) in its root's family, after the b_1 nodes with children.
struct Shape {
  std::vector<int64_t> fanout;  // b_d, d = 0 (top) .. D - 1 (leaves)
  std::vector<int64_t> family;  // the size of a family of level d: b_d (plus the hubs at 0)
  std::vector<int64_t> nodes;   // nodes of level d in one tree
  std::vector<int64_t> leaves;  // leaves below a node of level d (without hubs)
  int64_t depth, extra, tree, saved;  // tree: the leaves of the bottom level; saved: what
                                      // the forward keeps per (tree, head), in floats
  Shape(std::vector<int64_t> f, int64_t dim, int64_t dim_v, int64_t hubs = 0)
      : fanout(std::move(f)), extra(hubs) {
    depth = static_cast<int64_t>(fanout.size());
    family = fanout;
    family[0] += extra;
    nodes.resize(depth);
    leaves.resize(depth);
    int64_t n = 1;
    for (int64_t d = 0; d < depth; ++d) nodes[d] = n *= fanout[d];
    tree = n;
    for (int64_t d = 0; d < depth; ++d) leaves[d] = tree / nodes[d];
    nodes[0] += extra;
    saved = 0;
    for (int64_t d = 0; d < depth; ++d)
      saved += nodes[d] * (family[d] + 2 + (d + 1 < depth ? 2 * dim + dim_v : 0));
  }
  // Whether node i of level d is a leaf: the bottom level's nodes, and the hubs.
  bool leaf(int64_t d, int64_t i) const { return d + 1 == depth || (d == 0 && i >= fanout[0]); }
};

// Everything one (tree, head) keeps between the passes, per level. The node sums (levels
// above the leaves), the weights P, lse and the energies lie in `saved` (Shape::saved
// floats), which the forward hands the backward.
template <typename T>
struct Levels {
  std::vector<T*> q, k, v, p, lse, a;
  // w: P scaled by the mass reaching the node (the own weight on the diagonal at the leaves)
  std::vector<std::vector<T>> w, u, delta, mu, gain, own;  // gain: e^delta, own: e^u
  // under a leaf mask: every node's leaf count n and 1 / n (0 for n = 0)
  std::vector<std::vector<T>> count, inv;
  Levels(const Shape& s, int64_t dim, int64_t dim_v, T* saved)
      : q(s.depth), k(s.depth), v(s.depth), p(s.depth), lse(s.depth), a(s.depth), w(s.depth),
        u(s.depth), delta(s.depth), mu(s.depth), gain(s.depth), own(s.depth), count(s.depth),
        inv(s.depth) {
    for (int64_t d = 0; d < s.depth; ++d) {
      const int64_t n = s.nodes[d];
      if (d + 1 < s.depth) {
        q[d] = saved;
        k[d] = q[d] + n * dim;
        v[d] = k[d] + n * dim;
        saved = v[d] + n * dim_v;
      }
      p[d] = saved;
      lse[d] = saved + n * s.family[d];
      a[d] = lse[d] + n;
      saved = a[d] + n;
      w[d].resize(n * s.family[d]);
      u[d].resize(n);
      delta[d].resize(n);
      mu[d].resize(n);
      gain[d].resize(n);
      own[d].resize(n);
    }
  }
};

template <typename T>
struct Task {
  const Shape& s;
  int64_t dim, dim_v;
  T tau;
  bool include_self, size_bias;
  Rows<T> leaf_q, leaf_k, leaf_v;
  // position embeddings per level (rows of this tree and head; none: empty) and the rows
  // their gradients go to
  std::vector<Rows<T>> eps, eps_grad;
  int64_t eps_dim;
  // the tree's leaf mask (0 or 1 per leaf; none: null)
  const T* mask = nullptr;
  // the family above the roots: what the root's top-down pass starts from (its log mass u
  // and output acc; null: 0), and where its energy and pooled q, k, v means go (null: not
  // asked for)
  struct Root {
    T u = 0;
    const T* acc = nullptr;
    T *energy = nullptr, *q = nullptr, *k = nullptr, *v = nullptr;
  } root;
  // the hubs' q, k, v rows and where their outputs go, and their mask (Shape::extra)
  struct Hubs {
    Rows<T> q, k, v, out;
    const T* mask = nullptr;
  } hubs;

  // The q, k, v rows of level d: the inputs' at the leaves, the node sums above them.
  std::array<Rows<T>, 3> rows(Levels<T>& l, int64_t d) const {
    if (d + 1 == s.depth) return {leaf_q, leaf_k, leaf_v};
    return {Rows<T>{l.q[d], dim}, Rows<T>{l.k[d], dim}, Rows<T>{l.v[d], dim_v}};
  }
  bool gated(int64_t d) const { return d + 1 < s.depth || include_self; }
  int64_t max_fanout() const { return *std::max_element(s.family.begin(), s.family.end()); }

  // Leaf counts n and their inverses (0 for n = 0) of every node, under a leaf mask.
  void count(Levels<T>& l) const {
    if (!mask) return;
    for (int64_t d = s.depth - 1; d >= 0; --d) {
      std::vector<T>& n = l.count[d];
      if (d + 1 == s.depth) {
        n.assign(mask, mask + s.tree);
      } else {
        n.assign(s.nodes[d], T(0));
        for (int64_t i = 0; i < s.nodes[d + 1]; ++i) n[i / s.fanout[d + 1]] += l.count[d + 1][i];
        if (d == 0) std::copy(hubs.mask, hubs.mask + s.extra, n.begin() + s.fanout[0]);
      }
      l.inv[d].resize(n.size());
      for (size_t i = 0; i < n.size(); ++i) l.inv[d][i] = n[i] > 0 ? T(1) / n[i] : T(0);
    }
  }

  // Every node's total log(e^a + e^lse) of level d (lse alone without an energy), into
  // `totals`, in one vectorized pass.
  void totals_of(Levels<T>& l, int64_t d, std::vector<T>& totals) const {
    const T neg_inf = -std::numeric_limits<T>::infinity();
    const int64_t nodes = s.nodes[d];
    const T* a = l.a[d];
    const T* lse = l.lse[d];
    totals.resize(nodes);
    T* t = totals.data();
    if (!gated(d)) {
      std::copy(lse, lse + nodes, t);
      return;
    }
#pragma omp simd
    for (int64_t i = 0; i < nodes; ++i) {
      const bool none = a[i] == neg_inf && lse[i] == neg_inf;  // log_add_exp, vectorized
      const T rest = std::log1p(std::exp(-std::abs(a[i] - lse[i])));
      t[i] = none ? neg_inf : std::max(a[i], lse[i]) + rest;
    }
  }

  // The energy of the parent of level d's family f, a(A) = sum_C n(C)/n(A) log(e^a(C) +
  // e^lse(C)) (`totals`: the children's logs, from totals_of; `inv`: 1 / n(A)), and its
  // node sums (sq, sk, sv).
  T pool(Levels<T>& l, int64_t d, int64_t f, const T* totals, T inv, T* sq, T* sk,
         T* sv) const {
    const int64_t b = s.fanout[d];
    T total = 0;
    for (int64_t j = 0; j < b; ++j) {
      const int64_t i = f * b + j;
      if (!mask)
        total += totals[i];
      else if (l.count[d][i] > 0)
        total += l.count[d][i] * totals[i];
    }
    // the sums of the family's rows (at the leaves, of the valid ones)
    const T one = 1;
    const bool weighed = mask && d + 1 == s.depth;
    const T* coef = weighed ? mask + f * b : &one;
    const int64_t cs = weighed ? 1 : 0;
    const auto [q, k, v] = rows(l, d);
    combine(sq, (const T*)nullptr, one, coef, cs, q, f * b, b, dim);
    combine(sk, (const T*)nullptr, one, coef, cs, k, f * b, b, dim);
    combine(sv, (const T*)nullptr, one, coef, cs, v, f * b, b, dim_v);
    return total * inv;
  }

  // Bottom-up: node sums, weights P (0 on the diagonal, and at keys without valid leaves),
  // lse and energies of every level; with `root.energy`, also the roots' energy and pooled
  // means.
  void up(Levels<T>& l) const {
    const T neg_inf = -std::numeric_limits<T>::infinity();
    count(l);
    const int64_t widest = max_fanout();
    std::vector<T> buf(eps_dim ? widest * widest : 0), key(widest), totals;
    for (int64_t j = 0; j < s.extra; ++j) {  // the hubs' rows, after the top nodes' sums
      const int64_t i = s.fanout[0] + j;
      std::copy(hubs.q[j], hubs.q[j] + dim, l.q[0] + i * dim);
      std::copy(hubs.k[j], hubs.k[j] + dim, l.k[0] + i * dim);
      std::copy(hubs.v[j], hubs.v[j] + dim_v, l.v[0] + i * dim_v);
    }
    for (int64_t d = s.depth - 1; d >= 0; --d) {
      const int64_t b = s.family[d], n = s.leaves[d], nodes = s.nodes[d];
      // unmasked, every node of the level has n leaves: 1/n^2 in the scale, log n in lse
      const T scale = mask ? tau : tau / static_cast<T>(n * n);
      const T bias = size_bias && n > 1 && !mask ? std::log(static_cast<T>(n)) : T(0);
      const auto [q, k, v] = rows(l, d);
      T* p = l.p[d];
      for (int64_t first = 0; first < nodes; first += b) {
        gram(p + first * b, q, k, first, b, dim, scale);
        if (mask) {  // the means' 1 / n(i) n(j); keys: + log n(j), -inf without leaves
          const T* inv = l.inv[d].data() + first;
          const T* count = l.count[d].data() + first;
          for (int64_t j = 0; j < b; ++j)
            key[j] = count[j] > 0 ? (size_bias ? std::log(count[j]) : T(0)) : neg_inf;
          for (int64_t r = 0; r < b; ++r) {
            T* row = p + (first + r) * b;
#pragma omp simd
            for (int64_t j = 0; j < b; ++j) row[j] *= inv[r] * inv[j];
          }
        }
        if (eps_dim) {  // + e_i . e_j
          gram(buf.data(), eps[d], eps[d], first, b, eps_dim, T(1));
#pragma omp simd
          for (int64_t x = 0; x < b * b; ++x) p[first * b + x] += buf[x];
        }
        for (int64_t r = 0; r < b; ++r) {
          const int64_t i = first + r;
          T* row = p + i * b;
          if (s.leaf(d, i)) l.a[d][i] = include_self ? row[r] : neg_inf;
          if (mask) {
#pragma omp simd
            for (int64_t j = 0; j < b; ++j) row[j] += key[j];
          }
          row[r] = neg_inf;
          T m = neg_inf;
#pragma omp simd reduction(max : m)
          for (int64_t j = 0; j < b; ++j) m = row[j] > m ? row[j] : m;
          if (m == neg_inf) {  // no key: P = 0, lse = -inf (NaN logits: NaN)
            l.lse[d][i] = keyless_row(row, b);
            continue;
          }
          if (b == 2) {  // one key, the sibling: P = 1, lse its logit
            row[r] = T(0);
            row[1 - r] = T(1);
            l.lse[d][i] = m + bias;
            continue;
          }
          l.lse[d][i] = m + std::log(normalized_exp(row, b, m)) + bias;
        }
      }
      if (d == 0) break;
      const auto [pq, pk, pv] = rows(l, d - 1);  // the parents' energies and node sums
      totals_of(l, d, totals);
      for (int64_t f = 0; f < nodes / b; ++f) {
        const T inv = mask ? l.inv[d - 1][f] : T(1) / static_cast<T>(b);
        l.a[d - 1][f] = pool(l, d, f, totals.data(), inv, pq[f], pk[f], pv[f]);
      }
    }
    if (!root.energy) return;
    T inv = T(1) / static_cast<T>(s.tree);  // the root's, and its means from the sums
    if (mask) {
      const T n = std::accumulate(l.count[0].begin(), l.count[0].end(), T(0));
      inv = n > 0 ? T(1) / n : T(0);
    }
    totals_of(l, 0, totals);
    const T mean = mask ? inv : T(1) / static_cast<T>(s.fanout[0]);
    *root.energy = pool(l, 0, 0, totals.data(), mean, root.q, root.k, root.v);
    for (int64_t c = 0; c < dim; ++c) root.q[c] *= inv, root.k[c] *= inv;
    for (int64_t c = 0; c < dim_v; ++c) root.v[c] *= inv;
  }

  // Top-down: log masses, and the output written to `out` (leaf rows, stride out.stride;
  // no output where out.data is null), from the roots' mass root.u and output root.acc.
  void down(Levels<T>& l, Rows<T> out) const {
    const T neg_inf = -std::numeric_limits<T>::infinity();
    const bool write = out.data != nullptr;
    std::vector<T> acc_parent, acc, coef(max_fanout());
    for (int64_t d = 0; d < s.depth; ++d) {
      const int64_t b = s.family[d], nodes = s.nodes[d];
      const T inv_n = T(1) / static_cast<T>(s.leaves[d]);
      const bool leaves = d + 1 == s.depth;
      const Rows<T> v = rows(l, d)[2];
      if (!leaves && write) acc.resize(nodes * dim_v);  // every row written below
      // the gates: log mu = log sigmoid(x), log(1 - mu) = log sigmoid(-x), x = a - lse
      // (mu = 0 without an energy; no mass at all where a = lse = -inf); every node's mass
      // and its own weight e^u
      const T* a = l.a[d];
      const T* lse = l.lse[d];
      const T* u_up = d ? l.u[d - 1].data() : nullptr;
      T* delta = l.delta[d].data();
      T* u = l.u[d].data();
      T* mu = l.mu[d].data();
      T* gain = l.gain[d].data();
      T* own = l.own[d].data();
      const bool gate = gated(d);
      for (int64_t i = 0; i < nodes; ++i) u[i] = u_up ? u_up[i / b] : root.u;  // the parents'
#pragma omp simd
      for (int64_t i = 0; i < nodes; ++i) {
        const bool none = a[i] == neg_inf && lse[i] == neg_inf;
        const T x = none ? T(0) : a[i] - lse[i];
        const T t = std::log1p(std::exp(-std::abs(x)));
        const T base = u[i];
        delta[i] = gate ? (none ? neg_inf : base + std::min(-x, T(0)) - t) : base;
        u[i] = gate ? (none ? neg_inf : base + std::min(x, T(0)) - t) : base;
        mu[i] = gate && !none ? std::exp(std::min(x, T(0)) - t) : T(0);
        gain[i] = std::exp(delta[i]);
        own[i] = std::exp(u[i]);
      }
      for (int64_t i = 0; i < nodes; ++i) {
        const T* prow = l.p[d] + i * b;
        T* wrow = l.w[d].data() + i * b;
        const T g = gain[i];
#pragma omp simd
        for (int64_t j = 0; j < b; ++j) wrow[j] = g * prow[j];
        const bool leaf = s.leaf(d, i);
        wrow[i % b] = leaf && include_self ? own[i] : T(0);
        if (!write) continue;
        T* o = leaves ? out[i] : leaf ? hubs.out[i - s.fanout[0]] : acc.data() + i * dim_v;
        if (leaf && mask && l.count[d][i] == 0) {  // a masked leaf's output: 0
          std::fill(o, o + dim_v, T(0));
          continue;
        }
        const T* base = d ? acc_parent.data() + (i / b) * dim_v : root.acc;
        if (!mask) {
          combine(o, base, inv_n, wrow, 1, v, i - i % b, b, dim_v);
          continue;
        }
        const T* inv = l.inv[d].data() + (i - i % b);  // the keys' means: 1 / n(j)
        for (int64_t j = 0; j < b; ++j) coef[j] = wrow[j] * inv[j];
        combine(o, base, T(1), coef.data(), 1, v, i - i % b, b, dim_v);
      }
      acc_parent.swap(acc);
    }
  }

  // The gradients of the leaves' rows (dq, dk, dv) and of the position embeddings, from the
  // output's (grad), after `down` recomputed the masses. Under a leaf mask the means, keys
  // and energies take their nodes' counts; a masked leaf's output is 0 whatever its
  // gradient, and its rows get 0.
  void backward(Levels<T>& l, Rows<T> grad, Rows<T> dq, Rows<T> dk, Rows<T> dv) const {
    const int64_t depth = s.depth;
    const T one = 1;
    // leaves to roots: the output gradient summed per node G, dWW = W * dW, d delta, du
    std::vector<std::vector<T>> g(depth), dww(depth), d_delta(depth), du(depth);
    for (int64_t d = depth - 1; d >= 0; --d) {
      const int64_t b = s.fanout[d], nodes = s.nodes[d];
      const T inv_n = T(1) / static_cast<T>(s.leaves[d]);
      const bool leaves = d + 1 == depth;
      Rows<T> gr = leaves ? grad : Rows<T>{g[d].data(), dim_v};
      const Rows<T> v = rows(l, d)[2];
      dww[d].resize(nodes * b);
      d_delta[d].resize(nodes);
      if (leaves) du[d].assign(nodes, 0);  // above: the children's, summed below
      for (int64_t first = 0; first < nodes; first += b) {
        T* block = dww[d].data() + first * b;
        gram(block, gr, v, first, b, dim_v, mask ? one : inv_n);
        const T* w = l.w[d].data() + first * b;
        if (mask) {  // dW_ij = G_i . v_j / n(j); no G at a masked leaf
          const T* inv = l.inv[d].data() + first;
          for (int64_t r = 0; r < b; ++r) {
            const T keep = leaves ? inv[r] : one;
#pragma omp simd
            for (int64_t j = 0; j < b; ++j) block[r * b + j] *= keep * inv[j];
          }
        }
#pragma omp simd
        for (int64_t x = 0; x < b * b; ++x) block[x] *= w[x];
        for (int64_t r = 0; r < b; ++r) {
          const T* row = block + r * b;
          T dd = 0;
#pragma omp simd reduction(+ : dd)
          for (int64_t j = 0; j < b; ++j) dd += row[j];
          if (leaves) du[d][first + r] = row[r];
          d_delta[d][first + r] = dd - row[r];
        }
      }
      if (d == 0) break;
      g[d - 1].resize(s.nodes[d - 1] * dim_v);
      du[d - 1].assign(s.nodes[d - 1], 0);
      // a parent's G: the sum of its children's (of its valid leaves')
      const bool weighed = mask && leaves;
      for (int64_t f = 0; f < nodes / b; ++f)
        combine(g[d - 1].data() + f * dim_v, (const T*)nullptr, one,
                weighed ? mask + f * b : &one, weighed ? 1 : 0, gr, f * b, b, dim_v);
      for (int64_t i = 0; i < nodes; ++i) du[d - 1][i / b] += du[d][i] + d_delta[d][i];
    }
    // roots to leaves: energies, softmax, rows
    const int64_t widest = max_fanout();
    std::vector<T> da_parent, da, pq, pk, pv, nq, nk, nv, ds, sym(widest), cq(widest),
        ck(widest), cv(widest);
    for (int64_t d = 0; d < depth; ++d) {
      const int64_t b = s.fanout[d], nodes = s.nodes[d];
      const int64_t n = s.leaves[d];
      const T scale = tau / static_cast<T>(n * n), inv_n = T(1) / static_cast<T>(n);
      const bool leaves = d + 1 == depth;
      const auto [q, k, v] = rows(l, d);
      Rows<T> gr = leaves ? grad : Rows<T>{g[d].data(), dim_v};
      Rows<T> oq = leaves ? dq : Rows<T>{nullptr, dim}, ok = leaves ? dk : Rows<T>{nullptr, dim},
             ov = leaves ? dv : Rows<T>{nullptr, dim_v};
      if (!leaves) {
        nq.resize(nodes * dim);
        nk.resize(nodes * dim);
        nv.resize(nodes * dim_v);
        oq.data = nq.data();
        ok.data = nk.data();
        ov.data = nv.data();
      }
      const T* inv = mask ? l.inv[d].data() : nullptr;
      da.assign(nodes, 0);
      ds.resize(b * b);
      for (int64_t first = 0; first < nodes; first += b) {  // one family at a time
        for (int64_t r = 0; r < b; ++r) {  // dS of the family, [b, b]
          const int64_t i = first + r;
          // the parent's energy is the count-weighted mean of its children's totals
          T g_energy = 0;
          if (d)
            g_energy = da_parent[i / b] * (mask ? l.count[d][i] * l.inv[d - 1][i / b]
                                                 : T(1) / static_cast<T>(b));
          T dlse;
          if (gated(d)) {
            const T mu = l.mu[d][i], rest = 1 - mu;
            const T dx = du[d][i] * rest - d_delta[d][i] * mu;
            da[i] = dx + g_energy * mu;
            dlse = g_energy * rest - dx;
          } else {
            dlse = g_energy;
          }
          const T shift = d_delta[d][i] - dlse;
          const T* p = l.p[d] + i * b;
          const T* dw = dww[d].data() + i * b;
          T* row = ds.data() + r * b;
#pragma omp simd
          for (int64_t j = 0; j < b; ++j) row[j] = dw[j] - p[j] * shift;
          row[r] = leaves && include_self ? da[i] : T(0);
        }
        const T* w = l.w[d].data() + first * b;
        for (int64_t r = 0; r < b; ++r) {  // each row: the parent's gradient plus its products
          const int64_t i = first + r, parent = i / b;
          const T* bq = d ? pq.data() + parent * dim : nullptr;
          const T* bk = d ? pk.data() + parent * dim : nullptr;
          const T* bv = d ? pv.data() + parent * dim_v : nullptr;
          if (!mask) {
            combine(oq[i], bq, scale, ds.data() + r * b, 1, k, first, b, dim);
            combine(ok[i], bk, scale, ds.data() + r, b, q, first, b, dim);
            combine(ov[i], bv, inv_n, w + r, b, gr, first, b, dim_v);
          } else {  // S_ij = tau q_i . k_j / n(i) n(j); a masked leaf's rows get nothing
            const T* valid = leaves ? mask + first : nullptr;
            for (int64_t j = 0; j < b; ++j) {
              cq[j] = ds[r * b + j] * inv[first + j];
              ck[j] = ds[j * b + r] * inv[first + j];
              cv[j] = w[j * b + r] * (valid ? valid[j] : one);
            }
            const bool dropped = leaves && valid[r] == 0;
            combine(oq[i], dropped ? nullptr : bq, tau * inv[i], cq.data(), 1, k, first, b, dim);
            combine(ok[i], dropped ? nullptr : bk, tau * inv[i], ck.data(), 1, q, first, b, dim);
            combine(ov[i], dropped ? nullptr : bv, inv[i], cv.data(), 1, gr, first, b, dim_v);
          }
          if (eps_dim) {  // (dS + dS^T) e
            for (int64_t j = 0; j < b; ++j) sym[j] = ds[r * b + j] + ds[j * b + r];
            combine(eps_grad[d][i], (const T*)nullptr, T(1), sym.data(), 1, eps[d], first, b,
                    eps_dim);
          }
        }
      }
      pq.swap(nq);
      pk.swap(nk);
      pv.swap(nv);
      da_parent.swap(da);
    }
  }
};

template <typename T>
Rows<T> head_rows(const at::Tensor& t, int64_t tree_start, int64_t h) {
  T* base = t.data_ptr<T>() + tree_start * t.stride(0) + h * t.stride(1);
  return Rows<T>{base, t.stride(0)};
}

void check_rows(const at::Tensor& t, const at::Tensor& q, const char* name) {
  TORCH_CHECK(t.dim() == 3 && t.stride(2) == 1, name,
              " must be [L, H, d] with unit channel stride");
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == q.scalar_type(), name,
              " must be a CPU tensor of q's dtype");
  TORCH_CHECK(t.size(0) == q.size(0) && t.size(1) == q.size(1), name,
              " must have q's leaves and heads");
}

// The leaves' rows of q, k, v and the position embeddings; the number of trees.
int64_t check(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
              const std::vector<at::Tensor>& eps, const Shape& s) {
  check_rows(q, q, "q");
  check_rows(k, q, "k");
  check_rows(v, q, "v");
  TORCH_CHECK(k.size(2) == q.size(2), "q and k must have the same channels");
  for (int64_t b : s.fanout) TORCH_CHECK(b >= 2, "every fanout must be at least 2");
  TORCH_CHECK(q.size(0) % s.tree == 0, "the leaves are not a whole number of trees");
  const int64_t trees = q.size(0) / s.tree;
  TORCH_CHECK(eps.empty() || static_cast<int64_t>(eps.size()) == s.depth,
              "eps must have one tensor per level");
  for (size_t d = 0; d < eps.size(); ++d) {
    const at::Tensor& e = eps[d];
    TORCH_CHECK(e.dim() == 3 && e.stride(2) == 1 && e.device().is_cpu() &&
                    e.scalar_type() == q.scalar_type(),
                "eps must be [H | 1, n_d, c] CPU tensors of q's dtype with unit channel stride");
    TORCH_CHECK((e.size(0) == 1 || e.size(0) == q.size(1)) &&
                    e.size(1) == trees * s.nodes[d] && e.size(2) == eps[0].size(2),
                "eps does not match the forest's levels and heads");
  }
  return trees;
}

template <typename T>
std::vector<Rows<T>> level_rows(const std::vector<at::Tensor>& per_level, const Shape& s,
                                int64_t tree, int64_t h) {
  std::vector<Rows<T>> rows;
  for (size_t d = 0; d < per_level.size(); ++d) {
    const at::Tensor& e = per_level[d];
    const int64_t head = e.size(0) == 1 ? 0 : h;
    rows.push_back({e.data_ptr<T>() + head * e.stride(0) + tree * s.nodes[d] * e.stride(1),
                    e.stride(1)});
  }
  return rows;
}

// The leaf mask as one value of q's dtype per leaf (undefined: none).
at::Tensor leaf_mask(const std::optional<at::Tensor>& mask, const at::Tensor& q) {
  if (!mask) return at::Tensor();
  TORCH_CHECK(mask->dim() == 1 && mask->size(0) == q.size(0) && mask->device().is_cpu(),
              "the leaf mask must be a CPU tensor with one value per leaf");
  return mask->to(q.scalar_type()).contiguous();
}

// The rows of head h of [N, H, c] `t` that `index` (one entry per leaf; negative: a padding
// slot, read as `zeros`) picks.
template <typename T>
Rows<T> indexed_rows(const at::Tensor& t, const int64_t* index, int64_t h, T* zeros) {
  Rows<T> rows = head_rows<T>(t, 0, h);
  rows.index = index;
  rows.zeros = zeros;
  return rows;
}

// 1 for the entries of `index` that are rows, 0 for the padding slots.
template <typename T>
void valid_rows(std::vector<T>& out, const int64_t* index, int64_t n) {
  out.resize(n);
  for (int64_t i = 0; i < n; ++i) out[i] = index[i] >= 0 ? T(1) : T(0);
}

// Runs `fn(task, levels, tree, h, zeros)` for every (tree, head), in parallel; eps_grad: per
// level [H, n_d, c], the rows the task writes the gradients of its position embeddings to;
// mask: from leaf_mask; rows: none (tree t's leaves are rows t * s.tree, ... of q, k, v), or
// [trees, s.tree] int64, the rows of every tree's leaves (negative: padding slots, masked);
// saved: the tasks' states, Shape::saved values each in (tree, head) order (null: a buffer
// of the task's own), which `levels` lays out; zeros: a zero row of max(d, d_v) values `fn`
// may hand out as well.
template <typename T, typename F>
void each_task(const Shape& s, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
               const std::vector<at::Tensor>& eps, const std::vector<at::Tensor>& eps_grad,
               const at::Tensor& mask, const at::Tensor& rows, T* saved, int64_t trees,
               double tau, bool include_self, bool size_bias, F fn) {
  const int64_t heads = q.size(1);
  const int64_t eps_dim = eps.empty() ? 0 : eps[0].size(2);
  const T* leaf_mask = mask.defined() ? mask.data_ptr<T>() : nullptr;
  const int64_t* index = rows.defined() ? rows.data_ptr<int64_t>() : nullptr;
  at::parallel_for(0, trees * heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<T> zeros(std::max(q.size(2), v.size(2)), T(0)), valid, own(saved ? 0 : s.saved);
    for (int64_t item = begin; item < end; ++item) {
      const int64_t h = item % heads, tree = item / heads, start = tree * s.tree;
      Task<T> task{s, q.size(2), v.size(2), static_cast<T>(tau), include_self, size_bias,
                   head_rows<T>(q, start, h), head_rows<T>(k, start, h),
                   head_rows<T>(v, start, h), level_rows<T>(eps, s, tree, h),
                   level_rows<T>(eps_grad, s, tree, h), eps_dim};
      task.mask = leaf_mask ? leaf_mask + start : nullptr;
      if (index) {
        task.leaf_q = indexed_rows<T>(q, index + start, h, zeros.data());
        task.leaf_k = indexed_rows<T>(k, index + start, h, zeros.data());
        task.leaf_v = indexed_rows<T>(v, index + start, h, zeros.data());
        valid_rows(valid, index + start, s.tree);
        task.mask = valid.data();
      }
      Levels<T> levels(s, q.size(2), v.size(2), saved ? saved + item * s.saved : own.data());
      fn(task, levels, tree, h, zeros.data());
    }
  });
}

}  // namespace

// The output [L, H, d_v] (in v's memory layout) and, with `save`, what the backward reads
// ([trees * heads, Shape::saved]; else empty). eps: the position embeddings of every level
// below the roots, [H | 1, n_d, c] in breadth-first order (or none); mask: [L], nonzero for
// the valid leaves (or none).
std::vector<at::Tensor> forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                const std::vector<at::Tensor>& eps,
                                std::vector<int64_t> fanout, double tau, bool include_self,
                                bool size_bias, bool save,
                                const std::optional<at::Tensor>& mask) {
  const Shape s(std::move(fanout), q.size(2), v.size(2));
  const int64_t trees = check(q, k, v, eps, s);
  const at::Tensor valid = leaf_mask(mask, q);
  at::Tensor out = hiergraph::empty_like(v);
  at::Tensor saved = q.new_empty({save ? trees * q.size(1) : 0, s.saved});
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "hsa_forward", [&] {
    scalar_t* states = save ? saved.data_ptr<scalar_t>() : nullptr;
    each_task<scalar_t>(s, q, k, v, eps, {}, valid, at::Tensor(), states, trees, tau,
                        include_self, size_bias,
                        [&](Task<scalar_t>& task, Levels<scalar_t>& levels, int64_t tree,
                            int64_t h, scalar_t*) {
      task.up(levels);
      task.down(levels, head_rows<scalar_t>(out, tree * s.tree, h));
    });
  });
  return {out, saved};
}

// The bottom-up pass alone (no gradients), up to the roots: the state `down` continues from
// ([trees * heads, Shape::saved]), the roots' energies [H, trees] and pooled q, k, v means
// [H, trees, d | d_v] (0 for a root without valid leaves). Arguments as in `forward`.
std::vector<at::Tensor> up(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const std::vector<at::Tensor>& eps, std::vector<int64_t> fanout,
                           double tau, bool include_self, bool size_bias,
                           const std::optional<at::Tensor>& mask) {
  const Shape s(std::move(fanout), q.size(2), v.size(2));
  const int64_t trees = check(q, k, v, eps, s), heads = q.size(1);
  const at::Tensor valid = leaf_mask(mask, q);
  at::Tensor saved = q.new_empty({trees * heads, s.saved});
  at::Tensor energy = q.new_empty({heads, trees});
  at::Tensor pq = q.new_empty({heads, trees, q.size(2)});
  at::Tensor pk = hiergraph::empty_like(pq), pv = q.new_empty({heads, trees, v.size(2)});
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "hsa_up", [&] {
    each_task<scalar_t>(s, q, k, v, eps, {}, valid, at::Tensor(), saved.data_ptr<scalar_t>(),
                        trees, tau, include_self, size_bias,
                        [&](Task<scalar_t>& task, Levels<scalar_t>& levels, int64_t tree,
                            int64_t h, scalar_t*) {
      const int64_t root = h * trees + tree;
      task.root.energy = energy.data_ptr<scalar_t>() + root;
      task.root.q = pq.data_ptr<scalar_t>() + root * q.size(2);
      task.root.k = pk.data_ptr<scalar_t>() + root * q.size(2);
      task.root.v = pv.data_ptr<scalar_t>() + root * v.size(2);
      task.up(levels);
    });
  });
  return {saved, energy, pq, pk, pv};
}

// The top-down pass from `up`'s state, starting at every root from the log mass `u`
// [H, trees] and the output `acc` [H, trees, d_v] a family above them hands down: the
// output [L, H, d_v], as from `forward`.
at::Tensor down(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                const std::vector<at::Tensor>& eps, const at::Tensor& saved, const at::Tensor& u,
                const at::Tensor& acc, std::vector<int64_t> fanout, double tau,
                bool include_self, bool size_bias, const std::optional<at::Tensor>& mask) {
  const Shape s(std::move(fanout), q.size(2), v.size(2));
  const int64_t trees = check(q, k, v, eps, s), heads = q.size(1);
  const at::Tensor valid = leaf_mask(mask, q);
  TORCH_CHECK(saved.is_contiguous() && saved.numel() == trees * heads * s.saved &&
                  saved.scalar_type() == q.scalar_type(),
              "saved does not come from this forest's up pass");
  TORCH_CHECK(u.sizes() == at::IntArrayRef({heads, trees}) &&
                  acc.sizes() == at::IntArrayRef({heads, trees, v.size(2)}),
              "u must be [H, trees] and acc [H, trees, d_v]");
  const at::Tensor root_u = u.to(q.scalar_type()).contiguous();
  const at::Tensor root_acc = acc.to(q.scalar_type()).contiguous();
  at::Tensor out = hiergraph::empty_like(v);
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "hsa_down", [&] {
    each_task<scalar_t>(s, q, k, v, eps, {}, valid, at::Tensor(), saved.data_ptr<scalar_t>(),
                        trees, tau, include_self, size_bias,
                        [&](Task<scalar_t>& task, Levels<scalar_t>& levels, int64_t tree,
                            int64_t h, scalar_t*) {
      const int64_t root = h * trees + tree;
      task.root.u = root_u.data_ptr<scalar_t>()[root];
      task.root.acc = root_acc.data_ptr<scalar_t>() + root * v.size(2);
      task.count(levels);
      task.down(levels, head_rows<scalar_t>(out, tree * s.tree, h));
    });
  });
  return out;
}

// The gradients of q, k, v (in their memory layouts) from the output's, `grad`, and those
// of the position embeddings per head, [H, n_d, c] per level; mask: the forward's.
std::vector<at::Tensor> backward(const at::Tensor& grad, const at::Tensor& q,
                                 const at::Tensor& k, const at::Tensor& v,
                                 const std::vector<at::Tensor>& eps, const at::Tensor& saved,
                                 std::vector<int64_t> fanout, double tau, bool include_self,
                                 bool size_bias, const std::optional<at::Tensor>& mask) {
  const Shape s(std::move(fanout), q.size(2), v.size(2));
  const int64_t trees = check(q, k, v, eps, s);
  check_rows(grad, q, "grad");
  TORCH_CHECK(grad.size(2) == v.size(2), "grad must have v's channels");
  TORCH_CHECK(saved.is_contiguous() && saved.numel() == trees * q.size(1) * s.saved &&
                  saved.scalar_type() == q.scalar_type(),
              "saved does not come from this forest's forward");
  const at::Tensor valid = leaf_mask(mask, q);
  at::Tensor dq = hiergraph::empty_like(q);
  at::Tensor dk = hiergraph::empty_like(k);
  at::Tensor dv = hiergraph::empty_like(v);
  std::vector<at::Tensor> grads{dq, dk, dv}, eps_grad;
  for (const at::Tensor& e : eps)
    eps_grad.push_back(e.new_empty({q.size(1), e.size(1), e.size(2)}));
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "hsa_backward", [&] {
    each_task<scalar_t>(s, q, k, v, eps, eps_grad, valid, at::Tensor(),
                        saved.data_ptr<scalar_t>(), trees, tau, include_self, size_bias,
                        [&](Task<scalar_t>& task, Levels<scalar_t>& levels, int64_t tree,
                            int64_t h, scalar_t*) {
      const int64_t start = tree * s.tree;
      task.count(levels);
      task.down(levels, Rows<scalar_t>{nullptr, 0});  // the log masses and weights
      task.backward(levels, head_rows<scalar_t>(grad, start, h),
                    head_rows<scalar_t>(dq, start, h), head_rows<scalar_t>(dk, start, h),
                    head_rows<scalar_t>(dv, start, h));
    });
  });
  grads.insert(grads.end(), eps_grad.begin(), eps_grad.end());
  return grads;
}

// HSA over trees whose root has `windows` = fanout[0] subtrees of equal fanout
// (fanout[1:]) and hubs as leaves of its own family (hiergraph.integrations.hub_windows),
// without gradients: tree t's window leaves are the rows leaf_rows[t] ([trees, windows *
// b_2 ... b_D] int64) of q, k, v [N, H, d | d_v], its hubs the rows hub_rows[t] ([trees,
// G]); a negative entry is a padding slot (no leaf). Every leaf's and hub's output is
// written to its row of `out` [N, H, d_v]; the other rows are left as they are.
void hub_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                 const at::Tensor& leaf_rows, const at::Tensor& hub_rows,
                 std::vector<int64_t> fanout, double tau, bool include_self, bool size_bias,
                 at::Tensor& out) {
  TORCH_CHECK(fanout.size() >= 2, "the windows need a level below the root's family");
  const Shape s(std::move(fanout), q.size(2), v.size(2), hub_rows.size(1));
  check_rows(q, q, "q");
  check_rows(k, q, "k");
  check_rows(v, q, "v");
  TORCH_CHECK(out.dim() == 3 && out.stride(2) == 1 && out.device().is_cpu() &&
                  out.scalar_type() == q.scalar_type() && out.size(1) == q.size(1),
              "out must be [N, H, d_v] CPU rows of q's dtype and heads, unit channel stride");
  TORCH_CHECK(k.size(2) == q.size(2) && out.size(2) == v.size(2),
              "k must have q's channels and out v's");
  TORCH_CHECK(s.fanout[0] >= 1, "the root needs a window");
  for (int64_t d = 1; d < s.depth; ++d)
    TORCH_CHECK(s.fanout[d] >= 2, "every fanout below the root must be at least 2");
  for (const at::Tensor* t : {&leaf_rows, &hub_rows})
    TORCH_CHECK(t->dim() == 2 && t->scalar_type() == at::kLong && t->is_contiguous() &&
                    t->device().is_cpu(),
                "leaf_rows and hub_rows must be contiguous [trees, n] int64 CPU tensors");
  const int64_t trees = leaf_rows.size(0);
  TORCH_CHECK(leaf_rows.size(1) == s.tree && hub_rows.size(0) == trees,
              "leaf_rows must be [trees, the windows' leaves], hub_rows [trees, hubs]");
  for (const at::Tensor* t : {&leaf_rows, &hub_rows})
    TORCH_CHECK(t->numel() == 0 || t->max().item<int64_t>() < std::min(q.size(0), out.size(0)),
                "leaf_rows and hub_rows index rows of q, k, v and out");
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "hsa_hub_forward", [&] {
    const int64_t* hub_index = hub_rows.data_ptr<int64_t>();
    each_task<scalar_t>(s, q, k, v, {}, {}, at::Tensor(), leaf_rows, nullptr, trees, tau,
                        include_self, size_bias,
                        [&](Task<scalar_t>& task, Levels<scalar_t>& levels, int64_t tree,
                            int64_t h, scalar_t* zeros) {
      const int64_t* own = hub_index + tree * s.extra;
      std::vector<scalar_t> valid;
      valid_rows(valid, own, s.extra);
      task.hubs = {indexed_rows<scalar_t>(q, own, h, zeros),
                   indexed_rows<scalar_t>(k, own, h, zeros),
                   indexed_rows<scalar_t>(v, own, h, zeros),
                   indexed_rows<scalar_t>(out, own, h, zeros), valid.data()};
      task.up(levels);
      task.down(levels, indexed_rows<scalar_t>(out, leaf_rows.data_ptr<int64_t>() +
                                                        tree * s.tree, h, zeros));
    });
  });
}
