// The C++ attention kernels of the working tree (pe_fast::) against those of a git revision (pe_fast_old::, the
// same header with its namespace renamed by bench/op/kernel_ab.sh), in one process: float32, one thread, random
// inputs; each repeat times old forward, new forward, old backward, new backward in turn, so that a slow spell
// of a shared machine hits both; prints medians and the median of the per-repeat ratios old / new.
#include "pe_attention.h"
#include "pe_attention_old.h"

#include <algorithm>
#include <ctime>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <utility>
#include <vector>

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// this thread's CPU time: on a shared machine, the time the other processes take the core away is not counted
double thread_seconds() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

template <typename Seconds>
double seconds(Seconds&& run) {
  const double start = thread_seconds();
  run();
  return thread_seconds() - start;
}

// the two versions behind one interface
struct New {
  using Problem = pe_fast::Problem<float>;
  template <typename... Args>
  static void forward(Args&&... args) { pe_fast::attention_forward<float>(std::forward<Args>(args)...); }
  template <typename... Args>
  static void backward(Args&&... args) { pe_fast::attention_backward<float>(std::forward<Args>(args)...); }
};
struct Old {
  using Problem = pe_fast_old::Problem<float>;
  template <typename... Args>
  static void forward(Args&&... args) { pe_fast_old::attention_forward<float>(std::forward<Args>(args)...); }
  template <typename... Args>
  static void backward(Args&&... args) { pe_fast_old::attention_backward<float>(std::forward<Args>(args)...); }
};

}  // namespace

int main(int argc, char** argv) {
  if (argc != 6) {
    std::fprintf(stderr, "usage: kernel_ab N D_HEAD PROBES PROBLEMS REPEATS\n");
    return 2;
  }
  const int n = std::atoi(argv[1]), dh = std::atoi(argv[2]), K = std::atoi(argv[3]), P = std::atoi(argv[4]),
            repeats = std::atoi(argv[5]);
  if (n < 1 || dh < 1 || K < 0 || P < 1 || repeats < 1) {
    std::fprintf(stderr, "error: N, D_HEAD, PROBLEMS and REPEATS must be positive, PROBES not negative\n");
    return 2;
  }
  const int w = 3 * dh;  // one problem's tokens: q | k | v, as one head of the packed projection
  std::mt19937 gen(1);
  std::normal_distribution<float> normal;
  std::vector<float> qkv(size_t(P) * n * w), probes(size_t(K) * n * n), out(size_t(P) * n * dh), lse(size_t(P) * n);
  std::vector<float> dqkv(qkv.size()), scratch;
  std::vector<double> sums(3 + K);
  for (float& v : qkv) v = normal(gen);
  for (float& v : probes) v = normal(gen) > 0 ? 1.0f : 0.0f;

  auto forward = [&](auto api) {
    using Problem = typename decltype(api)::Problem;
    for (int p = 0; p < P; ++p) {
      const float* q = qkv.data() + size_t(p) * n * w;
      api.forward(Problem{q, q + dh, q + 2 * dh, w, n, dh}, K ? probes.data() : nullptr, K,
                  out.data() + size_t(p) * n * dh, dh, lse.data() + size_t(p) * n, sums.data(), scratch);
    }
  };
  auto backward = [&](auto api) {
    using Problem = typename decltype(api)::Problem;
    for (int p = 0; p < P; ++p) {
      const float* q = qkv.data() + size_t(p) * n * w;
      float* d = dqkv.data() + size_t(p) * n * w;
      const float* o = out.data() + size_t(p) * n * dh;
      api.backward(Problem{q, q + dh, q + 2 * dh, w, n, dh}, o, dh, lse.data() + size_t(p) * n, d, d + dh,
                   d + 2 * dh, w, scratch);
    }
  };
  forward(Old{}), forward(New{}), backward(Old{}), backward(New{});  // warm-up
  std::vector<double> fwd_old, fwd_new, bwd_old, bwd_new, fwd_ratio, bwd_ratio;
  for (int r = 0; r < repeats; ++r) {
    fwd_old.push_back(seconds([&] { forward(Old{}); }));
    fwd_new.push_back(seconds([&] { forward(New{}); }));
    bwd_old.push_back(seconds([&] { backward(Old{}); }));
    bwd_new.push_back(seconds([&] { backward(New{}); }));
    fwd_ratio.push_back(fwd_old.back() / fwd_new.back());
    bwd_ratio.push_back(bwd_old.back() / bwd_new.back());
  }
  std::printf("N=%d d_head=%d probes=%d problems=%d: forward old %.2f ms, new %.2f ms (%.2fx); backward old %.2f ms, "
              "new %.2f ms (%.2fx)\n", n, dh, K, P, median(fwd_old) * 1e3, median(fwd_new) * 1e3, median(fwd_ratio),
              median(bwd_old) * 1e3, median(bwd_new) * 1e3, median(bwd_ratio));
  return 0;
}
