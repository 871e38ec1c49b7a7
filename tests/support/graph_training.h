// The Trainer twice on the same data from the same weights (manual_seed 11): an MLP with SGD
// (momentum 0.9, rate 0.05 halved each epoch), batch 4 on "cuda", 2 epochs, eager and with
// cuda_graphs; for the tests that --cuda-graphs trains as eager steps do (one device, DDP).
#pragma once

#include <memory>
#include <vector>

#include "data/dataset.h"
#include "engine/generator.h"
#include "layers/models/registry.h"
#include "layers/optim/lr_schedule.h"
#include "layers/optim/optimizer.h"
#include "train/trainer.h"

namespace rg::testing {

struct EagerAndGraphed {
  std::vector<train::TrainResult> results;  // [0] eager, [1] cuda_graphs
  std::vector<NamedTensors> weights;        // the parameters after each run
};

inline EagerAndGraphed train_eager_and_graphed(std::shared_ptr<const data::Dataset> data,
                                               const Shape& sample, int64_t classes) {
  EagerAndGraphed out;
  for (bool graphs : {false, true}) {
    manual_seed(11);
    auto model = nn::make_model({.name = "mlp", .sample_shape = sample, .num_classes = classes});
    auto opt = std::make_shared<optim::Sgd>(model->parameters(),
                                            optim::SgdOptions{.lr = 0.05, .momentum = 0.9});
    train::Options o;
    o.batch_size = 4;
    o.device = "cuda";
    o.cuda_graphs = graphs;
    o.schedule = [](int64_t spe, int) { return std::make_shared<optim::StepLr>(0.05, spe, 0.5); };
    train::Trainer trainer(model, opt, data, o);
    out.results.push_back(trainer.fit(2));
    out.weights.push_back(model->named_parameters());
  }
  return out;
}

}  // namespace rg::testing
