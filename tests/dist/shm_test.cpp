// The shared-memory collectives (comm/shm_group.h) in real rank processes started by
// ringgrad-run (they share a host, so gloo groups set them up and `auto` picks them): every
// collective and dtype through them, chunk boundaries, agreement with gloo's own all-reduce on
// random values, a peer killed mid-transfer ending in an error that names it, a rank that never
// joins ending in a named timeout, and ranks on "different hosts" (RG_HOST_ID) falling back to
// gloo. Correctness only: nothing here is timed
// except the bound on how long a dead peer may take to be noticed.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "comm/init.h"
#include "comm/process_group_gloo.h"
#include "engine/dispatch.h"
#include "engine/ops/factory.h"
#include "kernels/cpu/cast.h"
#include "support/collective_checks.h"
#include "support/errors.h"

namespace rg::dist {
namespace {

using namespace std::chrono_literals;
namespace kcpu = rg::kernels::cpu;

const std::vector<DType> kDtypes = {DType::f32,  DType::f64, DType::f16, DType::bf16,
                                    DType::i64,  DType::i32, DType::u8};
const std::vector<ReduceOp> kOps = {ReduceOp::sum, ReduceOp::avg, ReduceOp::max, ReduceOp::min};

ProcessGroupGloo& default_gloo() {
  auto* pg = dynamic_cast<ProcessGroupGloo*>(&default_group()->backend_group());
  EXPECT_NE(pg, nullptr) << "the shm tests run on gloo";
  return *pg;
}

std::unique_ptr<ProcessGroupGloo> own_group(const char* name, ProcessGroupOptions o = {}) {
  o.name = name;
  return std::make_unique<ProcessGroupGloo>(default_store(), default_group()->rank(),
                                            default_group()->size(), o);
}

TEST(DistShm, RanksOfOneHostGetSharedMemoryAndAutoUsesIt) {
  auto& pg = default_gloo();
  ASSERT_GE(pg.size(), 2) << "run through ringgrad-run --nproc-per-node N (N >= 2)";
  EXPECT_TRUE(pg.has_shared_memory());
  pg.set_algorithm(Algorithm::automatic);
  rg::testing::check_all_reduce(pg, DType::f32, 1000, ReduceOp::sum);
}

TEST(DistShm, EveryCollectiveAndDtype) {
  auto& pg = default_gloo();
  pg.set_algorithm(Algorithm::shm);
  rg::testing::check_everything(pg, /*heavy=*/true);
  rg::testing::check_64_mib(pg);
  pg.set_algorithm(Algorithm::automatic);
}

// Sizes around the pipeline's chunk: one element less, exactly one, one more, several plus a
// remainder, for every dtype and op: all-reduce, reduce-scatter, broadcast and all-gather.
TEST(DistShm, ChunkBoundaries) {
  ProcessGroupOptions o;
  o.algorithm = Algorithm::shm;
  o.shm_chunk_bytes = 4096;
  auto pg = own_group("shm-chunks", o);
  ASSERT_TRUE(pg->has_shared_memory());
  const size_t n = size_t(pg->size());
  for (DType dt : kDtypes) {
    if (dt == DType::u8 && n > 4) continue;  // u8 sums stay exact up to 4 ranks
    const size_t chunk = o.shm_chunk_bytes / element_size(dt);
    for (size_t count : {size_t(1), n - 1, n + 1, chunk - 1, chunk, chunk + 1, 3 * chunk + 5}) {
      for (ReduceOp op : kOps) rg::testing::check_all_reduce(*pg, dt, count, op);
      rg::testing::check_reduce_scatter(*pg, dt, count / n + 1, ReduceOp::sum);
      rg::testing::check_broadcast(*pg, dt, count, int(count % n));
      rg::testing::check_all_gather(*pg, dt, count);
    }
  }
  pg->barrier()->wait();
}

// x in [-1, 1] for floats, small integers otherwise; rank r's values from seed r.
Tensor random_input(DType dtype, size_t count, int rank) {
  std::mt19937 gen(uint32_t(1234 + rank));
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  Tensor t = Tensor::empty({int64_t(count)}, dtype);
  dispatch_all(dtype, [&]<class T>() {
    T* p = t.data<T>();
    for (size_t i = 0; i < count; ++i) {
      const double x = u(gen);
      p[i] = kcpu::convert<T>(is_floating(dtype) ? x : std::floor(x * 30 + 31));
    }
  });
  return t;
}

double epsilon(DType dtype) {
  switch (dtype) {
    case DType::f64:
      return std::ldexp(1.0, -52);
    case DType::f32:
      return std::ldexp(1.0, -23);
    case DType::f16:
      return std::ldexp(1.0, -10);
    case DType::bf16:
      return std::ldexp(1.0, -7);
    default:
      return 0;
  }
}

// Gloo's all-reduce and ours on the same random inputs: bitwise equal for integers and for max and
// min; floating sums and averages add in another order, so they may differ by the rounding of
// 2n additions: |shm - gloo| <= 2 n eps(dtype) (sum over ranks of |x|) + eps(dtype) |gloo|.
TEST(DistShm, MatchesGlooNative) {
  auto& pg = default_gloo();
  const int n = pg.size();
  // Several chunks of the default 1 MiB in every dtype.
  const size_t count = (ProcessGroupOptions{}.shm_chunk_bytes / 2) * 3 + 7;
  for (DType dt : kDtypes) {
    if (dt == DType::u8) continue;  // random u8 sums would wrap around
    for (ReduceOp op : kOps) {
      Tensor native = random_input(dt, count, pg.rank()), shm = native.clone();
      pg.set_algorithm(Algorithm::native);
      pg.all_reduce(native, op)->wait();
      pg.set_algorithm(Algorithm::shm);
      pg.all_reduce(shm, op)->wait();
      std::vector<Tensor> inputs;
      for (int r = 0; r < n; ++r) inputs.push_back(random_input(dt, count, r));
      const bool exact = !is_floating(dt) || op == ReduceOp::max || op == ReduceOp::min;
      dispatch_all(dt, [&]<class T>() {
        const T* a = native.data<T>();
        const T* b = shm.data<T>();
        for (size_t i = 0; i < count; ++i) {
          const double x = kcpu::convert<double>(a[i]), y = kcpu::convert<double>(b[i]);
          double abs_sum = 0;
          for (const Tensor& in : inputs) abs_sum += std::abs(kcpu::convert<double>(in.data<T>()[i]));
          const double tol = exact ? 0 : 2 * n * epsilon(dt) * abs_sum + epsilon(dt) * std::abs(x);
          if (std::abs(x - y) > tol) {
            ADD_FAILURE() << dtype_name(dt) << " " << reduce_op_name(op) << " element " << i
                          << ": gloo " << x << ", shm " << y << " (tolerance " << tol << ")";
            return;
          }
        }
      });
    }
  }
  pg.set_algorithm(Algorithm::automatic);
}

// The last rank dies while a 64 MiB all-reduce is under way (many chunks): every other rank
// must end in an error naming it, well before the group's 60 s timeout.
TEST(DistShm, PeerKilledMidTransferIsAnErrorNotAHang) {
  ProcessGroupOptions o;
  o.algorithm = Algorithm::shm;
  o.timeout = 60s;
  o.shm_chunk_bytes = 64 << 10;
  auto pg = own_group("shm-killed", o);
  ASSERT_TRUE(pg->has_shared_memory());
  const int last = pg->size() - 1;
  pg->barrier()->wait();
  Tensor t = ones({int64_t(1) << 24});
  if (pg->rank() == last) {
    auto w = pg->all_reduce(t);  // runs on the group's worker thread
    std::this_thread::sleep_for(5ms);
    _exit(0);  // no goodbye, as in a crash
  }
  const auto t0 = std::chrono::steady_clock::now();
  const std::string e = rg::testing::error_of([&] { pg->all_reduce(t)->wait(); });
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 15s)
      << "a dead peer must not take the 60 s timeout to notice";
  EXPECT_NE(e.find("all_reduce #2"), std::string::npos) << e;
  EXPECT_NE(e.find("rank " + std::to_string(last)), std::string::npos) << e;
  EXPECT_NE(e.find("exited"), std::string::npos) << e;
  std::cout << "rank " << pg->rank() << " saw: " << e << "\n";
}

// The last rank stays alive but never joins: the others time out at the group's timeout, and
// the error names it (the first rank to time out tells the others through the segment).
TEST(DistShm, RankThatNeverCallsTimesOutNamingIt) {
  ProcessGroupOptions o;
  o.algorithm = Algorithm::shm;
  o.timeout = 2s;
  auto pg = own_group("shm-never", o);
  ASSERT_TRUE(pg->has_shared_memory());
  const int last = pg->size() - 1;
  auto store = default_store();
  if (pg->rank() != last) {
    const std::string e = rg::testing::error_of([&] { pg->all_reduce(ones({100000}))->wait(); });
    EXPECT_NE(e.find("all_reduce #1"), std::string::npos) << e;
    EXPECT_NE(e.find("timed out after 2000 ms"), std::string::npos) << e;
    EXPECT_NE(e.find("ranks that have not joined it: " + std::to_string(last)), std::string::npos)
        << e;
    std::cout << "rank " << pg->rank() << " saw: " << e << "\n";
    store->add("shm-never/checked", 1);
  }
  while (store->add("shm-never/checked", 0) < last) std::this_thread::sleep_for(10ms);
}

// Ranks that say they are on two hosts get no segment: `auto` is gloo's all-reduce, and an
// explicit shm is refused with a message instead of running.
TEST(DistShm, RanksOnDifferentHostsFallBackToGloo) {
  const int rank = default_group()->rank();
  ASSERT_EQ(setenv("RG_HOST_ID", rank % 2 ? "host-b" : "host-a", 1), 0);
  auto pg = own_group("shm-two-hosts");
  unsetenv("RG_HOST_ID");
  EXPECT_FALSE(pg->has_shared_memory());
  rg::testing::check_all_reduce(*pg, DType::f32, 1000, ReduceOp::sum);
  pg->set_algorithm(Algorithm::shm);
  rg::testing::expect_error([&] { pg->all_reduce(ones({4})); }, "needs every rank of the group on one host");
  pg->set_algorithm(Algorithm::ring);
  rg::testing::check_all_reduce(*pg, DType::f32, 1000, ReduceOp::avg);
  pg->barrier()->wait();
}

}  // namespace
}  // namespace rg::dist
