// Thread count policy and parallel_for (OpenMP underneath; OpenBLAS follows the same count).
#include "kernels/cpu/parallel.h"

#include <omp.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <thread>

#include "kernels/error.h"

extern "C" void openblas_set_num_threads(int);

namespace rg::kernels::cpu {
namespace {

int parse_positive_env(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return 0;
  char* end = nullptr;
  const long n = std::strtol(v, &end, 10);
  RG_CHECK(end != v && *end == '\0' && n > 0 && n <= 4096, name, "='", v,
           "' is not a positive integer");
  return int(n);
}

int default_threads() {
  if (int n = parse_positive_env("RG_NUM_THREADS")) return n;
  const int hw = std::max(1u, std::thread::hardware_concurrency());
  const int local_world = std::max(1, parse_positive_env("LOCAL_WORLD_SIZE"));
  return std::max(1, hw / local_world);
}

int& thread_count() {
  static int n = [] {
    const int t = default_threads();
    openblas_set_num_threads(t);
    return t;
  }();
  return n;
}

}  // namespace

int num_threads() { return thread_count(); }

void set_num_threads(int n) {
  RG_CHECK(n > 0, "set_num_threads: thread count must be positive, got ", n);
  thread_count() = n;
  openblas_set_num_threads(n);
}

void parallel_for(int64_t begin, int64_t end, int64_t grain,
                  const std::function<void(int64_t, int64_t)>& fn, int max_threads) {
  const int64_t n = end - begin;
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  const int threads = max_threads > 0 ? std::min(max_threads, num_threads()) : num_threads();
  const int64_t chunks = std::min<int64_t>(threads, (n + grain - 1) / grain);
  if (chunks <= 1 || omp_in_parallel()) {
    fn(begin, end);
    return;
  }
#pragma omp parallel for num_threads(chunks) schedule(static, 1)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t lo = begin + n * c / chunks;
    const int64_t hi = begin + n * (c + 1) / chunks;
    fn(lo, hi);
  }
}

}  // namespace rg::kernels::cpu
