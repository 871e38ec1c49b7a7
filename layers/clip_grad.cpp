// clip_grad_norm_ and clip_grad_value_ over engine/ops/grad_clip.h: one total_norm per (device,
// dtype) group of gradients, then the coefficient applied on the device.
#include "layers/clip_grad.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "engine/autograd/grad_mode.h"
#include "engine/ops/factory.h"
#include "engine/ops/grad_clip.h"
#include "kernels/error.h"

namespace rg::nn::utils {
namespace {

// The defined gradients of `parameters`.
std::vector<Tensor> gradients(const std::vector<Tensor>& parameters) {
  std::vector<Tensor> grads;
  for (const Tensor& p : parameters) {
    RG_CHECK(p.defined(), "clip_grad: a parameter is an undefined tensor");
    Tensor g = p.grad();
    if (g.defined()) grads.push_back(std::move(g));
  }
  return grads;
}

}  // namespace

Tensor clip_grad_norm_(const std::vector<Tensor>& parameters, double max_norm, double norm_type,
                       bool error_if_nonfinite) {
  RG_CHECK(max_norm >= 0.0, "clip_grad_norm_: max_norm must be >= 0, got ", max_norm);
  RG_CHECK(norm_type > 0.0, "clip_grad_norm_: norm_type must be > 0 (or inf), got ", norm_type);
  NoGradGuard no_grad;
  std::vector<Tensor> grads = gradients(parameters);
  if (grads.empty()) return zeros({});
  // Group by (device, dtype) in order of first appearance, as PyTorch's foreach grouping.
  std::vector<std::vector<Tensor>> groups;
  for (Tensor& g : grads) {
    auto it = std::find_if(groups.begin(), groups.end(), [&](const std::vector<Tensor>& group) {
      return group[0].device() == g.device() && group[0].dtype() == g.dtype();
    });
    if (it == groups.end()) {
      groups.push_back({g});
    } else {
      it->push_back(g);
    }
  }
  Tensor total;
  if (groups.size() == 1) {
    total = total_norm(groups[0], norm_type);
  } else {
    const Device device = groups[0][0].device();
    const DType dtype = groups[0][0].dtype();
    std::vector<Tensor> norms;
    for (const auto& group : groups)
      norms.push_back(total_norm(group, norm_type).to(device).to(dtype));
    total = total_norm(norms, norm_type);
  }
  if (error_if_nonfinite) {
    const double t = total.item();  // one read back, as PyTorch's check
    RG_CHECK(std::isfinite(t), "clip_grad_norm_: the total norm of order ", norm_type,
             " of the gradients is ", t,
             ", so they cannot be clipped; to scale them by it anyway, pass "
             "error_if_nonfinite = false");
  }
  for (Tensor& g : grads) {
    const Tensor norm = total.device() == g.device() && total.dtype() == g.dtype()
                            ? total
                            : total.to(g.device()).to(g.dtype());
    scale_by_clip_coef_(g, norm, max_norm);
  }
  return total;
}

void clip_grad_value_(const std::vector<Tensor>& parameters, double clip_value) {
  RG_CHECK(clip_value >= 0.0, "clip_grad_value_: clip_value must be >= 0, got ", clip_value);
  NoGradGuard no_grad;
  for (Tensor& g : gradients(parameters)) clamp_(g, -clip_value, clip_value);
}

}  // namespace rg::nn::utils
