// Evaluation of a Trainer: loss (cross-entropy) and exact top-1/top-5 counts over the first N
// samples of the evaluation set, each rank on its own shard with the sums all-reduced, or
// (eval_on_rank0) rank 0 on all of it while the others wait for its result through the store.
#pragma once

#include <cstdint>
#include <memory>

#include "data/dataset.h"
#include "layers/module.h"

namespace rg::dist {
class ProcessGroup;
}

namespace rg::train {

struct EvalResult {
  double loss = 0, top1 = 0, top5 = 0;
};

struct EvaluatorOptions {
  int64_t batch_size = 1000;
  int workers = 0;
  int64_t max_samples = 0;  // 0: all
  bool on_rank0 = false;
  MemoryFormat memory_format = MemoryFormat::contiguous;  // DataLoaderOptions::memory_format
};

class Evaluator {
 public:
  Evaluator(std::shared_ptr<const data::Dataset> data, dist::ProcessGroup* pg, Device device,
            const EvaluatorOptions& options);
  // Evaluates `model` (the module itself, not a DDP wrapper) after epoch `epoch`; every rank
  // calls it and gets the same result.
  EvalResult evaluate(nn::Module& model, int epoch) const;

 private:
  EvalResult sharded(nn::Module& model, dist::ProcessGroup* pg) const;
  EvalResult on_rank0(nn::Module& model, int epoch) const;

  std::shared_ptr<const data::Dataset> data_;
  dist::ProcessGroup* pg_;
  Device device_;
  EvaluatorOptions options_;
};

}  // namespace rg::train
