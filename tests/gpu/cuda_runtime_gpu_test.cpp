// The CUDA runtime on a real GPU (label gpu): the caching allocator's steady state, host-device
// round trips of every dtype, asynchronous copies through pinned memory, events and streams, and
// Tensor::to. Skipped with a message without a device.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "engine/cuda/device_guard.h"
#include "engine/cuda/event.h"
#include "engine/cuda/memory.h"
#include "engine/cuda/stream.h"
#include "engine/ops/factory.h"
#include "engine/tensor.h"
#include "kernels/cuda/device.h"
#include "kernels/error.h"

namespace rg {
namespace {

#define RG_REQUIRE_GPU()                                                     \
  do {                                                                       \
    if (cuda::device_count() == 0) {                                         \
      GTEST_SKIP() << "no CUDA device (" << cuda::library_versions() << ")"; \
    }                                                                        \
  } while (0)

// Bytes that differ per element and per dtype, including values with every bit pattern class.
Tensor pattern(const Shape& shape, DType dtype, uint32_t seed) {
  Tensor t = Tensor::empty(shape, dtype);
  auto* p = static_cast<uint8_t*>(t.raw_data());
  uint32_t x = seed * 2654435761u + 1;
  for (size_t i = 0; i < t.nbytes(); ++i) {
    x = x * 1664525u + 1013904223u;
    p[i] = uint8_t(x >> 24);
  }
  return t;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

TEST(GpuCudaRuntime, SteadyStateAllocationsNeedNoCudaMalloc) {
  RG_REQUIRE_GPU();
  const std::vector<int64_t> sizes = {1, 1000, 65536, 262145, 3 << 20, 5 << 20, 7};
  auto step = [&] {
    std::vector<Tensor> live;
    for (int64_t n : sizes) {
      live.push_back(Tensor::empty({n}, DType::f32, Device::cuda(0)));
      (void)Tensor::empty({n / 2 + 1}, DType::f16, Device::cuda(0));  // a temporary
    }
  };
  step();
  const cuda::DeviceMemoryStats warm = cuda::memory_stats(0);
  for (int i = 0; i < 20; ++i) step();
  const cuda::DeviceMemoryStats after = cuda::memory_stats(0);
  EXPECT_EQ(after.num_device_allocs, warm.num_device_allocs);
  EXPECT_EQ(after.num_device_frees, warm.num_device_frees);
  EXPECT_EQ(after.reserved_bytes, warm.reserved_bytes);
  EXPECT_EQ(after.allocated_bytes, warm.allocated_bytes);
  EXPECT_GE(after.peak_allocated_bytes, int64_t(sizes[4] * 4));
  cuda::empty_cache();
  EXPECT_LE(cuda::memory_stats(0).reserved_bytes, after.reserved_bytes);
}

TEST(GpuCudaRuntime, RoundTripOfEveryDTypeOnEveryDevice) {
  RG_REQUIRE_GPU();
  for (int d = 0; d < cuda::device_count(); ++d) {
    for (DType dt :
         {DType::f32, DType::f64, DType::f16, DType::bf16, DType::i64, DType::i32, DType::u8}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " on cuda:" + std::to_string(d));
      const Tensor host = pattern({3, 1001}, dt, uint32_t(d * 10 + int(dt)));
      const Tensor dev = host.to(Device::cuda(d));
      EXPECT_EQ(dev.device(), Device::cuda(d));
      EXPECT_TRUE(same_bytes(dev.to(Device::cpu()), host));
      EXPECT_TRUE(same_bytes(dev.narrow(0, 1, 2).to(Device::cpu()), host.narrow(0, 1, 2)));
      EXPECT_TRUE(same_bytes(dev.clone().to(Device::cpu()), host));
    }
  }
}

TEST(GpuCudaRuntime, ConversionsZerosAndItem) {
  RG_REQUIRE_GPU();
  const Tensor host = from_vector<float>({1.5f, -2.f, 1000.f}, {3});
  Tensor dev = Tensor::empty({3}, DType::bf16, Device::cuda(0));
  dev.copy_(host);
  EXPECT_EQ(dev.to_vector<float>(), (std::vector<float>{1.5f, -2.f, 1000.f}));
  EXPECT_EQ(zeros({1000}, DType::f64, Device::cuda(0)).to_vector<double>(),
            std::vector<double>(1000, 0.0));
  EXPECT_EQ(from_vector<int64_t>({-7}, {1}).to(Device::cuda(0)).item<int64_t>(), -7);
}

TEST(GpuCudaRuntime, AsyncCopiesThroughPinnedMemory) {
  RG_REQUIRE_GPU();
  const cuda::Stream s = cuda::pooled_stream(0);
  cuda::StreamGuard guard(s);
  const Tensor source = pattern({16 << 20}, DType::f32, 7);  // 64 MiB
  Tensor pinned = source.pin_memory();
  ASSERT_TRUE(pinned.is_pinned());
  const Tensor dev = pinned.to(Device::cuda(0), /*non_blocking=*/true);
  Tensor back = Tensor::empty_pinned(source.shape(), source.dtype());
  back.copy_(dev, /*non_blocking=*/true);
  pinned = Tensor();  // freed while the upload may still run: kept from reuse until it is done
  cuda::Event done;
  done.record(s);
  done.synchronize();
  EXPECT_TRUE(done.query());
  EXPECT_TRUE(s.query());
  EXPECT_TRUE(same_bytes(back, source));
  // Pinned blocks are cached: the same sizes again need no new cudaHostAlloc.
  const int64_t host_allocs = cuda::pinned_memory_stats().num_host_allocs;
  for (int i = 0; i < 3; ++i) {
    Tensor p = Tensor::empty_pinned(source.shape(), source.dtype());
    p.copy_(dev, /*non_blocking=*/true);
    s.synchronize();
  }
  EXPECT_EQ(cuda::pinned_memory_stats().num_host_allocs, host_allocs);
}

TEST(GpuCudaRuntime, EventsOrderWorkAcrossStreams) {
  RG_REQUIRE_GPU();
  const cuda::Stream producer = cuda::pooled_stream(0);
  const cuda::Stream consumer = cuda::pooled_stream(0);
  ASSERT_NE(producer, consumer);
  const Tensor source = pattern({8 << 20}, DType::f32, 11);
  const Tensor pinned = source.pin_memory();
  Tensor a = Tensor::empty(source.shape(), source.dtype(), Device::cuda(0));
  Tensor b;
  cuda::Event start(/*enable_timing=*/true), end(/*enable_timing=*/true);
  {
    cuda::StreamGuard g(producer);
    start.record();
    a.copy_(pinned, /*non_blocking=*/true);
    end.record();
  }
  {
    cuda::StreamGuard g(consumer);
    consumer.wait(end);  // the copy below must see the upload
    b = a.clone();       // allocated for, and copied on, the consumer stream
    cuda::record_stream(a, consumer);
  }
  // b is read on the current (default) stream, which does not wait for non-blocking streams.
  consumer.synchronize();
  EXPECT_TRUE(same_bytes(b.to(Device::cpu()), source));
  end.synchronize();
  EXPECT_GT(start.elapsed_ms(end), 0.0f);
  EXPECT_TRUE(producer.query());
}

TEST(GpuCudaRuntime, StreamWaitsForAnotherStream) {
  RG_REQUIRE_GPU();
  const cuda::Stream s1 = cuda::pooled_stream(0);
  const cuda::Stream s2 = cuda::pooled_stream(0);
  const Tensor source = pattern({4 << 20}, DType::i32, 3);
  Tensor dev;
  {
    cuda::StreamGuard g(s1);
    dev = source.to(Device::cuda(0), /*non_blocking=*/true);
  }
  s2.wait(s1);
  Tensor copy;
  {
    cuda::StreamGuard g(s2);
    copy = dev.clone();
  }
  s2.synchronize();
  EXPECT_TRUE(same_bytes(copy.to(Device::cpu()), source));
}

TEST(GpuCudaRuntime, DeviceGuardAndCrossDeviceCopies) {
  RG_REQUIRE_GPU();
  const int n = cuda::device_count();
  const int before = cuda::current_device();
  {
    cuda::DeviceGuard g(n - 1);
    EXPECT_EQ(cuda::current_device(), n - 1);
  }
  EXPECT_EQ(cuda::current_device(), before);
  if (n < 2) GTEST_SKIP() << "one GPU: no cross-device copy to test";
  const Tensor host = pattern({100000}, DType::f16, 5);
  const Tensor on1 = host.to(Device::cuda(0)).to(Device::cuda(1));
  EXPECT_TRUE(same_bytes(on1.to(Device::cpu()), host));
}

TEST(GpuCudaRuntime, OutOfMemoryIsAClearErrorAndTheDeviceStaysUsable) {
  RG_REQUIRE_GPU();
  try {
    (void)Tensor::empty({int64_t(1) << 40}, DType::f32, Device::cuda(0));  // 4 TiB
    FAIL() << "allocated 4 TiB";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("CUDA out of memory on cuda:0"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(from_vector<float>({2.5f}, {1}).to(Device::cuda(0)).item<float>(), 2.5f);
}

}  // namespace
}  // namespace rg
