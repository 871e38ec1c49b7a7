// Autocast's casting rules and the CPU's f16/bf16 route (engine/ops/autocast_policy.h).
#include "engine/ops/autocast_policy.h"

#include "engine/autocast.h"

namespace rg {
namespace {

// The rank of a floating dtype in promotion: f16 and bf16 meet in f32, as in PyTorch.
DType wider(DType a, DType b) {
  if (a == b) return a;
  if (a == DType::f64 || b == DType::f64) return DType::f64;
  return DType::f32;
}

}  // namespace

std::optional<std::vector<Tensor>> autocast_inputs(AutocastPolicy policy,
                                                   std::initializer_list<Tensor> inputs) {
  const Tensor* first = nullptr;
  for (const Tensor& t : inputs)
    if (t.defined()) {
      first = &t;
      break;
    }
  if (first == nullptr || !autocast_enabled(first->device().type)) return std::nullopt;
  std::optional<DType> target;
  switch (policy) {
    case AutocastPolicy::lower:
      target = autocast_dtype(first->device().type);
      break;
    case AutocastPolicy::f32:
      target = DType::f32;
      break;
    case AutocastPolicy::promote:
      for (const Tensor& t : inputs)
        if (t.defined() && is_floating(t.dtype()))
          target = target ? wider(*target, t.dtype()) : t.dtype();
      break;
  }
  if (!target) return std::nullopt;
  const auto eligible = [&](const Tensor& t) {
    return t.defined() && is_floating(t.dtype()) && t.dtype() != *target &&
           (policy == AutocastPolicy::promote || t.dtype() != DType::f64);
  };
  bool changes = false;
  for (const Tensor& t : inputs) changes = changes || eligible(t);
  if (!changes) return std::nullopt;
  std::vector<Tensor> out;
  out.reserve(inputs.size());
  for (const Tensor& t : inputs) out.push_back(eligible(t) ? t.to(*target) : t);
  return out;
}

bool cpu_half_inputs(std::initializer_list<Tensor> inputs) {
  for (const Tensor& t : inputs)
    if (t.defined() && t.device().is_cpu() && is_half(t.dtype())) return true;
  return false;
}

Tensor half_to_f32(const Tensor& t) {
  return t.defined() && is_half(t.dtype()) ? t.to(DType::f32) : t;
}

}  // namespace rg
