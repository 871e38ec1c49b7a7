// The op table (DESIGN.md section 11): one entry per engine op naming its forward, whether it is
// differentiable, its dtypes per device, its sample inputs and its bad inputs with their errors.
// tests/ops/op_table_test.cpp turns every entry into checks; adding an op is adding an entry.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "engine/tensor.h"
#include "support/gradcheck.h"

namespace rg::testing {

using OpFn = std::function<Tensor(const std::vector<Tensor>&)>;

// One call of an op. Floating inputs are f64 on the CPU (the harness converts them to the dtype
// and device under test); integer inputs (class targets) are used as they are.
struct OpSample {
  std::string name;
  std::vector<Tensor> inputs;
  OpFn forward = {};         // empty: the entry's; set when the non-tensor arguments differ
  int64_t grad_inputs = -1;  // the first grad_inputs floating inputs are differentiated (-1: all);
                             // the others are constants (running statistics)
  bool gradcheck = true;     // false for the models' shapes: too many elements to probe one by one
  bool empty_batch = false;  // a batch of 0 samples: must work, with all-zero gradients
};

// A call that must throw an rg::Error whose message contains `fragment`. Inputs as in OpSample
// but used with the dtypes given (a dtype mismatch is a bad input).
struct OpBadInput {
  std::string name;
  std::vector<Tensor> inputs;
  std::string fragment;
  OpFn forward = {};  // empty: the entry's; the error must be the same on every device
};

struct OpEntry {
  std::string name;  // the engine function's name
  OpFn forward;
  bool differentiable = true;
  // f16 and bf16 on the CPU compute in f32 through conversions (engine/ops/autocast_policy.h)
  // and are checked against f32 as the CUDA half types are.
  std::vector<DType> cpu_dtypes = {DType::f32, DType::f64, DType::f16, DType::bf16};
  std::vector<DType> cuda_dtypes = {DType::f32, DType::f64, DType::f16, DType::bf16};
  std::function<std::vector<OpSample>()> samples;
  std::function<std::vector<OpBadInput>()> bad_inputs;
  GradcheckOptions gradcheck_options;
  // CUDA f16/bf16 against the CPU in f32 on the same rounded inputs: tolerance_for(dtype) times
  // this, for ops whose result rounds more than once in the half type (reductions, GEMM).
  double half_tolerance_scale = 1.0;
  bool host_result = false;  // the result is a host value even for CUDA inputs (counts)
  // Which TF32 switch (engine/tf32.h) lets f32 run on TF32 tensor cores on CUDA: the harness
  // compares f32 with TF32 off at f32's tolerance and again with it on at kTf32Tolerance.
  enum class Tf32 { none, conv, matmul };
  Tf32 tf32 = Tf32::none;
};

// Every entry, in a fixed order; names are unique.
const std::vector<OpEntry>& op_table();
const OpEntry& op_entry(const std::string& name);
std::vector<std::string> op_names();

}  // namespace rg::testing
