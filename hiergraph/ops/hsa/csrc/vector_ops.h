// Dot products and scaled additions of rows that the compiler vectorizes (`omp simd`: the
// dot product's sum may be reordered across the vector lanes), exponentials of rows (a
// softmax), log-space sums and gates, and the vector variants of exp and log1p, shared by
// the kernels.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#if defined(__GLIBC__) && defined(__x86_64__)
// glibc's vector math library (libmvec): lets the compiler vectorize exp and log1p in
// `omp simd` loops
extern "C" float expf(float) noexcept __attribute__((simd("notinbranch")));
extern "C" double exp(double) noexcept __attribute__((simd("notinbranch")));
extern "C" float log1pf(float) noexcept __attribute__((simd("notinbranch")));
extern "C" double log1p(double) noexcept __attribute__((simd("notinbranch")));
#endif

namespace hiergraph {

template <typename T>
inline T dot(const T* __restrict x, const T* __restrict y, int64_t n) {
  T s = 0;
#pragma omp simd reduction(+ : s)
  for (int64_t c = 0; c < n; ++c) s += x[c] * y[c];
  return s;
}

// A softmax row s[0 .. n) whose maximum is -inf: without keys (all -inf), s <- 0 and returns
// the log-partition -inf; or with NaN logits, which the maximum skips (comparisons with NaN
// fail), s <- NaN and returns NaN, so that the NaN input reaches the output.
template <typename T>
inline T keyless_row(T* s, int64_t n) {
  const bool nan = std::any_of(s, s + n, [](T y) { return y != y; });
  std::fill(s, s + n, nan ? std::numeric_limits<T>::quiet_NaN() : T(0));
  return nan ? std::numeric_limits<T>::quiet_NaN() : -std::numeric_limits<T>::infinity();
}

// y += a x
template <typename T>
inline void axpy(T* __restrict y, T a, const T* __restrict x, int64_t n) {
#pragma omp simd
  for (int64_t c = 0; c < n; ++c) y[c] += a * x[c];
}

// x <- exp(x - shift), in place; returns the sum (vectorized: glibc's vector exp).
template <typename T>
inline T exp_shifted(T* __restrict x, int64_t n, T shift) {
  T total = 0;
#pragma omp simd reduction(+ : total)
  for (int64_t j = 0; j < n; ++j) {
    x[j] = std::exp(x[j] - shift);
    total += x[j];
  }
  return total;
}

// x <- exp(x - shift) / sum_j exp(x_j - shift), in place (a softmax, given shift >= max x);
// returns the sum.
template <typename T>
inline T normalized_exp(T* __restrict x, int64_t n, T shift) {
  const T total = exp_shifted(x, n, shift), inv = T(1) / total;
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) x[j] *= inv;
  return total;
}

// log(e^a + e^b), -inf when both are, NaN when either is (|a - b| keeps a NaN that std::max
// and std::min would drop).
template <typename T>
inline T log_add_exp(T a, T b) {
  constexpr T neg_inf = -std::numeric_limits<T>::infinity();
  if (a == neg_inf && b == neg_inf) return neg_inf;
  return std::max(a, b) + std::log1p(std::exp(-std::abs(a - b)));
}

// The gates of a node with energy a and siblings' log-sum lse: log(e^a + e^lse), log mu and
// log(1 - mu) with mu = sigmoid(a - lse) (log sigmoid(x) = min(x, 0) - log(1 + e^-|x|)), from
// one exp and one log1p (their shared log(1 + e^-|a - lse|)); all -inf when a = lse = -inf (no
// energy and no key: no mass passes).
template <typename T>
struct LogGates {
  T sum, log_mu, log_rest;
};

template <typename T>
inline LogGates<T> log_gates(T a, T lse) {
  constexpr T neg_inf = -std::numeric_limits<T>::infinity();
  if (a == neg_inf && lse == neg_inf) return {neg_inf, neg_inf, neg_inf};
  const T x = a - lse, shared = std::log1p(std::exp(-std::abs(x)));
  return {std::max(a, lse) + shared, std::min(x, T(0)) - shared, std::min(-x, T(0)) - shared};
}

}  // namespace hiergraph
