// DDP with the module on a CUDA device, across real processes (label dist, started by
// ringgrad-run), on the emulated devices of rg_engine_emu: buckets on the device, gradients copied
// and scaled into them by the device kernels, the comm hooks' casts, the final write-back, and
// the host bookkeeping of a group whose tensors live on the device. RG_TEST_BACKEND picks the
// group: "nccl" is ProcessGroupNCCL over the emulated NCCL (its own communication stream,
// overlapping backward, ordered by events); "gloo" (default) is gloo behind DeviceStagingGroup,
// which stages every collective through host copies. N ranks with batch B must match one CPU
// process with batch N*B.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <map>
#include <numeric>

#include "comm/ddp.h"
#include "comm/init.h"
#include "comm/prefix_store.h"
#include "engine/ops/binary.h"
#include "engine/ops/factory.h"
#include "engine/ops/loss.h"
#include "engine/trace.h"
#include "layers/models/mlp.h"
#include "layers/optim/optimizer.h"
#include "kernels/error.h"
#include "support/parameter_difference.h"

namespace rg::dist {
namespace {

using namespace std::chrono_literals;

bool nccl_group() {
  const char* b = std::getenv("RG_TEST_BACKEND");
  return b != nullptr && std::strcmp(b, "nccl") == 0;
}

class DistEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    InitOptions o;
    o.backend = nccl_group() ? "nccl" : "gloo";
    o.group.timeout = 60s;
    init_process_group(o);
  }
  void TearDown() override { destroy_process_group(); }
};
const auto* const kEnv = ::testing::AddGlobalTestEnvironment(new DistEnvironment);

// A group whose tensors live on `device`, running `inner` (a CPU group) on host copies: each
// collective copies its device tensors to the host, runs there, and copies results back when the
// inner work completes, before its own Work completes.
class DeviceStagingGroup final : public ProcessGroup {
 public:
  DeviceStagingGroup(std::shared_ptr<ProcessGroup> inner, Device device)
      : ProcessGroup(inner->rank(), inner->size(), inner->options()),
        inner_(std::move(inner)),
        device_(device) {}

  const char* backend() const override { return "staged-gloo"; }
  Device tensor_device() const override { return device_; }

  WorkPtr all_reduce(const Tensor& t, ReduceOp op) override {
    const Tensor host = to_host(t);
    return staged("all_reduce", inner_->all_reduce(host, op), t, host);
  }
  WorkPtr broadcast(const Tensor& t, int root) override {
    const Tensor host = to_host(t);
    return staged("broadcast", inner_->broadcast(host, root), t, host);
  }
  WorkPtr all_gather(const Tensor& out, const Tensor& in) override {
    const Tensor host_out = to_host(out);
    return staged("all_gather", inner_->all_gather(host_out, to_host(in)), out, host_out);
  }
  WorkPtr reduce_scatter(const Tensor& out, const Tensor& in, ReduceOp op) override {
    const Tensor host_out = to_host(out);
    return staged("reduce_scatter", inner_->reduce_scatter(host_out, to_host(in), op), out,
                  host_out);
  }
  WorkPtr barrier() override { return inner_->barrier(); }
  WorkPtr send(const Tensor& t, int dst, uint32_t tag) override {
    return inner_->send(to_host(t), dst, tag);
  }
  WorkPtr recv(const Tensor& t, int src, uint32_t tag) override {
    const Tensor host = to_host(t);
    return staged("recv", inner_->recv(host, src, tag), t, host);
  }

  int64_t staged_ops() const { return staged_ops_; }

 private:
  Tensor to_host(const Tensor& t) const {
    EXPECT_EQ(t.device(), device_) << "a collective got a tensor on " << t.device().str();
    return t.to(Device::cpu()).detach();
  }
  WorkPtr staged(const char* op, const WorkPtr& inner, const Tensor& device_out,
                 const Tensor& host_out) {
    auto work = std::make_shared<Work>(op, uint64_t(++staged_ops_));
    work->mark_started();
    inner->on_complete([work, device_out, host_out](const Work& w) {
      std::exception_ptr error = w.exception();
      if (!error) {
        try {
          Tensor out = device_out;
          out.copy_(host_out);
        } catch (...) {
          error = std::current_exception();
        }
      }
      work->finish(error);
    });
    return work;
  }

  std::shared_ptr<ProcessGroup> inner_;
  Device device_;
  int64_t staged_ops_ = 0;
};

constexpr int64_t kB = 8, kIn = 20, kClasses = 5;

// As in ddp_test.cpp: in f64 the device run and the CPU run agree to rounding (~1e-16), so the
// exact-equivalence checks use f64; in f32 a rounding-flipped ReLU could move a parameter by
// ~1e-5, so the f32 runs are held to 1e-4.
constexpr double kExactTolerance = 1e-12;
constexpr double kF32Tolerance = 1e-4;
double tolerance(DType dtype) { return dtype == DType::f64 ? kExactTolerance : kF32Tolerance; }

// The group DDP runs on: the NCCL default group itself, or gloo staged through the host.
std::shared_ptr<ProcessGroup> device_group() {
  if (nccl_group()) return default_group();
  return std::make_shared<DeviceStagingGroup>(default_group(), Device::cuda(0));
}

double ddp_on_device_vs_single_cpu_process(const DdpOptions& options, int steps,
                                           DType dtype = DType::f32, int accumulation = 1) {
  auto pg = default_group();
  const int n = pg->size(), r = pg->rank();
  auto group = device_group();
  const Device device = group->tensor_device();
  RG_CHECK(device.is_cuda(), "the device group must keep its tensors on a CUDA device");
  Generator g1(3), g2(3), data(5);
  auto ref = std::make_shared<nn::MLP>(kIn, std::vector<int64_t>{32, 16}, kClasses, g1);
  auto model = std::make_shared<nn::MLP>(kIn, std::vector<int64_t>{32, 16}, kClasses, g2);
  ref->to(dtype);
  model->to(dtype);
  model->to(device);
  DistributedDataParallel ddp(model, group, options);
  optim::Sgd ref_opt(ref->parameters(), {.lr = 0.1, .momentum = 0.9});
  optim::Sgd opt(model->parameters(), {.lr = 0.1, .momentum = 0.9});
  const int64_t global = n * kB;
  for (int step = 0; step < steps; ++step) {
    const Tensor x = rand({global, kIn}, data).to(dtype);
    std::vector<int64_t> labels(static_cast<size_t>(global));
    for (int64_t i = 0; i < global; ++i) labels[size_t(i)] = (i * 3 + step) % kClasses;
    const Tensor y = from_vector<int64_t>(labels, {global});
    ref_opt.zero_grad();
    cross_entropy(ref->forward(x), y).backward();
    ref_opt.step();

    opt.zero_grad(/*set_to_none=*/!options.gradient_as_bucket_view);
    // The rank's kB rows in `accumulation` micro-batches, all but the last under no_sync; the
    // loss of each is scaled so that the sum is the mean over the rank's rows.
    const int64_t micro = kB / accumulation;
    for (int m = 0; m < accumulation; ++m) {
      const Tensor mine_x = x.narrow(0, r * kB + m * micro, micro).to(device);
      const Tensor mine_y = y.narrow(0, r * kB + m * micro, micro).to(device);
      auto run = [&] {
        Tensor loss = cross_entropy(ddp(mine_x), mine_y);
        if (accumulation > 1) loss = loss * (1.0 / accumulation);
        loss.backward();
      };
      if (m + 1 < accumulation) {
        auto guard = ddp.no_sync();
        run();
      } else {
        run();
      }
    }
    opt.step();
  }
  for (const Tensor& p : model->parameters()) EXPECT_TRUE(p.device().is_cuda());
  if (auto* staged = dynamic_cast<DeviceStagingGroup*>(group.get())) {
    EXPECT_GT(staged->staged_ops(), 0);
  }
  return testing::relative_parameter_difference(*model, *ref);
}

TEST(DdpOnDevice, MlpMatchesOneCpuProcessWithTheWholeBatch) {
  ASSERT_GE(default_group()->size(), 2) << "run through ringgrad-run --nproc-per-node N (N >= 2)";
  for (DType dtype : {DType::f64, DType::f32})
    for (bool view : {false, true}) {
      DdpOptions o;
      o.gradient_as_bucket_view = view;
      o.bucket_cap_mb = 0.002;  // several buckets
      o.first_bucket_mb = 0.001;
      const double d = ddp_on_device_vs_single_cpu_process(o, 4, dtype);
      EXPECT_LE(d, tolerance(dtype)) << dtype_name(dtype) << " gradient_as_bucket_view=" << view;
    }
}

TEST(DdpOnDevice, Fp16HookStaysWithinItsTolerance) {
  DdpOptions o;
  o.comm_hook = CommHook::fp16;
  o.bucket_cap_mb = 0.002;
  EXPECT_LE(ddp_on_device_vs_single_cpu_process(o, 4), 1e-3);
}

TEST(DdpOnDevice, Bf16HookStaysWithinItsTolerance) {
  DdpOptions o;
  o.comm_hook = CommHook::bf16;
  o.bucket_cap_mb = 0.002;
  EXPECT_LE(ddp_on_device_vs_single_cpu_process(o, 4), 2e-2);
}

TEST(DdpOnDevice, NoSyncAccumulationMatchesTheWholeBatch) {
  DdpOptions o;
  o.bucket_cap_mb = 0.002;
  EXPECT_LE(ddp_on_device_vs_single_cpu_process(o, 3, DType::f64, /*accumulation=*/2),
            kExactTolerance);
}

TEST(DdpOnDevice, OurRingAllReduceMatchesTheWholeBatch) {
  auto pg = default_group();
  pg->set_algorithm(Algorithm::ring);
  DdpOptions o;
  o.bucket_cap_mb = 0.002;
  const double d = ddp_on_device_vs_single_cpu_process(o, 3, DType::f64);
  pg->set_algorithm(Algorithm::native);
  EXPECT_LE(d, kExactTolerance);
}

TEST(DdpOnDevice, FindUnusedParametersWorksOnTheDevice) {
  DdpOptions o;
  o.find_unused_parameters = true;  // the used flags go through the device group
  EXPECT_LE(ddp_on_device_vs_single_cpu_process(o, 2, DType::f64), kExactTolerance);
}

// A gloo group of the same ranks (for the NCCL runs, whose default group is NCCL): the CPU DDP
// that the device DDP is compared with.
std::shared_ptr<ProcessGroup> cpu_group() {
  if (!nccl_group()) return default_group();
  static std::shared_ptr<ProcessGroup> gloo = make_process_group(
      "gloo", std::make_shared<PrefixStore>("cpu-reference", default_store()),
      default_group()->rank(), default_group()->size(), default_group()->options());
  return gloo;
}

// DDP with `options` on the device group and on a CPU gloo group, step by step on the same data,
// and one CPU process with the whole batch and no hook. Returns (device vs CPU DDP, device vs
// whole batch).
std::pair<double, double> hooked_ddp_on_device_vs_on_cpu(const DdpOptions& options, int steps) {
  auto pg = default_group();
  const int n = pg->size(), r = pg->rank();
  auto group = device_group();
  const Device device = group->tensor_device();
  Generator g1(3), g2(3), g3(3), data(5);
  const std::vector<int64_t> hidden{32, 16};
  auto whole = std::make_shared<nn::MLP>(kIn, hidden, kClasses, g1);
  auto cpu = std::make_shared<nn::MLP>(kIn, hidden, kClasses, g2);
  auto model = std::make_shared<nn::MLP>(kIn, hidden, kClasses, g3);
  model->to(device);
  DistributedDataParallel ddp(model, group, options);
  DistributedDataParallel cpu_ddp(cpu, cpu_group(), options);
  const optim::SgdOptions sgd{.lr = 0.1, .momentum = 0.9};
  optim::Sgd whole_opt(whole->parameters(), sgd), cpu_opt(cpu->parameters(), sgd),
      opt(model->parameters(), sgd);
  const int64_t global = n * kB;
  for (int step = 0; step < steps; ++step) {
    const Tensor x = rand({global, kIn}, data);
    std::vector<int64_t> labels(static_cast<size_t>(global));
    for (int64_t i = 0; i < global; ++i) labels[size_t(i)] = (i * 3 + step) % kClasses;
    const Tensor y = from_vector<int64_t>(labels, {global});
    whole_opt.zero_grad();
    cross_entropy(whole->forward(x), y).backward();
    whole_opt.step();
    const Tensor mine_x = x.narrow(0, r * kB, kB), mine_y = y.narrow(0, r * kB, kB);
    cpu_opt.zero_grad();
    cross_entropy(cpu_ddp(mine_x), mine_y).backward();
    cpu_opt.step();
    opt.zero_grad();
    cross_entropy(ddp(mine_x.to(device)), mine_y.to(device)).backward();
    opt.step();
  }
  return {testing::relative_parameter_difference(*model, *cpu),
          testing::relative_parameter_difference(*model, *whole)};
}

TEST(DdpOnDevice, PowerSgdOnTheDeviceFollowsPowerSgdOnTheCpu) {
  // Rank 1 loses most of each matrix, so the run leaves the exact one (checked: the hook really
  // compressed), while the device run (cuBLAS factors, Gram-Schmidt kernel, error feedback and
  // warm start on the device, both rounds on the communication stream) stays with the CPU run.
  DdpOptions o;
  o.comm_hook = CommHook::powersgd;
  o.powersgd.rank = 1;
  o.powersgd.start_iter = 2;
  o.bucket_cap_mb = 0.002;  // several buckets, each with its own factors
  o.first_bucket_mb = 0.001;
  const auto [vs_cpu, vs_whole] = hooked_ddp_on_device_vs_on_cpu(o, 6);
  EXPECT_LE(vs_cpu, kF32Tolerance);
  EXPECT_GT(vs_whole, 10 * kF32Tolerance) << "PowerSGD did not compress";
  if (default_group()->rank() == 0)
    std::cout << "powersgd on the device: vs cpu " << vs_cpu << ", vs whole batch " << vs_whole
              << "\n";
}

TEST(DdpOnDevice, TheTraceShowsAllReducesOnTheNcclStreamOverlappingBackwardKernels) {
  if (!nccl_group()) GTEST_SKIP() << "the NCCL group's stream spans (RG_TEST_BACKEND=nccl)";
  auto group = default_group();
  Generator gen(3), data(5);
  auto model = std::make_shared<nn::MLP>(kIn, std::vector<int64_t>{256, 256, 128}, kClasses, gen);
  model->to(group->tensor_device());
  DdpOptions o;
  o.bucket_cap_mb = 0.1;  // a bucket per layer or two, launched while backward goes on
  o.first_bucket_mb = 0.01;
  DistributedDataParallel ddp(model, group, o);
  trace::take_events();
  trace::set_enabled(true);
  constexpr int kSteps = 4;
  for (int step = 0; step < kSteps; ++step) {
    const Tensor x = rand({64, kIn}, data).to(group->tensor_device());
    const Tensor y = from_vector<int64_t>(std::vector<int64_t>(64, step % kClasses), {64});
    cross_entropy(ddp(x), y.to(group->tensor_device())).backward();
  }
  trace::set_enabled(false);
  const std::vector<trace::Event> events = trace::take_events();
  std::map<int, std::string> lanes;
  for (const auto& [lane, name] : trace::lane_names()) lanes[lane] = name;
  auto on_lane = [&](const trace::Event& e, const std::string& part) {
    return lanes.count(e.lane) && lanes[e.lane].find(part) != std::string::npos;
  };
  std::vector<const trace::Event*> reduces, kernels;
  for (const auto& e : events) {
    if (e.phase != 'X') continue;
    if (on_lane(e, "NCCL stream") && e.name.rfind("all_reduce", 0) == 0) reduces.push_back(&e);
    if (on_lane(e, " stream") && e.category == "backward kernels") kernels.push_back(&e);
  }
  std::string lane_list;
  for (const auto& [lane, name] : lanes) lane_list += " '" + name + "'";
  ASSERT_FALSE(kernels.empty()) << "no backward kernel spans on a stream's lane; lanes:"
                                << lane_list << ", " << events.size() << " events";
  // The buckets (rebuilt once) of every step, each on the communication stream's lane.
  ASSERT_GE(reduces.size(), size_t(2 * kSteps));
  int overlapping = 0;
  for (const auto* r : reduces)
    for (const auto* k : kernels)
      if (r->ts_us < k->ts_us + k->dur_us && k->ts_us < r->ts_us + r->dur_us) {
        ++overlapping;
        break;
      }
  EXPECT_GT(overlapping, 0) << "no all-reduce ran while a backward kernel ran (" << reduces.size()
                            << " all-reduces, " << kernels.size() << " backward kernels)";
  if (group->rank() == 0)
    std::cout << overlapping << " of " << reduces.size()
              << " all-reduces overlapped backward kernels on the stream lanes\n";
}

}  // namespace
}  // namespace rg::dist
