// The op table's harness: every entry of tests/ops/op_table.cpp becomes f64 gradient checks,
// bitwise determinism, empty-batch and bad-input tests on the CPU (rg_op_table_tests, labels
// gradcheck and unit) and, built again with RG_OP_TABLE_DEVICE into the device test executables
// (rg_emu_engine_tests: label emu; rg_gpu_device_tests: label gpu), CPU vs CUDA comparisons of
// outputs, gradients and updated constants per dtype, device determinism and the bad inputs there.
#include "ops/op_table.h"

#include <gtest/gtest.h>

#include <cstring>
#include <optional>
#include <set>

#include "device/device_test_util.h"
#include "engine/autocast.h"
#include "engine/autograd/grad_mode.h"
#include "support/errors.h"
#include "support/gradcheck.h"

namespace rg::testing {
namespace {

using V = std::vector<Tensor>;

const OpFn& forward_of(const OpEntry& e, const OpSample& s) {
  return s.forward ? s.forward : e.forward;
}

// Whether input i of s is differentiated: floating, and among the first grad_inputs floating ones.
std::vector<bool> differentiated(const OpSample& s) {
  std::vector<bool> d;
  int64_t floating = 0;
  for (const Tensor& t : s.inputs) {
    const bool f = t.defined() && is_floating(t.dtype());
    d.push_back(f && (s.grad_inputs < 0 || floating < s.grad_inputs));
    floating += f ? 1 : 0;
  }
  return d;
}

// The sample's inputs as `dtype` (floating ones) on `device`, fresh copies; differentiated ones
// are leaves requiring grad when `grad`.
V prepare(const OpSample& s, DType dtype, Device device, bool grad) {
  const std::vector<bool> d = differentiated(s);
  V out;
  for (size_t i = 0; i < s.inputs.size(); ++i) {
    const Tensor& t = s.inputs[i];
    Tensor c = is_floating(t.dtype()) ? t.to(dtype) : t;
    c = c.detach().clone().to(device).detach();
    if (grad && d[i]) c.set_requires_grad(true);
    out.push_back(c);
  }
  return out;
}

// Forward, then backward of sum(out * upstream) when the op is differentiable. `upstream` is
// made from a fixed generator on the first call (its shape is the output's).
struct OpRun {
  Tensor out;
  V grads;   // per input: its gradient (undefined when not differentiated)
  V inputs;  // the inputs after the call (constants updated in place: running statistics)
};
OpRun run(const OpEntry& e, const OpSample& s, DType dtype, Device device, Tensor& upstream) {
  OpRun r;
  r.inputs = prepare(s, dtype, device, e.differentiable);
  r.out = forward_of(e, s)(r.inputs);
  if (!e.differentiable) return r;
  if (!upstream.defined()) {
    Generator gen(1234);
    upstream = random_tensor(r.out.shape(), gen, DType::f64);
  }
  if (r.out.requires_grad()) {
    sum(mul(r.out, upstream.to(r.out.dtype()).to(r.out.device()))).backward();
  }
  for (const Tensor& t : r.inputs) r.grads.push_back(t.requires_grad() ? t.grad() : Tensor());
  return r;
}

std::vector<unsigned char> bytes_of(const Tensor& t) {
  const Tensor c = t.to(Device::cpu());
  std::vector<unsigned char> b(c.nbytes());
  if (!b.empty()) std::memcpy(b.data(), c.raw_data(), b.size());
  return b;
}

// Two runs give the same bits: output, every gradient and every input after the call.
void expect_bitwise_equal(const OpRun& a, const OpRun& b, const std::string& what) {
  EXPECT_EQ(bytes_of(a.out), bytes_of(b.out)) << what << ": output";
  for (size_t i = 0; i < a.grads.size(); ++i) {
    if (!a.grads[i].defined()) continue;
    EXPECT_EQ(bytes_of(a.grads[i]), bytes_of(b.grads[i])) << what << ": gradient of input " << i;
  }
  for (size_t i = 0; i < a.inputs.size(); ++i) {
    if (!a.inputs[i].defined()) continue;
    EXPECT_EQ(bytes_of(a.inputs[i]), bytes_of(b.inputs[i])) << what << ": input " << i << " after";
  }
}

V bad_inputs_on(const OpBadInput& b, Device device) {
  V out;
  for (const Tensor& t : b.inputs) out.push_back(t.defined() ? t.to(device) : t);
  return out;
}

std::string name_of(const ::testing::TestParamInfo<std::string>& info) { return info.param; }

// Every sample of e in `dtype` on `device` against the CPU: the output, every gradient and every
// input after the call (running statistics) within tolerance_for(dtype) (device_test_util.h). The
// half types run against the CPU in f32 on the same rounded inputs and upstream gradient, with the
// entry's half_tolerance_scale.
void expect_matches_cpu(const OpEntry& e, DType dtype, Device device,
                        std::optional<Tolerance> tolerance = std::nullopt) {
  const bool half = is_half(dtype);
  Tolerance tol = tolerance.value_or(tolerance_for(dtype));
  if (half) tol = {tol.atol * e.half_tolerance_scale, tol.rtol * e.half_tolerance_scale};
  for (const OpSample& original : e.samples()) {
    SCOPED_TRACE(original.name + " in " + dtype_name(dtype) + " on " + device.str());
    // The half types: both runs start from the inputs rounded to the half type.
    OpSample s = original;
    if (half)
      for (Tensor& t : s.inputs)
        if (t.defined() && is_floating(t.dtype())) t = t.to(dtype).to(DType::f64);
    Tensor upstream;
    const OpRun dev_probe = run(e, s, dtype, device, upstream);
    if (half && upstream.defined()) upstream = upstream.to(dtype).to(DType::f64);
    const OpRun dev = run(e, s, dtype, device, upstream);
    const OpRun cpu = run(e, s, half ? DType::f32 : dtype, Device::cpu(), upstream);
    if (!e.host_result) {
      EXPECT_TRUE(dev.out.device() == device) << "the output is on " << dev.out.device().str();
    }
    EXPECT_EQ(dev.out.dtype(),
              is_floating(cpu.out.dtype()) && !e.host_result ? dtype : cpu.out.dtype());
    expect_close(dev.out, cpu.out, tol.atol, tol.rtol, "forward");
    for (size_t i = 0; i < cpu.grads.size(); ++i) {
      ASSERT_EQ(dev.grads[i].defined(), cpu.grads[i].defined()) << "gradient of input " << i;
      if (!cpu.grads[i].defined()) continue;
      EXPECT_TRUE(dev.grads[i].device() == device) << "gradient of input " << i;
      EXPECT_EQ(dev.grads[i].dtype(), dtype) << "gradient of input " << i;
      expect_close(dev.grads[i], cpu.grads[i], tol.atol, tol.rtol,
                   "gradient of input " + std::to_string(i));
    }
    for (size_t i = 0; i < cpu.inputs.size(); ++i) {
      if (cpu.inputs[i].defined() && !cpu.inputs[i].requires_grad())
        expect_close(dev.inputs[i], cpu.inputs[i], tol.atol, tol.rtol,
                     "input " + std::to_string(i) + " after the call");
    }
  }
}

// PyTorch's autocast lists (aten/src/ATen/autocast_mode.cpp, CUDA), by the names of ringgrad's
// ops: cross_entropy is PyTorch's cross_entropy_loss, causal_attention its
// scaled_dot_product_attention (is_causal). An op on neither list follows its inputs: floating
// inputs of one dtype give that dtype, mixed ones the wider (type promotion).
const std::set<std::string> kPytorchLowerPrecision = {"conv2d", "linear", "matmul",
                                                      "causal_attention"};
const std::set<std::string> kPytorchF32 = {
    "softmax", "log_softmax", "nll_loss", "cross_entropy", "mse_loss",  "smooth_l1_loss",
    "sum",     "exp",         "log",      "pow",           "layer_norm"};

// The entry's first sample under AutocastGuard(device, low): the dtype its output has for f32 and
// for `low` inputs, and f32 for a mixed f32/low pair; gradients reach every input in its own dtype.
void expect_autocast_dtypes(const OpEntry& e, Device device, DType low) {
  const OpSample s = e.samples().front();
  const auto forward = [&](DType in_dtype, bool mixed) {
    V in = prepare(s, in_dtype, device, e.differentiable);
    if (mixed) {  // the first floating input f32, the others `low`
      for (Tensor& t : in)
        if (is_floating(t.dtype())) {
          const bool grad = t.requires_grad();
          t = t.detach().to(DType::f32);
          t.set_requires_grad(grad);
          break;
        }
    }
    Tensor out;
    {
      const AutocastGuard autocast(device, low);
      out = forward_of(e, s)(in);
    }
    if (out.requires_grad()) sum(out.to(DType::f64)).backward();
    for (const Tensor& t : in) {
      if (t.requires_grad() && t.grad().defined()) {
        EXPECT_EQ(t.grad().dtype(), t.dtype())
            << "gradient of a " << dtype_name(t.dtype()) << " input";
      }
    }
    return out;
  };
  int floating_inputs = 0;
  for (const Tensor& t : s.inputs) floating_inputs += t.defined() && is_floating(t.dtype());
  const Tensor from_f32 = forward(DType::f32, false);
  if (!is_floating(from_f32.dtype()) || e.host_result) return;  // indices, counts
  const Tensor from_low = forward(low, false);
  const std::string what =
      e.name + " under autocast(" + device.str() + ", " + dtype_name(low) + ")";
  if (kPytorchLowerPrecision.count(e.name)) {
    EXPECT_EQ(from_f32.dtype(), low) << what << " from f32 inputs";
    EXPECT_EQ(from_low.dtype(), low) << what << " from " << dtype_name(low) << " inputs";
  } else if (kPytorchF32.count(e.name)) {
    EXPECT_EQ(from_f32.dtype(), DType::f32) << what << " from f32 inputs";
    EXPECT_EQ(from_low.dtype(), DType::f32) << what << " from " << dtype_name(low) << " inputs";
  } else {
    EXPECT_EQ(from_f32.dtype(), DType::f32) << what << " from f32 inputs";
    EXPECT_EQ(from_low.dtype(), low) << what << " from " << dtype_name(low) << " inputs";
    if (floating_inputs == 2) {
      EXPECT_EQ(forward(low, true).dtype(), DType::f32)
          << what << " from f32 and " << dtype_name(low);
    }
  }
}

#ifndef RG_OP_TABLE_DEVICE

// ---- CPU: label gradcheck ----

class OpGradcheck : public ::testing::TestWithParam<std::string> {};

// Differentiable ops: central differences in f64 on every sample the entry allows it for. Others:
// no autograd history even from inputs that require grad.
TEST_P(OpGradcheck, F64CentralDifferences) {
  const OpEntry& e = op_entry(GetParam());
  for (const OpSample& s : e.samples()) {
    if (!s.gradcheck) continue;
    const V all = prepare(s, DType::f64, Device::cpu(), true);
    if (!e.differentiable) {
      EXPECT_FALSE(forward_of(e, s)(all).requires_grad()) << s.name;
      continue;
    }
    // gradcheck perturbs the differentiated inputs; the others are bound as constants.
    V leaves;
    std::vector<int> slot;
    for (size_t i = 0; i < all.size(); ++i) {
      if (!all[i].requires_grad()) continue;
      slot.push_back(int(i));
      leaves.push_back(all[i]);
    }
    const OpFn& f = forward_of(e, s);
    auto bound = [&](const V& xs) {
      V in = all;
      for (size_t j = 0; j < slot.size(); ++j) in[size_t(slot[j])] = xs[j];
      return f(in);
    };
    EXPECT_EQ(gradcheck(bound, leaves, e.gradcheck_options), "") << s.name;
  }
}

INSTANTIATE_TEST_SUITE_P(Ops, OpGradcheck, ::testing::ValuesIn(op_names()), name_of);

// ---- CPU: label unit ----

class OpTable : public ::testing::TestWithParam<std::string> {};

// Every sample twice in every CPU dtype: the same bits (no thread-count or order dependence).
TEST_P(OpTable, RepeatedRunsAreBitwiseEqual) {
  const OpEntry& e = op_entry(GetParam());
  for (DType dtype : e.cpu_dtypes) {
    for (const OpSample& s : e.samples()) {
      Tensor upstream;
      const OpRun a = run(e, s, dtype, Device::cpu(), upstream);
      const OpRun b = run(e, s, dtype, Device::cpu(), upstream);
      expect_bitwise_equal(a, b, s.name + " " + dtype_name(dtype));
    }
  }
}

// Every entry states what an empty batch does: it works (with all-zero gradients: nothing flows)
// or it is a bad input with a clear error.
TEST_P(OpTable, EmptyBatchWorksOrIsAClearError) {
  const OpEntry& e = op_entry(GetParam());
  int declared = 0;
  for (const OpSample& s : e.samples()) {
    if (!s.empty_batch) continue;
    ++declared;
    Tensor upstream;
    const OpRun r = run(e, s, DType::f32, Device::cpu(), upstream);
    EXPECT_TRUE(r.out.defined()) << s.name;
    for (size_t i = 0; i < r.grads.size(); ++i) {
      if (!r.inputs[i].requires_grad()) continue;
      if (!r.grads[i].defined()) continue;  // no gradient reached it: zero
      EXPECT_EQ(r.grads[i].shape(), r.inputs[i].shape()) << s.name << " input " << i;
      for (double g : r.grads[i].to_vector<double>()) EXPECT_EQ(g, 0.0) << s.name << " input " << i;
    }
  }
  for (const OpBadInput& b : e.bad_inputs())
    for (const Tensor& t : b.inputs) declared += t.defined() && t.dim() > 0 && t.size(0) == 0;
  EXPECT_GT(declared, 0) << e.name << " has no empty-batch sample or bad input";
}

// f16 and bf16 on the CPU (f32 compute through conversions) against f32 on the same rounded inputs.
TEST_P(OpTable, HalfTypesMatchF32) {
  const OpEntry& e = op_entry(GetParam());
  int tested = 0;
  for (DType dtype : e.cpu_dtypes) {
    if (!is_half(dtype)) continue;
    expect_matches_cpu(e, dtype, Device::cpu());
    ++tested;
  }
  if (tested == 0) GTEST_SKIP() << e.name << " has no f16/bf16 on the CPU";
}

// Under autocast each op runs in the dtype PyTorch's lists give it (expect_autocast_dtypes).
TEST_P(OpTable, AutocastFollowsPytorchsLists) {
  const OpEntry& e = op_entry(GetParam());
  if (std::count(e.cpu_dtypes.begin(), e.cpu_dtypes.end(), DType::bf16) == 0)
    GTEST_SKIP() << e.name << " writes into given tensors: not an autocast op, as in PyTorch";
  for (DType low : {DType::bf16, DType::f16}) expect_autocast_dtypes(e, Device::cpu(), low);
}

TEST_P(OpTable, BadInputsAreClearErrors) {
  const OpEntry& e = op_entry(GetParam());
  for (const OpBadInput& b : e.bad_inputs()) {
    SCOPED_TRACE(b.name);
    const OpFn& f = b.forward ? b.forward : e.forward;
    const V in = bad_inputs_on(b, Device::cpu());
    expect_error([&] { f(in); }, b.fragment);
  }
}

INSTANTIATE_TEST_SUITE_P(Ops, OpTable, ::testing::ValuesIn(op_names()), name_of);

#else  // RG_OP_TABLE_DEVICE

// ---- CUDA (emulated or real) against the CPU ----

using DeviceParam = std::tuple<std::string, DType>;

class OpTableDevice : public ::testing::TestWithParam<DeviceParam> {
 protected:
  void SetUp() override { RG_REQUIRE_DEVICE(); }
  const OpEntry& entry() const { return op_entry(std::get<0>(GetParam())); }
  DType dtype() const { return std::get<1>(GetParam()); }
  bool supported() const {
    const auto& d = entry().cuda_dtypes;
    return std::find(d.begin(), d.end(), dtype()) != d.end();
  }
};

// Every sample on CUDA against the CPU (expect_matches_cpu). A dtype the entry does not support on
// CUDA is a clear error.
TEST_P(OpTableDevice, MatchesTheCpu) {
  const OpEntry& e = entry();
  if (!supported()) {
    const OpSample s = e.samples().front();
    EXPECT_FALSE(error_of([&] { forward_of(e, s)(prepare(s, dtype(), kCuda, false)); }).empty())
        << e.name << " in " << dtype_name(dtype()) << " on CUDA: expected an rg::Error";
    return;
  }
  // f32 is compared as f32: TF32 off (OpTableDeviceTf32 below compares it with TF32 on).
  const cuda::Tf32Guard full_f32(false, false);
  expect_matches_cpu(e, dtype(), kCuda);
}

// Every sample twice on the device: the same bits.
TEST_P(OpTableDevice, RepeatedRunsAreBitwiseEqual) {
  const OpEntry& e = entry();
  if (!supported()) GTEST_SKIP() << dtype_name(dtype()) << " is not supported on CUDA";
  for (const OpSample& s : e.samples()) {
    Tensor upstream;
    const OpRun a = run(e, s, dtype(), kCuda, upstream);
    const OpRun b = run(e, s, dtype(), kCuda, upstream);
    expect_bitwise_equal(a, b, s.name);
  }
}

std::string device_name(const ::testing::TestParamInfo<DeviceParam>& info) {
  return std::get<0>(info.param) + "_" + dtype_name(std::get<1>(info.param));
}

INSTANTIATE_TEST_SUITE_P(Ops, OpTableDevice,
                         ::testing::Combine(::testing::ValuesIn(op_names()),
                                            ::testing::Values(DType::f32, DType::f64, DType::f16,
                                                              DType::bf16)),
                         device_name);

// f32 with TF32 allowed, for the ops whose f32 may run on TF32 tensor cores (cuDNN convolutions,
// cuBLAS products): within TF32's stated tolerance (kTf32Tolerance) of the CPU's f32. The emulator
// rounds their inputs to TF32 as the tensor cores do (kernels/emu/tf32.h).
class OpTableDeviceTf32 : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override { RG_REQUIRE_DEVICE(); }
};

TEST_P(OpTableDeviceTf32, MatchesTheCpuWithinTf32Tolerance) {
  const OpEntry& e = op_entry(GetParam());
  const cuda::Tf32Guard tf32(e.tf32 == OpEntry::Tf32::conv, e.tf32 == OpEntry::Tf32::matmul);
  expect_matches_cpu(e, DType::f32, kCuda, kTf32Tolerance);
}

std::vector<std::string> tf32_op_names() {
  std::vector<std::string> names;
  for (const OpEntry& e : op_table())
    if (e.tf32 != OpEntry::Tf32::none) names.push_back(e.name);
  return names;
}

INSTANTIATE_TEST_SUITE_P(Ops, OpTableDeviceTf32, ::testing::ValuesIn(tf32_op_names()), name_of);

class OpTableDeviceErrors : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override { RG_REQUIRE_DEVICE(); }
};

// Every bad input gives the CPU's error on CUDA too: one contract per op.
TEST_P(OpTableDeviceErrors, BadInputsAreTheCpusErrors) {
  const OpEntry& e = op_entry(GetParam());
  for (const OpBadInput& b : e.bad_inputs()) {
    SCOPED_TRACE(b.name);
    const OpFn& f = b.forward ? b.forward : e.forward;
    const V in = bad_inputs_on(b, kCuda);
    expect_error([&] { f(in); }, b.fragment);
  }
}

INSTANTIATE_TEST_SUITE_P(Ops, OpTableDeviceErrors, ::testing::ValuesIn(op_names()), name_of);

class OpTableDeviceAutocast : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override { RG_REQUIRE_DEVICE(); }
};

// Under autocast on CUDA each op runs in the dtype PyTorch's lists give it.
TEST_P(OpTableDeviceAutocast, FollowsPytorchsLists) {
  const OpEntry& e = op_entry(GetParam());
  if (std::count(e.cpu_dtypes.begin(), e.cpu_dtypes.end(), DType::bf16) == 0)
    GTEST_SKIP() << e.name << " writes into given tensors: not an autocast op, as in PyTorch";
  for (DType low : {DType::bf16, DType::f16}) {
    if (std::count(e.cuda_dtypes.begin(), e.cuda_dtypes.end(), low) == 0) continue;
    expect_autocast_dtypes(e, kCuda, low);
  }
}

INSTANTIATE_TEST_SUITE_P(Ops, OpTableDeviceAutocast, ::testing::ValuesIn(op_names()), name_of);

#endif  // RG_OP_TABLE_DEVICE

}  // namespace
}  // namespace rg::testing
