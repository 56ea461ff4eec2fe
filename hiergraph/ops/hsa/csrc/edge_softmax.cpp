// Softmax attention of query rows over lists of key rows (hiergraph.ops.hsa.native,
// edge_softmax): the prefix query of every (leaf, ancestor) pair of strictly causal HSA over
// the left siblings of its ancestor. Query p attends to the key rows key_node[e] of its edges
// e = ptr[p] .. ptr[p + 1] - 1 with the logits
//   s_e = tau q_p . k_n + log_n[n] (+ eps[pair_node[p]] . eps[n]),   n = key_node[e],
// and returns lse_p = log sum_e exp(s_e) and theta_p = sum_e softmax(s)_e v_n, per head. The
// gathered [E, H, d] rows that the tensor version forms are never formed: a row's logits,
// weights and sums stay in cache. The backward runs over the queries (their gradients and
// every edge's weight and logit gradient) and then over the keys, whose edges come in the
// order `order` with pointers `key_ptr` (the transposed lists), so no two threads write a row.
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
using hiergraph::check_qkv;
using hiergraph::check_tensor;
using hiergraph::dot;
using hiergraph::exp_shifted;
using Tensors = std::vector<at::Tensor>;

// Row pointers into the shared arguments, per (query, head).
template <typename T>
struct Rows {
  const T *q, *k, *v, *log_n, *eps;
  const int64_t *ptr, *node, *pair_node;
  int64_t heads, d, dv, c;
  T tau;

  // The logits of query p, head h over its edges, into s; returns their maximum.
  T logits(int64_t p, int64_t h, std::vector<T>& s) const {
    const int64_t start = ptr[p], n = ptr[p + 1] - start;
    s.resize(n);
    const T* qh = q + (p * heads + h) * d;
    const T* eq = eps ? eps + (pair_node[p] * heads + h) * c : nullptr;
    T top = -std::numeric_limits<T>::infinity();
    for (int64_t j = 0; j < n; ++j) {
      const int64_t key = node[start + j];
      T value = tau * dot(qh, k + (key * heads + h) * d, d) + log_n[key];
      if (eq) value += dot(eq, eps + (key * heads + h) * c, c);
      s[j] = value;
      top = std::max(top, value);
    }
    return top;
  }
};

template <typename T>
Rows<T> rows(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
             const at::Tensor& log_n, const std::optional<at::Tensor>& eps,
             const at::Tensor& pair_node, const at::Tensor& ptr, const at::Tensor& node,
             double tau) {
  return {q.data_ptr<T>(), k.data_ptr<T>(), v.data_ptr<T>(), log_n.data_ptr<T>(),
          eps ? eps->data_ptr<T>() : nullptr, ptr.data_ptr<int64_t>(),
          node.data_ptr<int64_t>(), pair_node.data_ptr<int64_t>(), q.size(1), q.size(2),
          v.size(2), eps ? eps->size(2) : 0, static_cast<T>(tau)};
}

void check_inputs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                  const at::Tensor& log_n, const std::optional<at::Tensor>& eps,
                  const at::Tensor& pair_node, const at::Tensor& ptr, const at::Tensor& node) {
  check_qkv(q, k, v, "edge_softmax");
  check_tensor(log_n, q, 1, "log_n");
  TORCH_CHECK(k.size(1) == q.size(1) && v.size(1) == q.size(1) && k.size(2) == q.size(2) &&
                  v.size(0) == k.size(0) && log_n.size(0) == k.size(0),
              "q [P, H, d], k [N, H, d], v [N, H, d_v] and log_n [N] do not match");
  if (eps) {
    check_tensor(*eps, q, 3, "eps");
    TORCH_CHECK(eps->size(0) == k.size(0) && eps->size(1) == q.size(1), "eps must be [N, H, c]");
  }
  check_index(pair_node, "pair_node");
  check_index(ptr, "ptr");
  check_index(node, "key_node");
  TORCH_CHECK(ptr.size(0) == q.size(0) + 1 && pair_node.size(0) == q.size(0),
              "ptr must be [P + 1] and pair_node [P]");
  // the rows every edge and query reads: in range, and ptr ascending from 0 to E
  const int64_t* p = ptr.data_ptr<int64_t>();
  bool ascending = p[0] == 0 && p[q.size(0)] == node.size(0);
  for (int64_t i = 0; i < q.size(0) && ascending; ++i) ascending = p[i] <= p[i + 1];
  TORCH_CHECK(ascending, "ptr must ascend from 0 to the number of edges");
  const int64_t nodes = k.size(0);
  for (const auto& [t, name] : {std::pair{&node, "key_node"}, {&pair_node, "pair_node"}}) {
    const int64_t* x = t->data_ptr<int64_t>();
    TORCH_CHECK(std::all_of(x, x + t->numel(), [nodes](int64_t i) { return i >= 0 && i < nodes; }),
                name, " must hold rows of k (0 .. N - 1)");
  }
}

}  // namespace

// {lse [P, H] (-inf without edges), theta [P, H, d_v] (0 without edges)}.
Tensors edge_softmax_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                             const at::Tensor& log_n, const std::optional<at::Tensor>& eps,
                             const at::Tensor& pair_node, const at::Tensor& ptr,
                             const at::Tensor& key_node, double tau) {
  check_inputs(q, k, v, log_n, eps, pair_node, ptr, key_node);
  const int64_t pairs = q.size(0), heads = q.size(1), dv = v.size(2);
  at::Tensor lse = q.new_empty({pairs, heads});
  at::Tensor theta = q.new_zeros({pairs, heads, dv});
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "hsa_edge_softmax_forward", [&] {
    using T = scalar_t;
    const Rows<T> r = rows<T>(q, k, v, log_n, eps, pair_node, ptr, key_node, tau);
    T* lse_out = lse.data_ptr<T>();
    T* theta_out = theta.data_ptr<T>();
    at::parallel_for(0, pairs, 64, [&](int64_t begin, int64_t end) {
      std::vector<T> s;
      for (int64_t p = begin; p < end; ++p) {
        const int64_t start = r.ptr[p], n = r.ptr[p + 1] - start;
        for (int64_t h = 0; h < heads; ++h) {
          T* th = theta_out + (p * heads + h) * dv;
          if (n == 0) {
            lse_out[p * heads + h] = -std::numeric_limits<T>::infinity();
            continue;
          }
          const T top = r.logits(p, h, s);
          const T total = exp_shifted(s.data(), n, top);
          for (int64_t j = 0; j < n; ++j)
            axpy(th, s[j], r.v + (r.node[start + j] * heads + h) * dv, dv);
          for (int64_t c = 0; c < dv; ++c) th[c] /= total;
          lse_out[p * heads + h] = top + std::log(total);
        }
      }
    });
  });
  return {lse, theta};
}

// {dq, dk, dv, d_eps} from the gradients of lse [P, H] and theta [P, H, d_v]; d_eps [N, H, c]
// holds the key side of the embeddings' gradient, and d_eps_query [P, H, c] (the last
// tensor) the query side, which the caller adds to the rows pair_node.
Tensors edge_softmax_backward(const at::Tensor& grad_lse, const at::Tensor& grad_theta,
                              const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                              const at::Tensor& log_n, const std::optional<at::Tensor>& eps,
                              const at::Tensor& pair_node, const at::Tensor& ptr,
                              const at::Tensor& key_node, const at::Tensor& key_pair,
                              const at::Tensor& order, const at::Tensor& key_ptr,
                              const at::Tensor& lse, const at::Tensor& theta, double tau) {
  check_inputs(q, k, v, log_n, eps, pair_node, ptr, key_node);
  check_tensor(grad_lse, q, 2, "grad_lse");
  check_tensor(grad_theta, q, 3, "grad_theta");
  check_tensor(lse, q, 2, "lse");
  check_tensor(theta, q, 3, "theta");
  check_index(key_pair, "key_pair");
  check_index(order, "order");
  check_index(key_ptr, "key_ptr");
  const int64_t pairs = q.size(0), heads = q.size(1), d = q.size(2), dv = v.size(2);
  const int64_t nodes = k.size(0), edges = key_node.size(0), c = eps ? eps->size(2) : 0;
  TORCH_CHECK(key_pair.size(0) == edges && order.size(0) == edges &&
                  key_ptr.size(0) == nodes + 1,
              "key_pair and order must be [E], key_ptr [N + 1]");
  at::Tensor dq = hiergraph::zeros_like(q);
  at::Tensor dk = hiergraph::zeros_like(k);
  at::Tensor dv_out = hiergraph::zeros_like(v);
  at::Tensor d_eps_key = eps ? hiergraph::zeros_like(*eps) : at::Tensor();
  at::Tensor d_eps_query = eps ? q.new_zeros({pairs, heads, c}) : at::Tensor();
  // per edge and head: the weight and the logit's gradient, from the pass over the queries
  at::Tensor weight = q.new_empty({edges, heads});
  at::Tensor grad_logit = q.new_empty({edges, heads});
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "hsa_edge_softmax_backward", [&] {
    using T = scalar_t;
    const Rows<T> r = rows<T>(q, k, v, log_n, eps, pair_node, ptr, key_node, tau);
    const T *g_lse = grad_lse.data_ptr<T>(), *g_theta = grad_theta.data_ptr<T>();
    const T *lse_in = lse.data_ptr<T>(), *theta_in = theta.data_ptr<T>();
    T *w_out = weight.data_ptr<T>(), *gl_out = grad_logit.data_ptr<T>();
    T* dq_out = dq.data_ptr<T>();
    T* deq_out = eps ? d_eps_query.data_ptr<T>() : nullptr;
    at::parallel_for(0, pairs, 64, [&](int64_t begin, int64_t end) {
      std::vector<T> s;
      for (int64_t p = begin; p < end; ++p) {
        const int64_t start = r.ptr[p], n = r.ptr[p + 1] - start;
        if (n == 0) continue;
        for (int64_t h = 0; h < heads; ++h) {
          const int64_t row = p * heads + h;
          r.logits(p, h, s);
          exp_shifted(s.data(), n, lse_in[row]);  // the weights
          const T* gth = g_theta + row * dv;
          const T mean = dot(gth, theta_in + row * dv, dv);  // sum_e w_e (g . v_e)
          T* dqh = dq_out + row * d;
          T* deq = deq_out ? deq_out + row * c : nullptr;
          for (int64_t j = 0; j < n; ++j) {
            const int64_t e = start + j, key = r.node[e];
            const T w = s[j];
            const T* vj = r.v + (key * heads + h) * dv;
            const T g = w * (dot(gth, vj, dv) - mean + g_lse[row]);
            w_out[e * heads + h] = w;
            gl_out[e * heads + h] = g;
            const T* kj = r.k + (key * heads + h) * d;
            axpy(dqh, r.tau * g, kj, d);
            if (deq) axpy(deq, g, r.eps + (key * heads + h) * c, c);
          }
        }
      }
    });
    // the keys: every edge into node n, in the transposed order
    const int64_t *kp = key_pair.data_ptr<int64_t>(), *ord = order.data_ptr<int64_t>();
    const int64_t* kptr = key_ptr.data_ptr<int64_t>();
    T *dk_out = dk.data_ptr<T>(), *dv_ptr = dv_out.data_ptr<T>();
    T* dek_out = eps ? d_eps_key.data_ptr<T>() : nullptr;
    at::parallel_for(0, nodes, 64, [&](int64_t begin, int64_t end) {
      for (int64_t n = begin; n < end; ++n) {
        for (int64_t i = kptr[n]; i < kptr[n + 1]; ++i) {
          const int64_t e = ord[i], p = kp[e];
          for (int64_t h = 0; h < heads; ++h) {
            const T g = gl_out[e * heads + h], w = w_out[e * heads + h];
            const T* qh = r.q + (p * heads + h) * d;
            const T* gth = g_theta + (p * heads + h) * dv;
            T* dkh = dk_out + (n * heads + h) * d;
            T* dvh = dv_ptr + (n * heads + h) * dv;
            axpy(dkh, r.tau * g, qh, d);
            axpy(dvh, w, gth, dv);
            if (dek_out) {
              const T* eq = r.eps + (r.pair_node[p] * heads + h) * c;
              axpy(dek_out + (n * heads + h) * c, g, eq, c);
            }
          }
        }
      }
    });
  });
  return {dq, dk, dv_out, d_eps_key, d_eps_query};
}
