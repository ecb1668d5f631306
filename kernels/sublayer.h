// The element-wise ends of a block's sublayers, each one pass over the activations where torch takes several:
//   residual layer norm   y = LN(a + b + add)·w + β    (forward: add, layer_norm, addcmul; backward: five more)
//   bias GELU             y = GELU(z + bias), exact     (forward: the bias copy of baddbmm, gelu; backward:
//                                                        gelu_backward, whose erf and exp torch runs unvectorised
//                                                        on the CPU, and the bias gradient's sum)
// At the fMRI default (rows of 32 and 64) these passes were about a third of a training step's CPU time.
//
// Header-only, no torch: plain pointers and sizes, templated on float / double. The caller (csrc/sublayer_cpu.cpp)
// spreads the rows over threads; every function here works on one range of rows and writes the parameter
// gradients of that range to its own partial sums, which the caller adds up in a fixed order (deterministic).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "pe_attention.h"  // fast_exp

namespace pe_fast {

// GELU needs Φ(x) = ½·erfc(−x/√2) and φ(x) = exp(−x²/2)/√(2π) at once; both come from one exp(−t²), t = x/√2.
// float: erfc(|t|) = exp(−t²)·Q(1/(1 + |t|/2)), Q a degree-9 least-squares fit of the relative error on
// 0 ≤ t ≤ 9.4 (beyond, exp(−t²) is 0 in float), fitted for pe_fast in float64 against mpmath, 2026-12: erfc within
// 4e-6 relatively (the rounding of t² in exp(−t²), at the far tail), GELU and its derivative within about 1e-7 of
// their exact values. One branch: an earlier fit switched to erf's Taylor-like form below |t| = 0.9, which cost
// both forms for every element. double: the C library (the float64 path is the tests' reference, not a fast
// path). Always inlined: a call per element keeps the loops that use it scalar, and with several such loops in one
// file gcc stops inlining it on its own (measured: a loop 7× slower).
template <typename T>
struct GeluParts {
  T cdf;  // Φ(x)
  T pdf;  // φ(x)
};

[[gnu::always_inline]] inline GeluParts<float> gelu_parts(float x) {
  const float t = x * 0.70710678118654752f, a = std::abs(t);
  const float e = fast_exp(-t * t);
  const float w = 1.0f / (1.0f + 0.5f * a);
  const float q = -4.333993274485692e-06f + w * (0.2821796238422394f + w * (0.2815324366092682f + w * (
      0.24731780588626862f + w * (0.18981429934501648f + w * (-0.0016214264323934913f + w * (0.24706174433231354f +
      w * (-0.46344059705734253f + w * (0.2743276059627533f + w * -0.05716719850897789f))))))));
  const float tail = e * q;  // erfc(|t|)
  return {t >= 0.0f ? 1.0f - 0.5f * tail : 0.5f * tail, e * 0.3989422804014327f};
}

[[gnu::always_inline]] inline GeluParts<double> gelu_parts(double x) {
  return {0.5 * std::erfc(-x * 0.70710678118654752), std::exp(-0.5 * x * x) * 0.3989422804014327};
}

// Forward: y = x·Φ(x), x = z + bias, for `rows` rows of `width`. The backward recomputes x from z: storing it
// would cost a pass of writes, recomputing it costs an add.
template <typename T>
void bias_gelu_forward(int64_t rows, int width, const T* __restrict__ z, const T* __restrict__ bias,
                       T* __restrict__ y) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* zr = z + r * width;
    T* yr = y + r * width;
#pragma omp simd
    for (int j = 0; j < width; ++j) {
      const T x = zr[j] + bias[j];
      yr[j] = x * gelu_parts(x).cdf;
    }
  }
}

// Backward: dz = dy·GELU'(x) = dy·(Φ(x) + x·φ(x)), x = z + bias; dbias += Σ_rows dz.
template <typename T>
void bias_gelu_backward(int64_t rows, int width, const T* __restrict__ z, const T* __restrict__ bias,
                        const T* __restrict__ dy, T* __restrict__ dz, T* __restrict__ dbias) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* zr = z + r * width;
    const T* dyr = dy + r * width;
    T* dzr = dz + r * width;
#pragma omp simd
    for (int j = 0; j < width; ++j) {
      const T x = zr[j] + bias[j];
      const auto parts = gelu_parts(x);
      const T g = dyr[j] * (parts.cdf + x * parts.pdf);
      dzr[j] = g;
      dbias[j] += g;
    }
  }
}

// One row's x = a + b (+ add), into x[width]; add == nullptr: none.
template <typename T>
inline void residual_row(const T* __restrict__ a, const T* __restrict__ b, const T* __restrict__ add, int width,
                         T* __restrict__ x) {
  if (add != nullptr) {
#pragma omp simd
    for (int j = 0; j < width; ++j) x[j] = a[j] + b[j] + add[j];
  } else {
#pragma omp simd
    for (int j = 0; j < width; ++j) x[j] = a[j] + b[j];
  }
}

// A range of rows of one model: a, b [rows × width]; add [add_rows × width] (the PE of each token plus the folded
// bias of the projection before; nullptr: nothing), repeating over the rows; w, beta [width].
template <typename T>
struct NormRows {
  const T* a;
  const T* b;
  const T* add;
  int64_t add_rows;
  int64_t first_row;  // of this range in its model: row r of the range adds add[(first_row + r) % add_rows]
  const T* w;
  const T* beta;
  int64_t rows;
  int width;

  // row r's x = a + b + add, into x[width]
  void input(int64_t r, T* __restrict__ x) const {
    residual_row(a + r * width, b + r * width, add ? add + ((first_row + r) % add_rows) * width : nullptr, width, x);
  }
};

// A row's mean and 1/sqrt(variance + eps) in units of its largest |x|: where |x| passes about 1e19 in float, the sum
// of squares (or beyond 1e37 the sum) overflows, and 1/sqrt(inf) would make every x̂ zero.
template <typename T>
void scaled_moments(const T* __restrict__ x, int D, T eps, T& mu, T& inv) {
  T largest = T(0);
  for (int j = 0; j < D; ++j) largest = std::max(largest, std::abs(x[j]));
  if (!(largest > T(0)) || !std::isfinite(largest)) return;  // NaN or inf in the row: they stay in mu and inv
  const T unit = T(1) / largest;
  T sum = T(0);
  for (int j = 0; j < D; ++j) sum += x[j] * unit;
  const T m = sum / T(D);
  T squares = T(0);
  for (int j = 0; j < D; ++j) squares += (x[j] * unit - m) * (x[j] * unit - m);
  mu = m * largest;
  inv = unit / std::sqrt(squares / T(D) + eps * unit * unit);
}

// Forward: y = (x − mean)·rstd·w + β per row, x = a + b + add; mean and rstd [rows] kept for the backward. x − mean
// is taken in halves, (x/2 − mean/2)·(2·rstd), the same numbers where it fits and finite where x − mean would pass
// float's largest value. x: scratch [width].
template <typename T>
void residual_layer_norm_forward(const NormRows<T>& n, T eps, T* __restrict__ y, T* __restrict__ mean,
                                 T* __restrict__ rstd, T* __restrict__ x) {
  const int D = n.width;
  for (int64_t r = 0; r < n.rows; ++r) {
    n.input(r, x);
    T sum = T(0);
#pragma omp simd reduction(+ : sum)
    for (int j = 0; j < D; ++j) sum += x[j];
    T mu = sum / T(D);
    T squares = T(0);
#pragma omp simd reduction(+ : squares)
    for (int j = 0; j < D; ++j) squares += (x[j] - mu) * (x[j] - mu);
    T inv = T(1) / std::sqrt(squares / T(D) + eps);  // the biased variance, as torch's layer_norm
    if (!std::isfinite(squares)) scaled_moments(x, D, eps, mu, inv);
    const T half_mu = mu * T(0.5), twice_inv = inv * T(2);
    T* yr = y + r * D;
#pragma omp simd
    for (int j = 0; j < D; ++j) yr[j] = (x[j] * T(0.5) - half_mu) * twice_inv * n.w[j] + n.beta[j];
    mean[r] = mu;
    rstd[r] = inv;
  }
}

// Backward, x̂ = (x − mean)·rstd recomputed from a, b and add; g = dy·w:
//   dx = rstd·(g − mean(g) − x̂·mean(g·x̂))   (the gradient of a, of b, and summed, of add)
//   dw += Σ_rows dy·x̂,  dβ += Σ_rows dy.   x: scratch [width].
template <typename T>
void residual_layer_norm_backward(const NormRows<T>& n, const T* __restrict__ mean, const T* __restrict__ rstd,
                                  const T* __restrict__ dy, T* __restrict__ dx, T* __restrict__ dw,
                                  T* __restrict__ dbeta, T* __restrict__ x) {
  const int D = n.width;
  for (int64_t r = 0; r < n.rows; ++r) {
    n.input(r, x);
    const T half_mu = mean[r] * T(0.5), twice_inv = rstd[r] * T(2), inv = rstd[r];
    const T* dyr = dy + r * D;
    T sum_g = T(0), sum_gx = T(0);
#pragma omp simd reduction(+ : sum_g, sum_gx)
    for (int j = 0; j < D; ++j) {
      const T xhat = (x[j] * T(0.5) - half_mu) * twice_inv;  // in halves, as the forward's
      const T g = dyr[j] * n.w[j];
      sum_g += g;
      sum_gx += g * xhat;
      dw[j] += dyr[j] * xhat;
      dbeta[j] += dyr[j];
      x[j] = xhat;
    }
    const T mean_g = sum_g / T(D), mean_gx = sum_gx / T(D);
    T* dxr = dx + r * D;
#pragma omp simd
    for (int j = 0; j < D; ++j) dxr[j] = inv * (dyr[j] * n.w[j] - mean_g - x[j] * mean_gx);
  }
}

}  // namespace pe_fast
