// kernels/pe_attention.h against a naive double-precision implementation (the full N×N map, explicit sums).
// Exit code 0 when every case passes; each failure prints one line.
#include "pe_attention.h"

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

namespace {

int failures = 0;

void check(const char* what, const char* type, int n, int dh, double error, double scale, double tol) {
  if (!(error <= tol * scale)) {
    std::printf("FAIL %s<%s> n=%d dh=%d: max error %.3g > %.3g × scale %.3g\n", what, type, n, dh, error, tol, scale);
    ++failures;
  }
}

double max_abs(const std::vector<double>& a) {
  double m = 0;
  for (double v : a) m = std::max(m, std::abs(v));
  return m;
}

template <typename T>
double max_diff(const std::vector<T>& got, const std::vector<double>& expected) {
  double m = 0;
  for (size_t i = 0; i < got.size(); ++i) m = std::max(m, std::abs(static_cast<double>(got[i]) - expected[i]));
  return m;
}

struct Case {
  int n, dh, num_probes;
  double logit_scale;  // large values move the row max across key tiles: exercises the online rescaling
  bool addend;         // the kernels get q, k, v as two parts (Problem::add_*) that they add on load
  bool sparse_dout = false;  // about 4 of 5 rows of dout zero (a loss at some tokens): the backward skips them
};

struct Naive {  // everything the kernels compute, by the textbook formulas
  std::vector<double> out, lse, stats, dq, dk, dv;
};

// qkv: [n, 3·dh] (q | k | v per token), probes [K, n, n], dout [n, dh]
Naive naive(const Case& c, const std::vector<double>& qkv, const std::vector<double>& probes,
            const std::vector<double>& dout) {
  const int n = c.n, dh = c.dh, K = c.num_probes, w = 3 * dh;
  const double scale = 1.0 / std::sqrt(double(dh));
  std::vector<double> p(size_t(n) * n);
  Naive r{std::vector<double>(size_t(n) * dh, 0.0), std::vector<double>(n), std::vector<double>(3 + K, 0.0),
          std::vector<double>(size_t(n) * dh, 0.0), std::vector<double>(size_t(n) * dh, 0.0),
          std::vector<double>(size_t(n) * dh, 0.0)};
  for (int i = 0; i < n; ++i) {
    std::vector<double> s(n);
    double top = -INFINITY;
    for (int j = 0; j < n; ++j) {
      s[j] = 0;
      for (int d = 0; d < dh; ++d) s[j] += qkv[i * w + d] * qkv[j * w + dh + d];
      s[j] *= scale;
      top = std::max(top, s[j]);
    }
    double total = 0;
    for (int j = 0; j < n; ++j) total += std::exp(s[j] - top);
    r.lse[i] = top + std::log(total);
    double entropy = 0, peak = 0, sq = 0;
    for (int j = 0; j < n; ++j) {
      const double pij = std::exp(s[j] - r.lse[i]);
      p[size_t(i) * n + j] = pij;
      if (pij > 0) entropy -= pij * std::log(pij);
      peak = std::max(peak, pij);
      sq += pij * pij;
      for (int d = 0; d < dh; ++d) r.out[i * dh + d] += pij * qkv[j * w + 2 * dh + d];
      for (int k = 0; k < K; ++k) r.stats[3 + k] += pij * probes[(size_t(k) * n + i) * n + j];
    }
    r.stats[0] += entropy;
    r.stats[1] += peak;
    r.stats[2] += sq;
  }
  for (int i = 0; i < n; ++i) {
    std::vector<double> dp(n);
    double delta = 0;
    for (int j = 0; j < n; ++j) {
      dp[j] = 0;
      for (int d = 0; d < dh; ++d) dp[j] += dout[i * dh + d] * qkv[j * w + 2 * dh + d];
      delta += p[size_t(i) * n + j] * dp[j];
    }
    for (int j = 0; j < n; ++j) {
      const double pij = p[size_t(i) * n + j], ds = pij * (dp[j] - delta);
      for (int d = 0; d < dh; ++d) {
        r.dq[i * dh + d] += scale * ds * qkv[j * w + dh + d];
        r.dk[j * dh + d] += scale * ds * qkv[i * w + d];
        r.dv[j * dh + d] += pij * dout[i * dh + d];
      }
    }
  }
  return r;
}

template <typename T>
void run_case(const Case& c, const char* type, double tol) {
  const int n = c.n, dh = c.dh, K = c.num_probes, w = 3 * dh;
  std::mt19937 gen(1000 * n + dh);
  std::normal_distribution<double> normal;
  std::bernoulli_distribution coin(0.4);
  std::vector<double> qkv(size_t(n) * w), probes(size_t(K) * n * n), dout(size_t(n) * dh);
  for (size_t i = 0; i < qkv.size(); ++i) qkv[i] = normal(gen) * ((i % w) < size_t(dh) ? c.logit_scale : 1.0);
  for (auto& t : probes) t = coin(gen) ? 1.0 : 0.0;
  for (auto& t : dout) t = normal(gen);
  std::bernoulli_distribution zero_row(0.8);
  if (c.sparse_dout)
    for (int i = 0; i < n; ++i)
      if (zero_row(gen)) std::fill(dout.begin() + i * dh, dout.begin() + (i + 1) * dh, 0.0);
  // the kernels see the inputs rounded to T; the reference gets the same rounded values
  for (auto& t : qkv) t = static_cast<double>(static_cast<T>(t));
  for (auto& t : dout) t = static_cast<double>(static_cast<T>(t));
  std::vector<double> addend(c.addend ? qkv.size() : 0), total = qkv;
  for (size_t i = 0; i < addend.size(); ++i) {
    addend[i] = static_cast<double>(static_cast<T>(normal(gen)));
    total[i] += addend[i];
  }
  const Naive expected = naive(c, total, probes, dout);

  std::vector<T> qkv_t(qkv.begin(), qkv.end()), probes_t(probes.begin(), probes.end());
  std::vector<T> addend_t(addend.begin(), addend.end());
  std::vector<T> out(size_t(n) * dh), lse(n), dout_t(dout.begin(), dout.end());
  std::vector<double> sums(3 + K);
  std::vector<T> scratch;
  pe_fast::Problem<T> pr{qkv_t.data(), qkv_t.data() + dh, qkv_t.data() + 2 * dh, w, n, dh};
  if (c.addend) {
    pr.add_q = addend_t.data();
    pr.add_k = addend_t.data() + dh;
    pr.add_v = addend_t.data() + 2 * dh;
    pr.add_stride = w;
  }
  pe_fast::attention_forward(pr, K ? probes_t.data() : nullptr, K, out.data(), dh, lse.data(), sums.data(), scratch);

  std::vector<T> dqkv(size_t(n) * w, T(-1));
  pe_fast::attention_backward(pr, dout_t.data(), dh, lse.data(), dqkv.data(), dqkv.data() + dh,
                              dqkv.data() + 2 * dh, w, scratch);
  std::vector<T> dq(size_t(n) * dh), dk(size_t(n) * dh), dv(size_t(n) * dh);
  for (int i = 0; i < n; ++i)
    for (int d = 0; d < dh; ++d) {
      dq[i * dh + d] = dqkv[i * w + d];
      dk[i * dh + d] = dqkv[i * w + dh + d];
      dv[i * dh + d] = dqkv[i * w + 2 * dh + d];
    }

  check("out", type, n, dh, max_diff(out, expected.out), max_abs(expected.out), tol);
  check("lse", type, n, dh, max_diff(lse, expected.lse), max_abs(expected.lse), tol);
  for (int k = 0; k < 3 + K; ++k)  // each statistic on its own scale
    check("stats", type, n, dh, std::abs(sums[k] - expected.stats[k]), std::abs(expected.stats[k]), tol);
  check("dq", type, n, dh, max_diff(dq, expected.dq), max_abs(expected.dq), tol);
  check("dk", type, n, dh, max_diff(dk, expected.dk), max_abs(expected.dk), tol);
  check("dv", type, n, dh, max_diff(dv, expected.dv), max_abs(expected.dv), tol);
}

template <typename T>
void check_exp(const char* type, double tol) {
  double worst = 0;
  for (double x = -700; x <= 80; x += 0.01713) {
    if (x < pe_fast::ExpConstants<T>::lo) continue;
    const double want = std::exp(static_cast<double>(static_cast<T>(x)));
    worst = std::max(worst, std::abs(static_cast<double>(pe_fast::fast_exp(static_cast<T>(x))) - want) / want);
  }
  check("fast_exp relative", type, 0, 0, worst, 1.0, tol);
  const T at_minus_inf = pe_fast::fast_exp(-std::numeric_limits<T>::infinity());
  const T far_below = pe_fast::fast_exp(T(-1000));
  check("fast_exp(-inf), fast_exp(-1000)", type, 0, 0, std::abs(double(at_minus_inf)) + std::abs(double(far_below)),
        1.0, 0.0);
}

}  // namespace

int main() {
  check_exp<float>("float", 3e-7);
  check_exp<double>("double", 1e-15);
  const Case cases[] = {
      {1, 1, 0, 1.0, false},    {16, 16, 3, 1.0, false},  {17, 24, 1, 1.0, false}, {100, 40, 2, 1.0, false},
      {129, 16, 0, 1.0, false}, {360, 16, 2, 1.0, false}, {300, 64, 1, 1.0, false},
      {257, 8, 1, 8.0, false},  // 8: peaked rows, the max moves across key tiles
      {16, 16, 2, 1.0, true},   {17, 24, 1, 1.0, true},   {257, 8, 1, 8.0, true},
      {100, 32, 2, 1.0, true, true}, {257, 8, 1, 8.0, false, true}, {1, 8, 0, 1.0, false, true},
  };
  for (const Case& c : cases) {
    run_case<double>(c, "double", 1e-11);
    run_case<float>(c, "float", 2e-5);
  }
  if (failures == 0) std::printf("all kernel checks passed\n");
  return failures == 0 ? 0 : 1;
}
