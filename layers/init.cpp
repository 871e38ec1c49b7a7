// Initializers (fan computations as in torch.nn.init._calculate_fan_in_and_fan_out).
#include "layers/init.h"

#include <cmath>

#include "engine/autograd/grad_mode.h"
#include "engine/ops/factory.h"
#include "kernels/error.h"

namespace rg::nn::init {

namespace {
int64_t receptive(const Tensor& w) {
  RG_CHECK(w.dim() >= 2, "init: fan in/out needs a tensor with at least 2 dims, got ",
           shape_str(w.shape()));
  int64_t r = 1;
  for (int64_t d = 2; d < w.dim(); ++d) r *= w.size(d);
  return r;
}
}  // namespace

int64_t fan_in(const Tensor& w) { return w.size(1) * receptive(w); }
int64_t fan_out(const Tensor& w) { return w.size(0) * receptive(w); }

void uniform_(Tensor& t, double bound, Generator& gen) {
  NoGradGuard no_grad;
  rg::uniform_(t, -bound, bound, gen);
}

void kaiming_uniform_(Tensor& w, double a, Generator& gen) {
  const double gain = std::sqrt(2.0 / (1.0 + a * a));
  uniform_(w, gain * std::sqrt(3.0 / double(fan_in(w))), gen);
}

void kaiming_normal_fan_out_(Tensor& w, Generator& gen) {
  NoGradGuard no_grad;
  rg::normal_(w, 0.0, std::sqrt(2.0 / double(fan_out(w))), gen);
}

}  // namespace rg::nn::init
