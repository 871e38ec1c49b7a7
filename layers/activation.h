// Stateless modules wrapping engine ops: ReLU, Flatten, Dropout (with its own Generator or the
// process-wide default_generator()).
#pragma once

#include <memory>

#include "engine/generator.h"
#include "layers/module.h"

namespace rg::nn {

class ReLU final : public Module {
 public:
  Tensor forward_impl(const Tensor& x) override;
  std::string type_name() const override { return "ReLU"; }
};

class Flatten final : public Module {
 public:
  explicit Flatten(int64_t start_dim = 1, int64_t end_dim = -1)
      : start_(start_dim), end_(end_dim) {}
  Tensor forward_impl(const Tensor& x) override;
  std::string type_name() const override { return "Flatten"; }

 private:
  int64_t start_, end_;
};

// Drops with probability p in training mode only. Masks come from `gen`, shared by all dropout
// layers of a model so that a model's randomness is one reproducible stream.
class Dropout final : public Module {
 public:
  Dropout(double p, std::shared_ptr<Generator> gen);
  // Masks from default_generator() (seed it with rg::manual_seed), as torch.nn.Dropout.
  explicit Dropout(double p = 0.5);
  Tensor forward_impl(const Tensor& x) override;
  std::string type_name() const override { return "Dropout"; }
  // The mask stream (shared by a model's dropout layers); checkpoints save and restore it.
  Generator& generator() const { return *gen_; }
  double p() const { return p_; }

 protected:
  std::string extra_repr() const override { return "p=" + std::to_string(p_); }

 private:
  double p_;
  std::shared_ptr<Generator> gen_;
};

}  // namespace rg::nn
