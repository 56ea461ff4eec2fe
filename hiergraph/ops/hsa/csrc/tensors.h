// The tensors the kernels allocate, on at::Tensor's methods alone (new_empty, new_zeros,
// new_full and these helpers), so that a kernel's source includes ATen/core/Tensor.h rather
// than ATen/ATen.h, which declares every operator: parsing that header was most of each
// source's compile time, and the extension is compiled on a user's machine on first use.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <numeric>
#include <utility>
#include <vector>

namespace hiergraph {

// Dense strides that keep the order of t's (at::infer_dense_strides: dimensions sorted by
// stride, innermost first, an ambiguous pair (a stride 0, or equal strides and sizes)
// keeping the contiguous order).
inline std::vector<int64_t> dense_strides_like(const at::Tensor& t) {
  const int64_t n = t.dim();
  std::vector<int64_t> perm(n), strides(n);
  std::iota(perm.rbegin(), perm.rend(), int64_t(0));  // n - 1, ..., 0: innermost first
  // > 0: dimension a goes after (outside) dimension b; < 0: before; 0: ambiguous
  auto order = [&](int64_t a, int64_t b) {
    const int64_t sa = t.stride(a), sb = t.stride(b);
    if (sa == 0 || sb == 0) return 0;
    if (sa != sb) return sa < sb ? -1 : 1;
    return t.size(a) > t.size(b) ? 1 : 0;
  };
  for (int64_t i = 1; i < n; ++i) {  // an insertion sort, as PyTorch's
    int64_t moving = i;
    for (int64_t j = i - 1; j >= 0; --j) {
      const int comparison = order(perm[j], perm[moving]);
      if (comparison < 0) break;
      if (comparison > 0) {
        std::swap(perm[j], perm[moving]);
        moving = j;
      }
    }
  }
  int64_t stride = 1;
  for (int64_t i = 0; i < n; ++i) {
    strides[perm[i]] = stride;
    if (t.size(perm[i]) > 1) stride *= t.size(perm[i]);
  }
  return strides;
}

// at::empty_like(t) (memory format preserved): t's strides where t is non-overlapping and
// dense, else dense strides in the order of t's.
inline at::Tensor empty_like(const at::Tensor& t) {
  if (t.is_non_overlapping_and_dense()) return t.new_empty_strided(t.sizes(), t.strides());
  return t.new_empty_strided(t.sizes(), dense_strides_like(t));
}

// at::zeros_like(t).
inline at::Tensor zeros_like(const at::Tensor& t) { return empty_like(t).zero_(); }

// at::full_like(t, value).
inline at::Tensor full_like(const at::Tensor& t, double value) {
  return empty_like(t).fill_(value);
}

}  // namespace hiergraph
