// ringgrad-bench allreduce: for each algorithm and size, warm-up, timed back-to-back all-reduces
// (time averaged over ranks), then one checked run that counts wrong elements; nccl-tests'
// algbw = bytes / time and busbw = algbw * 2(n-1)/n. The machine's memcpy bandwidth is measured
// in the same run as the ceiling that a loopback all-reduce cannot beat.
#include "apps/allreduce_bench.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <fstream>
#include <map>

#include "apps/common/plot.h"
#include "comm/init.h"
#include "comm/process_group_gloo.h"
#include "comm/process_group_nccl.h"
#include "engine/cuda/device_guard.h"
#include "engine/dispatch.h"
#include "engine/ops/factory.h"
#include "kernels/cpu/cast.h"
#include "kernels/cuda/device.h"
#include "kernels/error.h"

namespace rg::apps {
namespace {

using Clock = std::chrono::steady_clock;

struct Row {
  std::string algorithm;
  uint64_t bytes = 0, count = 0;
  double time_us = 0, algbw = 0, busbw = 0;
  int64_t wrong = 0;
};

std::string human_bytes(uint64_t b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB"};
  int u = 0;
  double v = double(b);
  while (v >= 1024 && u < 3) v /= 1024, ++u;
  return fmt::format("{:g} {}", v, units[u]);
}

// Single-threaded memcpy of 64 MiB, best of several: what one core can move.
double memcpy_gbps() {
  const size_t n = size_t(64) << 20;
  std::vector<char> a(n, 1), b(n, 0);
  double best = 1e30;
  for (int i = 0; i < 8; ++i) {
    const auto t0 = Clock::now();
    std::memcpy(b.data(), a.data(), n);
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
    a[size_t(i)] = b[size_t(i) + 1];  // keeps the copies observable
  }
  return double(n) / best / 1e9;
}

// The mean over ranks of a per-rank figure.
double mean_over_ranks(dist::ProcessGroup& pg, double x) {
  Tensor t = full({1}, x, DType::f64);
  pg.all_reduce(t, dist::ReduceOp::avg)->wait();
  return t.item();
}

int64_t sum_over_ranks(dist::ProcessGroup& pg, int64_t x) {
  Tensor t = full({1}, double(x), DType::i64);
  pg.all_reduce(t, dist::ReduceOp::sum)->wait();
  return t.data<int64_t>()[0];
}

// Fills rank-dependent small integers, all-reduces once and counts elements that differ from
// the exact sum. `t` may be a CUDA tensor: the values go through the CPU.
int64_t count_wrong(dist::ProcessGroup& pg, Tensor& t) {
  const int n = pg.size();
  int64_t wrong = 0;
  Tensor host = Tensor::empty(t.shape(), t.dtype());
  dispatch_all(t.dtype(), [&]<class T>() {
    T* p = host.data<T>();
    const int64_t count = t.numel();
    for (int64_t i = 0; i < count; ++i)
      p[i] = kernels::cpu::convert<T>(double((pg.rank() + 1) * (i % 5)));
    t.copy_(host);
    pg.all_reduce(t)->wait();
    if (t.device().is_cuda()) cuda::synchronize(t.device().index);
    host.copy_(t);
    for (int64_t i = 0; i < count; ++i)
      if (kernels::cpu::convert<double>(p[i]) != double(n * (n + 1) / 2 * (i % 5))) ++wrong;
  });
  return wrong;
}

int auto_iters(uint64_t bytes) {
  return int(std::clamp<uint64_t>((uint64_t(1) << 30) / std::max<uint64_t>(bytes, 1), 5, 200));
}

}  // namespace

uint64_t parse_bytes(const std::string& s) {
  size_t pos = 0;
  uint64_t v = 0;
  try {
    v = std::stoull(s, &pos);
  } catch (const std::exception&) {
    RG_FAIL("'", s, "' is not a size (examples: 4, 64K, 16M, 1G)");
  }
  const std::string suffix = s.substr(pos);
  static const std::map<std::string, uint64_t> mult = {
      {"", 1},        {"B", 1},         {"K", 1 << 10},           {"KiB", 1 << 10},
      {"M", 1 << 20}, {"MiB", 1 << 20}, {"G", uint64_t(1) << 30}, {"GiB", uint64_t(1) << 30}};
  auto it = mult.find(suffix);
  RG_CHECK(it != mult.end(), "'", s, "' is not a size (examples: 4, 64K, 16M, 1G)");
  return v * it->second;
}

int run_allreduce_bench(const AllreduceBenchOptions& o) {
  const DType dtype = parse_dtype(o.dtype);
  const uint64_t lo = parse_bytes(o.min_bytes), hi = parse_bytes(o.max_bytes);
  RG_CHECK(lo >= 1 && lo <= hi, "--min-bytes must be >= 1 and <= --max-bytes");
  dist::InitOptions init;
  init.backend = "gloo";
  init.group.ring_chunk_bytes = size_t(o.chunk_kib) << 10;
  init.group.shm_chunk_bytes = size_t(o.shm_chunk_kib) << 10;
  auto pg = dist::init_process_group(init);
  const bool root = pg->rank() == 0;
  const int n = pg->size();
  const double bus_factor = n > 1 ? 2.0 * (n - 1) / n : 1.0;
  // One rank at a time, so that ranks sharing cores do not slow each other's copies: what one
  // core moves undisturbed.
  double my_memcpy = 0;
  for (int r = 0; r < n; ++r) {
    if (pg->rank() == r) my_memcpy = memcpy_gbps();
    pg->barrier()->wait();
  }
  const double memcpy_bw = mean_over_ranks(*pg, my_memcpy);

  if (root) {
    fmt::print("# ringgrad-bench allreduce: {} ranks, dtype {}, sizes {} .. {} (x{})\n", n, o.dtype,
               human_bytes(lo), human_bytes(hi), o.step_factor);
    if (n == 1) fmt::print("# 1 rank: start it with ringgrad-run --nproc-per-node N\n");
    fmt::print("# memcpy bandwidth (1 thread, 64 MiB, each rank alone, mean over ranks): {:.2f} GB/s\n",
               memcpy_bw);
  }
  std::vector<Row> rows;
  std::shared_ptr<dist::ProcessGroupNCCL> nccl;  // created when an nccl-* row first needs it
  for (const std::string& name : o.algorithms) {
    const auto dash = name.find('-');
    RG_CHECK(dash != std::string::npos, "unknown algorithm '", name,
             "' (expected gloo-native, gloo-ring, gloo-shm, nccl-native or nccl-ring)");
    const std::string backend = name.substr(0, dash);
    const dist::Algorithm algo = dist::parse_algorithm(name.substr(dash + 1));
    RG_CHECK(backend == "gloo" || backend == "nccl", "unknown backend in '", name, "'");
    RG_CHECK(algo != dist::Algorithm::shm || backend == "gloo", "'", name,
             "': shared memory is gloo's (nccl-native already uses it within a node)");
    // Every rank decides alike: the GPU count of a machine is the same for all of its ranks.
    if (backend == "nccl" && !dist::nccl_available()) {
      if (root)
        fmt::print("\n# {}: skipped: {}\n", name,
                   cuda::built_with_cuda() ? "no CUDA device on this machine"
                                           : "ringgrad was built without CUDA");
      continue;
    }
    // Ranks on several hosts have no shared-memory segment (and every rank knows it alike).
    if (algo == dist::Algorithm::shm) {
      const auto* gloo = dynamic_cast<const dist::ProcessGroupGloo*>(&pg->backend_group());
      if (gloo == nullptr || !gloo->has_shared_memory()) {
        if (root) fmt::print("\n# {}: skipped: the ranks are not all on one host\n", name);
        continue;
      }
    }
    if (backend == "nccl" && !nccl) {
      dist::ProcessGroupOptions no;
      no.name = "bench-nccl";
      no.ring_chunk_bytes = size_t(o.chunk_kib) << 10;
      nccl = std::make_shared<dist::ProcessGroupNCCL>(dist::default_store(), pg->rank(), pg->size(),
                                                      no);
    }
    dist::ProcessGroup& group = backend == "nccl" ? *nccl : *pg;
    const Device device = backend == "nccl" ? Device::cuda(nccl->device()) : Device::cpu();
    // NCCL's Work::wait() only orders the current stream; timing needs the host to wait too.
    auto settle = [&] {
      if (device.is_cuda()) cuda::synchronize(device.index);
    };
    group.set_algorithm(algo);
    if (root)
      fmt::print(
          "\n# {}\n# {:>12} {:>12} {:>6} {:>6} {:>12} {:>8} {:>8} {:>7}\n"
          "# {:>12} {:>12} {:>6} {:>6} {:>12} {:>8} {:>8} {:>7}\n",
          name, "size", "count", "type", "redop", "time", "algbw", "busbw", "#wrong", "(B)",
          "(elements)", "", "", "(us)", "(GB/s)", "(GB/s)", "");
    for (uint64_t bytes = lo; bytes <= hi; bytes *= uint64_t(o.step_factor)) {
      const uint64_t count = bytes / element_size(dtype);
      if (count == 0) continue;
      Tensor t = zeros({int64_t(count)}, dtype).to(device);
      const int iters = o.iters > 0 ? o.iters : auto_iters(bytes);
      for (int i = 0; i < o.warmup; ++i) group.all_reduce(t)->wait();
      settle();
      pg->barrier()->wait();
      const auto t0 = Clock::now();
      std::vector<dist::WorkPtr> works;
      for (int i = 0; i < iters; ++i) works.push_back(group.all_reduce(t));
      for (auto& w : works) w->wait();
      settle();
      const double us =
          std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / iters;
      Row r{name, count * element_size(dtype), count, mean_over_ranks(*pg, us), 0, 0, 0};
      r.algbw = double(r.bytes) / (r.time_us * 1e-6) / 1e9;
      r.busbw = r.algbw * bus_factor;
      r.wrong = sum_over_ranks(*pg, count_wrong(group, t));
      if (root) {
        fmt::print("  {:>12} {:>12} {:>6} {:>6} {:>12.1f} {:>8.3f} {:>8.3f} {:>7}\n", r.bytes,
                   r.count, o.dtype, "sum", r.time_us, r.algbw, r.busbw, r.wrong);
        std::fflush(stdout);
      }
      rows.push_back(r);
      if (bytes > hi / uint64_t(o.step_factor)) break;  // no overflow past hi
    }
  }
  int64_t total_wrong = 0;
  for (const Row& r : rows) total_wrong += r.wrong;
  if (root) {
    fmt::print("\n# summary (algbw GB/s; memcpy ceiling {:.2f} GB/s)\n", memcpy_bw);
    for (uint64_t mib : {1, 16, 64}) {
      std::string line = fmt::format("#   {:>3} MiB:", mib);
      for (const Row& r : rows)
        if (r.bytes == mib << 20)
          line += fmt::format("  {} {:.3f} ({:.0f}% of memcpy)", r.algorithm, r.algbw,
                              100.0 * r.algbw / memcpy_bw);
      fmt::print("{}\n", line);
    }
    fmt::print("# wrong values in total: {}\n", total_wrong);
    if (!o.csv.empty()) {
      std::ofstream f(o.csv);
      RG_CHECK(f.good(), "cannot write ", o.csv);
      f << "algorithm,ranks,bytes,count,dtype,time_us,algbw_gbps,busbw_gbps,wrong\n";
      for (const Row& r : rows)
        f << fmt::format("{},{},{},{},{},{:.3f},{:.4f},{:.4f},{}\n", r.algorithm, n, r.bytes,
                         r.count, o.dtype, r.time_us, r.algbw, r.busbw, r.wrong);
      fmt::print("# wrote {}\n", o.csv);
    }
    if (!o.plot.empty()) {
      std::map<std::string, Series> by_algo;
      for (const Row& r : rows) {
        auto& s = by_algo[r.algorithm];
        s.name = r.algorithm;
        s.x.push_back(double(r.bytes));
        s.y.push_back(r.busbw);
      }
      std::vector<Series> series;
      for (auto& [_, s] : by_algo) series.push_back(s);
      series.push_back({fmt::format("memcpy ({:.2f} GB/s)", memcpy_bw),
                        {double(lo), double(hi)},
                        {memcpy_bw, memcpy_bw}});
      plot_png(o.plot,
               {fmt::format("all-reduce bus bandwidth, {} ranks, {}", n, o.dtype),
                "message size (bytes)", "busbw (GB/s)", true, false, true},
               series);
      fmt::print("# wrote {}\n", o.plot);
    }
  }
  nccl.reset();
  pg->barrier()->wait();
  dist::destroy_process_group();
  return total_wrong == 0 ? 0 : 1;
}

}  // namespace rg::apps
