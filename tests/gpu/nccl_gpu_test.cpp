// ProcessGroupNCCL on a real GPU (label gpu; skipped without one): a one-rank group's
// collectives with both algorithms, and argument errors. Multi-rank NCCL runs need several GPUs:
// `ringgrad-run --nproc-per-node N ringgrad-bench allreduce` checks every value of nccl-native
// and nccl-ring there (its #wrong column).
#include <gtest/gtest.h>

#include "comm/hash_store.h"
#include "comm/process_group_nccl.h"
#include "engine/ops/factory.h"
#include "kernels/cuda/device.h"
#include "support/errors.h"

namespace rg::dist {
namespace {

class NcclGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
    pg_ = std::make_unique<ProcessGroupNCCL>(std::make_shared<HashStore>(), 0, 1);
  }
  std::unique_ptr<ProcessGroupNCCL> pg_;
};

TEST_F(NcclGpuTest, OneRankCollectivesKeepTheValues) {
  const Device gpu = Device::cuda(pg_->device());
  Tensor x = arange(0, 1000, 1, DType::f32).to(gpu);
  pg_->all_reduce(x)->wait();
  pg_->all_reduce(x, ReduceOp::avg)->wait();
  pg_->broadcast(x, 0)->wait();
  Tensor gathered = Tensor::empty({1000}, DType::f32, gpu);
  pg_->all_gather(gathered, x)->wait();
  pg_->barrier()->wait();
  const auto v = gathered.to(Device::cpu()).to_vector<float>();
  for (size_t i = 0; i < v.size(); ++i) ASSERT_EQ(v[i], float(i));
}

TEST_F(NcclGpuTest, OurRingOnOneRankAveragesToItself) {
  pg_->set_algorithm(Algorithm::ring);
  Tensor x = arange(0, 4099, 1, DType::f32).to(Device::cuda(pg_->device()));
  pg_->all_reduce(x, ReduceOp::avg)->wait();
  const auto v = x.to(Device::cpu()).to_vector<float>();
  for (size_t i = 0; i < v.size(); ++i) ASSERT_EQ(v[i], float(i));
}

TEST_F(NcclGpuTest, CpuTensorsAreAClearError) {
  rg::testing::expect_error([&] { pg_->all_reduce(zeros({4})); }, "this NCCL group uses cuda:");
}

}  // namespace
}  // namespace rg::dist
