// One decoding step of the hierarchical KV cache (hiergraph.nn.hierarchical_kv_cache), on
// its own store: the new leaf's key and value, the path nodes' prefix queries, one softmax
// per level over its closed children, the energies up the path and the gated output, as one
// call instead of a few dozen tensor operations. The store's layout and the formulas are
// those of HierarchicalKVCache; the host-side bookkeeping (families closed and opened, the
// slots) stays there.
#include <ATen/Dispatch.h>
#include <ATen/core/Tensor.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "vector_ops.h"

namespace {

using hiergraph::log_add_exp;
using hiergraph::log_gates;

void check_store(const at::Tensor& t, const at::Tensor& keys, const char* name) {
  TORCH_CHECK(t.is_contiguous() && t.device().is_cpu() && t.scalar_type() == keys.scalar_type(),
              name, " must be a contiguous CPU tensor of the store's dtype");
}

}  // namespace

// The output [H, d_v] of a token whose leaf is child `slot` of open node m - 1 (depth m),
// below the open nodes 0 .. m - 1 whose closed children number widths[j] (the leaf
// included) and hold leaves[j] leaves; nodes first - 1 .. m - 1 of the path (A_first ..
// A_m, the leaf last) are new. Writes the leaf's key and value, the path's prefix sums and
// queries, and the energies the store keeps (ng of the leaf's parent, g of the inner path
// nodes). Store: keys [levels, H, capacity, d + c + 2] ([rho_k, eps, log n, n]), values
// [levels, H, capacity, d_v + 1], query [levels, H, d + c + 2] ([tau rho_q, eps, 1, 0]),
// prefix [levels, H, d + 1] ([tau sum q, n]), ng and g [levels, H]; q, k [H, d], v [H, d_v].
at::Tensor kv_step(at::Tensor& keys, at::Tensor& values, at::Tensor& query, at::Tensor& prefix,
                   at::Tensor& ng, at::Tensor& g, const at::Tensor& q, const at::Tensor& k,
                   const at::Tensor& v, int64_t m, int64_t first,
                   const std::vector<int64_t>& widths, const std::vector<int64_t>& leaves,
                   int64_t slot, double tau) {
  for (const auto& [t, name] : {std::pair{&values, "values"}, {&query, "query"},
                                {&prefix, "prefix"}, {&ng, "ng"}, {&g, "g"}, {&keys, "keys"}})
    check_store(*t, keys, name);
  const int64_t heads = keys.size(1), capacity = keys.size(2), width = keys.size(3);
  const int64_t d = q.size(1), dv = v.size(1);
  for (const at::Tensor* t : {&q, &k, &v})
    TORCH_CHECK(t->dim() == 2 && t->size(0) == heads && t->device().is_cpu() &&
                    t->scalar_type() == keys.scalar_type(),
                "q, k, v must be [H, ·] CPU tensors of the store's heads and dtype");
  TORCH_CHECK(k.size(1) == d && prefix.size(2) == d + 1 && width >= d + 2 &&
                  values.size(3) == dv + 1 && query.size(2) == width,
              "q, k, v do not match the store's channels");
  TORCH_CHECK(m >= 1 && m <= keys.size(0) && first >= 1 && first <= m, "bad depths");
  TORCH_CHECK(static_cast<int64_t>(widths.size()) >= m &&
                  static_cast<int64_t>(leaves.size()) >= m,
              "one width and leaf count per open node");
  for (int64_t j = 0; j < m; ++j)
    TORCH_CHECK(widths[j] >= 0 && widths[j] <= capacity, "bad width");
  TORCH_CHECK(slot >= 0 && slot < widths[m - 1], "bad slot");
  at::Tensor out = keys.new_empty({heads, dv});
  AT_DISPATCH_FLOATING_TYPES(keys.scalar_type(), "hsa_kv_step", [&] {
    using T = scalar_t;
    const at::Tensor qc = q.contiguous(), kc = k.contiguous(), vc = v.contiguous();
    const T neg_inf = -std::numeric_limits<T>::infinity(), t = static_cast<T>(tau);
    std::vector<T> lse(m), theta(m * dv), a(m), logits;  // reused by every head
    for (int64_t h = 0; h < heads; ++h) {
      const T* qh = qc.data_ptr<T>() + h * d;
      // the leaf: a closed child of its parent, [k, eps, log 1, 1] and [v, 1]
      const int64_t leaf = ((m - 1) * heads + h) * capacity + slot;  // its slot in the store
      T* key = keys.data_ptr<T>() + leaf * width;
      T* value = values.data_ptr<T>() + leaf * (dv + 1);
      std::copy(kc.data_ptr<T>() + h * d, kc.data_ptr<T>() + (h + 1) * d, key);
      key[width - 2] = 0;
      key[width - 1] = 1;
      std::copy(vc.data_ptr<T>() + h * dv, vc.data_ptr<T>() + (h + 1) * dv, value);
      value[dv] = 1;
      // prefix [tau sum q, n] of A_1 .. A_m: new nodes start at the leaf, the others add it;
      // the query of every level: the prefix mean
      for (int64_t r = 0; r < m; ++r) {
        T* row = prefix.data_ptr<T>() + (r * heads + h) * (d + 1);
        const bool fresh = r >= first - 1;
        for (int64_t c = 0; c < d; ++c) row[c] = (fresh ? T(0) : row[c]) + t * qh[c];
        row[d] = fresh ? T(1) : row[d] + 1;
        T* mean = query.data_ptr<T>() + (r * heads + h) * width;
        for (int64_t c = 0; c < d; ++c) mean[c] = row[c] / row[d];
      }
      // every level's softmax over its closed children (the deepest covers the leaf itself:
      // its lse is the leaf's g, its theta mixes in the leaf's value)
      for (int64_t r = 0; r < m; ++r) {
        const int64_t n = widths[r];
        T* th = theta.data() + r * dv;
        std::fill(th, th + dv, T(0));
        if (n == 0) {
          lse[r] = neg_inf;
          continue;
        }
        const T* mean = query.data_ptr<T>() + (r * heads + h) * width;
        const T* rows = keys.data_ptr<T>() + (r * heads + h) * capacity * width;
        const T* vals = values.data_ptr<T>() + (r * heads + h) * capacity * (dv + 1);
        logits.resize(n);
        T top = neg_inf;
        for (int64_t j = 0; j < n; ++j) {
          T s = 0;
          for (int64_t c = 0; c < width; ++c) s += mean[c] * rows[j * width + c];
          logits[j] = s;
          top = std::max(top, s);
        }
        T total = 0;
        for (int64_t j = 0; j < n; ++j) {
          const T e = std::exp(logits[j] - top);
          total += e;
          for (int64_t c = 0; c < dv; ++c) th[c] += e * vals[j * (dv + 1) + c];
        }
        for (int64_t c = 0; c < dv; ++c) th[c] /= total;
        lse[r] = top + std::log(total);
      }
      // energies up the path: a(A_{i+1}) = (ng_{i+1} + n(A_{i+2}) g(A_{i+2})) / n(A_{i+1}),
      // g = log(e^a + e^lse); the leaf's parent has mu = 0 (theta mixes v in)
      T* ng_h = ng.data_ptr<T>() + h;
      T* g_h = g.data_ptr<T>() + h;
      ng_h[(m - 1) * heads] += lse[m - 1];
      std::fill(a.begin(), a.end(), neg_inf);
      int64_t n_node = leaves[m - 1];
      for (int64_t i = m - 2; i >= 0; --i) {
        int64_t n_child = 0;
        if (i < m - 2) {
          n_child = n_node;
          n_node += leaves[i + 1];
        }
        const T n = static_cast<T>(n_node);
        a[i] = ng_h[(i + 1) * heads] / n;
        if (n_child) a[i] += g_h[(i + 1) * heads] * static_cast<T>(n_child) / n;
        g_h[i * heads] = log_add_exp(a[i], lse[i]);
      }
      // out = sum_s prod_{r<s} mu_r (1 - mu_s) theta_s, mu = sigmoid(a - lse)
      T* o = out.data_ptr<T>() + h * dv;
      std::fill(o, o + dv, T(0));
      T log_mass = 0;
      for (int64_t r = 0; r < m && log_mass > neg_inf; ++r) {
        T log_mu, log_rest;
        if (lse[r] == neg_inf) {  // no closed child: all mass goes down
          log_mu = 0;
          log_rest = neg_inf;
        } else if (a[r] == neg_inf) {
          log_mu = neg_inf;
          log_rest = 0;
        } else {
          const auto gate = log_gates(a[r], lse[r]);
          log_mu = gate.log_mu;
          log_rest = gate.log_rest;
        }
        const T weight = std::exp(log_mass + log_rest);
        for (int64_t c = 0; c < dv; ++c) o[c] += weight * theta[r * dv + c];
        log_mass += log_mu;
      }
    }
  });
  return out;
}
