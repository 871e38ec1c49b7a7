// ReLU, Flatten and Dropout modules.
#include "layers/activation.h"

#include "engine/ops/activation.h"
#include "engine/ops/dropout.h"
#include "engine/ops/flatten.h"
#include "kernels/error.h"

namespace rg::nn {

Tensor ReLU::forward_impl(const Tensor& x) { return relu(x); }

Tensor Flatten::forward_impl(const Tensor& x) { return flatten(x, start_, end_); }

Dropout::Dropout(double p, std::shared_ptr<Generator> gen) : p_(p), gen_(std::move(gen)) {
  RG_CHECK(p >= 0 && p <= 1, "Dropout: p must be in [0, 1], got ", p);
  RG_CHECK(gen_ != nullptr, "Dropout: a generator is required");
}

// Shares the process-wide generator without owning it (it lives for the whole program).
Dropout::Dropout(double p)
    : Dropout(p, std::shared_ptr<Generator>(std::shared_ptr<Generator>(), &default_generator())) {}

Tensor Dropout::forward_impl(const Tensor& x) { return dropout(x, p_, is_training(), *gen_); }

}  // namespace rg::nn
