// embedding through kernels/embedding.h, one call per kernel on both devices. The backward keeps
// only the indices; its kernels' first_bad check happened in the forward.
#include "engine/ops/embedding.h"

#include "engine/autograd/function.h"
#include "engine/device_checks.h"
#include "engine/dispatch.h"
#include "engine/ops/autocast_policy.h"
#include "engine/ops/check.h"
#include "kernels/embedding.h"
#include "kernels/error.h"

namespace rg {

using autograd::SavedTensor;

Tensor embedding(const Tensor& weight, const Tensor& indices, int64_t padding_idx) {
  // Not on PyTorch's autocast lists: runs in the weight's dtype.
  if (cpu_half_inputs({weight}))
    return embedding(half_to_f32(weight), indices, padding_idx).to(weight.dtype());
  check_inputs("embedding", {weight});
  check_dim("embedding", weight, 2, "[V, D]");
  RG_CHECK(indices.defined(), "embedding: indices is an undefined tensor");
  RG_CHECK(indices.dtype() == DType::i64, "embedding: indices must be an i64 tensor, got ",
           dtype_name(indices.dtype()));
  RG_CHECK(indices.device() == weight.device(), "embedding: indices are on ",
           indices.device().str(), " but weight is on ", weight.device().str());
  const int64_t v = weight.size(0), d = weight.size(1), n = indices.numel();
  kernels::detail::check_padding_idx("embedding", padding_idx, v);
  Shape shape = indices.shape();
  shape.push_back(d);
  Tensor out = Tensor::empty(shape, weight.dtype(), weight.device());
  const Tensor first_bad = Tensor::empty({2}, DType::i64, weight.device());
  dispatch_on(weight.device(), weight.dtype(), "embedding", [&]<class T, class B>() {
    kernels::Embedding<B>::embedding(weight.data<T>(), indices.data<int64_t>(), out.data<T>(),
                                     first_bad.data<int64_t>(), n, v, d, kernel_ctx(weight));
  });
  // Read back at once (a stall on CUDA) unless a DeferredChecks scope takes the flag.
  auto describe = [v, wshape = weight.shape()](int64_t pos, int64_t value) {
    return detail::cat("embedding: index ", value, " at position ", pos, " is out of range for ", v,
                       " embeddings (weight ", shape_str(wshape), ")");
  };
  if (DeferredChecks* deferred = DeferredChecks::current();
      deferred && first_bad.device().is_cuda()) {
    deferred->post(first_bad, n, std::move(describe));
  } else if (const std::vector<int64_t> got = first_bad.to(Device::cpu()).to_vector<int64_t>();
             got[0] < n) {
    RG_FAIL(describe(got[0], got[1]));
  }
  return autograd::record(
      out, "EmbeddingBackward", {weight},
      [si = SavedTensor(indices), wshape = weight.shape(), n, v, d, padding_idx](const Tensor& g) {
        Tensor grad_weight = Tensor::empty(wshape, g.dtype(), g.device());
        dispatch_on(g.device(), g.dtype(), "embedding_backward", [&]<class T, class B>() {
          using K = kernels::Embedding<B>;
          const Tensor ws = Tensor::empty({K::template embedding_backward_workspace_bytes<T>(v, d)},
                                          DType::u8, g.device());
          K::embedding_backward(g.data<T>(), si.get().data<int64_t>(), grad_weight.data<T>(), n, v,
                                d, padding_idx, kernels::Workspace{ws.raw_data(), ws.numel()},
                                kernel_ctx(g));
        });
        return std::vector<Tensor>{grad_weight};
      });
}

}  // namespace rg
