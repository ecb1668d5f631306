// The torch glue of the sublayer ends (kernels/sublayer.h), registered as torch.ops.pe_fast_cpp.*: bias GELU and
// residual layer norm, forward and backward, on [M, R, width] activations (M models of R rows). Rows are spread
// over ATen's intra-op threads in fixed chunks; each chunk sums its parameter gradients apart and the chunks'
// sums are added in order, so a result does not depend on the thread count. pe_fast/ops/sublayer_ends.py calls
// these in plain eager mode only (a traced or transformed call takes torch's ops), so they need no fake-tensor
// or vmap rules.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include <vector>

#include "sublayer.h"

namespace {

constexpr int64_t kChunkRows = 256;  // rows per unit of work: one chunk's partial sums per parameter gradient

struct Chunks {
  int64_t M, R, per_model;
  int64_t count() const { return M * per_model; }
  int64_t model(int64_t c) const { return c / per_model; }
  int64_t first(int64_t c) const { return (c % per_model) * kChunkRows; }
  int64_t rows(int64_t c) const { return std::min(kChunkRows, R - first(c)); }
};

Chunks chunks_of(const at::Tensor& x) {
  TORCH_CHECK(x.dim() == 3 && x.size(1) > 0 && x.size(2) > 0, "expected activations [M, R, width], got ",
              x.sizes());
  return {x.size(0), x.size(1), (x.size(1) + kChunkRows - 1) / kChunkRows};
}

void check_per_model(const at::Tensor& p, const at::Tensor& x, const char* name) {
  TORCH_CHECK(p.dim() == 2 && p.size(0) == x.size(0) && p.size(1) == x.size(2), name, " must be [M, width] = [",
              x.size(0), ", ", x.size(2), "], got ", p.sizes());
  TORCH_CHECK(p.scalar_type() == x.scalar_type() && p.is_contiguous(), name, " must be contiguous, of x's dtype");
}

// GELU(z + bias[:, None]) of z [M,R,F], bias [M,F].
at::Tensor bias_gelu_forward(const at::Tensor& z, const at::Tensor& bias) {
  TORCH_CHECK(z.is_contiguous(), "z must be contiguous");
  check_per_model(bias, z, "bias");
  const Chunks c = chunks_of(z);
  const int F = static_cast<int>(z.size(2));
  at::Tensor y = at::empty_like(z);
  AT_DISPATCH_FLOATING_TYPES(z.scalar_type(), "pe_fast_cpp::bias_gelu_forward", [&] {
    const scalar_t* z_p = z.const_data_ptr<scalar_t>();
    const scalar_t* b_p = bias.const_data_ptr<scalar_t>();
    scalar_t* y_p = y.mutable_data_ptr<scalar_t>();
    at::parallel_for(0, c.count(), 1, [&](int64_t begin, int64_t end) {
      for (int64_t k = begin; k < end; ++k) {
        const int64_t at_row = (c.model(k) * c.R + c.first(k)) * F;
        pe_fast::bias_gelu_forward(c.rows(k), F, z_p + at_row, b_p + c.model(k) * F, y_p + at_row);
      }
    });
  });
  return y;
}

// From the forward's z and bias, and dy: (dz [M,R,F], dbias [M,F]).
std::tuple<at::Tensor, at::Tensor> bias_gelu_backward(const at::Tensor& z, const at::Tensor& bias,
                                                      const at::Tensor& dy_in) {
  TORCH_CHECK(z.is_contiguous() && dy_in.sizes() == z.sizes(), "z must be contiguous, dy of z's shape");
  check_per_model(bias, z, "bias");
  const at::Tensor dy = dy_in.to(z.scalar_type()).contiguous();
  const Chunks c = chunks_of(z);
  const int F = static_cast<int>(z.size(2));
  at::Tensor dz = at::empty_like(z);
  at::Tensor partial = at::zeros({c.M, c.per_model, F}, z.options());
  AT_DISPATCH_FLOATING_TYPES(z.scalar_type(), "pe_fast_cpp::bias_gelu_backward", [&] {
    const scalar_t* z_p = z.const_data_ptr<scalar_t>();
    const scalar_t* b_p = bias.const_data_ptr<scalar_t>();
    const scalar_t* dy_p = dy.const_data_ptr<scalar_t>();
    scalar_t* dz_p = dz.mutable_data_ptr<scalar_t>();
    scalar_t* part_p = partial.mutable_data_ptr<scalar_t>();
    at::parallel_for(0, c.count(), 1, [&](int64_t begin, int64_t end) {
      for (int64_t k = begin; k < end; ++k) {
        const int64_t at_row = (c.model(k) * c.R + c.first(k)) * F;
        pe_fast::bias_gelu_backward(c.rows(k), F, z_p + at_row, b_p + c.model(k) * F, dy_p + at_row, dz_p + at_row,
                                    part_p + k * F);
      }
    });
  });
  return {dz, partial.sum(1)};
}

// a, b [M,R,D], add [M,T,D] or none (row r adds add[:, r % T]), w, beta [M,D].
template <typename T>
pe_fast::NormRows<T> norm_rows(const at::Tensor& a, const at::Tensor& b, const at::Tensor& add, const at::Tensor& w,
                               const at::Tensor& beta, const Chunks& c, int64_t k) {
  const int64_t m = c.model(k), D = a.size(2), at_row = (m * c.R + c.first(k)) * D;
  const int64_t T_rows = add.defined() ? add.size(1) : 1;
  return {a.const_data_ptr<T>() + at_row, b.const_data_ptr<T>() + at_row,
          add.defined() ? add.const_data_ptr<T>() + m * T_rows * D : nullptr, T_rows, c.first(k),
          w.const_data_ptr<T>() + m * D, beta.const_data_ptr<T>() + m * D, c.rows(k), static_cast<int>(D)};
}

at::Tensor checked_add(const std::optional<at::Tensor>& add, const at::Tensor& a) {
  if (!add.has_value()) return at::Tensor();
  TORCH_CHECK(add->dim() == 3 && add->size(0) == a.size(0) && add->size(2) == a.size(2) && add->size(1) > 0 &&
                  a.size(1) % add->size(1) == 0,
              "add must be [M, T, D] with T dividing the rows of a [M, R, D], got ", add->sizes(), " for ", a.sizes());
  TORCH_CHECK(add->scalar_type() == a.scalar_type(), "add must have a's dtype");
  return add->contiguous();
}

void check_pair(const at::Tensor& a, const at::Tensor& b) {
  TORCH_CHECK(a.is_contiguous() && b.is_contiguous() && a.sizes() == b.sizes() &&
                  a.scalar_type() == b.scalar_type(),
              "a and b must be contiguous, of one shape and dtype");
}

// y = LN(a + b + add)·w + beta over the last dim; returns (y, mean [M,R], rstd [M,R]).
std::tuple<at::Tensor, at::Tensor, at::Tensor> residual_layer_norm_forward(
    const at::Tensor& a, const at::Tensor& b, const std::optional<at::Tensor>& add_in, const at::Tensor& w,
    const at::Tensor& beta, double eps) {
  check_pair(a, b);
  const Chunks c = chunks_of(a);
  const at::Tensor add = checked_add(add_in, a);
  check_per_model(w, a, "weight");
  check_per_model(beta, a, "bias");
  at::Tensor y = at::empty_like(a);
  at::Tensor mean = at::empty({c.M, c.R}, a.options());
  at::Tensor rstd = at::empty({c.M, c.R}, a.options());
  AT_DISPATCH_FLOATING_TYPES(a.scalar_type(), "pe_fast_cpp::residual_layer_norm_forward", [&] {
    scalar_t* y_p = y.mutable_data_ptr<scalar_t>();
    scalar_t* mean_p = mean.mutable_data_ptr<scalar_t>();
    scalar_t* rstd_p = rstd.mutable_data_ptr<scalar_t>();
    at::parallel_for(0, c.count(), 1, [&](int64_t begin, int64_t end) {
      std::vector<scalar_t> x(a.size(2));
      for (int64_t k = begin; k < end; ++k) {
        const int64_t row = c.model(k) * c.R + c.first(k);
        pe_fast::residual_layer_norm_forward(norm_rows<scalar_t>(a, b, add, w, beta, c, k), static_cast<scalar_t>(eps),
                                             y_p + row * a.size(2), mean_p + row, rstd_p + row, x.data());
      }
    });
  });
  return {y, mean, rstd};
}

// (dx [M,R,D]: the gradient of a, of b, and summed over the repeats, of add; dw [M,D]; dbeta [M,D])
std::tuple<at::Tensor, at::Tensor, at::Tensor> residual_layer_norm_backward(
    const at::Tensor& a, const at::Tensor& b, const std::optional<at::Tensor>& add_in, const at::Tensor& w,
    const at::Tensor& mean, const at::Tensor& rstd, const at::Tensor& dy_in) {
  check_pair(a, b);
  const Chunks c = chunks_of(a);
  const at::Tensor add = checked_add(add_in, a);
  check_per_model(w, a, "weight");
  TORCH_CHECK(mean.is_contiguous() && rstd.is_contiguous() && mean.numel() == c.M * c.R && rstd.numel() == c.M * c.R,
              "mean and rstd must be the forward's [M, R]");
  TORCH_CHECK(dy_in.sizes() == a.sizes(), "dy must have a's shape");
  const at::Tensor dy = dy_in.to(a.scalar_type()).contiguous();
  const int64_t D = a.size(2);
  at::Tensor dx = at::empty_like(a);
  at::Tensor partial = at::zeros({2, c.M, c.per_model, D}, a.options());  // dw's, then dbeta's
  AT_DISPATCH_FLOATING_TYPES(a.scalar_type(), "pe_fast_cpp::residual_layer_norm_backward", [&] {
    const scalar_t* mean_p = mean.const_data_ptr<scalar_t>();
    const scalar_t* rstd_p = rstd.const_data_ptr<scalar_t>();
    const scalar_t* dy_p = dy.const_data_ptr<scalar_t>();
    scalar_t* dx_p = dx.mutable_data_ptr<scalar_t>();
    scalar_t* part_p = partial.mutable_data_ptr<scalar_t>();
    const int64_t beta_part = c.count() * D;
    at::parallel_for(0, c.count(), 1, [&](int64_t begin, int64_t end) {
      std::vector<scalar_t> x(D);
      for (int64_t k = begin; k < end; ++k) {
        const int64_t row = c.model(k) * c.R + c.first(k);
        // w stands in for beta in norm_rows: the backward does not read beta
        pe_fast::residual_layer_norm_backward(norm_rows<scalar_t>(a, b, add, w, w, c, k), mean_p + row, rstd_p + row,
                                              dy_p + row * D, dx_p + row * D, part_p + k * D,
                                              part_p + beta_part + k * D, x.data());
      }
    });
  });
  at::Tensor sums = partial.sum(2);
  return {dx, sums[0], sums[1]};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(pe_fast_cpp, m) {
  m.def("bias_gelu_forward(Tensor z, Tensor bias) -> Tensor");
  m.def("bias_gelu_backward(Tensor z, Tensor bias, Tensor dy) -> (Tensor, Tensor)");
  m.def("residual_layer_norm_forward(Tensor a, Tensor b, Tensor? add, Tensor weight, Tensor bias, float eps) "
        "-> (Tensor, Tensor, Tensor)");
  m.def("residual_layer_norm_backward(Tensor a, Tensor b, Tensor? add, Tensor weight, Tensor mean, Tensor rstd, "
        "Tensor dy) -> (Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(pe_fast_cpp, CPU, m) {
  m.impl("bias_gelu_forward", &bias_gelu_forward);
  m.impl("bias_gelu_backward", &bias_gelu_backward);
  m.impl("residual_layer_norm_forward", &residual_layer_norm_forward);
  m.impl("residual_layer_norm_backward", &residual_layer_norm_backward);
}
