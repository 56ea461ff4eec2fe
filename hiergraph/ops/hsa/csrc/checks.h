// Input checks the kernels share (hiergraph.ops.hsa.native): tensors in q's dtype, index
// tensors, and the float32 / float64 rows of q, k, v a kernel reads where they lie.
#pragma once

#include <ATen/core/Tensor.h>

namespace hiergraph {

// t: a contiguous CPU tensor with `dim` dimensions, of like's dtype.
inline void check_tensor(const at::Tensor& t, const at::Tensor& like, int64_t dim,
                         const char* name) {
  TORCH_CHECK(t.device().is_cpu() && t.is_contiguous() && t.dim() == dim &&
                  t.scalar_type() == like.scalar_type(),
              name, " must be a contiguous CPU tensor with ", dim, " dims of q's dtype");
}

// t: a contiguous CPU int64 tensor of `shape`.
inline void check_index(const at::Tensor& t, at::IntArrayRef shape, const char* name) {
  TORCH_CHECK(t.device().is_cpu() && t.is_contiguous() && t.scalar_type() == at::kLong &&
                  t.sizes() == shape,
              name, " must be a contiguous ", shape, " CPU int64 tensor");
}

// t: a contiguous 1-D CPU int64 tensor of any length.
inline void check_index(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.dim() == 1, name, " must be 1-D");
  check_index(t, {t.size(0)}, name);
}

// q, k, v: contiguous float32 or float64 CPU tensors with 3 dimensions, of one dtype
// (`kernel` names the kernel in the error).
inline void check_qkv(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                      const char* kernel) {
  TORCH_CHECK(q.scalar_type() == at::kFloat || q.scalar_type() == at::kDouble, kernel,
              " takes float32 or float64");
  check_tensor(q, q, 3, "q");
  check_tensor(k, q, 3, "k");
  check_tensor(v, q, 3, "v");
}

// q, k [L, H, d] and v [L, H, d_v] of L leaves, as check_qkv.
inline void check_leaf_qkv(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const char* kernel) {
  check_qkv(q, k, v, kernel);
  TORCH_CHECK(k.sizes() == q.sizes() && v.size(0) == q.size(0) && v.size(1) == q.size(1),
              "q, k [L, H, d] and v [L, H, d_v] do not match");
}

}  // namespace hiergraph
