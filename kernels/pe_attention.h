// Attention + attention-map statistics of one (model, batch, head) problem, forward and backward.
//
// Header-only, no torch, no Python: plain pointers and sizes, templated on float / double. The caller (csrc/)
// runs one problem per call and spreads the problems over threads, one scratch buffer per thread.
//
// Forward: online softmax over key tiles (the N×N map exists only as one [kRowBlock × kKeyTile] tile), with the
// statistics as extra running sums rescaled like the normaliser l = Σ e, e = exp(s − m):
//   entropy  = log l − Σ e·(s − m) / l     max prob = 1 / l   (m ends as the row max)
//   Σ p²     = Σ e² / l²                   probe k  = Σ e·T_k / l
// The log-sum-exp m + log l of every row is saved; the backward recomputes P from it (flash-attention style).
// The tile products are small register-blocked GEMMs (`gemm`) whose vector loop runs along contiguous rows:
// keys are copied transposed to [dh × N] for Q·Kᵀ, values as [N × dh] for P·V. Built with -O3 -march=native
// -fopenmp(-simd) -fno-trapping-math, gcc vectorises every inner loop (see fast_exp for the last flag).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

namespace pe_fast {

constexpr int kRowBlock = 24;   // query rows that share one pass over a key tile (the tile stays in L1/L2); a multiple
                                // of the GEMMs' row blocks (12 with AVX-512, 6 without): 16 left a 4-row block
constexpr int kKeyTile = 128;   // keys per tile

// Transposed keys and values are stored with their rows padded with zeros to a whole number of vectors
// (8 floats, 2 × 4 doubles), so that the Q·Kᵀ and dO·Vᵀ tile products run without a scalar tail: at N = 100
// that tail took about a third of those products' time.
inline int padded(int n) { return (n + 7) / 8 * 8; }

constexpr double inverse_factorial(int k) { return k == 0 ? 1.0 : inverse_factorial(k - 1) / k; }

template <typename T>
struct ExpConstants;

template <>
struct ExpConstants<float> {
  using Bits = uint32_t;
  static constexpr float lo = -87.0f, hi = 88.0f;  // 2^n stays a normal number
  static constexpr float shifter = 12582912.0f;    // 1.5·2^23: adding it rounds to an integer in the low bits
  static constexpr float ln2_hi = 0.693145751953125f, ln2_lo = 1.428606765330187045e-6f;
  static constexpr int mantissa_bits = 23, exponent_bias = 127, degree = 7;
};

template <>
struct ExpConstants<double> {
  using Bits = uint64_t;
  static constexpr double lo = -708.0, hi = 709.0;
  static constexpr double shifter = 6755399441055744.0;  // 1.5·2^52
  static constexpr double ln2_hi = 6.93147180369123816490e-01, ln2_lo = 1.90821492927058770002e-10;
  static constexpr int mantissa_bits = 52, exponent_bias = 1023, degree = 13;
};

// Σ_{k ≤ degree} r^k / k! by Horner's rule, one FMA per degree, unrolled at compile time so that the caller's loop
// body stays straight-line code (the nested form 1 + r/k·(…) took a multiply and an FMA per degree)
template <typename T, int k, int degree>
inline T taylor_exp(T r) {
  if constexpr (k == degree) {
    return T(inverse_factorial(k));
  } else {
    return taylor_exp<T, k + 1, degree>(r) * r + T(inverse_factorial(k));
  }
}

// exp(x) = 2^n · e^r, |r| ≤ ln2/2, e^r by its Taylor polynomial (error below one ulp of T). std::exp does not
// vectorise without libmvec and -ffast-math (which would also fold the shifter trick away); this does, given
// -fno-trapping-math (else gcc keeps the clamping compares as branches: scalar code, about 3× slower).
// Below `lo` it returns exactly 0, as exp(−inf) must.
template <typename T>
inline T fast_exp(T x) {
  using C = ExpConstants<T>;
  using Bits = typename C::Bits;
  const T xc = std::min(std::max(x, C::lo), C::hi);
  const T t = xc * T(1.4426950408889634) + C::shifter;
  const T n = t - C::shifter;
  const T r = (xc - n * C::ln2_hi) - n * C::ln2_lo;
  const T p = taylor_exp<T, 0, C::degree>(r);
  Bits bits;
  std::memcpy(&bits, &t, sizeof bits);
  bits = (bits + Bits(C::exponent_bias)) << C::mantissa_bits;  // the low bits of t hold n
  T two_n;
  std::memcpy(&two_n, &bits, sizeof two_n);
  return x < C::lo ? T(0) : p * two_n;
}

// One problem's q, k, v: token i's vectors start at q + i·qkv_stride (likewise k, v); head dim dh.
// Optionally a per-token addend in the same layout (token i's at add_q + i·add_stride, likewise add_k, add_v;
// nullptr: none), added as the operands are loaded: the caller passes x·W and (pe·W + b) apart, which saves
// it the passes over the activations that adding them would cost (pe_fast/ops/projection.py).
template <typename T>
struct Problem {
  const T* q;
  const T* k;
  const T* v;
  int64_t qkv_stride;
  int n;
  int dh;
  const T* add_q = nullptr;
  const T* add_k = nullptr;
  const T* add_v = nullptr;
  int64_t add_stride = 0;
};

// dst[d·dst_step] = (src[d] + add[d])·scale for d < dh; add == nullptr: nothing added. The branch sits outside
// the loops, so each stays one vectorisable loop.
template <typename T>
inline void load_row(const T* __restrict__ src, const T* __restrict__ add, T scale, int dh, T* __restrict__ dst,
                     int64_t dst_step) {
  if (add != nullptr) {
#pragma omp simd
    for (int d = 0; d < dh; ++d) dst[d * dst_step] = (src[d] + add[d]) * scale;
  } else {
#pragma omp simd
    for (int d = 0; d < dh; ++d) dst[d * dst_step] = src[d] * scale;
  }
}

// Copies one problem's q, k and v out of the packed [n × 3D] projection in a single pass over its tokens, in
// memory order: the qkv tensor is far larger than the caches, and three strided passes (one per operand) read
// memory at about half the speed of one sequential pass (measured on the 2-core CI machine).
//   q_rows [n × dh] = scale·(q + add_q) (nullptr: skipped);
//   k_cols, v_cols [dh × padded(n)] (transposed, zero beyond column n; nullptr: skipped);
//   k_rows, v_rows [n × dh] (nullptr: skipped)
template <typename T>
inline void load_problem(const Problem<T>& pr, T scale, T* __restrict__ q_rows, T* __restrict__ k_cols,
                         T* __restrict__ k_rows, T* __restrict__ v_cols, T* __restrict__ v_rows) {
  const int n = pr.n, dh = pr.dh, n_pad = padded(n);
  const bool added = pr.add_q != nullptr;
  for (int j = 0; j < n; ++j) {
    const T* q = pr.q + j * pr.qkv_stride;
    const T* k = pr.k + j * pr.qkv_stride;
    const T* v = pr.v + j * pr.qkv_stride;
    const T* add_q = added ? pr.add_q + j * pr.add_stride : nullptr;
    const T* add_k = added ? pr.add_k + j * pr.add_stride : nullptr;
    const T* add_v = added ? pr.add_v + j * pr.add_stride : nullptr;
    const int64_t row = static_cast<int64_t>(j) * dh;
    if (q_rows != nullptr) load_row(q, add_q, scale, dh, q_rows + row, 1);
    if (k_cols != nullptr) load_row(k, add_k, T(1), dh, k_cols + j, n_pad);
    if (k_rows != nullptr) load_row(k, add_k, T(1), dh, k_rows + row, 1);
    if (v_cols != nullptr) load_row(v, add_v, T(1), dh, v_cols + j, n_pad);
    if (v_rows != nullptr) load_row(v, add_v, T(1), dh, v_rows + row, 1);
  }
  for (T* cols : {k_cols, v_cols})
    if (cols != nullptr)
      for (int64_t d = 0; d < dh; ++d) std::fill(cols + d * n_pad + n, cols + (d + 1) * n_pad, T(0));
}

// C[r][j0 .. j0 + L) (+)= Σ_k A(r,k)·B[k][j] for R rows and L columns (a whole number of vectors) at once,
// A(r,k) = a[r·a_row + k·a_k], in R·L running sums that the compiler keeps in registers: independent FMA chains
// (one would wait on the FMA latency), and per k only L/lanes vector loads of B and R broadcasts of A.
template <bool kAccumulate, int R, int L, typename T>
inline void gemm_block(int j0, int depth, const T* a, int64_t a_row, int64_t a_k, const T* b, int64_t ldb, T* c,
                       int64_t ldc) {
  T sum[R][L];
  for (int r = 0; r < R; ++r)
    for (int l = 0; l < L; ++l) sum[r][l] = kAccumulate ? c[r * ldc + j0 + l] : T(0);
  for (int k = 0; k < depth; ++k) {
    const T* bk = b + k * ldb + j0;
    for (int r = 0; r < R; ++r) {
      const T ar = a[r * a_row + k * a_k];
#pragma omp simd
      for (int l = 0; l < L; ++l) sum[r][l] += ar * bk[l];
    }
  }
  for (int r = 0; r < R; ++r)
    for (int l = 0; l < L; ++l) c[r * ldc + j0 + l] = sum[r][l];
}

// R rows of C: columns in blocks of two vectors (per k, 2 loads of B and R broadcasts of A feed 2·R FMAs: the
// FMA units, not the load ports, set the pace), then one vector, then (AVX-512) one 8-float half vector: the
// padded key rows are whole multiples of 8 (`padded`), then a scalar tail. Vectors are 64 bytes where the build
// targets AVX-512 (setup.py asks gcc for 512-bit vectors there), else 32.
template <bool kAccumulate, int R, typename T>
inline void gemm_rows(int cols, int depth, const T* a, int64_t a_row, int64_t a_k, const T* b, int64_t ldb, T* c,
                      int64_t ldc) {
#if defined(__AVX512F__)
  constexpr int W = 64 / sizeof(T);
#else
  constexpr int W = 32 / sizeof(T);
#endif
  constexpr int H = 32 / sizeof(T);
  int j0 = 0;
  for (; j0 + 2 * W <= cols; j0 += 2 * W) gemm_block<kAccumulate, R, 2 * W>(j0, depth, a, a_row, a_k, b, ldb, c, ldc);
  for (; j0 + W <= cols; j0 += W) gemm_block<kAccumulate, R, W>(j0, depth, a, a_row, a_k, b, ldb, c, ldc);
  if constexpr (W > H)
    for (; j0 + H <= cols; j0 += H) gemm_block<kAccumulate, R, H>(j0, depth, a, a_row, a_k, b, ldb, c, ldc);
  for (int j = j0; j < cols; ++j)
    for (int r = 0; r < R; ++r) {
      T sum = kAccumulate ? c[r * ldc + j] : T(0);
      for (int k = 0; k < depth; ++k) sum += a[r * a_row + k * a_k] * b[k * ldb + j];
      c[r * ldc + j] = sum;
    }
}

// C[rows × cols] = A[rows × depth]·B[depth × cols], or += when kAccumulate (A strided as in gemm_block; B, C
// row-major). Six rows at a time: 6 × 2 vectors of sums, 2 of B and a broadcast fill 15 of AVX2's 16 registers
// (8 rows × 1 vector, the earlier blocking, was 1.03–1.15× slower at N = 100: bench/op/kernel_ab.sh); with
// AVX-512's 32 registers twelve rows (27 registers): 1.07–1.09× over the six rows at N = 100.
template <bool kAccumulate, typename T>
inline void gemm(int rows, int cols, int depth, const T* a, int64_t a_row, int64_t a_k, const T* b, int64_t ldb,
                 T* c, int64_t ldc) {
  int r = 0;
#if defined(__AVX512F__)
  for (; r + 12 <= rows; r += 12) gemm_rows<kAccumulate, 12>(cols, depth, a + r * a_row, a_row, a_k, b, ldb, c + r * ldc, ldc);
#endif
  for (; r + 6 <= rows; r += 6) gemm_rows<kAccumulate, 6>(cols, depth, a + r * a_row, a_row, a_k, b, ldb, c + r * ldc, ldc);
  for (; r + 4 <= rows; r += 4) gemm_rows<kAccumulate, 4>(cols, depth, a + r * a_row, a_row, a_k, b, ldb, c + r * ldc, ldc);
  for (; r < rows; ++r) gemm_rows<kAccumulate, 1>(cols, depth, a + r * a_row, a_row, a_k, b, ldb, c + r * ldc, ldc);
}

// max(x[0 .. len)) in lanes: gcc does not vectorise a max reduction without -ffinite-math-only (it would change
// what a NaN does), and one scalar chain of maxima waits on the latency of each: at N = 100 that loop was a third
// of the forward's time. Lane-wise maxima are plain selects, which it does vectorise.
template <typename T>
inline T row_max(const T* __restrict__ x, int len) {
  constexpr int L = 64 / sizeof(T);
  T lanes[L];
  for (int l = 0; l < L; ++l) lanes[l] = -std::numeric_limits<T>::infinity();
  int j = 0;
  for (; j + L <= len; j += L) {
#pragma omp simd
    for (int l = 0; l < L; ++l) lanes[l] = std::max(lanes[l], x[j + l]);
  }
  for (; j < len; ++j) lanes[0] = std::max(lanes[0], x[j]);
  T result = lanes[0];
  for (int l = 1; l < L; ++l) result = std::max(result, lanes[l]);
  return result;
}

template <typename T>
inline T dot(const T* a, const T* b, int len) {
  T sum = T(0);
#pragma omp simd reduction(+ : sum)
  for (int j = 0; j < len; ++j) sum += a[j] * b[j];
  return sum;
}

// Forward of one problem.
//   probes: [num_probes, n, n] (nullptr when num_probes == 0); out: token i's head output at out + i·out_stride;
//   lse: [n]; stat_sums: [3 + num_probes], receives the sums over the n rows of entropy, max prob, Σp², probes;
//   scratch: grown as needed and reused across calls (one per thread: no allocation per problem).
template <typename T>
void attention_forward(const Problem<T>& pr, const T* probes, int num_probes, T* out, int64_t out_stride,
                       T* lse, double* stat_sums, std::vector<T>& scratch) {
  const int n = pr.n, dh = pr.dh, K = num_probes, n_pad = padded(n), tile = std::min(kKeyTile, n_pad);
  const int64_t plane = static_cast<int64_t>(dh) * n, plane_pad = static_cast<int64_t>(dh) * n_pad;
  scratch.resize(std::max(scratch.size(), static_cast<size_t>(plane_pad + 2 * plane + kRowBlock * (dh + K + tile))));
  T* kt = scratch.data();          // [dh × n_pad]
  T* v = kt + plane_pad;           // [n × dh]
  T* q_all = v + plane;            // [n × dh], scaled by 1/√dh
  T* acc = q_all + plane;          // [rows × dh], Σ e·v
  T* mass = acc + kRowBlock * dh;  // [rows × K]
  T* s = mass + kRowBlock * K;     // [rows × tile]: the scores, then e = exp(s − m), of one key tile
  const T scale = T(1) / std::sqrt(T(dh));
  load_problem<T>(pr, scale, q_all, kt, nullptr, nullptr, v);
  T m[kRowBlock], l[kRowBlock], es[kRowBlock], e2[kRowBlock];
  for (int k = 0; k < 3 + K; ++k) stat_sums[k] = 0.0;

  for (int i0 = 0; i0 < n; i0 += kRowBlock) {
    const int rows = std::min(kRowBlock, n - i0);
    const T* q = q_all + static_cast<int64_t>(i0) * dh;
    for (int r = 0; r < rows; ++r) {
      m[r] = -std::numeric_limits<T>::infinity();
      l[r] = es[r] = e2[r] = T(0);
    }
    std::fill(acc, acc + rows * dh, T(0));
    std::fill(mass, mass + rows * K, T(0));

    for (int j0 = 0; j0 < n; j0 += tile) {
      const int cols = std::min(tile, n - j0);  // the keys; the scores are computed for whole vectors
      gemm<false>(rows, std::min(tile, n_pad - j0), dh, q, dh, 1, kt + j0, n_pad, s, tile);
      for (int r = 0; r < rows; ++r) {
        T* sr = s + r * tile;
        const T m_new = std::max(m[r], row_max(sr, cols));
        const T alpha = fast_exp(m[r] - m_new);  // 0 on the first tile, where m = −inf
        // differences of finite logits can overflow to −inf (−3e38 − 3e38), and 0·(−inf) is NaN: held at the
        // bound fast_exp clamps to (the same e), so that every e·x term of the entropy is a number
        const T far = ExpConstants<T>::lo;
        const T shift = l[r] > T(0) ? std::max(m[r] - m_new, far) * l[r] : T(0);
        T sum_e = T(0), sum_ex = T(0), sum_e2 = T(0);
#pragma omp simd reduction(+ : sum_e, sum_ex, sum_e2)
        for (int j = 0; j < cols; ++j) {
          const T x = std::max(sr[j] - m_new, far);
          const T e = fast_exp(x);
          sr[j] = e;
          sum_e += e;
          sum_ex += e * x;
          sum_e2 += e * e;
        }
        l[r] = alpha * l[r] + sum_e;
        es[r] = alpha * (es[r] + shift) + sum_ex;  // Σ e·(s − m) re-based on the new max
        e2[r] = alpha * alpha * e2[r] + sum_e2;
        const T* probe_row = probes + static_cast<int64_t>(i0 + r) * n + j0;
        for (int k = 0; k < K; ++k)
          mass[r * K + k] = alpha * mass[r * K + k] + dot(sr, probe_row + static_cast<int64_t>(k) * n * n, cols);
        for (int d = 0; d < dh; ++d) acc[r * dh + d] *= alpha;
        m[r] = m_new;
      }
      gemm<true>(rows, dh, cols, s, tile, 1, v + static_cast<int64_t>(j0) * dh, dh, acc, dh);
    }

    for (int r = 0; r < rows; ++r) {
      const T inv_l = T(1) / l[r], log_l = std::log(l[r]);
      for (int d = 0; d < dh; ++d) out[(i0 + r) * out_stride + d] = acc[r * dh + d] * inv_l;
      lse[i0 + r] = m[r] + log_l;
      stat_sums[0] += static_cast<double>(log_l - es[r] * inv_l);
      stat_sums[1] += static_cast<double>(inv_l);
      stat_sums[2] += static_cast<double>(e2[r] * inv_l * inv_l);
      for (int k = 0; k < K; ++k) stat_sums[3 + k] += static_cast<double>(mass[r * K + k] * inv_l);
    }
  }
}

// Backward of one problem, P recomputed from S and the saved lse.
//   dout: the gradient of token i's head output at dout + i·out_stride;
//   dq, dk, dv: token i's gradients at dq + i·grad_stride (likewise dk, dv); every entry is written;
//   scratch as in attention_forward.
// With dS = P ∘ (dP − Δ), Δ_i = Σ_j P_ij·dP_ij, dP = dO·Vᵀ:  dQ = scale·dS·K, dK = scale·dSᵀ·Q, dV = Pᵀ·dO.
// A query row whose dO is zero adds nothing to any of them (its dP, Δ and dS are zero) and gets dQ = 0: only the
// rows with a non-zero dO are computed, gathered into row blocks. A loss that reads some tokens' outputs (the
// masked-token tasks' last block) leaves most rows zero.
template <typename T>
void attention_backward(const Problem<T>& pr, const T* dout, int64_t out_stride, const T* lse,
                        T* dq, T* dk, T* dv, int64_t grad_stride, std::vector<T>& scratch) {
  const int n = pr.n, dh = pr.dh, n_pad = padded(n), tile = std::min(kKeyTile, n_pad);
  const int64_t plane = static_cast<int64_t>(dh) * n, plane_pad = static_cast<int64_t>(dh) * n_pad;
  scratch.resize(std::max(scratch.size(),
                          static_cast<size_t>(2 * plane_pad + 4 * plane + kRowBlock * (3 * dh + 2 * n_pad + 1))));
  T* kt = scratch.data();          // [dh × n_pad]
  T* vt = kt + plane_pad;          // [dh × n_pad]
  T* k = vt + plane_pad;           // [n × dh]
  T* dk_acc = k + plane;           // [n × dh]
  T* dv_acc = dk_acc + plane;      // [n × dh]
  T* q_all = dv_acc + plane;       // [n × dh], scaled: dK = dSᵀ·(scale·Q)
  T* g = q_all + plane;            // [rows × dh], dO
  T* dq_acc = g + kRowBlock * dh;  // [rows × dh]
  T* q_rows = dq_acc + kRowBlock * dh;  // [rows × dh]: the block's rows of q_all, where they are not contiguous
  T* p = q_rows + kRowBlock * dh;  // [rows × n_pad]: S, then P
  T* ds = p + kRowBlock * n_pad;   // [rows × n_pad]: dP, then dS
  T* row_lse = ds + kRowBlock * n_pad;  // [rows]
  const T scale = T(1) / std::sqrt(T(dh));

  // the rows with a non-zero dO (NaN counts as non-zero: it must reach the gradients)
  thread_local std::vector<int> live;  // reused: one allocation per thread, not per problem
  live.clear();
  for (int i = 0; i < n; ++i) {
    const T* row = dout + static_cast<int64_t>(i) * out_stride;
    int d = 0;
    while (d < dh && row[d] == T(0)) ++d;  // a live row usually stops this at d = 0
    if (d < dh) live.push_back(i);
    else
      std::fill(dq + static_cast<int64_t>(i) * grad_stride, dq + static_cast<int64_t>(i) * grad_stride + dh, T(0));
  }
  const int num_live = static_cast<int>(live.size());
  if (num_live == 0) {
    for (int j = 0; j < n; ++j)
      for (int d = 0; d < dh; ++d) dk[j * grad_stride + d] = dv[j * grad_stride + d] = T(0);
    return;
  }
  load_problem<T>(pr, scale, q_all, kt, k, vt, nullptr);
  std::fill(dk_acc, dk_acc + 2 * plane, T(0));

  for (int b0 = 0; b0 < num_live; b0 += kRowBlock) {
    const int rows = std::min(kRowBlock, num_live - b0);
    const int* block = live.data() + b0;
    const bool contiguous = block[rows - 1] - block[0] == rows - 1;
    const T* q = q_all + static_cast<int64_t>(block[0]) * dh;
    if (!contiguous) {
      for (int r = 0; r < rows; ++r)
        std::copy(q_all + static_cast<int64_t>(block[r]) * dh, q_all + static_cast<int64_t>(block[r] + 1) * dh,
                  q_rows + r * dh);
      q = q_rows;
    }
    for (int r = 0; r < rows; ++r) {
      const int64_t i = block[r];
      std::copy(dout + i * out_stride, dout + i * out_stride + dh, g + r * dh);
      row_lse[r] = lse[i];
    }
    std::fill(dq_acc, dq_acc + rows * dh, T(0));

    // S and dP of the whole rows first: Δ = Σ_j P_j·dP_j must be summed from the same P and dP that dS = P·(dP − Δ)
    // uses, so that a saturated row (P one-hot) cancels exactly, as the reference's softmax backward does. Δ taken as
    // dO·O instead differs from it by the rounding of O, which dS then carries times |K| (large logits: large K).
    for (int j0 = 0; j0 < n; j0 += tile) {
      const int cols_pad = std::min(tile, n_pad - j0);  // whole vectors; only the first n columns are used
      gemm<false>(rows, cols_pad, dh, q, dh, 1, kt + j0, n_pad, p + j0, n_pad);   // S
      gemm<false>(rows, cols_pad, dh, g, dh, 1, vt + j0, n_pad, ds + j0, n_pad);  // dP
    }
    // P = exp(S − shift) over its own sum. exp(S − lse) alone lost lse's log Σ where a row's logits share a large
    // offset (lse rounds at their magnitude), and P its sum of 1; that rounding is the same for the whole row, and
    // the sum takes it out. Beyond |lse| = 1e8 it could pass exp's range: the row's max is the shift there.
    for (int r = 0; r < rows; ++r) {
      T* pr_ = p + r * n_pad;
      T* dsr = ds + r * n_pad;
      T shift = row_lse[r];
      if (!(std::abs(shift) < T(1e8))) {
        shift = pr_[0];
        for (int j = 1; j < n; ++j) shift = pr_[j] > shift ? pr_[j] : shift;
      }
      T sum = T(0), weighted = T(0);
#pragma omp simd reduction(+ : sum, weighted)
      for (int j = 0; j < n; ++j) {
        pr_[j] = fast_exp(pr_[j] - shift);
        sum += pr_[j];
        weighted += pr_[j] * dsr[j];
      }
      const T inv = T(1) / sum, delta = weighted * inv;
#pragma omp simd
      for (int j = 0; j < n; ++j) {
        pr_[j] *= inv;
        dsr[j] = pr_[j] * (dsr[j] - delta);
      }
    }
    for (int j0 = 0; j0 < n; j0 += tile) {
      const int cols = std::min(tile, n - j0);
      const int64_t at = static_cast<int64_t>(j0) * dh;
      gemm<true>(rows, dh, cols, ds + j0, n_pad, 1, k + at, dh, dq_acc, dh);   // dQ += dS·K
      gemm<true>(cols, dh, rows, ds + j0, 1, n_pad, q, dh, dk_acc + at, dh);   // dK += dSᵀ·Q
      gemm<true>(cols, dh, rows, p + j0, 1, n_pad, g, dh, dv_acc + at, dh);    // dV += Pᵀ·dO
    }
    for (int r = 0; r < rows; ++r)
      for (int d = 0; d < dh; ++d) dq[block[r] * grad_stride + d] = dq_acc[r * dh + d] * scale;
  }
  for (int j = 0; j < n; ++j) {
    std::copy(dk_acc + static_cast<int64_t>(j) * dh, dk_acc + static_cast<int64_t>(j + 1) * dh, dk + j * grad_stride);
    std::copy(dv_acc + static_cast<int64_t>(j) * dh, dv_acc + static_cast<int64_t>(j + 1) * dh, dv + j * grad_stride);
  }
}

}  // namespace pe_fast
