// Tensor API: factories, views sharing storage, dtype conversions, item, printing, errors.
#include <gtest/gtest.h>

#include <cmath>

#include "engine/ops/binary.h"
#include "engine/ops/factory.h"
#include "kernels/error.h"
#include "support/errors.h"

namespace rg {
namespace {

TEST(Tensor, FactoriesFillValues) {
  EXPECT_EQ(zeros({2, 3}).to_vector<float>(), std::vector<float>(6, 0.f));
  EXPECT_EQ(ones({4}, DType::i64).to_vector<int64_t>(), std::vector<int64_t>(4, 1));
  EXPECT_EQ(full({2}, 2.5, DType::f64).to_vector<double>(), (std::vector<double>{2.5, 2.5}));
  EXPECT_EQ(arange(5).to_vector<int64_t>(), (std::vector<int64_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(arange(1, 2, 0.25, DType::f32).to_vector<float>(),
            (std::vector<float>{1, 1.25, 1.5, 1.75}));
  EXPECT_EQ(arange(3, 0, 1).numel(), 0);
}

TEST(Tensor, ViewAndNarrowShareStorage) {
  Tensor t = arange(12, DType::f32);
  Tensor v = t.view({3, -1});
  EXPECT_EQ(v.shape(), (Shape{3, 4}));
  Tensor rows = v.narrow(0, 1, 2);
  EXPECT_EQ(rows.shape(), (Shape{2, 4}));
  EXPECT_EQ(rows.to_vector<float>()[0], 4.f);
  rows.fill_(-1);
  EXPECT_EQ(t.to_vector<float>()[4], -1.f);
  EXPECT_EQ(t.to_vector<float>()[11], -1.f);
  EXPECT_EQ(t.to_vector<float>()[3], 3.f);
  Tensor flat = t.flat_narrow(2, 3);
  EXPECT_EQ(flat.storage().get(), t.storage().get());
  EXPECT_EQ(flat.to_vector<float>(), (std::vector<float>{2, 3, -1}));
}

TEST(Tensor, DTypeConversionsRoundTrip) {
  Tensor t = from_vector<float>({1.5f, -2.25f, 65504.f, 1e-7f}, {4});
  Tensor h = t.to(DType::f16);
  EXPECT_EQ(h.dtype(), DType::f16);
  const auto back = h.to(DType::f32).to_vector<float>();
  EXPECT_EQ(back[0], 1.5f);
  EXPECT_EQ(back[1], -2.25f);
  EXPECT_EQ(back[2], 65504.f);
  EXPECT_EQ(back[3], 0x1p-23f);  // f16 subnormal: 1e-7 is nearest to 2 * 2^-24
  const auto bf = t.to(DType::bf16).to(DType::f32).to_vector<float>();
  EXPECT_EQ(bf[0], 1.5f);
  EXPECT_EQ(bf[1], -2.25f);
  EXPECT_EQ(bf[2], 65536.f);  // nearest bf16
  EXPECT_EQ(t.to(DType::i32).to_vector<int32_t>(), (std::vector<int32_t>{1, -2, 65504, 0}));
  EXPECT_EQ(from_vector<int64_t>({300}, {1}).to(DType::u8).item(), 44.0);
}

TEST(Tensor, HalfRoundsToNearestEven) {
  // 1 + 2^-11 lies halfway between 1 and 1 + 2^-10: ties go to the even mantissa (1).
  EXPECT_EQ(half_to_float(float_to_half(1.0f + 0x1p-11f)), 1.0f);
  EXPECT_EQ(half_to_float(float_to_half(1.0f + 3 * 0x1p-11f)), 1.0f + 0x1p-9f);
  EXPECT_EQ(half_to_float(float_to_half(70000.f)), INFINITY);
  EXPECT_TRUE(std::isnan(half_to_float(float_to_half(NAN))));
  EXPECT_EQ(bfloat16_to_float(float_to_bfloat16(1.0f + 0x1p-8f)), 1.0f);
}

TEST(Tensor, ItemAndPrinting) {
  EXPECT_EQ(full({1, 1}, 3.0).item(), 3.0);
  const std::string s = from_vector<float>({1, 2, 3, 4}, {2, 2}).str();
  EXPECT_NE(s.find("[[1.0000, 2.0000]"), std::string::npos) << s;
  EXPECT_NE(s.find("shape=[2, 2], dtype=f32"), std::string::npos) << s;
  const std::string long_s = arange(100).str();
  EXPECT_NE(long_s.find("[0, 1, 2, ..., 97, 98, 99]"), std::string::npos) << long_s;
}

TEST(Tensor, RandomIsReproducibleFromSeedAndOffset) {
  Generator g1(42), g2(42);
  Tensor a = rand({1001}, g1);
  Tensor b = rand({1001}, g2);
  EXPECT_EQ(a.to_vector<float>(), b.to_vector<float>());
  Tensor c = rand({1001}, g1);  // advanced offset: different numbers
  EXPECT_NE(a.to_vector<float>(), c.to_vector<float>());
  const auto v = a.to_vector<float>();
  double mean = 0;
  for (float x : v) {
    EXPECT_GE(x, 0.f);
    EXPECT_LT(x, 1.f);
    mean += x;
  }
  EXPECT_NEAR(mean / v.size(), 0.5, 0.03);
  Generator g3(7);
  const auto n = randn({20000}, g3, DType::f64).to_vector<double>();
  double m = 0, sq = 0;
  for (double x : n) {
    m += x;
    sq += x * x;
  }
  m /= n.size();
  EXPECT_NEAR(m, 0.0, 0.03);
  EXPECT_NEAR(sq / n.size() - m * m, 1.0, 0.05);
}

TEST(Tensor, ClearErrors) {
  Tensor t = zeros({2, 3});
  EXPECT_THROW(t.view({4, 2}), Error);
  EXPECT_THROW(t.view({-1, -1}), Error);
  EXPECT_THROW(t.narrow(0, 1, 2), Error);
  EXPECT_THROW(t.narrow(1, 0, 1), Error);
  EXPECT_THROW(t.flat_narrow(5, 2), Error);
  EXPECT_THROW(t.item(), Error);
  EXPECT_THROW(t.data<double>(), Error);
  EXPECT_THROW(add(t, zeros({4})), Error);
  EXPECT_THROW(add(t, zeros({2, 3}, DType::f64)), Error);
  EXPECT_THROW(Tensor().shape(), Error);
  testing::expect_error(
      [] {
        Tensor::empty({int64_t{1} << 40, int64_t{1} << 40});
      },
      "more elements than fit in 64 bits");
  EXPECT_THROW(zeros({2}, DType::i64).set_requires_grad(true), Error);
  try {
    t.view({4, 2});
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[2, 3]"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace rg

namespace rg {
namespace {

TEST(CpuAllocator, CachesLargeBlocksAndCountsBytes) {
  cpu_empty_cache();
  const auto before = cpu_memory_stats();
  {
    Tensor big = empty({1 << 18});  // 1 MiB: cached size class
    const auto during = cpu_memory_stats();
    EXPECT_EQ(during.allocated_bytes - before.allocated_bytes, 1 << 20);
    EXPECT_GE(during.peak_bytes, during.allocated_bytes);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(big.raw_data()) % 64, 0u);
  }
  const auto after_free = cpu_memory_stats();
  EXPECT_EQ(after_free.allocated_bytes, before.allocated_bytes);
  EXPECT_EQ(after_free.reserved_bytes - before.reserved_bytes, 1 << 20);  // kept for reuse
  {
    Tensor again = empty({(1 << 18) - 100});  // same size class: no new memory
    EXPECT_EQ(cpu_memory_stats().reserved_bytes, after_free.reserved_bytes);
  }
  cpu_empty_cache();
  EXPECT_EQ(cpu_memory_stats().reserved_bytes, before.reserved_bytes);
}

// Recycling on (or off) for one test, whatever this machine's default.
struct Recycling {
  explicit Recycling(bool on) : was(cpu_cache_recycling()) {
    set_cpu_cache_recycling(on);
    cpu_empty_cache();  // a clean cache and high-water mark
  }
  ~Recycling() {
    cpu_empty_cache();
    set_cpu_cache_recycling(was);
  }
  bool was;
};

constexpr int64_t kMiB = int64_t(1) << 20;
Tensor mib(int64_t n) { return empty({n * kMiB / 4}); }

TEST(CpuAllocator, RecyclingKeepsTheCacheUnderItsHighWaterMark) {
  Recycling on(true);
  const int64_t base = cpu_memory_stats().reserved_bytes;
  { Tensor a = mib(8), b = mib(8); }  // 16 MiB in use at most, then idle
  EXPECT_EQ(cpu_memory_stats().reserved_bytes - base, 16 * kMiB);
  {
    Tensor c = mib(16);  // a miss: the idle 8 MiB blocks go first
    EXPECT_EQ(cpu_memory_stats().reserved_bytes - base, 16 * kMiB);
    const float* p = c.data<float>();
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % (2 * kMiB), 0u);  // huge-page aligned
  }
  {
    Tensor d = mib(32);  // more than ever in use: grows, after giving back the idle 16 MiB
    EXPECT_EQ(cpu_memory_stats().reserved_bytes - base, 32 * kMiB);
  }
}

TEST(CpuAllocator, WithoutRecyclingEveryClassKeepsItsOwnMaximum) {
  Recycling off(false);
  const int64_t base = cpu_memory_stats().reserved_bytes;
  { Tensor a = mib(8), b = mib(8); }
  { Tensor c = mib(16); }
  EXPECT_EQ(cpu_memory_stats().reserved_bytes - base, 32 * kMiB);
}

TEST(CpuAllocator, RecyclingGivesBackTheMostRecentlyUsedClassFirst) {
  Recycling on(true);
  const int64_t base = cpu_memory_stats().reserved_bytes;
  {
    Tensor eight = mib(8);
    { Tensor sixteen = mib(16); }  // freed first: used before `eight` was freed
  }
  // 24 MiB mapped, the high-water mark; 12 MiB more needs 12 MiB given back. The 8 MiB class was
  // used last, so its block goes first, then the 16 MiB one.
  {
    Tensor twelve = mib(12);
    EXPECT_EQ(cpu_memory_stats().reserved_bytes - base, 12 * kMiB);
  }
  cpu_empty_cache();  // nothing in use: the high-water mark starts again from 0
  const int64_t base2 = cpu_memory_stats().reserved_bytes;
  {
    Tensor ten = mib(10);
    { Tensor sixteen = mib(16); }
  }
  // 26 MiB mapped; 9 MiB more: giving back the 10 MiB block (used last) is enough, and the
  // 16 MiB one stays cached.
  Tensor nine = mib(9);
  EXPECT_EQ(cpu_memory_stats().reserved_bytes - base2, 25 * kMiB);
  Tensor sixteen_again = mib(16);  // a cache hit: no growth
  EXPECT_EQ(cpu_memory_stats().reserved_bytes - base2, 25 * kMiB);
}

TEST(CpuAllocator, SmallBlocksAreNeverRecycled) {
  Recycling on(true);
  const int64_t base = cpu_memory_stats().reserved_bytes;
  { Tensor a = mib(4), b = mib(4); }
  { Tensor c = mib(8); }  // an 8 MiB miss may only give back blocks of 8 MiB or more
  EXPECT_EQ(cpu_memory_stats().reserved_bytes - base, 16 * kMiB);
}

}  // namespace
}  // namespace rg
