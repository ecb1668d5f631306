// The torch glue of the C++ CPU backend: two ops on the projected qkv, registered as torch.ops.pe_fast_cpp.*
// (their fake-tensor rules are in pe_fast/ops/cpp_attention.py). The QKV projection and its backward stay
// batched ATen GEMMs in Python; these ops run kernels/pe_attention.h over every (model, batch, head) problem,
// spread over ATen's intra-op threads (torch.set_num_threads). q, k, v are qkv [M,B,N,3D] plus, when given,
// the per-model addend [M,N,3D] (pe·W + b, pe_fast/ops/projection.py), added as the kernels load them.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <Python.h>
#include <torch/library.h>

#include "pe_attention.h"

namespace {

struct Dims {
  int64_t M, B, N, D, H, dh;
};

Dims dims_of(const at::Tensor& qkv, int64_t num_heads) {
  TORCH_CHECK(qkv.dim() == 4 && qkv.size(3) % (3 * num_heads) == 0, "qkv must be [M,B,N,3D] with H | D");
  const int64_t D = qkv.size(3) / 3;
  return {qkv.size(0), qkv.size(1), qkv.size(2), D, num_heads, D / num_heads};
}

template <typename T>
pe_fast::Problem<T> problem(const T* qkv, const T* addend, const Dims& s, int64_t p) {
  // problem p = (m·B + b)·H + h: the row order of lse [M,B,H,N]
  const T* q = qkv + (p / s.H) * s.N * 3 * s.D + (p % s.H) * s.dh;
  pe_fast::Problem<T> pr{q, q + s.D, q + 2 * s.D, 3 * s.D, static_cast<int>(s.N), static_cast<int>(s.dh)};
  if (addend != nullptr) {
    pr.add_q = addend + (p / s.H / s.B) * s.N * 3 * s.D + (p % s.H) * s.dh;
    pr.add_k = pr.add_q + s.D;
    pr.add_v = pr.add_q + 2 * s.D;
    pr.add_stride = 3 * s.D;
  }
  return pr;
}

// the addend as a contiguous [M,N,3D] tensor of qkv's dtype, or an undefined tensor
at::Tensor addend_of(const std::optional<at::Tensor>& addend, const at::Tensor& qkv, const Dims& s) {
  if (!addend.has_value()) return at::Tensor();
  TORCH_CHECK(addend->dim() == 3 && addend->size(0) == s.M && addend->size(1) == s.N && addend->size(2) == 3 * s.D,
              "addend must be [M,N,3D] like qkv [M,B,N,3D]");
  return addend->to(qkv.scalar_type()).contiguous();
}

// qkv [M,B,N,3D] (+ addend [M,N,3D]) -> out [M,B,N,D], stats [M,H,3+K] float32 (means over batch and rows),
// lse [M,B,H,N]
std::tuple<at::Tensor, at::Tensor, at::Tensor> attention_forward(const at::Tensor& qkv_in,
                                                                 const std::optional<at::Tensor>& addend_in,
                                                                 int64_t num_heads,
                                                                 const std::optional<at::Tensor>& probes_in) {
  const at::Tensor qkv = qkv_in.contiguous();
  const Dims s = dims_of(qkv, num_heads);
  const at::Tensor addend = addend_of(addend_in, qkv, s);
  const int64_t K = probes_in.has_value() ? probes_in->size(0) : 0;
  at::Tensor out = at::empty({s.M, s.B, s.N, s.D}, qkv.options());
  at::Tensor lse = at::empty({s.M, s.B, s.H, s.N}, qkv.options());
  at::Tensor sums = at::empty({s.M, s.B, s.H, 3 + K}, qkv.options().dtype(at::kDouble));
  AT_DISPATCH_FLOATING_TYPES(qkv.scalar_type(), "pe_fast_cpp::attention_forward", [&] {
    const at::Tensor probes = K ? probes_in->to(qkv.scalar_type()).contiguous() : at::Tensor();
    const scalar_t* qkv_p = qkv.const_data_ptr<scalar_t>();
    const scalar_t* add_p = addend.defined() ? addend.const_data_ptr<scalar_t>() : nullptr;
    const scalar_t* probe_p = K ? probes.const_data_ptr<scalar_t>() : nullptr;
    scalar_t* out_p = out.mutable_data_ptr<scalar_t>();
    scalar_t* lse_p = lse.mutable_data_ptr<scalar_t>();
    double* sums_p = sums.mutable_data_ptr<double>();
    at::parallel_for(0, s.M * s.B * s.H, 1, [&](int64_t begin, int64_t end) {
      std::vector<scalar_t> scratch;  // one per thread's range of problems
      for (int64_t p = begin; p < end; ++p)
        pe_fast::attention_forward(problem(qkv_p, add_p, s, p), probe_p, static_cast<int>(K),
                                   out_p + (p / s.H) * s.N * s.D + (p % s.H) * s.dh, s.D, lse_p + p * s.N,
                                   sums_p + p * (3 + K), scratch);
    });
  });
  // per-problem sums -> means over batch and rows; summed in a fixed order: deterministic
  at::Tensor stats = sums.sum({1}).div_(static_cast<double>(s.B * s.N)).to(at::kFloat);
  return {out, stats, lse};
}

// dqkv [M,B,N,3D] of the attention (q, k, v's gradient: xw's, and the addend's before its sum over B), from
// the forward's qkv, addend and lse and the gradient of out. out is the kernel backends' common interface
// (projection.backward_around; Triton's backward takes Δ = rowsum(dO·O) from it): these kernels sum Δ from P and dP.
at::Tensor attention_backward(const at::Tensor& qkv_in, const std::optional<at::Tensor>& addend_in,
                              const at::Tensor& grad_out_in, const at::Tensor& /*out*/, const at::Tensor& lse_in,
                              int64_t num_heads) {
  const at::Tensor qkv = qkv_in.contiguous();
  const Dims s = dims_of(qkv, num_heads);
  const at::Tensor addend = addend_of(addend_in, qkv, s);
  const at::Tensor grad_out = grad_out_in.to(qkv.scalar_type()).contiguous();
  const at::Tensor lse = lse_in.to(qkv.scalar_type()).contiguous();
  at::Tensor dqkv = at::empty_like(qkv);
  AT_DISPATCH_FLOATING_TYPES(qkv.scalar_type(), "pe_fast_cpp::attention_backward", [&] {
    const scalar_t* qkv_p = qkv.const_data_ptr<scalar_t>();
    const scalar_t* add_p = addend.defined() ? addend.const_data_ptr<scalar_t>() : nullptr;
    const scalar_t* grad_p = grad_out.const_data_ptr<scalar_t>();
    const scalar_t* lse_p = lse.const_data_ptr<scalar_t>();
    scalar_t* dqkv_p = dqkv.mutable_data_ptr<scalar_t>();
    at::parallel_for(0, s.M * s.B * s.H, 1, [&](int64_t begin, int64_t end) {
      std::vector<scalar_t> scratch;
      for (int64_t p = begin; p < end; ++p) {
        const int64_t at_out = (p / s.H) * s.N * s.D + (p % s.H) * s.dh;
        scalar_t* dq = dqkv_p + (p / s.H) * s.N * 3 * s.D + (p % s.H) * s.dh;
        pe_fast::attention_backward(problem(qkv_p, add_p, s, p), grad_p + at_out, s.D, lse_p + p * s.N,
                                    dq, dq + s.D, dq + 2 * s.D, 3 * s.D, scratch);
      }
    });
  });
  return dqkv;
}

}  // namespace

TORCH_LIBRARY(pe_fast_cpp, m) {
  m.def("attention_forward(Tensor qkv, Tensor? addend, int num_heads, Tensor? probes) -> (Tensor, Tensor, Tensor)");
  m.def("attention_backward(Tensor qkv, Tensor? addend, Tensor grad_out, Tensor out, Tensor lse, int num_heads) "
        "-> Tensor");
}

TORCH_LIBRARY_IMPL(pe_fast_cpp, CPU, m) {
  m.impl("attention_forward", &attention_forward);
  m.impl("attention_backward", &attention_backward);
}

// The widest vector instructions the kernels were compiled for (setup.py's -march): pe_fast._C.isa
#if defined(__AVX512F__)
constexpr const char* kIsa = "avx512";
#elif defined(__AVX2__)
constexpr const char* kIsa = "avx2";
#else
constexpr const char* kIsa = "baseline";
#endif

// Importing pe_fast._C loads the library, which registers the ops above; the module holds only `isa`
// (plain CPython API instead of pybind11 / torch/extension.h: a build several times faster).
PyMODINIT_FUNC PyInit__C() {
  static PyModuleDef module = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, nullptr};
  PyObject* m = PyModule_Create(&module);
  if (m != nullptr && PyModule_AddStringConstant(m, "isa", kIsa) != 0) {
    Py_DECREF(m);
    return nullptr;
  }
  return m;
}
