// How ops apply autocast (engine/autocast.h) and run f16/bf16 on the CPU. Internal to the ops.
//
// An op's entry point, in this order: (1) autocast: `if (auto c = autocast_inputs(policy, {...}))`
// re-enters the op with the cast inputs; (2) its checks (check_inputs: one dtype); (3) on the CPU,
// `if (cpu_half_inputs({...}))` re-enters it in f32 on half_to_f32 copies and converts the result
// back, since CPU kernels compute in f32 and f64 only (PyTorch's CPU f16/bf16 kernels also
// compute in f32 and round each result once); (4) its kernels. A lower-precision op takes its f32
// route under NoAutocastGuard, or autocast would cast the f32 copies straight back.
#pragma once

#include <initializer_list>
#include <optional>
#include <vector>

#include "engine/tensor.h"

namespace rg {

enum class AutocastPolicy {
  lower,    // conv2d, linear, matmul, causal_attention: the guard's f16 or bf16
  f32,      // losses, softmax, sum, exp, log, pow, layer_norm: f32
  promote,  // binary ops: the widest floating dtype among the inputs
};

// When autocast is on for the device of the first defined input and `policy` changes the dtype
// of some input: every input, the eligible ones cast (defined floating tensors, never f64 under
// lower and f32, as in PyTorch); otherwise nullopt and the op runs on its inputs as they are.
std::optional<std::vector<Tensor>> autocast_inputs(AutocastPolicy policy,
                                                   std::initializer_list<Tensor> inputs);

// Whether some defined input is a f16 or bf16 tensor on the CPU.
bool cpu_half_inputs(std::initializer_list<Tensor> inputs);
// t converted to f32 when it is f16 or bf16 (differentiably), otherwise t itself.
Tensor half_to_f32(const Tensor& t);

}  // namespace rg
