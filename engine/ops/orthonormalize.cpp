// orthonormalize_columns_: checks, an f64 scratch matrix on p's device, one kernel call.
#include "engine/ops/orthonormalize.h"

#include "engine/autograd/grad_mode.h"
#include "engine/dispatch.h"
#include "engine/ops/check.h"
#include "kernels/cpu/orthonormalize.h"
#include "kernels/cuda/orthonormalize.h"
#include "kernels/error.h"

namespace rg {

const Tensor& orthonormalize_columns_(const Tensor& p) {
  check_inputs("orthonormalize_columns_", {p});
  check_dim("orthonormalize_columns_", p, 2, "[n, r]");
  RG_CHECK(p.dtype() == DType::f32 || p.dtype() == DType::f64,
           "orthonormalize_columns_: needs f32 or f64, got ", dtype_name(p.dtype()));
  RG_CHECK(!(GradMode::is_enabled() && p.requires_grad()),
           "orthonormalize_columns_: an in-place op on a tensor that requires grad");
  const int64_t n = p.size(0), r = p.size(1);
  if (n == 0 || r == 0) return p;
  const Tensor work = Tensor::empty({n * r}, DType::f64, p.device());
  dispatch_on(p.device(), p.dtype(), "orthonormalize_columns_", [&]<class T, class B>() {
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
      if constexpr (kOnCuda<B>) {
        kernels::cuda::orthonormalize_columns<T>(p.data<T>(), n, r, work.data<double>(),
                                                 cuda_stream(p));
      } else {
        kernels::cpu::orthonormalize_columns<T>(p.data<T>(), n, r, work.data<double>());
      }
    }
  });
  p.bump_version();
  return p;
}

}  // namespace rg
