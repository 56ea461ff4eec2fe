// Dot products and scaled additions of rows that the compiler vectorizes (`omp simd`: the
// dot product's sum may be reordered across the vector lanes), shared by the kernels.
#pragma once

#include <cstdint>

namespace hiergraph {

template <typename T>
inline T dot(const T* __restrict x, const T* __restrict y, int64_t n) {
  T s = 0;
#pragma omp simd reduction(+ : s)
  for (int64_t c = 0; c < n; ++c) s += x[c] * y[c];
  return s;
}

// y += a x
template <typename T>
inline void axpy(T* __restrict y, T a, const T* __restrict x, int64_t n) {
#pragma omp simd
  for (int64_t c = 0; c < n; ++c) y[c] += a * x[c];
}

}  // namespace hiergraph
