// Products of the rows of one family, for the HSA kernels: the logits S = alpha x_i . y_j of
// its members (gram) and weighted sums of its rows (combine), vectorized with GCC's vector
// extensions at the width of the build's vector registers. Rows come through an accessor R
// whose r[i] is row i's first value (a family's rows may lie anywhere).
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "vector_ops.h"

namespace hiergraph {

// The width of the widest vector registers the build targets (a generic vector wider than
// them is split into several, and its shuffles into scalar code).
#if defined(__AVX512F__)
#define HIERGRAPH_VECTOR_BYTES 64
#elif defined(__AVX__)
#define HIERGRAPH_VECTOR_BYTES 32
#else
#define HIERGRAPH_VECTOR_BYTES 16
#endif

// Vectors of one register (GCC vector extensions) of `size` values.
template <typename T>
struct Lanes {
  static constexpr int size = HIERGRAPH_VECTOR_BYTES / sizeof(T);
  typedef T vec __attribute__((vector_size(HIERGRAPH_VECTOR_BYTES)));
  typedef std::conditional_t<sizeof(T) == 4, int32_t, int64_t> index;
  typedef index mask __attribute__((vector_size(HIERGRAPH_VECTOR_BYTES)));

#if defined(__GNUC__) && !defined(__clang__)
  static constexpr bool reduces = true;
  // The vector whose lane m is the sum of the lanes of acc[m] (m < size), in log2(size)
  // halvings (`acc` is overwritten).
  static inline vec reduce(vec* acc) {
    halve<size / 2>(acc);
    return acc[0];
  }

  // At width h, acc[m] (m < h) takes the halves of acc[m] and acc[m + h] in alternate
  // blocks of h lanes, each lane the sum of two: `high` picks the second of the two.
  static mask halving(int h, bool high) {
    mask out;
    for (int p = 0; p < size; ++p) {
      const int block = p / (2 * h), within = p % (2 * h);
      out[p] = (within < h ? 0 : size) + block * 2 * h + within % h + (high ? h : 0);
    }
    return out;
  }

  template <int h>
  static inline void halve(vec* acc) {
    if constexpr (h >= 1) {
      static const mask lo = halving(h, false), hi = halving(h, true);
      for (int m = 0; m < h; ++m)
        acc[m] = __builtin_shuffle(acc[m], acc[m + h], lo) +
                 __builtin_shuffle(acc[m], acc[m + h], hi);
      halve<h / 2>(acc);
    }
  }
#else
  static constexpr bool reduces = false;  // no __builtin_shuffle: dot products instead
  static inline vec reduce(vec* acc) { return acc[0]; }
#endif
};

// out = base + alpha sum_j coef[j cs] rows[first + j] over `count` rows of N values (base
// null: 0). With N known at compile time the sum stays in registers.
template <typename T, int N, typename R>
inline void combine_fixed(T* __restrict out, const T* __restrict base, T alpha,
                          const T* __restrict coef, int64_t cs, const R& rows, int64_t first,
                          int64_t count) {
  using V = typename Lanes<T>::vec;
  constexpr int K = N / Lanes<T>::size;
  static_assert(K * Lanes<T>::size == N, "N must be a multiple of the lanes");
  V acc[K], r;
  for (int x = 0; x < K; ++x) {
    if (base)
      __builtin_memcpy(&acc[x], base + x * Lanes<T>::size, sizeof r);
    else
      acc[x] = V{};
  }
  for (int64_t j = 0; j < count; ++j) {
    const T c = alpha * coef[j * cs];
    const T* __restrict row = rows[first + j];
    for (int x = 0; x < K; ++x) {
      __builtin_memcpy(&r, row + x * Lanes<T>::size, sizeof r);
      acc[x] += c * r;
    }
  }
  for (int x = 0; x < K; ++x) __builtin_memcpy(out + x * Lanes<T>::size, &acc[x], sizeof r);
}

// combine_fixed<T, N> where N is a multiple of the lanes; false where it is not.
template <typename T, int N, typename R>
inline bool combine_lanes(T* out, const T* base, T alpha, const T* coef, int64_t cs,
                          const R& rows, int64_t first, int64_t count) {
  if constexpr (N % Lanes<T>::size == 0) {
    combine_fixed<T, N, R>(out, base, alpha, coef, cs, rows, first, count);
    return true;
  }
  return false;
}

template <typename T, typename R>
inline void combine(T* out, const T* base, T alpha, const T* coef, int64_t cs, const R& rows,
                    int64_t first, int64_t count, int64_t n) {
  const auto fixed = [&](auto width) {
    return combine_lanes<T, decltype(width)::value, R>(out, base, alpha, coef, cs, rows, first,
                                                     count);
  };
  using std::integral_constant;
  switch (n) {
    case 4: if (fixed(integral_constant<int, 4>{})) return; break;
    case 8: if (fixed(integral_constant<int, 8>{})) return; break;
    case 16: if (fixed(integral_constant<int, 16>{})) return; break;
    case 32: if (fixed(integral_constant<int, 32>{})) return; break;
    case 64: if (fixed(integral_constant<int, 64>{})) return; break;
    case 128: if (fixed(integral_constant<int, 128>{})) return; break;
    default: break;
  }
  for (int64_t x = 0; x < n; ++x) out[x] = base ? base[x] : T(0);
  for (int64_t j = 0; j < count; ++j) axpy(out, alpha * coef[j * cs], rows[first + j], n);
}

template <typename T, int N>
inline T dot_fixed(const T* __restrict x, const T* __restrict y) {
  T s = 0;
#pragma omp simd reduction(+ : s)
  for (int c = 0; c < N; ++c) s += x[c] * y[c];
  return s;
}

// S = alpha x_i . y_j for b rows i, j, dim a multiple of the lanes: the products of one row i
// with `lanes` rows j accumulate in as many vectors, reduced together at the end (a last,
// partial block of rows j repeats its last row, whose lanes are dropped).
template <typename T, typename R>
inline void gram_lanes(T* __restrict S, const R& x, const R& y, int64_t first, int64_t b,
                       int64_t dim, T alpha) {
  using L = Lanes<T>;
  typename L::vec acc[L::size], xv, yv, sums;
  const T* rows[L::size];
  for (int64_t block = 0; block < b; block += L::size) {
    const int64_t width = std::min<int64_t>(L::size, b - block);
    for (int m = 0; m < L::size; ++m) rows[m] = y[first + block + std::min<int64_t>(m, width - 1)];
    for (int64_t i = 0; i < b; ++i) {
      const T* xi = x[first + i];
      for (int m = 0; m < L::size; ++m) acc[m] = typename L::vec{};
      for (int64_t c = 0; c < dim; c += L::size) {
        __builtin_memcpy(&xv, xi + c, sizeof xv);
        for (int m = 0; m < L::size; ++m) {
          __builtin_memcpy(&yv, rows[m] + c, sizeof yv);
          acc[m] += xv * yv;
        }
      }
      sums = L::reduce(acc) * alpha;
      __builtin_memcpy(S + i * b + block, &sums, width * sizeof(T));
    }
  }
}

// S = alpha x_i . y_j for the b rows i, j of one family (S: b x b, row-major).
template <typename T, typename R>
inline void gram(T* __restrict S, const R& x, const R& y, int64_t first, int64_t b, int64_t dim,
                 T alpha) {
  // (families of fewer than half the lanes: more products wasted than reductions saved)
  if (Lanes<T>::reduces && 2 * b >= Lanes<T>::size && dim % Lanes<T>::size == 0)
    return gram_lanes(S, x, y, first, b, dim, alpha);
  auto each = [&](auto product) {
    for (int64_t i = 0; i < b; ++i) {
      const T* xi = x[first + i];
      for (int64_t j = 0; j < b; ++j) S[i * b + j] = alpha * product(xi, y[first + j]);
    }
  };
  switch (dim) {
    case 32: return each([](const T* u, const T* w) { return dot_fixed<T, 32>(u, w); });
    case 64: return each([](const T* u, const T* w) { return dot_fixed<T, 64>(u, w); });
    case 128: return each([](const T* u, const T* w) { return dot_fixed<T, 128>(u, w); });
    default: return each([dim](const T* u, const T* w) { return dot(u, w, dim); });
  }
}

}  // namespace hiergraph
