// Evaluation: sharded over the ranks (sums all-reduced) or on rank 0 (result through the store).
#include "train/evaluation.h"

#include <fmt/format.h>

#include <array>
#include <chrono>
#include <cstring>

#include "comm/init.h"
#include "data/dataloader.h"
#include "engine/autograd/grad_mode.h"
#include "engine/ops/loss.h"
#include "engine/ops/metrics.h"
#include "kernels/error.h"
#include "train/distributed.h"
#include "train/step.h"

namespace rg::train {
namespace {

// --eval-on-rank0: a store wait, not a collective barrier: the group's collectives time out after
// ProcessGroupOptions::timeout (300 s), which a long evaluation can exceed; this wait allows
// kEvalOnRank0Wait.
constexpr std::chrono::hours kEvalOnRank0Wait{24};

}  // namespace

Evaluator::Evaluator(std::shared_ptr<const data::Dataset> data, dist::ProcessGroup* pg,
                     Device device, const EvaluatorOptions& options)
    : data_(std::move(data)), pg_(pg), device_(device), options_(options) {}

EvalResult Evaluator::evaluate(nn::Module& model, int epoch) const {
  return pg_ && options_.on_rank0 ? on_rank0(model, epoch) : sharded(model, pg_);
}

// With a process group each rank evaluates its own shard (no padding, so no sample counts
// twice) and the counts are summed over ranks.
EvalResult Evaluator::sharded(nn::Module& model, dist::ProcessGroup* pg) const {
  model.eval();
  NoGradGuard no_grad;
  if (pg && pg->size() > 1) {
    // Every rank evaluates rank 0's model, the one checkpoints save and --eval-on-rank0
    // evaluates: the buffers (batch-norm running statistics, which each rank has updated from
    // its own last batch since DDP's broadcast) come from rank 0, as DDP's next forward does.
    std::vector<dist::WorkPtr> works;
    for (auto& [name, t] : model.named_buffers()) works.push_back(pg->broadcast(t, 0));
    for (auto& w : works) w->wait();
  }
  // --eval-samples: the same leading samples whatever the world size.
  const data::Dataset& test = *data_;
  const int64_t n_eval =
      options_.max_samples > 0 ? std::min(options_.max_samples, test.size()) : test.size();
  std::shared_ptr<data::Sampler> sampler;
  if (pg)
    sampler = std::make_shared<data::StridedSampler>(n_eval, pg->size(), pg->rank());
  else
    sampler = std::make_shared<data::SequentialSampler>(n_eval);
  data::DataLoader loader(data_, sampler,
                          {.batch_size = options_.batch_size,
                           .workers = options_.workers,
                           .memory_format = options_.memory_format});
  loader.start_epoch(0);
  double loss_sum = 0;
  int64_t correct1 = 0, correct5 = 0, n = 0;
  const int64_t k5 = std::min<int64_t>(5, test.num_classes());
  while (auto batch = loader.next()) {
    const auto [logits, targets] =
        as_rows(model.forward(batch->inputs.to(device_)), batch->targets.to(device_));
    const int64_t b = targets.numel();
    loss_sum += cross_entropy(logits, targets).item() * double(b);
    correct1 += topk_correct(logits, targets, 1);
    correct5 += topk_correct(logits, targets, k5);
    n += b;
  }
  model.train();
  std::vector<double> sums = {loss_sum, double(correct1), double(correct5), double(n)};
  sum_over_ranks(pg, sums);
  RG_CHECK(sums[3] > 0, "evaluation: the test set is empty");
  return {sums[0] / sums[3], sums[1] / sums[3], sums[2] / sums[3]};
}

// Rank 0 evaluates the whole test set on the module itself (so no buffer broadcast is issued
// that the other ranks would not match) and publishes the result under a store key that the
// others wait for. An error on rank 0 is published too, so the others fail with it.
EvalResult Evaluator::on_rank0(nn::Module& model, int epoch) const {
  const std::shared_ptr<dist::Store>& store = dist::default_store();
  const std::string key = fmt::format("ringgrad-train/eval_on_rank0/epoch{}", epoch);
  // 'R' and the three doubles, or 'E' and rank 0's error message.
  std::array<double, 3> v{};
  if (pg_->rank() == 0) {
    try {
      const EvalResult r = sharded(model, nullptr);
      v = {r.loss, r.top1, r.top5};
    } catch (const Error& e) {
      const std::string what = std::string("E") + e.what();
      store->set(key, dist::Bytes(what.begin(), what.end()));
      throw;
    }
    dist::Bytes bytes(1 + sizeof v, uint8_t('R'));
    std::memcpy(bytes.data() + 1, v.data(), sizeof v);
    store->set(key, bytes);
  } else {
    const dist::Bytes bytes = store->get(key, kEvalOnRank0Wait);
    const bool ok = bytes.size() == 1 + sizeof v && bytes[0] == 'R';
    RG_CHECK(ok, "--eval-on-rank0: rank 0's evaluation failed: ",
             bytes.empty() ? std::string() : std::string(bytes.begin() + 1, bytes.end()));
    std::memcpy(v.data(), bytes.data() + 1, sizeof v);
  }
  return {v[0], v[1], v[2]};
}

}  // namespace rg::train
