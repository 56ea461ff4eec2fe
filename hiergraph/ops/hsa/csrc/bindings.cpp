// The Python module of hiergraph's compiled HSA kernels (hiergraph.ops.hsa.native):
// equal-fanout and hub-tree HSA (uniform.cpp), HSA over any forest (ragged.cpp), strictly
// causal HSA over any forest (causal.cpp), the hierarchical KV cache's decoding step
// (kv_cache.cpp) and softmax attention over lists of keys (edge_softmax.cpp).
// torch/csrc/utils/pybind.h: pybind11 with PyTorch's tensor conversions, a third of what
// torch/extension.h takes to compile.
#include <torch/csrc/utils/pybind.h>

#include <optional>
#include <vector>

using Tensors = std::vector<at::Tensor>;
using Mask = std::optional<at::Tensor>;

Tensors forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                const Tensors& eps, std::vector<int64_t> fanout, double tau, bool include_self,
                bool size_bias, bool save, const Mask& mask);
Tensors up(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const Tensors& eps,
           std::vector<int64_t> fanout, double tau, bool include_self, bool size_bias,
           const Mask& mask);
at::Tensor down(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                const Tensors& eps, const at::Tensor& saved, const at::Tensor& u,
                const at::Tensor& acc, std::vector<int64_t> fanout, double tau,
                bool include_self, bool size_bias, const Mask& mask);
Tensors backward(const at::Tensor& grad, const at::Tensor& q, const at::Tensor& k,
                 const at::Tensor& v, const Tensors& eps, const at::Tensor& saved,
                 std::vector<int64_t> fanout, double tau, bool include_self, bool size_bias,
                 const Mask& mask);
void hub_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                 const at::Tensor& leaf_rows, const at::Tensor& hub_rows,
                 std::vector<int64_t> fanout, double tau, bool include_self, bool size_bias,
                 at::Tensor& out);
Tensors ragged_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                       const std::optional<at::Tensor>& eps, const at::Tensor& child_ptr,
                       const at::Tensor& leaf_row, const at::Tensor& node,
                       const at::Tensor& count, const at::Tensor& p_off,
                       const at::Tensor& tree_ptr, std::vector<int64_t> level_ptr, double tau,
                       bool include_self, bool size_bias);
Tensors ragged_backward(const at::Tensor& grad, const at::Tensor& q, const at::Tensor& k,
                        const at::Tensor& v, const std::optional<at::Tensor>& eps,
                        const at::Tensor& child_ptr, const at::Tensor& leaf_row,
                        const at::Tensor& node, const at::Tensor& count, const at::Tensor& p_off,
                        const at::Tensor& tree_ptr, const at::Tensor& mq, const at::Tensor& mk,
                        const at::Tensor& mv, const at::Tensor& p, const at::Tensor& lse,
                        const at::Tensor& a, const at::Tensor& u, const at::Tensor& delta,
                        std::vector<int64_t> level_ptr, double tau, bool include_self,
                        bool size_bias);
Tensors causal_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                       const std::optional<at::Tensor>& eps, const at::Tensor& path,
                       const at::Tensor& depth, const at::Tensor& pair_ptr,
                       const at::Tensor& first, const at::Tensor& last, const at::Tensor& count,
                       const at::Tensor& rank, const at::Tensor& node, int64_t trees,
                       double tau);
Tensors causal_statistics(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                          const std::optional<at::Tensor>& eps, const at::Tensor& path,
                          const at::Tensor& depth, const at::Tensor& pair_ptr,
                          const at::Tensor& first, const at::Tensor& last,
                          const at::Tensor& count, const at::Tensor& rank,
                          const at::Tensor& node, int64_t trees, double tau);
Tensors causal_backward(const at::Tensor& grad, const at::Tensor& q, const at::Tensor& k,
                        const at::Tensor& v, const std::optional<at::Tensor>& eps,
                        const at::Tensor& path, const at::Tensor& depth,
                        const at::Tensor& pair_ptr, const at::Tensor& first,
                        const at::Tensor& last, const at::Tensor& count, const at::Tensor& rank,
                        const at::Tensor& node, const at::Tensor& rho, const at::Tensor& lse,
                        const at::Tensor& a, const at::Tensor& g, const at::Tensor& rk,
                        const at::Tensor& rv, int64_t trees, double tau);
at::Tensor kv_step(at::Tensor& keys, at::Tensor& values, at::Tensor& query, at::Tensor& prefix,
                   at::Tensor& ng, at::Tensor& g, const at::Tensor& q, const at::Tensor& k,
                   const at::Tensor& v, int64_t m, int64_t first,
                   const std::vector<int64_t>& widths, const std::vector<int64_t>& leaves,
                   int64_t slot, double tau);
Tensors edge_softmax_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                             const at::Tensor& log_n, const std::optional<at::Tensor>& eps,
                             const at::Tensor& pair_node, const at::Tensor& ptr,
                             const at::Tensor& key_node, double tau);
Tensors edge_softmax_backward(const at::Tensor& grad_lse, const at::Tensor& grad_theta,
                              const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                              const at::Tensor& log_n, const std::optional<at::Tensor>& eps,
                              const at::Tensor& pair_node, const at::Tensor& ptr,
                              const at::Tensor& key_node, const at::Tensor& key_pair,
                              const at::Tensor& order, const at::Tensor& key_ptr,
                              const at::Tensor& lse, const at::Tensor& theta, double tau);

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("forward", &forward);
  m.def("up", &up);
  m.def("down", &down);
  m.def("backward", &backward);
  m.def("hub_forward", &hub_forward);
  m.def("ragged_forward", &ragged_forward);
  m.def("ragged_backward", &ragged_backward);
  m.def("causal_forward", &causal_forward);
  m.def("causal_backward", &causal_backward);
  m.def("causal_statistics", &causal_statistics);
  m.def("kv_step", &kv_step);
  m.def("edge_softmax_forward", &edge_softmax_forward);
  m.def("edge_softmax_backward", &edge_softmax_backward);
}
