// Strictly causal hierarchical self-attention over any forest, forward and backward, as one
// CPU kernel (hiergraph.ops.hsa.native builds and calls it): what
// hiergraph.ops.hsa.causal computes with edge lists, one (tree, head) at a time, leaf after
// leaf, as a decoder would.
//
// Nodes are breadth-first (BFS) positions; path[i, s] is the depth-s ancestor of leaf i
// (s = 0 the root .. depth[i] the leaf), first[x] / last[x] the first and last leaf below x,
// count[x] their number n(x), rank[x] its place among its siblings (its left siblings are
// the positions x - rank[x] .. x - 1), node[x] its node id (the row of the position
// embeddings eps). For leaf i and depth s >= 1 (a "pair", A = path[i, s]), with c the
// number of A's leaves up to i:
//   rho      = (sum of q over A's leaves up to i) / c,
//   logits   tau rho . rho_k(B) + log n(B) (+ eps(A) . eps(B)) over A's left siblings B
//            (all complete: the leaf order is depth first), lse and theta = sum P rho_v(B),
//   a        the leaf's self energy tau q . k (+ eps . eps) at s = depth[i], else
//            (sum of n(B) g(B) over the closed children B of A before the next ancestor
//            + c' g') / c, with g' and c' those of the pair below,
//   g        = log(e^a + e^lse),
// and the output sum_s e^(u_{s-1} + log(1 - mu_s)) theta_s + e^(u_m) v_i with
// u_s = u_{s-1} + log mu_s, mu = sigmoid(a - lse). A node's rho_k, rho_v and g are those of
// its last leaf's pair. The forward keeps every pair's rho, lse, a and g and every node's
// complete rho_k, rho_v; the backward walks the leaves in reverse, collecting the gradients
// of a node's rho_k, rho_v and g from the later leaves that read it before reaching its own
// leaves, and the gradient of every prefix sum as a running sum over the node's later leaves.
// causal_statistics is the forward with what a KV cache's prefill reads: every node's sums
// of q, k, v over its leaves and its complete g.
#include <ATen/Dispatch.h>
#include <ATen/core/Tensor.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <vector>

#include "checks.h"
#include "tensors.h"
#include "vector_ops.h"

namespace {

using hiergraph::axpy;
using hiergraph::check_index;
using hiergraph::check_leaf_qkv;
using hiergraph::check_tensor;
using hiergraph::dot;
using hiergraph::log_gates;
using hiergraph::normalized_exp;
using Tensors = std::vector<at::Tensor>;

// The forest's arrays and the inputs.
template <typename T>
struct Plan {
  const int64_t *path, *depth, *pair_ptr, *first, *last, *count, *rank, *node;
  int64_t width, trees, heads, d, dv, c;  // width: D + 1 entries of path per leaf; trees:
                                          // the roots, positions 0 .. trees - 1
  T tau;
  const T *q, *k, *v, *eps;
  std::vector<T> log_n;  // log n(x) of every position

  const T* row(const T* base, int64_t i, int64_t h, int64_t w) const {
    return base + (i * heads + h) * w;
  }
  const T* e(int64_t x, int64_t h) const { return eps + (node[x] * heads + h) * c; }
  int64_t pair(int64_t i, int64_t s) const { return pair_ptr[i] + s - 1; }
  // Leaves of A = path[i, s] up to i.
  int64_t seen(int64_t i, int64_t x) const { return i - first[x] + 1; }

  // The logits of the pair's query rho over the left siblings of x (into s, returned
  // count), with eps(x) . eps(B) when there are embeddings.
  int64_t logits(const T* rho, int64_t x, int64_t h, const T* rk, T* s) const {
    const int64_t keys = rank[x];
    for (int64_t j = 0; j < keys; ++j) {
      const int64_t b = x - keys + j;
      s[j] = tau * dot(rho, rk + (b * heads + h) * d, d) + log_n[b];
      if (eps) s[j] += dot(e(x, h), e(b, h), c);
    }
    return keys;
  }
};

void check_plan(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                const std::optional<at::Tensor>& eps, const at::Tensor& path,
                const at::Tensor& depth, const at::Tensor& pair_ptr, const at::Tensor& first,
                const at::Tensor& last, const at::Tensor& count, const at::Tensor& rank,
                const at::Tensor& node, int64_t trees) {
  check_leaf_qkv(q, k, v, "the causal HSA kernel");
  const int64_t leaves = q.size(0), n = count.size(0);
  TORCH_CHECK(path.dim() == 2 && path.size(0) == leaves, "path must be [L, D + 1]");
  check_index(path, {leaves, path.size(1)}, "path");
  check_index(depth, {leaves}, "depth");
  check_index(pair_ptr, {leaves + 1}, "pair_ptr");
  for (const auto& [t, name] : {std::pair{&first, "first"}, {&last, "last"}, {&count, "count"},
                                {&rank, "rank"}, {&node, "node"}})
    check_index(*t, {n}, name);
  if (eps) {
    check_tensor(*eps, q, 3, "eps");
    TORCH_CHECK(eps->size(0) == n && eps->size(1) == q.size(1), "eps must be [N, H, c]");
  }
  // every path in range (and -1 below its leaf), through nodes whose leaves hold the leaf;
  // every node's leaves and left siblings in range; the roots' leaves all leaves
  const int64_t *p = path.data_ptr<int64_t>(), *dp = depth.data_ptr<int64_t>();
  const int64_t *pp = pair_ptr.data_ptr<int64_t>(), *f = first.data_ptr<int64_t>();
  const int64_t *l = last.data_ptr<int64_t>(), *cn = count.data_ptr<int64_t>();
  const int64_t *r = rank.data_ptr<int64_t>(), *nd = node.data_ptr<int64_t>();
  const int64_t width = path.size(1);
  bool ok = pp[0] == 0 && trees >= 0 && trees <= n;
  int64_t covered = 0;
  for (int64_t x = 0; x < trees && ok; ++x) covered += cn[x];
  ok = ok && covered == leaves;
  for (int64_t i = 0; i < leaves && ok; ++i) {
    ok = dp[i] >= 0 && dp[i] < width && pp[i + 1] == pp[i] + dp[i];
    for (int64_t s = 0; s < width && ok; ++s) {
      const int64_t x = p[i * width + s];
      ok = s <= dp[i] ? x >= 0 && x < n && f[x] <= i && i <= l[x] : x == -1;
    }
  }
  for (int64_t x = 0; x < n && ok; ++x)
    ok = cn[x] == l[x] - f[x] + 1 && cn[x] >= 1 && r[x] >= 0 && r[x] <= x && nd[x] >= 0 &&
         nd[x] < n;
  TORCH_CHECK(ok, "the causal plan's arrays are inconsistent");
}

template <typename T>
Plan<T> plan(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
             const std::optional<at::Tensor>& eps, const at::Tensor& path,
             const at::Tensor& depth, const at::Tensor& pair_ptr, const at::Tensor& first,
             const at::Tensor& last, const at::Tensor& count, const at::Tensor& rank,
             const at::Tensor& node, int64_t trees, double tau) {
  const int64_t* n = count.data_ptr<int64_t>();
  std::vector<T> log_n(count.size(0));
  for (size_t x = 0; x < log_n.size(); ++x) log_n[x] = std::log(static_cast<T>(n[x]));
  return {path.data_ptr<int64_t>(),
          depth.data_ptr<int64_t>(),
          pair_ptr.data_ptr<int64_t>(),
          first.data_ptr<int64_t>(),
          last.data_ptr<int64_t>(),
          count.data_ptr<int64_t>(),
          rank.data_ptr<int64_t>(),
          node.data_ptr<int64_t>(),
          path.size(1),
          trees,
          q.size(1),
          q.size(2),
          v.size(2),
          eps ? eps->size(2) : 0,
          static_cast<T>(tau),
          q.data_ptr<T>(),
          k.data_ptr<T>(),
          v.data_ptr<T>(),
          eps ? eps->data_ptr<T>() : nullptr,
          std::move(log_n)};
}

// Runs fn(tree, h) for every (tree, head), in parallel.
template <typename F>
void each_task(int64_t trees, int64_t heads, const F& fn) {
  at::parallel_for(0, trees * heads, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) fn(t / heads, t % heads);
  });
}

// The forward pass: {out [L, H, d_v], rho [P, H, d], lse, a, g [P, H], rho_k [N, H, d],
// rho_v [N, H, d_v], the complete sums of q, k, v over every position's leaves [N, H, d + d
// + d_v] and, with `energies`, every position's complete g [N, H] (a root's 0)}. With
// `energies` (no backward to come) rho is not kept: each pair's lives in a task's buffer.
Tensors forward_pass(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                     const std::optional<at::Tensor>& eps, const at::Tensor& path,
                     const at::Tensor& depth, const at::Tensor& pair_ptr, const at::Tensor& first,
                     const at::Tensor& last, const at::Tensor& count, const at::Tensor& rank,
                     const at::Tensor& node, int64_t trees, double tau, bool energies) {
  check_plan(q, k, v, eps, path, depth, pair_ptr, first, last, count, rank, node, trees);
  const int64_t leaves = q.size(0), heads = q.size(1), n = count.size(0);
  const int64_t pairs = pair_ptr.data_ptr<int64_t>()[leaves];
  at::Tensor out = hiergraph::empty_like(v);
  at::Tensor rho = q.new_empty({energies ? 0 : pairs, heads, q.size(2)});
  at::Tensor lse = q.new_empty({pairs, heads});
  at::Tensor a = hiergraph::empty_like(lse), g = hiergraph::empty_like(lse);
  at::Tensor rk = q.new_empty({n, heads, q.size(2)});
  at::Tensor rv = q.new_empty({n, heads, v.size(2)});
  // the open nodes' running sums of q, k, v (complete once closed) and of n(B) g(B) over
  // their closed children
  at::Tensor sums = q.new_empty({n, heads, 2 * q.size(2) + v.size(2)});
  at::Tensor closed = q.new_empty({n, heads});
  at::Tensor energy = energies ? q.new_empty({n, heads}) : at::Tensor();
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "hsa_causal_forward", [&] {
    using T = scalar_t;
    const Plan<T> P = plan<T>(q, k, v, eps, path, depth, pair_ptr, first, last, count, rank,
                              node, trees, tau);
    const int64_t d = P.d, dv = P.dv, c = P.c;
    T *RHO = rho.data_ptr<T>(), *LSE = lse.data_ptr<T>(), *A = a.data_ptr<T>();
    T *G = g.data_ptr<T>(), *RK = rk.data_ptr<T>(), *RV = rv.data_ptr<T>();
    T *LG = closed.data_ptr<T>(), *O = out.data_ptr<T>();
    T* E = energies ? energy.data_ptr<T>() : nullptr;
    T* SUM = sums.data_ptr<T>();  // position x, head h: q at SUM[r * w], k, v after it
    const int64_t w = 2 * d + dv;
    each_task(P.trees, heads, [&](int64_t tree, int64_t h) {
      std::vector<T> s, theta, log_mu, log_rest;  // (the gates of the path's pairs)
      std::vector<T> own_rho(energies ? d : 0);      // (rho when it is not kept)
      for (int64_t i = P.first[tree]; i <= P.last[tree]; ++i) {
        const int64_t m = P.depth[i], *x = P.path + i * P.width;
        const T *qi = P.row(P.q, i, h, d), *ki = P.row(P.k, i, h, d);
        const T* vi = P.row(P.v, i, h, dv);
        for (int64_t t = 0; t <= m; ++t) {  // the path's prefix sums (opened at first leaves)
          const int64_t r = x[t] * heads + h;
          T* sq = SUM + r * w;
          if (P.first[x[t]] == i) {
            std::fill(sq, sq + w, T(0));
            LG[r] = 0;
          }
          axpy(sq, T(1), qi, d);
          axpy(sq + d, T(1), ki, d);
          axpy(sq + 2 * d, T(1), vi, dv);
        }
        theta.assign(m * dv, T(0));
        log_mu.resize(m + 1);
        log_rest.resize(m + 1);
        for (int64_t t = m; t >= 1; --t) {  // bottom-up: attention and energies
          const int64_t pr = P.pair(i, t) * heads + h, r = x[t] * heads + h;
          const T cnt = static_cast<T>(P.seen(i, x[t]));
          T* rh = energies ? own_rho.data() : RHO + pr * d;
          for (int64_t j = 0; j < d; ++j) rh[j] = SUM[r * w + j] / cnt;
          s.resize(P.rank[x[t]]);
          const int64_t keys = P.logits(rh, x[t], h, RK, s.data());
          T top = -std::numeric_limits<T>::infinity();
          for (int64_t j = 0; j < keys; ++j) top = std::max(top, s[j]);
          if (keys) {
            LSE[pr] = top + std::log(normalized_exp(s.data(), keys, top));
            for (int64_t j = 0; j < keys; ++j)
              axpy(theta.data() + (t - 1) * dv, s[j], RV + ((x[t] - keys + j) * heads + h) * dv,
                   dv);
          } else {
            LSE[pr] = top;
          }
          if (t == m) {
            A[pr] = P.tau * dot(qi, ki, d) + (P.eps ? dot(P.e(x[t], h), P.e(x[t], h), c) : T(0));
          } else {
            const int64_t below = P.pair(i, t + 1) * heads + h;
            const T child = static_cast<T>(P.seen(i, x[t + 1]));
            A[pr] = (LG[r] + child * G[below]) / cnt;
          }
          const auto gate = log_gates(A[pr], LSE[pr]);
          G[pr] = gate.sum;
          log_mu[t] = gate.log_mu;
          log_rest[t] = gate.log_rest;
        }
        T* o = O + (i * heads + h) * dv;  // top-down: gates and output
        std::fill(o, o + dv, T(0));
        T u = 0;
        for (int64_t t = 1; t <= m; ++t) {
          axpy(o, std::exp(u + log_rest[t]), theta.data() + (t - 1) * dv, dv);
          u += log_mu[t];
        }
        axpy(o, std::exp(u), vi, dv);
        for (int64_t t = m; t >= 0; --t) {  // nodes whose last leaf this is close
          if (P.last[x[t]] != i) continue;
          const int64_t r = x[t] * heads + h;
          const T inv = T(1) / static_cast<T>(P.count[x[t]]);
          for (int64_t j = 0; j < d; ++j) RK[r * d + j] = SUM[r * w + d + j] * inv;
          for (int64_t j = 0; j < dv; ++j) RV[r * dv + j] = SUM[r * w + 2 * d + j] * inv;
          const T gx = t >= 1 ? G[P.pair(i, t) * heads + h] : T(0);
          if (E) E[r] = gx;
          if (t >= 2) LG[x[t - 1] * heads + h] += static_cast<T>(P.count[x[t]]) * gx;
        }
      }
    });
  });
  return {out, rho, lse, a, g, rk, rv, sums, energy};
}

}  // namespace

// {out [L, H, d_v], rho [P, H, d], lse, a, g [P, H], rho_k [N, H, d], rho_v [N, H, d_v]}.
Tensors causal_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                       const std::optional<at::Tensor>& eps, const at::Tensor& path,
                       const at::Tensor& depth, const at::Tensor& pair_ptr,
                       const at::Tensor& first, const at::Tensor& last, const at::Tensor& count,
                       const at::Tensor& rank, const at::Tensor& node, int64_t trees,
                       double tau) {
  Tensors all = forward_pass(q, k, v, eps, path, depth, pair_ptr, first, last, count, rank,
                             node, trees, tau, false);
  all.resize(7);
  return all;
}

// {out [L, H, d_v], the sums of q, k, v over every position's leaves [N, H, d + d + d_v],
// every position's complete g [N, H] (a root's 0)}: what a cache's prefill reads.
Tensors causal_statistics(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                          const std::optional<at::Tensor>& eps, const at::Tensor& path,
                          const at::Tensor& depth, const at::Tensor& pair_ptr,
                          const at::Tensor& first, const at::Tensor& last,
                          const at::Tensor& count, const at::Tensor& rank,
                          const at::Tensor& node, int64_t trees, double tau) {
  Tensors all = forward_pass(q, k, v, eps, path, depth, pair_ptr, first, last, count, rank,
                             node, trees, tau, true);
  return {all[0], all[7], all[8]};
}

// {dq, dk, dv [L, H, .], d_eps [N, H, c] (undefined without eps)}.
Tensors causal_backward(const at::Tensor& grad, const at::Tensor& q, const at::Tensor& k,
                        const at::Tensor& v, const std::optional<at::Tensor>& eps,
                        const at::Tensor& path, const at::Tensor& depth,
                        const at::Tensor& pair_ptr, const at::Tensor& first,
                        const at::Tensor& last, const at::Tensor& count, const at::Tensor& rank,
                        const at::Tensor& node, const at::Tensor& rho, const at::Tensor& lse,
                        const at::Tensor& a, const at::Tensor& g, const at::Tensor& rk,
                        const at::Tensor& rv, int64_t trees, double tau) {
  check_plan(q, k, v, eps, path, depth, pair_ptr, first, last, count, rank, node, trees);
  check_tensor(grad, q, 3, "grad");
  TORCH_CHECK(grad.sizes() == v.sizes(), "grad must be shaped like v");
  const int64_t leaves = q.size(0), heads = q.size(1), n = count.size(0);
  const int64_t pairs = pair_ptr.data_ptr<int64_t>()[leaves];
  TORCH_CHECK(rho.is_contiguous() && rho.sizes() == at::IntArrayRef({pairs, heads, q.size(2)}),
              "the saved queries do not match");
  for (const at::Tensor* t : {&lse, &a, &g})
    TORCH_CHECK(t->is_contiguous() && t->sizes() == at::IntArrayRef({pairs, heads}),
                "the saved energies do not match");
  TORCH_CHECK(rk.is_contiguous() && rk.sizes() == at::IntArrayRef({n, heads, q.size(2)}) &&
                  rv.is_contiguous() && rv.sizes() == at::IntArrayRef({n, heads, v.size(2)}),
              "the saved keys and values do not match");
  at::Tensor dq = hiergraph::empty_like(q);
  at::Tensor dk = hiergraph::empty_like(k);
  at::Tensor dv_out = hiergraph::empty_like(v);
  at::Tensor d_eps = eps ? q.new_zeros({n, heads, eps->size(2)}) : at::Tensor();
  // per node: the gradients of its complete rho_k, rho_v and g (from later leaves) and of
  // its prefix query sums (a running sum over its later leaves)
  at::Tensor d_rk = hiergraph::zeros_like(rk), d_rv = hiergraph::zeros_like(rv);
  at::Tensor d_g = q.new_zeros({n, heads}), d_prefix = hiergraph::empty_like(rk);
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "hsa_causal_backward", [&] {
    using T = scalar_t;
    const Plan<T> P = plan<T>(q, k, v, eps, path, depth, pair_ptr, first, last, count, rank,
                              node, trees, tau);
    const int64_t d = P.d, dv = P.dv, c = P.c;
    const T *RHO = rho.data_ptr<T>(), *LSE = lse.data_ptr<T>(), *A = a.data_ptr<T>();
    const T *G = g.data_ptr<T>(), *RK = rk.data_ptr<T>(), *RV = rv.data_ptr<T>();
    const T* GR = grad.data_ptr<T>();
    T *DQ = dq.data_ptr<T>(), *DK = dk.data_ptr<T>(), *DV = dv_out.data_ptr<T>();
    T *DRK = d_rk.data_ptr<T>(), *DRV = d_rv.data_ptr<T>(), *DG = d_g.data_ptr<T>();
    T *DP = d_prefix.data_ptr<T>(), *DE = eps ? d_eps.data_ptr<T>() : nullptr;
    each_task(P.trees, heads, [&](int64_t tree, int64_t h) {
      std::vector<T> s, theta, mu, w, dx, da, drho(d);
      std::vector<int64_t> offset;
      for (int64_t i = P.last[tree]; i >= P.first[tree]; --i) {
        const int64_t m = P.depth[i], *x = P.path + i * P.width;
        const T *qi = P.row(P.q, i, h, d), *ki = P.row(P.k, i, h, d);
        const T *vi = P.row(P.v, i, h, dv), *go = GR + (i * heads + h) * dv;
        T *dqi = DQ + (i * heads + h) * d, *dki = DK + (i * heads + h) * d;
        T* dvi = DV + (i * heads + h) * dv;
        // the gates and the weights of the output's terms, from the top
        mu.assign(m + 1, T(0));
        w.assign(m + 1, T(0));
        T u = 0;
        for (int64_t t = 1; t <= m; ++t) {
          const int64_t pr = P.pair(i, t) * heads + h;
          const auto gate = log_gates(A[pr], LSE[pr]);
          w[t] = std::exp(u + gate.log_rest);
          mu[t] = std::exp(gate.log_mu);
          u += gate.log_mu;
        }
        const T own = std::exp(u);
        // every pair's weights (recomputed from the saved lse; pair t's from offset[t]) and
        // theta
        theta.assign((m + 1) * dv, T(0));
        offset.assign(m + 2, 0);
        for (int64_t t = 1; t <= m; ++t) offset[t + 1] = offset[t] + P.rank[x[t]];
        s.resize(offset[m + 1]);
        for (int64_t t = 1; t <= m; ++t) {
          const int64_t pr = P.pair(i, t) * heads + h, keys = P.rank[x[t]];
          T* p = s.data() + offset[t];
          P.logits(RHO + pr * d, x[t], h, RK, p);
          for (int64_t j = 0; j < keys; ++j) {
            p[j] = std::exp(p[j] - LSE[pr]);
            axpy(theta.data() + t * dv, p[j], RV + ((x[t] - keys + j) * heads + h) * dv, dv);
          }
        }
        // the output's gradient: d(log w_t) = w_t go . theta_t, d u_m = own go . v
        dx.assign(m + 1, T(0));
        T du = own * dot(go, vi, dv);
        for (int64_t t = m; t >= 1; --t) {
          const T d_rest = w[t] * dot(go, theta.data() + t * dv, dv);
          dx[t] = du * (1 - mu[t]) - d_rest * mu[t];  // x = a - lse
          du += d_rest;
        }
        // energies from the top: a's gradient reaches the pair below (its g) and the
        // closed children before it (their complete g)
        da.assign(m + 1, T(0));
        T carry = 0;  // the gradient of this pair's g from the pair above
        for (int64_t t = 1; t <= m; ++t) {
          const int64_t pr = P.pair(i, t) * heads + h, r = x[t] * heads + h;
          T dg = carry + (P.last[x[t]] == i ? DG[r] : T(0));
          da[t] = dx[t] + dg * mu[t];
          const T dlse = -dx[t] + dg * (1 - mu[t]);
          if (t < m) {
            const T cnt = static_cast<T>(P.seen(i, x[t]));
            carry = da[t] * static_cast<T>(P.seen(i, x[t + 1])) / cnt;
            const int64_t next = x[t + 1], keys = P.rank[next];
            for (int64_t j = 0; j < keys; ++j) {  // the closed children of x[t] before next
              const int64_t b = next - keys + j;
              DG[b * heads + h] += static_cast<T>(P.count[b]) * da[t] / cnt;
            }
          }
          // softmax of the pair: ds = P (dtheta . rho_v(B) - dtheta . theta + dlse)
          const int64_t keys = P.rank[x[t]];
          const T* rh = RHO + pr * d;
          const T* weight = s.data() + offset[t];
          const T gain = w[t];  // dtheta = w go
          const T centre = gain * dot(go, theta.data() + t * dv, dv);
          std::fill(drho.begin(), drho.end(), T(0));
          for (int64_t j = 0; j < keys; ++j) {
            const int64_t b = x[t] - keys + j, rb = b * heads + h;
            const T p = weight[j];
            const T ds = p * (gain * dot(go, RV + rb * dv, dv) - centre + dlse);
            axpy(drho.data(), P.tau * ds, RK + rb * d, d);
            axpy(DRK + rb * d, P.tau * ds, rh, d);
            axpy(DRV + rb * dv, p * gain, go, dv);
            if (DE) {
              axpy(DE + (P.node[x[t]] * heads + h) * c, ds, P.e(b, h), c);
              axpy(DE + (P.node[b] * heads + h) * c, ds, P.e(x[t], h), c);
            }
          }
          // the prefix query's gradient, a running sum over the node's later leaves
          T* dp = DP + r * d;
          if (P.last[x[t]] == i) std::fill(dp, dp + d, T(0));
          axpy(dp, T(1) / static_cast<T>(P.seen(i, x[t])), drho.data(), d);
        }
        // the leaf's rows: its prefix sums' and its nodes' keys' and values' gradients,
        // the self energy and its own value
        std::fill(dqi, dqi + d, T(0));
        std::fill(dki, dki + d, T(0));
        for (int64_t j = 0; j < dv; ++j) dvi[j] = own * go[j];
        for (int64_t t = 1; t <= m; ++t) {
          const int64_t r = x[t] * heads + h;
          const T inv = T(1) / static_cast<T>(P.count[x[t]]);
          axpy(dqi, T(1), DP + r * d, d);
          axpy(dki, inv, DRK + r * d, d);
          axpy(dvi, inv, DRV + r * dv, dv);
        }
        if (m >= 1) {
          axpy(dqi, P.tau * da[m], ki, d);
          axpy(dki, P.tau * da[m], qi, d);
          if (DE) axpy(DE + (P.node[x[m]] * heads + h) * c, 2 * da[m], P.e(x[m], h), c);
        }
      }
    });
  });
  return {dq, dk, dv_out, d_eps};
}
