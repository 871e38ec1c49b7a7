// The one-GPU-per-rank check of the NCCL group (comm/gpu_per_rank.h) without a device: the message
// for every way ranks can share a GPU, the store exchange (a rank that never publishes, a bad
// entry), and the NCCL error text (kernels/nccl_error.h) that every NCCL failure carries.
#include "comm/gpu_per_rank.h"

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "comm/hash_store.h"
#include "kernels/nccl_error.h"
#include "support/errors.h"

namespace rg::dist {
namespace {

using namespace std::chrono_literals;

RankGpu gpu(const std::string& uuid, int device, int count = 2, const std::string& host = "a") {
  return RankGpu{uuid, device, count, host};
}

constexpr char kFix[] = "NCCL needs one GPU per rank; start at most ";

TEST(GpuPerRank, DistinctGpusPass) {
  EXPECT_EQ(shared_gpu_error({}), "");
  EXPECT_EQ(shared_gpu_error({gpu("GPU-a", 0)}), "");
  EXPECT_EQ(shared_gpu_error({gpu("GPU-a", 0), gpu("GPU-b", 1), gpu("GPU-c", 0, 2, "b")}), "");
}

TEST(GpuPerRank, EverySharedGpuIsNamedWithWhatToDo) {
  EXPECT_EQ(shared_gpu_error({gpu("GPU-a", 0, 1), gpu("GPU-a", 0, 1)}),
            "ranks 0 and 1 both use GPU 0 (GPU-a): NCCL needs one GPU per rank; start at most 1 "
            "rank per node (--nproc-per-node) or use --backend gloo");
  EXPECT_EQ(shared_gpu_error({gpu("GPU-a", 0), gpu("GPU-b", 1), gpu("GPU-a", 0), gpu("GPU-b", 1)}),
            std::string("ranks 0 and 2 both use GPU 0 (GPU-a); ranks 1 and 3 both use GPU 1 "
                        "(GPU-b): ") +
                kFix + "2 ranks per node (--nproc-per-node) or use --backend gloo");
  // Three on one; another rank alone on its GPU is not named.
  const std::string three = shared_gpu_error(
      {gpu("GPU-b", 1, 4), gpu("GPU-a", 0, 4), gpu("GPU-b", 1, 4), gpu("GPU-b", 1, 4)});
  EXPECT_EQ(three.rfind("ranks 0, 2 and 3 all use GPU 1 (GPU-b): ", 0), 0u) << three;
  EXPECT_NE(three.find("at most 4 ranks per node"), std::string::npos) << three;
  // One GPU seen under two indexes (CUDA_VISIBLE_DEVICES differs between the ranks).
  EXPECT_EQ(
      shared_gpu_error({gpu("GPU-a", 0, 1), gpu("GPU-a", 1, 2)})
          .rfind("ranks 0 and 1 both use one GPU (GPU-a: cuda:0 on rank 0, cuda:1 on rank 1): ", 0),
      0u);
  // Several hosts: the host is named.
  EXPECT_EQ(shared_gpu_error(
                {gpu("GPU-a", 0, 1, "n1"), gpu("GPU-a", 0, 1, "n1"), gpu("GPU-b", 0, 1, "n2")})
                .rfind("ranks 0 and 1 both use GPU 0 of n1 (GPU-a): ", 0),
            0u);
}

TEST(GpuPerRank, TheStoreExchangeNamesARankThatNeverPublishes) {
  auto store = std::make_shared<HashStore>();
  std::vector<std::vector<RankGpu>> seen(2);
  std::thread other([&] { seen[1] = exchange_rank_gpus(*store, "g", 1, 2, gpu("GPU-b", 1), 10s); });
  seen[0] = exchange_rank_gpus(*store, "g", 0, 2, gpu("GPU-a", 0, 2, "host x"), 10s);
  other.join();
  for (const auto& all : seen) {
    ASSERT_EQ(all.size(), 2u);
    EXPECT_EQ(all[0].uuid, "GPU-a");
    EXPECT_EQ(all[0].host, "host x");
    EXPECT_EQ(all[1].device, 1);
    EXPECT_EQ(all[1].device_count, 2);
  }
  rg::testing::expect_error(
      [&] { exchange_rank_gpus(*store, "h", 0, 3, gpu("GPU-a", 0), 200ms); },
      "nccl: rank 0 waited 200 ms for the GPU of rank(s) 1 and 2, which never published it");
  store->set("m/1", "GPU-b\nnot a number\n2\nhost");
  rg::testing::expect_error([&] { exchange_rank_gpus(*store, "m", 0, 2, gpu("GPU-a", 0), 1s); },
                            "nccl: rank 1's GPU entry in the store is malformed");
}

TEST(GpuPerRank, RanksOnOneGpuAllFailAndRankZeroWaitsForTheOthers) {
  auto store = std::make_shared<HashStore>();
  std::vector<std::string> errors(3);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 3; ++r) {
    ranks.emplace_back([&, r] {
      if (r == 2) std::this_thread::sleep_for(100ms);
      errors[size_t(r)] = rg::testing::error_of(
          [&] { check_one_gpu_per_rank(*store, "p", r, 3, gpu("GPU-a", 0, 1), 10s); });
    });
  }
  for (auto& t : ranks) t.join();
  for (const std::string& e : errors)
    EXPECT_EQ(e.rfind("ranks 0, 1 and 2 all use GPU 0 (GPU-a): ", 0), 0u) << e;
  EXPECT_EQ(store->get("p/refused", 1s), to_bytes("3"));
}

TEST(GpuPerRank, FormatsUuidsAsNvidiaSmi) {
  const char bytes[16] = {0x52, 0x2f, 0x1a, 0x00, 0x01, char(0xff), 0x10,       0x20,
                          0x30, 0x40, 0x50, 0x60, 0x70, char(0x80), char(0x90), char(0xa0)};
  EXPECT_EQ(format_gpu_uuid(bytes), "GPU-522f1a00-01ff-1020-3040-5060708090a0");
}

TEST(NcclErrorText, NcclsWordsAndItsLastErrorInsteadOfTheDebugHint) {
  EXPECT_EQ(kernels::nccl_error_text("invalid usage (run with NCCL_DEBUG=WARN for details)",
                                     "Duplicate GPU detected : rank 0 and rank 1 both on CUDA "
                                     "device 1000\n"),
            "invalid usage: Duplicate GPU detected : rank 0 and rank 1 both on CUDA device 1000");
  // Without a last error, NCCL's text is kept whole (its hint is then the only lead).
  EXPECT_EQ(kernels::nccl_error_text("invalid usage (run with NCCL_DEBUG=WARN for details)", ""),
            "invalid usage (run with NCCL_DEBUG=WARN for details)");
  EXPECT_EQ(kernels::nccl_error_text("remote process exited or there was a network error", "x"),
            "remote process exited or there was a network error: x");
  EXPECT_EQ(kernels::nccl_error_text(nullptr, nullptr), "unknown NCCL error");
}

}  // namespace
}  // namespace rg::dist
