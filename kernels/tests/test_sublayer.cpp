// kernels/sublayer.h in float against the textbook formulas in double (erfc from the C library, explicit sums).
// Exit code 0 when every case passes; each failure prints one line.
#include "sublayer.h"

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

namespace {

int failures = 0;

void check(const char* what, double error, double tol) {
  if (!(error <= tol)) {
    std::printf("FAIL %s: max error %.3g > %.3g\n", what, error, tol);
    ++failures;
  }
}

double gelu(double x) { return 0.5 * x * std::erfc(-x / std::sqrt(2.0)); }
double gelu_derivative(double x) {
  return 0.5 * std::erfc(-x / std::sqrt(2.0)) + x * std::exp(-0.5 * x * x) / std::sqrt(2.0 * M_PI);
}

// Every float from −16 to 16 in steps of 1/4096 (both fit branches, their switch, the tails, exp's underflow)
void test_gelu_parts_over_the_range() {
  const int count = 32 * 4096 + 1, width = 1;
  std::vector<float> z(count), y(count), dy(count, 1.0f), dz(count);
  for (int i = 0; i < count; ++i) z[i] = -16.0f + float(i) / 4096.0f;
  const float bias = 0.0f;
  float dbias = 0.0f;
  pe_fast::bias_gelu_forward<float>(count, width, z.data(), &bias, y.data());
  pe_fast::bias_gelu_backward<float>(count, width, z.data(), &bias, dy.data(), dz.data(), &dbias);
  double value = 0, derivative = 0, dbias_sum = 0;
  for (int i = 0; i < count; ++i) {
    value = std::max(value, std::abs(y[i] - gelu(z[i])));
    derivative = std::max(derivative, std::abs(dz[i] - gelu_derivative(z[i])));
    dbias_sum += gelu_derivative(z[i]);
  }
  check("gelu, absolute", value, 5e-7);
  check("gelu derivative, absolute", derivative, 5e-7);
  check("bias gradient = sum of dz, relative", std::abs(dbias - dbias_sum) / std::abs(dbias_sum), 1e-5);
}

// Rows of a model with a bias (per column) and dy: forward and backward against double formulas
void test_bias_gelu_rows() {
  const int rows = 37, width = 11;
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> z(rows * width), bias(width), dy(rows * width), y(rows * width), dz(rows * width);
  std::vector<float> dbias(width, 0.0f);
  for (auto* v : {&z, &bias, &dy})
    for (auto& x : *v) x = normal(rng);
  pe_fast::bias_gelu_forward<float>(rows, width, z.data(), bias.data(), y.data());
  pe_fast::bias_gelu_backward<float>(rows, width, z.data(), bias.data(), dy.data(), dz.data(), dbias.data());
  double fwd = 0, bwd = 0, db = 0;
  for (int j = 0; j < width; ++j) {
    double want_db = 0;
    for (int r = 0; r < rows; ++r) {
      const double x = double(z[r * width + j]) + bias[j];
      fwd = std::max(fwd, std::abs(y[r * width + j] - gelu(x)));
      const double g = dy[r * width + j] * gelu_derivative(x);
      bwd = std::max(bwd, std::abs(dz[r * width + j] - g));
      want_db += g;
    }
    db = std::max(db, std::abs(dbias[j] - want_db));
  }
  check("bias gelu forward", fwd, 5e-6);
  check("bias gelu backward", bwd, 5e-6);
  check("bias gelu bias gradient", db, 5e-5);
}

// LN(a + b + add)·w + β over rows of D, add repeating every T rows, from first_row; gradients by the formulas
void test_residual_layer_norm(int rows, int D, int T, int first_row, bool with_add) {
  std::mt19937 rng(2);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> a(rows * D), b(rows * D), add(T * D), w(D), beta(D), dy(rows * D);
  for (auto* v : {&a, &b, &add, &w, &beta, &dy})
    for (auto& x : *v) x = normal(rng);
  std::vector<float> y(rows * D), mean(rows), rstd(rows), scratch(D), dx(rows * D), dw(D, 0.0f), dbeta(D, 0.0f);
  const pe_fast::NormRows<float> n{a.data(), b.data(), with_add ? add.data() : nullptr, T, first_row, w.data(),
                                   beta.data(), rows, D};
  const float eps = 1e-5f;
  pe_fast::residual_layer_norm_forward<float>(n, eps, y.data(), mean.data(), rstd.data(), scratch.data());
  pe_fast::residual_layer_norm_backward<float>(n, mean.data(), rstd.data(), dy.data(), dx.data(), dw.data(),
                                               dbeta.data(), scratch.data());
  double fwd = 0, bwd = 0, dparams = 0;
  std::vector<double> want_dw(D, 0.0), want_dbeta(D, 0.0);
  for (int r = 0; r < rows; ++r) {
    std::vector<double> x(D), xhat(D), g(D);
    double mu = 0, var = 0, mean_g = 0, mean_gx = 0;
    for (int j = 0; j < D; ++j) {
      x[j] = double(a[r * D + j]) + b[r * D + j] + (with_add ? add[((first_row + r) % T) * D + j] : 0.0);
      mu += x[j] / D;
    }
    for (int j = 0; j < D; ++j) var += (x[j] - mu) * (x[j] - mu) / D;
    const double inv = 1.0 / std::sqrt(var + eps);
    for (int j = 0; j < D; ++j) {
      xhat[j] = (x[j] - mu) * inv;
      fwd = std::max(fwd, std::abs(y[r * D + j] - (xhat[j] * w[j] + beta[j])));
      g[j] = double(dy[r * D + j]) * w[j];
      mean_g += g[j] / D;
      mean_gx += g[j] * xhat[j] / D;
      want_dw[j] += dy[r * D + j] * xhat[j];
      want_dbeta[j] += dy[r * D + j];
    }
    for (int j = 0; j < D; ++j) bwd = std::max(bwd, std::abs(dx[r * D + j] - inv * (g[j] - mean_g - xhat[j] * mean_gx)));
  }
  for (int j = 0; j < D; ++j)
    dparams = std::max({dparams, std::abs(dw[j] - want_dw[j]), std::abs(dbeta[j] - want_dbeta[j])});
  check(with_add ? "residual layer norm forward (add)" : "residual layer norm forward", fwd, 2e-5);
  check(with_add ? "residual layer norm dx (add)" : "residual layer norm dx", bwd, 5e-5);
  check(with_add ? "residual layer norm dw, dbeta (add)" : "residual layer norm dw, dbeta", dparams, 1e-4 * rows);
}

}  // namespace

int main() {
  test_gelu_parts_over_the_range();
  test_bias_gelu_rows();
  test_residual_layer_norm(50, 32, 10, 0, true);
  test_residual_layer_norm(23, 7, 5, 3, true);  // a range that starts inside a sequence
  test_residual_layer_norm(9, 64, 1, 0, false);
  if (failures == 0) std::printf("all sublayer kernel tests passed\n");
  return failures == 0 ? 0 : 1;
}
