// The tensors the kernels allocate, on at::Tensor's methods alone (new_empty, new_zeros,
// new_full and these helpers), so that a kernel's source includes ATen/core/Tensor.h rather
// than ATen/ATen.h, which declares every operator: parsing that header was most of each
// source's compile time, and the extension is compiled on a user's machine on first use.
// hiergraph.ops.hsa.native compiles with TORCH_ASSERT_ONLY_METHOD_OPERATORS, which makes an
// include of ATen/ATen.h an error.
#pragma once

#include <ATen/core/Tensor.h>

namespace hiergraph {

// at::empty_like(t) (memory format preserved): t's sizes and strides where t is
// non-overlapping and dense, else its sizes, contiguous.
inline at::Tensor empty_like(const at::Tensor& t) {
  return t.is_non_overlapping_and_dense() ? t.new_empty_strided(t.sizes(), t.strides())
                                          : t.new_empty(t.sizes());
}

// at::zeros_like(t).
inline at::Tensor zeros_like(const at::Tensor& t) { return empty_like(t).zero_(); }

// at::full_like(t, value).
inline at::Tensor full_like(const at::Tensor& t, double value) {
  return empty_like(t).fill_(value);
}

}  // namespace hiergraph
