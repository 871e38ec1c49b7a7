// Training loop: per-iteration LR schedule, cross-entropy, optimizer step, progress output,
// evaluation with exact top-1/top-5 counts, JSONL metrics.
#include "apps/common/trainer.h"

#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <ostream>

#include "data/dataloader.h"
#include "data/registry.h"
#include "engine/autograd/grad_mode.h"
#include "engine/ops/loss.h"
#include "engine/ops/metrics.h"
#include "kernels/error.h"
#include "layers/models/registry.h"
#include "layers/optim/lr_schedule.h"
#include "layers/optim/optimizer.h"

namespace rg::app {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

std::string format_duration(double s) {
  if (!std::isfinite(s) || s < 0) return "--:--";
  const int64_t t = int64_t(s + 0.5);
  return t >= 3600 ? fmt::format("{}:{:02}:{:02}", t / 3600, t / 60 % 60, t % 60)
                   : fmt::format("{:02}:{:02}", t / 60, t % 60);
}

std::unique_ptr<optim::Optimizer> make_optimizer(const TrainConfig& c, std::vector<Tensor> params) {
  if (c.optimizer == "sgd") {
    return std::make_unique<optim::Sgd>(
        std::move(params), optim::SgdOptions{.lr = c.lr, .momentum = c.momentum,
                                             .weight_decay = c.weight_decay,
                                             .nesterov = c.nesterov});
  }
  if (c.optimizer == "adam" || c.optimizer == "adamw") {
    optim::AdamOptions o{.lr = c.lr, .weight_decay = c.weight_decay};
    if (c.optimizer == "adamw") return optim::make_adamw(std::move(params), o);
    return std::make_unique<optim::Adam>(std::move(params), o);
  }
  RG_FAIL("unknown optimizer '", c.optimizer, "' (expected sgd, adam or adamw)");
}

struct EvalResult {
  double loss = 0, top1 = 0, top5 = 0;
};

EvalResult evaluate(nn::Module& model, const data::Dataset& test, int64_t batch_size,
                    int workers) {
  model.eval();
  NoGradGuard no_grad;
  data::DataLoader loader(std::shared_ptr<const data::Dataset>(&test, [](const data::Dataset*) {}),
                          std::make_shared<data::SequentialSampler>(test.size()),
                          {.batch_size = batch_size, .workers = workers});
  loader.start_epoch(0);
  double loss_sum = 0;
  int64_t correct1 = 0, correct5 = 0, n = 0;
  const int64_t k5 = std::min<int64_t>(5, test.num_classes());
  while (auto batch = loader.next()) {
    const Tensor logits = model.forward(batch->inputs);
    const int64_t b = batch->targets.numel();
    loss_sum += cross_entropy(logits, batch->targets).item() * double(b);
    correct1 += topk_correct(logits, batch->targets, 1);
    correct5 += topk_correct(logits, batch->targets, k5);
    n += b;
  }
  model.train();
  RG_CHECK(n > 0, "evaluation: the test set is empty");
  return {loss_sum / double(n), double(correct1) / double(n), double(correct5) / double(n)};
}

}  // namespace

TrainResult train(const TrainConfig& c, std::ostream& out) {
  RG_CHECK(c.epochs > 0, "--epochs must be positive, got ", c.epochs);
  RG_CHECK(c.batch_size > 0, "--batch-size must be positive, got ", c.batch_size);
  RG_CHECK(c.test_batch_size > 0, "--test-batch-size must be positive");
  RG_CHECK(c.eval_every >= 0, "--eval-every must be >= 0");
  const std::string dir = c.data_dir.empty() ? "data/" + c.dataset : c.data_dir;
  auto train_set = data::make_dataset(c.dataset, dir, true);
  auto test_set = data::make_dataset(c.dataset, dir, false);

  auto model = nn::make_model({.name = c.model, .sample_shape = train_set->sample_shape(),
                               .num_classes = train_set->num_classes(), .seed = c.seed});
  model->train();
  auto opt = make_optimizer(c, model->parameters());

  auto sampler = std::make_shared<data::RandomSampler>(train_set->size(), c.seed);
  data::DataLoader loader(train_set, sampler,
                          {.batch_size = c.batch_size, .drop_last = false, .workers = c.workers});
  const int64_t steps_per_epoch = loader.num_batches();
  const int64_t planned_steps = c.max_steps >= 0
                                    ? std::min<int64_t>(c.max_steps, steps_per_epoch * c.epochs)
                                    : steps_per_epoch * c.epochs;
  std::vector<int64_t> milestones;
  for (int64_t m : c.lr_milestones) milestones.push_back(m * steps_per_epoch);
  auto schedule = optim::make_schedule(
      c.lr_schedule, c.lr, steps_per_epoch * c.epochs,
      int64_t(std::llround(c.warmup_epochs * double(steps_per_epoch))), 0.1,
      c.lr_step_size * steps_per_epoch, milestones, c.lr_gamma);

  std::unique_ptr<std::ofstream> metrics;
  if (!c.metrics_path.empty()) {
    metrics = std::make_unique<std::ofstream>(c.metrics_path);
    RG_CHECK(metrics->good(), "--metrics: cannot write ", c.metrics_path);
  }

  out << fmt::format("ringgrad-train: {} on {} ({} train / {} test samples), {} parameters, "
                     "{} lr={} batch={} epochs={}\n",
                     c.model, c.dataset, train_set->size(), test_set->size(),
                     model->parameter_count(), opt->name(), c.lr, c.batch_size, c.epochs);
  out.flush();

  TrainResult result;
  const auto run_start = Clock::now();
  int64_t step = 0;
  for (int epoch = 1; epoch <= c.epochs && step < planned_steps; ++epoch) {
    loader.start_epoch(epoch - 1);
    const auto epoch_start = Clock::now();
    double loss_sum = 0;
    int64_t samples = 0, epoch_steps = 0;
    const int64_t epoch_planned = std::min(steps_per_epoch, planned_steps - step);
    const int64_t plain_every = std::max<int64_t>(1, epoch_planned / 10);
    while (step < planned_steps) {
      auto batch = loader.next();
      if (!batch) break;
      opt->set_lr(schedule->lr_at(step));
      const Tensor logits = model->forward(batch->inputs);
      const Tensor loss = cross_entropy(logits, batch->targets, c.label_smoothing);
      opt->zero_grad();
      loss.backward();
      opt->step();
      const double l = loss.item();
      RG_CHECK(std::isfinite(l), "training diverged: loss is ", l, " at step ", step,
               " (try a lower --lr)");
      const int64_t b = batch->targets.numel();
      loss_sum += l * double(b);
      samples += b;
      ++step;
      ++epoch_steps;
      const double elapsed = seconds_since(epoch_start);
      const double ips = double(samples) / std::max(elapsed, 1e-9);
      const double eta = elapsed / double(epoch_steps) * double(epoch_planned - epoch_steps);
      if (c.progress_bar) {
        const int width = 30;
        const int filled = int(double(width) * double(epoch_steps) / double(epoch_planned));
        out << fmt::format("\repoch {} [{}{}] {}/{} loss {:.4f} {:.0f} img/s ETA {}  ", epoch,
                           std::string(size_t(filled), '='), std::string(size_t(width - filled), ' '),
                           epoch_steps, epoch_planned, l, ips, format_duration(eta));
        out.flush();
      } else if (epoch_steps % plain_every == 0 || epoch_steps == epoch_planned) {
        out << fmt::format("epoch {} step {}/{} loss {:.4f} {:.0f} img/s ETA {}\n", epoch,
                           epoch_steps, epoch_planned, l, ips, format_duration(eta));
        out.flush();
      }
    }
    if (c.progress_bar) out << "\n";
    EpochSummary s;
    s.epoch = epoch;
    s.steps = epoch_steps;
    s.seconds = seconds_since(epoch_start);
    s.train_loss = samples ? loss_sum / double(samples) : 0;
    s.img_per_s = double(samples) / std::max(s.seconds, 1e-9);
    const bool last = epoch == c.epochs || step >= planned_steps;
    if ((c.eval_every > 0 && epoch % c.eval_every == 0) || last) {
      const EvalResult e = evaluate(*model, *test_set, c.test_batch_size, c.workers);
      s.evaluated = true;
      s.test_loss = e.loss;
      s.top1 = e.top1;
      s.top5 = e.top5;
    }
    out << fmt::format("epoch {} | train loss {:.4f}", epoch, s.train_loss);
    if (s.evaluated) {
      out << fmt::format(" | test loss {:.4f} | top-1 {:.2f}% | top-5 {:.2f}%", s.test_loss,
                         100 * s.top1, 100 * s.top5);
    }
    out << fmt::format(" | {:.0f} img/s | {:.1f} s\n", s.img_per_s, s.seconds);
    out.flush();
    if (metrics) {
      nlohmann::json j = {{"type", "epoch"},        {"epoch", epoch},
                          {"steps", s.steps},       {"train_loss", s.train_loss},
                          {"img_per_s", s.img_per_s}, {"seconds", s.seconds}};
      if (s.evaluated) {
        j["test_loss"] = s.test_loss;
        j["top1"] = s.top1;
        j["top5"] = s.top5;
      }
      *metrics << j.dump() << "\n";
      metrics->flush();
    }
    result.epochs.push_back(s);
    if (s.evaluated) {
      result.final_top1 = s.top1;
      result.final_top5 = s.top5;
      result.final_test_loss = s.test_loss;
    }
  }
  result.total_steps = step;
  result.total_seconds = seconds_since(run_start);
  nlohmann::json final_line = {{"type", "final"},
                               {"model", c.model},
                               {"dataset", c.dataset},
                               {"epochs", int(result.epochs.size())},
                               {"steps", result.total_steps},
                               {"test_loss", result.final_test_loss},
                               {"top1", result.final_top1},
                               {"top5", result.final_top5},
                               {"seconds", result.total_seconds}};
  out << final_line.dump() << "\n";
  if (metrics) *metrics << final_line.dump() << "\n";
  return result;
}

}  // namespace rg::app
