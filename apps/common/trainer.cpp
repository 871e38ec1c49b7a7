// ringgrad-train's training as a rg::train::Trainer: data sets, model, optimizer, schedule and
// loss from the flags, the run's shape, the header lines, and the test hooks (test_hooks.h).
#include "apps/common/trainer.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <ostream>

#include "apps/common/test_hooks.h"
#include "data/registry.h"
#include "data/text.h"
#include "engine/cuda/stream_trace.h"
#include "engine/deterministic.h"
#include "engine/ops/cudnn.h"
#include "engine/ops/factory.h"
#include "engine/ops/loss.h"
#include "engine/tf32.h"
#include "kernels/error.h"
#include "layers/models/registry.h"
#include "layers/optim/optimizer.h"
#include "layers/optim/param_groups.h"
#include "train/trainer.h"

namespace rg::app {
namespace {

// The parameter groups of --weight-decay-groups: one group with every parameter, or minGPT's
// split (Linear weights decay, the rest not).
std::vector<optim::ParamGroup> weight_decay_groups(const TrainConfig& c, const nn::Module& model) {
  const std::string& g = c.weight_decay_groups;
  const bool linear = g == "linear" || (g == "auto" && c.model.starts_with("gpt-"));
  if (linear) return optim::linear_weight_decay_groups(model, c.weight_decay);
  return {optim::ParamGroup{.params = model.parameters(), .weight_decay = c.weight_decay}};
}

std::shared_ptr<optim::Optimizer> make_optimizer(const TrainConfig& c, const nn::Module& model) {
  std::vector<optim::ParamGroup> groups = weight_decay_groups(c, model);
  if (c.optimizer == "sgd") {
    return std::make_shared<optim::Sgd>(std::move(groups),
                                        optim::SgdOptions{.lr = c.lr,
                                                          .momentum = c.momentum,
                                                          .weight_decay = c.weight_decay,
                                                          .nesterov = c.nesterov});
  }
  if (c.optimizer == "adam" || c.optimizer == "adamw") {
    optim::AdamOptions o{
        .lr = c.lr, .beta1 = c.adam_beta1, .beta2 = c.adam_beta2, .weight_decay = c.weight_decay};
    if (c.optimizer == "adamw") return optim::make_adamw(std::move(groups), o);
    return std::make_shared<optim::Adam>(std::move(groups), o);
  }
  RG_FAIL("unknown optimizer '", c.optimizer, "' (expected sgd, adam or adamw)");
}

// The training loss of --loss: cross-entropy on the class indices, or a regression loss of the
// logits against one-hot targets (classification as regression). `targets` are the batch's, on
// the host: the one-hot matrix is built there and copied to the logits' device.
Tensor training_loss(const TrainConfig& c, const Tensor& output, const Tensor& batch_targets) {
  const auto [logits, targets] = train::as_rows(output, batch_targets);
  if (c.loss == "cross-entropy")
    return cross_entropy(logits, targets.to(logits.device()), c.label_smoothing);
  const int64_t n = logits.size(0), classes = logits.size(1);
  RG_CHECK(targets.device().is_cpu() && targets.numel() == n, "--loss ", c.loss, ": expected ", n,
           " host targets");
  Tensor one_hot = zeros({n, classes});
  for (int64_t i = 0; i < n; ++i) {
    const int64_t k = targets.data<int64_t>()[i];
    RG_CHECK(k >= 0 && k < classes, "--loss ", c.loss, ": target ", k, " at index ", i,
             " is out of range for ", classes, " classes");
    one_hot.data<float>()[i * classes + k] = 1.0f;
  }
  one_hot = one_hot.to(logits.dtype()).to(logits.device());
  return c.loss == "mse" ? mse_loss(logits, one_hot) : smooth_l1_loss(logits, one_hot);
}
// What must match for a checkpoint to continue this run, causes before consequences; the trainer
// fills in world_size, epochs and steps_per_epoch. Paths, workers, tracing and --max-steps may
// differ; so may the world size (and with it steps_per_epoch).
train::RunShape run_shape(const TrainConfig& c, const data::CharDataset* text_set) {
  train::RunShape shape = {
      {"model", c.model},
      {"dataset", c.dataset},
      {"augment", c.augment ? "1" : "0"},
      {"world_size", ""},
      {"batch_size", std::to_string(c.batch_size)},
      {"grad_accum_steps", std::to_string(c.grad_accum_steps)},
      {"seed", std::to_string(c.seed)},
      {"epochs", ""},
      {"optimizer", fmt::format("{} lr={} momentum={} nesterov={} weight_decay={}", c.optimizer,
                                c.lr, c.momentum, c.nesterov, c.weight_decay)},
      {"lr_schedule",
       fmt::format("{} warmup={} step={} milestones={} gamma={}", c.lr_schedule, c.warmup_epochs,
                   c.lr_step_size, fmt::join(c.lr_milestones, ","), c.lr_gamma)},
      {"label_smoothing", fmt::format("{}", c.label_smoothing)},
      {"loss", c.loss},
      {"clip_grad", fmt::format("norm={} value={}", c.clip_grad_norm, c.clip_grad_value)},
      {"comm_hook", c.comm_hook},
      {"amp", c.amp},
      {"sync_bn", c.sync_bn ? "1" : "0"},
      // The layout of the buckets' flat state (PowerSGD's error feedback follows it).
      {"channels_last", c.channels_last ? "1" : "0"},
      {"model.dropout", c.dropout ? "1" : "0"},
      {"model.tie_weights", c.tie_weights ? "1" : "0"},
      {"optimizer.groups", c.weight_decay_groups},
      {"optimizer.betas", fmt::format("{},{}", c.adam_beta1, c.adam_beta2)},
      {"steps_per_epoch", ""}};
  if (text_set) {
    shape.emplace_back("text.block_size", std::to_string(c.block_size));
    shape.emplace_back("text.val_fraction", fmt::format("{}", c.val_fraction));
    shape.emplace_back("text.vocab", text_set->vocab().to_utf8());
  }
  return shape;
}

// The LR schedule of the flags, in steps of this world size.
train::ScheduleFn schedule(const TrainConfig& c) {
  return [c](int64_t steps_per_epoch, int epochs) {
    std::vector<int64_t> milestones;
    for (int64_t m : c.lr_milestones) milestones.push_back(m * steps_per_epoch);
    return optim::make_schedule(c.lr_schedule, c.lr, steps_per_epoch * epochs,
                                int64_t(std::llround(c.warmup_epochs * double(steps_per_epoch))),
                                0.1, c.lr_step_size * steps_per_epoch, milestones, c.lr_gamma);
  };
}

train::DistributedOptions distributed_options(const TrainConfig& c) {
  return {.backend = c.backend,
          .mode = c.mode,
          .dp_devices = c.dp_devices,
          .init_method = c.init_method,
          .allreduce = c.allreduce,
          .bucket_cap_mb = c.bucket_cap_mb,
          .first_bucket_mb = c.first_bucket_mb,
          .overlap = c.overlap,
          .comm_hook = c.comm_hook,
          .powersgd_rank = c.powersgd_rank,
          .powersgd_start_iter = c.powersgd_start_iter,
          .find_unused_parameters = c.find_unused_parameters,
          .static_graph = c.static_graph,
          .gradient_as_bucket_view = c.gradient_as_bucket_view,
          .sync_bn = c.sync_bn,
          .join = c.join,
          .debug = c.debug_distributed,
          .timeout_s = c.timeout_s,
          .make_replica = {}};
}

train::Options trainer_options(const TrainConfig& c, std::ostream& out) {
  return {.snapshot = c.snapshot_path,
          .snapshot_every = c.snapshot_every,
          .checkpoint = c.checkpoint_path,
          .resume = c.resume_path,
          .batch_size = c.batch_size,
          .workers = c.workers,
          .seed = c.seed,
          .steps_per_epoch = c.steps_per_epoch,
          .max_steps = c.max_steps,
          .uneven_data = c.uneven_data,
          .grad_accum_steps = c.grad_accum_steps,
          .clip_grad_norm = c.clip_grad_norm,
          .clip_grad_value = c.clip_grad_value,
          .amp = c.amp,
          .loss = [c](const Tensor& output,
                      const Tensor& targets) { return training_loss(c, output, targets); },
          .cuda_graphs = c.cuda_graphs,
          .channels_last = c.channels_last,
          .schedule = schedule(c),
          .eval_data = {},
          .eval_batch_size = c.test_batch_size,
          .eval_every = c.eval_every,
          .eval_samples = c.eval_samples,
          .eval_on_rank0 = c.eval_on_rank0,
          .early_stop_patience = c.early_stop_patience,
          .early_stop_metric = c.early_stop_metric,
          .check_consistency = c.check_consistency,
          .device = c.device,
          .distributed = distributed_options(c),
          .run_shape = {},
          .out = &out,
          .name = "ringgrad-train",
          .model_name = c.model,
          .dataset_name = c.dataset,
          .progress_bar = c.progress_bar,
          .tokens = c.dataset == "text",
          .metrics = c.metrics_path,
          .trace = c.trace_path,
          .trace_steps = c.trace_steps};
}

// The run's header lines (rank 0), printed when training starts.
class Header : public train::Callback {
 public:
  Header(const TrainConfig& c, const data::Dataset& train_set, const data::Dataset& test_set,
         const data::CharDataset* text_set, std::ostream& out)
      : c_(c),
        train_size_(train_set.size()),
        test_size_(test_set.size()),
        text_(text_set),
        out_(out) {}
  void on_train_start(const train::State& s) override {
    if (s.rank != 0) return;  // only rank 0 reports
    out_ << fmt::format(
        "ringgrad-train: {} on {} ({} train / {} test samples), {} parameters, "
        "{} lr={} batch={} epochs={} on {}\n",
        c_.model, c_.dataset, train_size_, test_size_, s.model->parameter_count(),
        s.optimizer->name(), c_.lr, c_.batch_size, c_.epochs, s.device.str());
    if (text_)
      out_ << fmt::format(
          "ringgrad-train: text {}: vocabulary of {} characters, blocks of {} tokens ({} per step "
          "in all), {} steps per epoch\n",
          c_.data_file, text_->vocab().size(), c_.block_size,
          c_.batch_size * c_.block_size * s.world, s.steps_per_epoch);
    weight_decay_line(*s.model);
    if (s.pg) ddp_line(s);
    notes(s);
    out_.flush();
  }

 private:
  void weight_decay_line(const nn::Module& model) {
    const auto groups = weight_decay_groups(c_, model);
    if (groups.size() <= 1 || c_.weight_decay <= 0) return;
    std::vector<std::string> parts;
    for (const auto& g : groups) {
      int64_t n = 0;
      for (const Tensor& p : g.params) n += p.numel();
      parts.push_back(fmt::format("{} on {} tensors ({} values)", g.weight_decay.value_or(0),
                                  g.params.size(), n));
    }
    out_ << fmt::format("ringgrad-train: weight decay {}\n", fmt::join(parts, ", "));
  }
  void ddp_line(const train::State& s) {
    out_ << fmt::format(
        "ringgrad-train: DDP over {} ranks ({} {}, buckets {} MiB / first {} MiB, "
        "{}, hook {}), batch {} per rank = {} in all{}\n",
        s.world, s.pg->backend(), c_.allreduce, c_.bucket_cap_mb, c_.first_bucket_mb,
        c_.overlap ? "overlapped with backward" : "after backward", c_.comm_hook, c_.batch_size,
        c_.batch_size * s.world,
        c_.grad_accum_steps > 1 ? fmt::format(", {} accumulation steps", c_.grad_accum_steps) : "");
  }
  void notes(const train::State& s) {
    const bool cuda = s.device.is_cuda();
    if (cuda)
      out_ << fmt::format(
          "ringgrad-train: f32 precision on CUDA (--tf32 {}): convolutions {}, "
          "matrix products {}\n",
          c_.tf32, cuda::allow_tf32_conv() ? "TF32" : "f32",
          cuda::allow_tf32_matmul() ? "TF32" : "f32");
    else if (c_.tf32 != "default")
      out_ << "ringgrad-train: note: --tf32 has no effect on the CPU (TF32 is a CUDA precision)\n";
    if (c_.cudnn_benchmark && !cuda)
      out_ << "ringgrad-train: note: --cudnn-benchmark has no effect on the CPU (cuDNN is "
              "CUDA's)\n";
    if (c_.cudnn_conv_api != "graph" && !cuda)
      out_ << "ringgrad-train: note: --cudnn-conv-api has no effect on the CPU (cuDNN is "
              "CUDA's)\n";
    if (c_.cudnn_benchmark && c_.deterministic && cuda)
      out_ << "ringgrad-train: note: --cudnn-benchmark times deterministic algorithms only, but "
              "two runs may choose different ones (and round differently); leave it off for "
              "bit-identical runs\n";
    if (c_.eval_on_rank0 && !s.pg)
      out_ << "ringgrad-train: note: --eval-on-rank0 has no effect without DDP (one process "
              "evaluates the whole test set anyway)\n";
  }
  const TrainConfig& c_;
  int64_t train_size_, test_size_;
  const data::CharDataset* text_;
  std::ostream& out_;
};

// The run's algorithm switches, set for the run and restored on every way out (tests run several
// trainings in one process).
struct AlgorithmSwitches {
  bool deterministic = deterministic_algorithms(), benchmark = cudnn_benchmark();
  CudnnConvApi conv_api = cudnn_conv_api();
  cuda::Tf32Guard tf32{cuda::allow_tf32_conv(), cuda::allow_tf32_matmul()};
  explicit AlgorithmSwitches(const TrainConfig& c) {
    RG_CHECK(c.tf32 == "default" || c.tf32 == "on" || c.tf32 == "off",
             "--tf32 must be on, off or default, got ", c.tf32);
    set_deterministic_algorithms(c.deterministic);
    RG_CHECK(c.cudnn_conv_api == "graph" || c.cudnn_conv_api == "legacy",
             "--cudnn-conv-api must be graph or legacy, got ", c.cudnn_conv_api);
    set_cudnn_benchmark(c.cudnn_benchmark);
    set_cudnn_conv_api(c.cudnn_conv_api == "legacy" ? CudnnConvApi::legacy : CudnnConvApi::graph);
    if (c.tf32 != "default") {
      cuda::set_allow_tf32_conv(c.tf32 == "on");
      cuda::set_allow_tf32_matmul(c.tf32 == "on");
    }
  }
  ~AlgorithmSwitches() {
    set_deterministic_algorithms(deterministic);
    set_cudnn_benchmark(benchmark);
    set_cudnn_conv_api(conv_api);
  }
};

}  // namespace

std::string config_error(const TrainConfig& c) {
  if (c.loss != "cross-entropy" && c.loss != "mse" && c.loss != "smooth-l1")
    return "--loss must be cross-entropy, mse or smooth-l1, got '" + c.loss + "'";
  if (c.loss != "cross-entropy" && c.label_smoothing != 0.0)
    return "--label-smoothing applies to --loss cross-entropy only (this run uses " + c.loss + ")";
  if (!(c.clip_grad_norm >= 0.0))  // also NaN
    return fmt::format("--clip-grad-norm must be >= 0 (0: off), got {}", c.clip_grad_norm);
  if (!(c.clip_grad_value >= 0.0))
    return fmt::format("--clip-grad-value must be >= 0 (0: off), got {}", c.clip_grad_value);
  if (c.clip_grad_norm > 0 && c.clip_grad_value > 0)
    return "--clip-grad-norm and --clip-grad-value cannot be combined: choose one";
  if (c.early_stop_patience < 0)
    return fmt::format("--early-stop-patience must be >= 0 (0: off), got {}",
                       c.early_stop_patience);
  if (c.early_stop_metric != "loss" && c.early_stop_metric != "top1")
    return "--early-stop-metric must be loss or top1, got '" + c.early_stop_metric + "'";
  if (c.check_consistency < 0)
    return fmt::format("--check-consistency must be >= 0 (0: off), got {}", c.check_consistency);
  if (c.channels_last && c.sync_bn)
    return "--channels-last cannot be combined with --sync-bn (SyncBatchNorm takes contiguous "
           "tensors only)";
  // What a replayed CUDA graph cannot do (the Trainer's own refusals, train/options.h; the
  // optimizer's below); the rest is refused when the trainer starts and at the capture.
  if (c.cuda_graphs) {
    std::ostream no_output(nullptr);
    const std::string why = train::cuda_graphs_refusal(trainer_options(c, no_output));
    if (!why.empty()) return why;
  }
  if (c.cuda_graphs && c.amp == "f16" && c.optimizer != "sgd" && c.adam_beta1 < 1 &&
      c.adam_beta2 < 1 && optim::adam_bias_table(c.adam_beta1, c.adam_beta2).empty())
    return fmt::format(
        "--cuda-graphs with --amp f16 and --optimizer {} needs betas whose bias corrections reach "
        "1 within 2^20 steps (--adam-beta1 {} --adam-beta2 {} do not: the step counts stay on the "
        "host, so the overflow check is read back at every step); or use --amp bf16",
        c.optimizer, c.adam_beta1, c.adam_beta2);
  // A joined rank shadows DDP's collectives and the progress output's loss sums; the collectives
  // below run at steps it cannot follow (SyncBatchNorm's in the forward, the checks' and the
  // mid-epoch snapshots' at optimizer steps), and PowerSGD's error feedback cannot send zeros.
  if (c.join && c.sync_bn) return "--join cannot be combined with --sync-bn";
  if (c.join && c.check_consistency > 0)
    return "--join cannot be combined with --check-consistency";
  if (c.join && c.snapshot_every > 0)
    return "--join cannot be combined with --snapshot-every (snapshots at epoch ends still work)";
  if (c.join && c.comm_hook == "powersgd")
    return "--join cannot be combined with --comm-hook powersgd";
  if (c.weight_decay_groups != "auto" && c.weight_decay_groups != "all" &&
      c.weight_decay_groups != "linear")
    return "--weight-decay-groups must be auto, all or linear, got '" + c.weight_decay_groups + "'";
  if (c.steps_per_epoch < 0)
    return fmt::format("--steps-per-epoch must be >= 0 (0: whole epochs), got {}",
                       c.steps_per_epoch);
  if (c.eval_samples < 0)
    return fmt::format("--eval-samples must be >= 0 (0: all), got {}", c.eval_samples);
  if (c.dataset == "text" && c.data_file.empty())
    return "--dataset text needs --data-file FILE (a UTF-8 text; scripts/get-data.sh kjv fetches "
           "one)";
  if (c.dataset != "text" && !c.data_file.empty())
    return "--data-file is for --dataset text (other data sets read --data-dir)";
  if (c.early_stop_patience > 0 && c.eval_every != 1)
    return fmt::format(
        "--early-stop-patience needs an evaluation every epoch: --eval-every must be 1, got {}",
        c.eval_every);
  return "";
}

std::string best_checkpoint_path(const std::string& path) {
  return train::best_checkpoint_path(path);
}

TrainResult train(const TrainConfig& c, std::ostream& out) {
  RG_CHECK(c.epochs > 0, "--epochs must be positive, got ", c.epochs);
  RG_CHECK(c.grad_accum_steps >= 1, "--grad-accum-steps must be >= 1");
  if (const std::string error = config_error(c); !error.empty()) RG_FAIL(error);
  train::Options options = trainer_options(c, out);
  const AlgorithmSwitches switches(c);
  const std::string dir = c.data_dir.empty() ? "data/" + c.dataset : c.data_dir;
  const data::DatasetOptions data_options{.augment = c.augment,
                                          .seed = c.seed,
                                          .data_file = c.data_file,
                                          .block_size = c.block_size,
                                          .val_fraction = c.val_fraction};
  std::shared_ptr<const data::Dataset> train_set =
      data::make_dataset(c.dataset, dir, true, data_options);
  options.eval_data = data::make_dataset(c.dataset, dir, false, data_options);
  // The text data set's vocabulary: part of the run's shape, and what ringgrad-sample decodes with.
  const auto* text_set = dynamic_cast<const data::CharDataset*>(train_set.get());
  const nn::ModelSpec model_spec{.name = c.model,
                                 .sample_shape = train_set->sample_shape(),
                                 .num_classes = train_set->num_classes(),
                                 .seed = c.seed,
                                 .dropout = c.dropout,
                                 .tie_weights = c.tie_weights};
  std::shared_ptr<nn::Module> model = nn::make_model(model_spec);
  options.distributed.make_replica = [model_spec] { return nn::make_model(model_spec); };
  options.run_shape = run_shape(c, text_set);
  auto optimizer = make_optimizer(c, *model);
  train::Trainer trainer(model, optimizer, train_set, options);
  add_test_hooks(trainer);
  trainer.add_callback(std::make_shared<Header>(c, *train_set, *options.eval_data, text_set, out));
  return trainer.fit(c.epochs);
}

}  // namespace rg::app
