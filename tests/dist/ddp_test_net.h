// The small net of the DDP diagnostics and static_graph tests: fc0 -> fc1 -> fc2, with modes that
// leave fc2 unused or run fc1 a second time through a reentrant checkpoint.
#pragma once

#include <memory>

#include "engine/autograd/engine.h"
#include "engine/autograd/function.h"
#include "engine/autograd/grad_mode.h"
#include "engine/ops/binary.h"
#include "layers/linear.h"

namespace rg::dist::testnet {

constexpr int64_t kIn = 12, kHidden = 8;

// fc0 -> fc1 -> fc2. `skip_fc2` leaves fc2 out (its parameters get no gradient); `reentrant` adds
// fc1 a second time through a reentrant checkpoint (the segment is recomputed in a backward run
// inside backward, as activation checkpointing's reentrant variant does), so fc1's gradient
// hooks fire twice in one backward.
class Net : public nn::Module {
 public:
  enum class Mode { normal, skip_fc2, reentrant };
  Net() {
    Generator g(7);
    fc0 = register_module("fc0", std::make_shared<nn::Linear>(kIn, kHidden, g));
    fc1 = register_module("fc1", std::make_shared<nn::Linear>(kHidden, kHidden, g));
    fc2 = register_module("fc2", std::make_shared<nn::Linear>(kHidden, kHidden, g));
  }
  Tensor forward_impl(const Tensor& x) override {
    const Tensor h = fc0->forward(x);
    Tensor y = fc1->forward(h);
    if (mode == Mode::reentrant) y = add(y, checkpointed_fc1(h));
    return mode == Mode::skip_fc2 ? y : fc2->forward(y);
  }
  std::string type_name() const override { return "Net"; }

  Mode mode = Mode::normal;
  std::shared_ptr<nn::Linear> fc0, fc1, fc2;

 private:
  Tensor checkpointed_fc1(const Tensor& h) {
    Tensor out;
    {
      NoGradGuard no_grad;  // the forward keeps nothing: backward recomputes
      out = fc1->forward(h);
    }
    auto layer = fc1;
    return autograd::record(out, "ReentrantCheckpoint", {h}, [layer, h](const Tensor& grad) {
      Tensor x = h.detach();
      x.set_requires_grad(true);
      Tensor y;
      {
        struct EnableGrad {
          bool prev = GradMode::is_enabled();
          EnableGrad() { GradMode::set_enabled(true); }
          ~EnableGrad() { GradMode::set_enabled(prev); }
        } enable;
        y = layer->forward(x);
      }
      autograd::Engine::backward({y}, {grad});
      return std::vector<Tensor>{x.grad()};
    });
  }
};

}  // namespace rg::dist::testnet
