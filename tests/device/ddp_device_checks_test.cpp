// DDP with a module on a CUDA device: refused with a reason by a process group that reduces CPU
// tensors (gloo), and a module spread over two devices is refused too. The reduction itself on
// CUDA needs NCCL, which only a GPU run covers.
#include <gtest/gtest.h>

#include <memory>

#include "comm/ddp.h"
#include "comm/hash_store.h"
#include "comm/init.h"
#include "device/device_test_util.h"
#include "layers/linear.h"
#include "support/errors.h"

namespace rg {
namespace {

using testing::kCuda;

TEST(DeviceDdp, GlooRefusesACudaModuleWithAReason) {
  RG_REQUIRE_DEVICE();
  auto group = dist::make_process_group("gloo", std::make_shared<dist::HashStore>(), 0, 1);
  EXPECT_EQ(group->tensor_device(), Device::cpu());
  Generator gen(1);
  auto model = std::make_shared<nn::Linear>(4, 3, gen);
  model->to(kCuda);
  testing::expect_error([&] { dist::DistributedDataParallel ddp(model, group); },
                        "the module is on cuda:0 but the gloo process group works on cpu (use "
                        "the nccl backend for CUDA modules)");
  // Half of the module back on the CPU: one device per module.
  model->named_parameters().back().second.impl()->storage =
      model->named_parameters().back().second.to(Device::cpu()).storage();
  testing::expect_error([&] { dist::DistributedDataParallel ddp(model, group); },
                        "DDP takes a module on one device");
}

}  // namespace
}  // namespace rg
