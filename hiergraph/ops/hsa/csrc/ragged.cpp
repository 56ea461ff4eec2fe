// Hierarchical self-attention over any forest (a batch of ragged trees), forward and
// backward, as one CPU kernel (hiergraph.ops.hsa.native builds and calls it).
//
// The forest is read in breadth-first (BFS) positions x: the children of x are the
// positions child_ptr[x] .. child_ptr[x + 1] - 1 (one family, in child order), leaf_row[x] is
// the leaf's row of q, k, v (-1 at inner nodes), count[x] its leaf count n(x), node[x] its
// node id (the row of the position embeddings eps), and p_off[x] where the weights of its
// children's family start (sum of the squared sizes of the families before it). Levels are
// BFS ranges, cut into the trees' ranges by tree_ptr. Each pass runs one task per (tree,
// head), level by level inside it, or, with fewer such tasks than threads, level by level
// over all trees, in parallel over every (family, head); a family's logits, weights and
// products stay in a few kilobytes. The notation
// is that of hiergraph.ops.hsa.attention.general_attention: rho the mean q, k, v of a node's
// leaves (a leaf's own rows), the sibling logits
//   s(C, B) = tau rho_q(C) . rho_k(B) + eps(C) . eps(B) + log n(B),
// P their softmax over the other members of C's family, lse its log-partition, a(C) the
// energy (a leaf's self energy tau q . k + eps . eps with include_self, else -inf; an inner
// node's sum of n(C) / n(A) log(e^a(C) + e^lse(C)) over its children), and, from the roots
// down, the log masses delta(C) = u(A) + log(1 - mu(C)), u(C) = u(A) + log mu(C) with
// mu = sigmoid(a - lse). A node's output row is its parent's plus e^delta(C) sum_B P rho_v(B);
// a leaf's, with include_self, plus e^u v. The forward keeps the inner nodes' means, P, lse,
// a, u and delta; the backward runs once from the leaves up (the output gradient summed per
// node G, the weights' gradients and those of delta and u) and once from the roots down
// (energies, softmax, means; a leaf's gradient is the sum over its root path of
// d rho(A) / n(A)).
#include <ATen/Dispatch.h>
#include <ATen/core/Tensor.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <vector>

#include "checks.h"
#include "family_ops.h"
#include "tensors.h"
#include "vector_ops.h"

namespace {

using hiergraph::axpy;
using hiergraph::check_index;
using hiergraph::check_leaf_qkv;
using hiergraph::check_tensor;
using hiergraph::combine;
using hiergraph::gram;
using hiergraph::keyless_row;
using hiergraph::log_add_exp;
using hiergraph::log_gates;
using hiergraph::normalized_exp;
using Tensors = std::vector<at::Tensor>;

template <typename T>
constexpr T kNegInf = -std::numeric_limits<T>::infinity();

// Rows of a family's members, one pointer each (filled once per family and head, so that
// the products read every row without working out where it lies).
template <typename T>
struct Members {
  const T* const* rows;
  const T* operator[](int64_t j) const { return rows[j]; }
};

// A thread's buffer of at least n pointers (`slot`: one of a few in use at once).
template <typename T>
const T** pointers(int64_t n, int slot) {
  thread_local std::vector<const T*> buffers[4];
  std::vector<const T*>& buffer = buffers[slot];
  if (static_cast<int64_t>(buffer.size()) < n) buffer.resize(n);
  return buffer.data();
}

// The forest and the inputs.
template <typename T>
struct Forest {
  const int64_t *child_ptr, *leaf_row, *node, *p_off, *tree_ptr;
  const T* count;
  std::vector<int64_t> level_ptr;
  int64_t trees;
  int64_t heads, d, dv, c, eps_heads;
  T tau;
  bool include_self;
  const T *q, *k, *v, *eps;
  std::vector<T> key;  // every position's key bias: log n with the size bias, else 0

  int64_t leaf(int64_t x) const { return leaf_row[x]; }
  // The rows of the family below `par` in head h: a leaf's row of `leaf` ([L, H, width]),
  // an inner node's of `inner` ([N, H, width]).
  Members<T> members(const T* leaf, const T* inner, int64_t width, int64_t par, int64_t h,
                     int slot) const {
    const int64_t c0 = child_ptr[par], b = child_ptr[par + 1] - c0;
    const T** rows = pointers<T>(b, slot);
    for (int64_t j = 0; j < b; ++j) {
      const int64_t x = c0 + j, r = leaf_row[x];
      rows[j] = r >= 0 ? leaf + (r * heads + h) * width : inner + (x * heads + h) * width;
    }
    return {rows};
  }
  // Their position embeddings (rows of eps [N, H or 1, c] in node order).
  Members<T> embeddings(int64_t par, int64_t h, int slot) const {
    const int64_t c0 = child_ptr[par], b = child_ptr[par + 1] - c0;
    const T** rows = pointers<T>(b, slot);
    for (int64_t j = 0; j < b; ++j)
      rows[j] = eps + (node[c0 + j] * eps_heads + (eps_heads == 1 ? 0 : h)) * c;
    return {rows};
  }
  // The weights of the family below `par`, head h: a [b, b] block.
  int64_t block(int64_t par, int64_t h, int64_t b) const { return p_off[par] * heads + h * b * b; }
  // Runs fn(par, h, b) for every family (parent par, b children) and head, level by level
  // from the deepest (`up`) or from the top: one task per (tree, head) where there are at
  // least as many as threads (a tree's rows stay in cache from level to level), else in
  // parallel over the families of each level.
  template <typename F>
  void families(bool up, const F& fn) const {
    const int64_t depth = static_cast<int64_t>(level_ptr.size()) - 1;
    const auto level = [&](int64_t step) { return up ? depth - step : step; };
    const auto run = [&](int64_t first, int64_t end, int64_t h) {
      for (int64_t par = first; par < end; ++par) {
        const int64_t b = child_ptr[par + 1] - child_ptr[par];
        if (b) fn(par, h, b);
      }
    };
    if (trees * heads >= at::get_num_threads()) {
      at::parallel_for(0, trees * heads, 1, [&](int64_t begin, int64_t end) {
        for (int64_t t = begin; t < end; ++t) {
          const int64_t tree = t / heads;
          for (int64_t step = 1; step < depth; ++step) {
            const int64_t* ptr = tree_ptr + (level(step) - 1) * (trees + 1) + tree;
            run(ptr[0], ptr[1], t % heads);
          }
        }
      });
      return;
    }
    for (int64_t step = 1; step < depth; ++step) {
      const int64_t first = level_ptr[level(step) - 1], parents = level_ptr[level(step)] - first;
      at::parallel_for(0, parents * heads, 16, [&](int64_t begin, int64_t end) {
        for (int64_t t = begin; t < end; ++t) run(first + t / heads, first + t / heads + 1, t % heads);
      });
    }
  }
};

// A thread's scratch buffer of at least n values (reused from task to task).
template <typename T>
T* scratch(int64_t n, int slot = 0) {
  thread_local std::vector<T> buffers[4];
  std::vector<T>& buffer = buffers[slot];
  if (static_cast<int64_t>(buffer.size()) < n) buffer.resize(n);
  return buffer.data();
}

// s <- softmax(s) in place; returns the log-partition (a row without keys: keyless_row).
template <typename T>
T softmax(T* __restrict s, int64_t n) {
  T top = kNegInf<T>;
  for (int64_t j = 0; j < n; ++j) top = std::max(top, s[j]);
  if (top == kNegInf<T>) return keyless_row(s, n);
  return top + std::log(normalized_exp(s, n, top));
}

// Checks the inputs and the forest: float32 or float64 rows, the children of every level
// the next level, in order, and of every tree's nodes the tree's nodes; leaves without
// children and each leaf row once, node ids in range, p_off the running sum of the families'
// squared sizes.
void check_forest(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                  const std::optional<at::Tensor>& eps, const at::Tensor& child_ptr,
                  const at::Tensor& leaf_row, const at::Tensor& node, const at::Tensor& count,
                  const at::Tensor& p_off, const at::Tensor& tree_ptr,
                  const std::vector<int64_t>& level_ptr) {
  check_leaf_qkv(q, k, v, "the forest HSA kernel");
  const int64_t n = count.size(0), leaves = q.size(0);
  TORCH_CHECK(level_ptr.size() >= 2 && level_ptr.front() == 0 && level_ptr.back() == n,
              "level_ptr must run from 0 to the number of nodes");
  check_tensor(count, q, 1, "count");
  check_index(child_ptr, {n + 1}, "child_ptr");
  check_index(leaf_row, {n}, "leaf_row");
  check_index(node, {n}, "node");
  check_index(p_off, {n + 1}, "p_off");
  const int64_t *cp = child_ptr.data_ptr<int64_t>(), *lr = leaf_row.data_ptr<int64_t>();
  const int64_t *nd = node.data_ptr<int64_t>(), *po = p_off.data_ptr<int64_t>();
  bool ok = cp[0] == level_ptr[1] && cp[n] == n && po[0] == 0;
  for (size_t l = 0; l + 1 < level_ptr.size() && ok; ++l) {
    ok = level_ptr[l] <= level_ptr[l + 1];
    // the children of level l are level l + 1, in order
    if (l + 2 < level_ptr.size()) ok = ok && cp[level_ptr[l + 1]] == level_ptr[l + 2];
  }
  // tree_ptr [D, T + 1]: every level cut into the trees' ranges, a tree's children in its
  // range of the next level
  const int64_t depth = static_cast<int64_t>(level_ptr.size()) - 1, trees = level_ptr[1];
  check_index(tree_ptr, {depth, trees + 1}, "tree_ptr");
  const int64_t* tp = tree_ptr.data_ptr<int64_t>();
  for (int64_t l = 0; l < depth && ok; ++l) {
    const int64_t* t = tp + l * (trees + 1);
    ok = t[0] == level_ptr[l] && t[trees] == level_ptr[l + 1];
    for (int64_t i = 0; i < trees && ok; ++i)
      ok = t[i] <= t[i + 1] && (l + 1 == depth || cp[t[i]] == t[i + trees + 1]) &&
           (l > 0 || t[i] == i);
  }
  std::vector<char> seen(leaves, 0);
  int64_t found = 0;
  for (int64_t x = 0; x < n && ok; ++x) {
    const int64_t b = cp[x + 1] - cp[x];
    ok = b >= 0 && (b == 0) == (lr[x] >= 0) && lr[x] < leaves && nd[x] >= 0 && nd[x] < n &&
         po[x + 1] == po[x] + b * b;
    if (ok && lr[x] >= 0) {
      ok = !seen[lr[x]];
      seen[lr[x]] = 1;
      ++found;
    }
  }
  TORCH_CHECK(ok && found == leaves, "the forest's arrays are inconsistent");
  if (eps) {
    check_tensor(*eps, q, 3, "eps");
    TORCH_CHECK(eps->size(0) == n && (eps->size(1) == 1 || eps->size(1) == q.size(1)),
                "eps must be [N, H or 1, c]");
  }
}

// The forest of checked inputs.
template <typename T>
Forest<T> forest(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                 const std::optional<at::Tensor>& eps, const at::Tensor& child_ptr,
                 const at::Tensor& leaf_row, const at::Tensor& node, const at::Tensor& count,
                 const at::Tensor& p_off, const at::Tensor& tree_ptr,
                 const std::vector<int64_t>& level_ptr, double tau, bool include_self,
                 bool size_bias) {
  const T* n = count.data_ptr<T>();
  std::vector<T> key(count.size(0), T(0));
  if (size_bias)
    for (size_t x = 0; x < key.size(); ++x) key[x] = std::log(n[x]);
  return {child_ptr.data_ptr<int64_t>(),
          leaf_row.data_ptr<int64_t>(),
          node.data_ptr<int64_t>(),
          p_off.data_ptr<int64_t>(),
          tree_ptr.data_ptr<int64_t>(),
          count.data_ptr<T>(),
          level_ptr,
          level_ptr[1],
          q.size(1),
          q.size(2),
          v.size(2),
          eps ? eps->size(2) : 0,
          eps ? eps->size(1) : 1,
          static_cast<T>(tau),
          include_self,
          q.data_ptr<T>(),
          k.data_ptr<T>(),
          v.data_ptr<T>(),
          eps ? eps->data_ptr<T>() : nullptr,
          std::move(key)};
}

}  // namespace

// {out [L, H, d_v], means_q, means_k, means_v [N, H, .], p [sum b^2 H], lse, a, u, delta
// [N, H]}: the output and what the backward reads.
Tensors ragged_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                       const std::optional<at::Tensor>& eps, const at::Tensor& child_ptr,
                       const at::Tensor& leaf_row, const at::Tensor& node,
                       const at::Tensor& count, const at::Tensor& p_off,
                       const at::Tensor& tree_ptr, std::vector<int64_t> level_ptr, double tau,
                       bool include_self, bool size_bias) {
  check_forest(q, k, v, eps, child_ptr, leaf_row, node, count, p_off, tree_ptr, level_ptr);
  const int64_t n = count.size(0), heads = q.size(1);
  at::Tensor out = hiergraph::empty_like(v);
  at::Tensor mq = q.new_empty({n, heads, q.size(2)}), mk = hiergraph::empty_like(mq);
  at::Tensor mv = q.new_empty({n, heads, v.size(2)});
  at::Tensor p = q.new_empty({p_off.data_ptr<int64_t>()[n] * heads});
  at::Tensor lse = q.new_full({n, heads}, -INFINITY), a = hiergraph::full_like(lse, -INFINITY);
  at::Tensor u = hiergraph::zeros_like(lse), delta = hiergraph::zeros_like(lse);
  at::Tensor acc = hiergraph::empty_like(mv);  // the inner nodes' output rows
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "hsa_ragged_forward", [&] {
    using T = scalar_t;
    const Forest<T> f = forest<T>(q, k, v, eps, child_ptr, leaf_row, node, count, p_off,
                                  tree_ptr, level_ptr, tau, include_self, size_bias);
    const int64_t d = f.d, dv = f.dv, depth = static_cast<int64_t>(f.level_ptr.size()) - 1;
    T *MQ = mq.data_ptr<T>(), *MK = mk.data_ptr<T>(), *MV = mv.data_ptr<T>();
    T *P = p.data_ptr<T>(), *L = lse.data_ptr<T>(), *A = a.data_ptr<T>();
    T *U = u.data_ptr<T>(), *Dl = delta.data_ptr<T>(), *O = out.data_ptr<T>();
    T* acc_rows = acc.data_ptr<T>();
    // ---- bottom-up: every family's weights and lse, its parent's means and energy
    f.families(true, [&](int64_t par, int64_t h, int64_t b) {
      const int64_t c0 = f.child_ptr[par];
      const auto Q = f.members(f.q, MQ, d, par, h, 0), K = f.members(f.k, MK, d, par, h, 1);
      const auto V = f.members(f.v, MV, dv, par, h, 2);
      T* w = P + f.block(par, h, b);
      gram(w, Q, K, 0, b, d, f.tau);
      if (f.eps) {  // + eps_i . eps_j
        T* e = scratch<T>(b * b);
        const auto E = f.embeddings(par, h, 3);
        gram(e, E, E, 0, b, f.c, T(1));
        for (int64_t x = 0; x < b * b; ++x) w[x] += e[x];
      }
      T* share = scratch<T>(b, 1);  // n(C) / n(A)
      const T inv = T(1) / f.count[par];
      for (int64_t j = 0; j < b; ++j) share[j] = f.count[c0 + j] * inv;
      const T* key = f.key.data() + c0;
      T energy = 0;
      for (int64_t i = 0; i < b; ++i) {
        const int64_t x = c0 + i;
        T* s = w + i * b;
        if (f.leaf(x) >= 0)  // the self energy: the logit's diagonal, before the key bias
          A[x * heads + h] = include_self ? s[i] : kNegInf<T>;
        for (int64_t j = 0; j < b; ++j) s[j] += key[j];
        s[i] = kNegInf<T>;
        L[x * heads + h] = softmax(s, b);
        energy += share[i] * log_add_exp(A[x * heads + h], L[x * heads + h]);
      }
      // the parent: the means of its leaves from its children's, and its energy
      combine(MQ + (par * heads + h) * d, (const T*)nullptr, T(1), share, 1, Q, 0, b, d);
      combine(MK + (par * heads + h) * d, (const T*)nullptr, T(1), share, 1, K, 0, b, d);
      combine(MV + (par * heads + h) * dv, (const T*)nullptr, T(1), share, 1, V, 0, b, dv);
      A[par * heads + h] = energy;
    });
    // ---- top-down: log masses and output rows; the roots start from u = 0 and no output
    // (a root leaf's output: its value, with include_self)
    for (int64_t x = 0; x < f.level_ptr[1]; ++x) {
      const bool is_leaf = f.leaf(x) >= 0;
      T* o = is_leaf ? O + f.leaf(x) * heads * dv : acc_rows + x * heads * dv;
      if (is_leaf && include_self)
        std::copy(f.v + f.leaf(x) * heads * dv, f.v + (f.leaf(x) + 1) * heads * dv, o);
      else
        std::fill(o, o + heads * dv, T(0));
    }
    f.families(false, [&](int64_t par, int64_t h, int64_t b) {
      const int64_t c0 = f.child_ptr[par];
      const auto V = f.members(f.v, MV, dv, par, h, 0);
      const T* w = P + f.block(par, h, b);
      const T up = U[par * heads + h];
      const T* base = acc_rows + (par * heads + h) * dv;
      for (int64_t i = 0; i < b; ++i) {
        const int64_t x = c0 + i, r = x * heads + h;
        const auto gate = log_gates(A[r], L[r]);
        Dl[r] = up + gate.log_rest;
        U[r] = up + gate.log_mu;
        const bool is_leaf = f.leaf(x) >= 0;
        T* o = is_leaf ? O + (f.leaf(x) * heads + h) * dv : acc_rows + r * dv;
        combine(o, base, std::exp(Dl[r]), w + i * b, 1, V, 0, b, dv);
        if (is_leaf && include_self) axpy(o, std::exp(U[r]), V[i], dv);
      }
    });
  });
  return {out, mq, mk, mv, p, lse, a, u, delta};
}

// {dq, dk, dv [L, H, .], d_eps [N, H, c] (per head; undefined without eps)} from the output's
// gradient and what the forward kept.
Tensors ragged_backward(const at::Tensor& grad, const at::Tensor& q, const at::Tensor& k,
                        const at::Tensor& v, const std::optional<at::Tensor>& eps,
                        const at::Tensor& child_ptr, const at::Tensor& leaf_row,
                        const at::Tensor& node, const at::Tensor& count, const at::Tensor& p_off,
                        const at::Tensor& tree_ptr, const at::Tensor& mq, const at::Tensor& mk,
                        const at::Tensor& mv, const at::Tensor& p, const at::Tensor& lse,
                        const at::Tensor& a, const at::Tensor& u, const at::Tensor& delta,
                        std::vector<int64_t> level_ptr, double tau, bool include_self,
                        bool size_bias) {
  check_forest(q, k, v, eps, child_ptr, leaf_row, node, count, p_off, tree_ptr, level_ptr);
  check_tensor(grad, q, 3, "grad");
  TORCH_CHECK(grad.sizes() == v.sizes(), "grad must be shaped like v");
  const int64_t n = count.size(0), heads = q.size(1);
  for (const auto& [t, w] : {std::pair{&mq, q.size(2)}, {&mk, q.size(2)}, {&mv, v.size(2)}})
    TORCH_CHECK(t->is_contiguous() && t->sizes() == at::IntArrayRef({n, heads, w}) &&
                    t->scalar_type() == q.scalar_type(),
                "the saved means do not match");
  for (const at::Tensor* t : {&lse, &a, &u, &delta})
    TORCH_CHECK(t->is_contiguous() && t->sizes() == at::IntArrayRef({n, heads}) &&
                    t->scalar_type() == q.scalar_type(),
                "the saved energies do not match");
  TORCH_CHECK(p.is_contiguous() && p.numel() == p_off.data_ptr<int64_t>()[n] * heads,
              "the saved weights do not match");
  // every row is written below (a root leaf's by the roots' loop)
  at::Tensor dq = hiergraph::empty_like(q);
  at::Tensor dk = hiergraph::empty_like(k);
  at::Tensor dv_out = hiergraph::empty_like(v);
  at::Tensor d_eps = eps ? q.new_zeros({n, heads, eps->size(2)}) : at::Tensor();
  // per node and head: G (the output gradient summed over its leaves; inner nodes), du,
  // d delta, da, and the accumulated gradients of the means of its strict ancestors
  at::Tensor g_rows = hiergraph::empty_like(mv);
  at::Tensor du = hiergraph::zeros_like(lse);
  at::Tensor dd = hiergraph::zeros_like(lse);
  at::Tensor da = hiergraph::zeros_like(lse), dww = hiergraph::empty_like(p);
  at::Tensor gq = hiergraph::empty_like(mq);
  at::Tensor gk = hiergraph::empty_like(mk);
  at::Tensor gv = hiergraph::empty_like(mv);
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "hsa_ragged_backward", [&] {
    using T = scalar_t;
    const Forest<T> f = forest<T>(q, k, v, eps, child_ptr, leaf_row, node, count, p_off,
                                  tree_ptr, level_ptr, tau, include_self, size_bias);
    const int64_t d = f.d, dvw = f.dv, c = f.c;
    const int64_t depth = static_cast<int64_t>(f.level_ptr.size()) - 1;
    const T *MQ = mq.data_ptr<T>(), *MK = mk.data_ptr<T>(), *MV = mv.data_ptr<T>();
    const T *P = p.data_ptr<T>(), *L = lse.data_ptr<T>(), *A = a.data_ptr<T>();
    const T *U = u.data_ptr<T>(), *Dl = delta.data_ptr<T>(), *Gin = grad.data_ptr<T>();
    T *G = g_rows.data_ptr<T>(), *DU = du.data_ptr<T>(), *DD = dd.data_ptr<T>();
    T *DA = da.data_ptr<T>(), *DW = dww.data_ptr<T>();
    T *GQ = gq.data_ptr<T>(), *GK = gk.data_ptr<T>(), *GV = gv.data_ptr<T>();
    T *DQ = dq.data_ptr<T>(), *DK = dk.data_ptr<T>(), *DV = dv_out.data_ptr<T>();
    T* DE = eps ? d_eps.data_ptr<T>() : nullptr;
    const T one = 1;
    // ---- leaves to roots: W * dW per weight, d delta, du; every parent's G and du
    f.families(true, [&](int64_t par, int64_t h, int64_t b) {
      const int64_t c0 = f.child_ptr[par];
      const auto Gm = f.members(Gin, G, dvw, par, h, 0);
      const auto V = f.members(f.v, MV, dvw, par, h, 1);
      const T* w = P + f.block(par, h, b);
      T* dw = DW + f.block(par, h, b);
      gram(dw, Gm, V, 0, b, dvw, one);  // dW = G_i . rho_v(j)
      T du_parent = 0;
      for (int64_t i = 0; i < b; ++i) {
        const int64_t x = c0 + i, r = x * heads + h;
        if (f.leaf(x) >= 0)  // a leaf's own weight e^u (with include_self)
          DU[r] = include_self ? std::exp(U[r]) * dw[i * b + i] : T(0);
        const T gain = std::exp(Dl[r]);
        T sum = 0;
        for (int64_t j = 0; j < b; ++j) sum += dw[i * b + j] *= gain * w[i * b + j];
        DD[r] = sum;
        du_parent += DU[r] + sum;
      }
      combine(G + (par * heads + h) * dvw, (const T*)nullptr, one, &one, 0, Gm, 0, b, dvw);
      DU[par * heads + h] = du_parent;
    });
    // ---- roots to leaves: energies, softmax, means. The roots start from no gradient; a
    // root leaf's value is its output (with include_self)
    for (int64_t x = 0; x < f.level_ptr[1]; ++x) {
      const bool is_leaf = f.leaf(x) >= 0;
      T* oq = is_leaf ? DQ + f.leaf(x) * heads * d : GQ + x * heads * d;
      T* ok = is_leaf ? DK + f.leaf(x) * heads * d : GK + x * heads * d;
      T* ov = is_leaf ? DV + f.leaf(x) * heads * dvw : GV + x * heads * dvw;
      std::fill(oq, oq + heads * d, T(0));
      std::fill(ok, ok + heads * d, T(0));
      if (is_leaf && include_self)
        std::copy(Gin + f.leaf(x) * heads * dvw, Gin + (f.leaf(x) + 1) * heads * dvw, ov);
      else
        std::fill(ov, ov + heads * dvw, T(0));
    }
    f.families(false, [&](int64_t par, int64_t h, int64_t b) {
      const int64_t c0 = f.child_ptr[par];
      const auto Q = f.members(f.q, MQ, d, par, h, 0), K = f.members(f.k, MK, d, par, h, 1);
      const auto Gm = f.members(Gin, G, dvw, par, h, 2);
      const auto E = f.eps ? f.embeddings(par, h, 3) : Members<T>{nullptr};
      const T* w = P + f.block(par, h, b);
      const T* dw = DW + f.block(par, h, b);
      T* ds = scratch<T>(b * b);
      T* gains = scratch<T>(b, 1);
      T* coef = scratch<T>(b, 2);
      const T da_parent = DA[par * heads + h], inv_parent = T(1) / f.count[par];
      for (int64_t i = 0; i < b; ++i) {  // dS of the family, [b, b]
        const int64_t x = c0 + i, r = x * heads + h;
        const auto gate = log_gates(A[r], L[r]);
        const T mu = std::exp(gate.log_mu), rest = std::exp(gate.log_rest);
        const T g_energy = da_parent * f.count[x] * inv_parent;
        const T dx = DU[r] * rest - DD[r] * mu;
        DA[r] = dx + g_energy * mu;
        const T shift = DD[r] - (g_energy * rest - dx);  // d delta - d lse
        for (int64_t j = 0; j < b; ++j) ds[i * b + j] = dw[i * b + j] - w[i * b + j] * shift;
        ds[i * b + i] = f.leaf(x) >= 0 && include_self ? DA[r] : T(0);
        gains[i] = std::exp(Dl[r]);
      }
      const T* bq = GQ + (par * heads + h) * d;
      const T* bk = GK + (par * heads + h) * d;
      const T* bv = GV + (par * heads + h) * dvw;
      for (int64_t i = 0; i < b; ++i) {
        const int64_t x = c0 + i, r = x * heads + h;
        // the gradient of this node's means (a leaf's rows) after its ancestors'
        const bool is_leaf = f.leaf(x) >= 0;
        const int64_t row = is_leaf ? f.leaf(x) * heads + h : r;
        T* oq = (is_leaf ? DQ : GQ) + row * d;
        T* ok = (is_leaf ? DK : GK) + row * d;
        T* ov = (is_leaf ? DV : GV) + row * dvw;
        const T scale = is_leaf ? one : one / f.count[x];
        combine(oq, bq, scale * f.tau, ds + i * b, 1, K, 0, b, d);
        combine(ok, bk, scale * f.tau, ds + i, b, Q, 0, b, d);
        for (int64_t j = 0; j < b; ++j) coef[j] = gains[j] * w[j * b + i];
        coef[i] = is_leaf && include_self ? std::exp(U[r]) : T(0);
        combine(ov, bv, scale, coef, 1, Gm, 0, b, dvw);
        if (DE) {  // (dS + dS^T) eps
          for (int64_t j = 0; j < b; ++j) coef[j] = ds[i * b + j] + ds[j * b + i];
          combine(DE + (f.node[x] * heads + h) * c, (const T*)nullptr, one, coef, 1,
                  E, 0, b, c);
        }
      }
    });
  });
  return {dq, dk, dv_out, d_eps};
}
