// dropout: a Philox mask holding 0 or 1/(1-p) per element, multiplied in; the backward multiplies
// the gradient by the same saved mask.
#include "engine/ops/dropout.h"

#include "engine/autograd/function.h"
#include "engine/cuda/graph.h"
#include "engine/dispatch.h"
#include "engine/ops/autocast_policy.h"
#include "engine/ops/binary.h"
#include "engine/ops/check.h"
#include "engine/ops/factory.h"
#include "kernels/cpu/cast.h"
#include "kernels/dropout.h"
#include "kernels/error.h"

namespace rg {

using autograd::SavedTensor;

Tensor dropout(const Tensor& x, double p, bool training, Generator& gen) {
  if (cpu_half_inputs({x})) return dropout(half_to_f32(x), p, training, gen).to(x.dtype());
  check_inputs("dropout", {x}, Formats::alike);
  RG_CHECK(p >= 0.0 && p <= 1.0, "dropout: probability p must be in [0, 1], got ", p);
  if (!training || p == 0.0) return x;
  // Like PyTorch, p == 1 multiplies by zero rather than by 1/(1-p) = inf, and draws nothing.
  if (p == 1.0) return mul(x, 0.0);
  const int64_t n = x.numel();
  const philox::Offset offset = cuda::philox_offset(gen, uint64_t(n + 3) / 4, x.device());
  Tensor mask = empty_like(x);
  Tensor out = empty_like(x);
  dispatch_on(x.device(), x.dtype(), "dropout", [&]<class T, class B>() {
    kernels::Dropout<B>::forward(x.data<T>(), out.data<T>(), mask.data<T>(), n, p,
                                 kernels::cpu::convert<T>(1.0 / (1.0 - p)), gen.seed(), offset,
                                 kernel_ctx(x));
  });
  return autograd::record(out, "DropoutBackward", {x}, [sm = SavedTensor(mask)](const Tensor& g) {
    const Tensor m = sm.get();
    Tensor grad_in = empty_like(m);
    dispatch_on(m.device(), m.dtype(), "dropout backward", [&]<class T, class B>() {
      kernels::Dropout<B>::backward(g.data<T>(), m.data<T>(), grad_in.data<T>(), m.numel(),
                                    kernel_ctx(m));
    });
    return std::vector<Tensor>{grad_in};
  });
}

}  // namespace rg
