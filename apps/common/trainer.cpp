// Training loop: per-iteration LR schedule, the loss (--loss), gradient clipping, optimizer step,
// progress output, evaluation with exact top-1/top-5 counts, early stopping, JSONL metrics.
#include "apps/common/trainer.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sys/resource.h>

#include <array>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <ostream>
#include <sstream>
#include <string_view>

#include "comm/consistency.h"
#include "comm/ddp.h"
#include "comm/debug_level.h"
#include "comm/init.h"
#include "comm/join.h"
#include "comm/reducer_snapshot.h"
#include "comm/sync_batch_norm.h"
#include "data/dataloader.h"
#include "data/registry.h"
#include "data/text.h"
#include "engine/autocast.h"
#include "engine/autograd/grad_mode.h"
#include "engine/cuda/memory.h"
#include "engine/cuda/runtime.h"
#include "engine/cuda/stream_trace.h"
#include "engine/deterministic.h"
#include "engine/ops/binary.h"
#include "engine/ops/cudnn.h"
#include "engine/ops/factory.h"
#include "engine/ops/loss.h"
#include "engine/ops/metrics.h"
#include "engine/serialization.h"
#include "engine/tf32.h"
#include "engine/trace.h"
#include "kernels/error.h"
#include "layers/amp/grad_scaler.h"
#include "layers/checkpoint.h"
#include "layers/clip_grad.h"
#include "layers/data_parallel.h"
#include "layers/models/registry.h"
#include "layers/optim/lr_schedule.h"
#include "layers/optim/optimizer.h"
#include "layers/optim/param_groups.h"

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

// The parameter groups of --weight-decay-groups: one group with every parameter, or minGPT's
// split (Linear weights decay, the rest not).
std::vector<optim::ParamGroup> weight_decay_groups(const TrainConfig& c, const nn::Module& model) {
  const std::string& g = c.weight_decay_groups;
  const bool linear = g == "linear" || (g == "auto" && c.model.starts_with("gpt-"));
  if (linear) return optim::linear_weight_decay_groups(model, c.weight_decay);
  return {optim::ParamGroup{.params = model.parameters(), .weight_decay = c.weight_decay}};
}

std::unique_ptr<optim::Optimizer> make_optimizer(const TrainConfig& c, const nn::Module& model) {
  std::vector<optim::ParamGroup> groups = weight_decay_groups(c, model);
  if (c.optimizer == "sgd") {
    return std::make_unique<optim::Sgd>(std::move(groups),
                                        optim::SgdOptions{.lr = c.lr,
                                                          .momentum = c.momentum,
                                                          .weight_decay = c.weight_decay,
                                                          .nesterov = c.nesterov});
  }
  if (c.optimizer == "adam" || c.optimizer == "adamw") {
    optim::AdamOptions o{
        .lr = c.lr, .beta1 = c.adam_beta1, .beta2 = c.adam_beta2, .weight_decay = c.weight_decay};
    if (c.optimizer == "adamw") return optim::make_adamw(std::move(groups), o);
    return std::make_unique<optim::Adam>(std::move(groups), o);
  }
  RG_FAIL("unknown optimizer '", c.optimizer, "' (expected sgd, adam or adamw)");
}

// A token model's [B, T, V] logits and [B, T] targets as [B T, V] rows and [B T] targets (every
// position is a prediction); classifiers' [B, C] and [B] pass through.
std::pair<Tensor, Tensor> as_rows(const Tensor& logits, const Tensor& targets) {
  if (logits.dim() != 3) return {logits, targets};
  return {logits.view({-1, logits.size(2)}), targets.view({-1})};
}

struct EvalResult {
  double loss = 0, top1 = 0, top5 = 0;
};

// Sums over ranks (in place); a no-op without a process group.
void sum_over_ranks(dist::ProcessGroup* pg, std::vector<double>& v) {
  if (!pg) return;
  Tensor t = dist::on_group_device(*pg, from_vector(v, {int64_t(v.size())}));
  pg->all_reduce(t)->wait();
  v = t.to_vector<double>();
}

// With a process group each rank evaluates its own shard (no padding, so no sample counts
// twice) and the counts are summed over ranks.
EvalResult evaluate(nn::Module& model, const data::Dataset& test, int64_t batch_size, int workers,
                    dist::ProcessGroup* pg, Device device, int64_t max_samples) {
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
  const int64_t n_eval = max_samples > 0 ? std::min(max_samples, test.size()) : test.size();
  std::shared_ptr<data::Sampler> sampler;
  if (pg)
    sampler = std::make_shared<data::StridedSampler>(n_eval, pg->size(), pg->rank());
  else
    sampler = std::make_shared<data::SequentialSampler>(n_eval);
  data::DataLoader loader(std::shared_ptr<const data::Dataset>(&test, [](const data::Dataset*) {}),
                          sampler, {.batch_size = batch_size, .workers = workers});
  loader.start_epoch(0);
  double loss_sum = 0;
  int64_t correct1 = 0, correct5 = 0, n = 0;
  const int64_t k5 = std::min<int64_t>(5, test.num_classes());
  while (auto batch = loader.next()) {
    const auto [logits, targets] =
        as_rows(model.forward(batch->inputs.to(device)), batch->targets.to(device));
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

// --eval-on-rank0: rank 0 evaluates the whole test set on the module itself (not the DDP wrapper,
// so no buffer broadcast is issued that the other ranks would not match) and publishes the result
// under a store key that the other ranks wait for. A store wait, not a collective barrier: the
// group's collectives time out after ProcessGroupOptions::timeout (300 s), which a long
// evaluation can exceed; this wait allows kEvalOnRank0Wait. An error on rank 0 is published too,
// so the others fail with it instead of waiting.
constexpr std::chrono::hours kEvalOnRank0Wait{24};

EvalResult evaluate_on_rank0(nn::Module& model, const data::Dataset& test, int64_t batch_size,
                             int workers, const dist::ProcessGroup& pg, Device device, int epoch,
                             int64_t max_samples) {
  const std::shared_ptr<dist::Store>& store = dist::default_store();
  const std::string key = fmt::format("ringgrad-train/eval_on_rank0/epoch{}", epoch);
  // 'R' and the three doubles, or 'E' and rank 0's error message.
  std::array<double, 3> v{};
  if (pg.rank() == 0) {
    try {
      const EvalResult r = evaluate(model, test, batch_size, workers, nullptr, device, max_samples);
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

// Gathers every rank's trace events on rank 0, which writes the Chrome trace.
void write_trace(const std::string& path, dist::ProcessGroup* pg) {
  const std::string mine = trace::serialize(trace::take_events());
  std::vector<std::string> all = {mine};
  if (pg && pg->size() > 1) {
    const int n = pg->size();
    const Device dev = pg->tensor_device();
    Tensor len = full({1}, double(mine.size()), DType::i64, dev);
    Tensor lens = Tensor::empty({n}, DType::i64, dev);
    pg->all_gather(lens, len)->wait();
    lens = lens.to(Device::cpu());
    int64_t max_len = 0;
    for (int r = 0; r < n; ++r) max_len = std::max(max_len, lens.data<int64_t>()[r]);
    Tensor buf = zeros({max_len}, DType::u8);
    std::copy(mine.begin(), mine.end(), buf.data<uint8_t>());
    Tensor bufs = Tensor::empty({max_len * n}, DType::u8, dev);
    pg->all_gather(bufs, dist::on_group_device(*pg, buf))->wait();
    bufs = bufs.to(Device::cpu());
    all.clear();
    for (int r = 0; r < n; ++r) {
      const char* p = reinterpret_cast<const char*>(bufs.data<uint8_t>() + r * max_len);
      all.emplace_back(p, size_t(lens.data<int64_t>()[r]));
    }
  }
  if (pg && pg->rank() != 0) return;
  std::vector<std::vector<trace::Event>> events;
  std::vector<std::string> names;
  for (size_t r = 0; r < all.size(); ++r) {
    events.push_back(trace::deserialize(all[r]));
    names.push_back(fmt::format("rank {}", r));
  }
  std::ofstream f(path);
  RG_CHECK(f.good(), "--trace: cannot write ", path);
  f << trace::chrome_trace_json(events, names, trace::lane_names());
}

// The batch's copy to the training device: while tracing, a span on the stream's lane.
Tensor batch_to_device(const Tensor& inputs, Device device) {
  const cuda::OpSpan span("copy to device", "data copy", device);
  return inputs.to(device);
}

// The training loss of --loss: cross-entropy on the class indices, or a regression loss of the
// logits against one-hot targets (classification as regression). `targets` are the batch's, on
// the host: the one-hot matrix is built there and copied to the logits' device.
Tensor training_loss(const TrainConfig& c, const Tensor& output, const Tensor& batch_targets) {
  const cuda::OpSpan span("loss", "loss", output.device());  // while tracing: its stream span
  const auto [logits, targets] = as_rows(output, batch_targets);
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
  const size_t slash = path.find_last_of('/');
  const size_t dot = path.find_last_of('.');
  const bool has_ext =
      dot != std::string::npos && dot > 0 && (slash == std::string::npos || dot > slash + 1);
  return has_ext ? path.substr(0, dot) + ".best" + path.substr(dot) : path + ".best";
}

TrainResult train(const TrainConfig& c, std::ostream& all_out) {
  RG_CHECK(c.epochs > 0, "--epochs must be positive, got ", c.epochs);
  RG_CHECK(c.grad_accum_steps >= 1, "--grad-accum-steps must be >= 1");
  if (const std::string error = config_error(c); !error.empty()) RG_FAIL(error);
  const dist::LaunchEnv env = dist::read_launch_env();
  std::shared_ptr<dist::ProcessGroup> pg;
  Device device = parse_device(c.device);
  if (!c.debug_distributed.empty())
    dist::set_debug_level(dist::parse_debug_level(c.debug_distributed));
  if (env.world_size > 1) {
    RG_CHECK(device.is_cuda() || c.backend != "nccl",
             "--backend nccl reduces CUDA tensors: add --device cuda (or use --backend gloo)");
    RG_CHECK(!device.is_cuda() || c.backend != "gloo",
             "--device cuda needs --backend nccl (or auto): gloo reduces CPU tensors");
    dist::InitOptions io;
    io.backend = device.is_cuda() ? "nccl" : c.backend == "auto" ? "gloo" : c.backend;
    io.group.algorithm = dist::parse_algorithm(c.allreduce);
    io.init_method = c.init_method;
    io.group.timeout = dist::Millis(int64_t(c.timeout_s * 1000));
    pg = dist::is_initialized() ? dist::default_group() : dist::init_process_group(env, io);
  }
  const int rank = pg ? pg->rank() : 0, world = pg ? pg->size() : 1;
  // The mode asked for must be the one the launch gives: ddp needs ranks, dp and single one
  // process.
  RG_CHECK(c.mode != "ddp" || world > 1,
           "--mode ddp needs several ranks: start it with ringgrad-run --nproc-per-node N (or set "
           "the launch variables); one process is --mode single or dp");
  RG_CHECK(c.mode == "auto" || c.mode == "ddp" || world == 1, "--mode ", c.mode,
           " runs in one process, but this job has ", world, " ranks (use --mode ddp)");
  RG_CHECK(c.mode != "dp" || device.is_cuda(),
           "--mode dp spreads the batch over CUDA devices: add --device cuda");
  // Fault injection for the restart tests, not for users: RG_TEST_FAULT=<where>:<n>:<rank> kills
  // this process (SIGKILL, as kill -9) when rank <rank> reaches <where> (step: after optimizer
  // step n; eval: the evaluation after epoch n; snapshot: just before the snapshot of step n is
  // written; snapshot-write: half-way through writing it, before the rename, through
  // engine/serialization.h's partial-write hook; stop: SIGSTOP instead, after step n), on the
  // first attempt only (RG_RESTART_COUNT 0). perturb (for the --check-consistency tests) kills
  // nothing: it adds 1e-3 to the first element of the first parameter after step n, so that
  // rank drifts from the others.
  const auto fault_at = [rank, restart = env.restart_count](const char* where, int64_t n) {
    static const std::string spec = [] {
      const char* v = std::getenv("RG_TEST_FAULT");
      return std::string(v ? v : "");
    }();
    return !spec.empty() && restart == 0 && spec == fmt::format("{}:{}:{}", where, n, rank);
  };
  const auto test_fault = [&fault_at](const char* where, int64_t n) {
    if (fault_at(where, n)) ::raise(SIGKILL);
    // stop:N:R stops rank R after step N (SIGSTOP, as a hung process), for the debug tests.
    if (std::string_view(where) == "step" && fault_at("stop", n)) ::raise(SIGSTOP);
  };
  // For the resume tests, not for users: RG_TEST_SAMPLE_LOG=<dir> appends one line per batch,
  // "<epoch> <step> <index>...", to <dir>/rank<r>.txt (flushed, so a killed rank's log is whole).
  std::unique_ptr<std::ofstream> sample_log;
  if (const char* dir = std::getenv("RG_TEST_SAMPLE_LOG"); dir && *dir) {
    sample_log =
        std::make_unique<std::ofstream>(fmt::format("{}/rank{}.txt", dir, rank), std::ios::app);
    RG_CHECK(sample_log->good(), "RG_TEST_SAMPLE_LOG: cannot write into ", dir);
  }
  // The run's algorithm switches, restored on every way out (tests run several trainings).
  struct AlgorithmSwitches {
    bool deterministic = deterministic_algorithms(), benchmark = cudnn_benchmark();
    cuda::Tf32Guard tf32{cuda::allow_tf32_conv(), cuda::allow_tf32_matmul()};
    ~AlgorithmSwitches() {
      set_deterministic_algorithms(deterministic);
      set_cudnn_benchmark(benchmark);
    }
  } restore_switches;
  set_deterministic_algorithms(c.deterministic);
  set_cudnn_benchmark(c.cudnn_benchmark);
  RG_CHECK(c.tf32 == "default" || c.tf32 == "on" || c.tf32 == "off",
           "--tf32 must be on, off or default, got ", c.tf32);
  if (c.tf32 != "default") {
    cuda::set_allow_tf32_conv(c.tf32 == "on");
    cuda::set_allow_tf32_matmul(c.tf32 == "on");
  }
  // Under DDP "cuda" is the GPU the rank's NCCL group uses.
  if (pg && device.is_cuda() && c.device == "cuda") device = pg->tensor_device();
  // Only rank 0 reports; the others write into a stream without a buffer (a no-op).
  std::ostream silent(nullptr);
  std::ostream& out = rank == 0 ? all_out : silent;
  RG_CHECK(c.batch_size > 0, "--batch-size must be positive, got ", c.batch_size);
  RG_CHECK(c.test_batch_size > 0, "--test-batch-size must be positive");
  RG_CHECK(c.eval_every >= 0, "--eval-every must be >= 0");
  const std::string dir = c.data_dir.empty() ? "data/" + c.dataset : c.data_dir;
  const data::DatasetOptions data_options{.augment = c.augment,
                                          .seed = c.seed,
                                          .data_file = c.data_file,
                                          .block_size = c.block_size,
                                          .val_fraction = c.val_fraction};
  auto train_set = data::make_dataset(c.dataset, dir, true, data_options);
  auto test_set = data::make_dataset(c.dataset, dir, false, data_options);
  // The text data set's vocabulary: part of the run's shape, and what ringgrad-sample decodes with.
  const auto* text_set = dynamic_cast<const data::CharDataset*>(train_set.get());
  const nn::ModelSpec model_spec{.name = c.model,
                                 .sample_shape = train_set->sample_shape(),
                                 .num_classes = train_set->num_classes(),
                                 .seed = c.seed,
                                 .dropout = c.dropout,
                                 .tie_weights = c.tie_weights};
  auto model = nn::make_model(model_spec);
  model->to(device);
  model->train();
  auto opt = make_optimizer(c, *model);
  RG_CHECK(c.amp == "off" || c.amp == "f16" || c.amp == "bf16",
           "--amp must be off, f16 or bf16, got '", c.amp, "'");
  // f16's narrow range needs loss scaling; bf16 has f32's range and runs without (as PyTorch's
  // recipes). Autocast covers the forward and the loss; parameters and the step stay f32.
  amp::GradScalerOptions scaler_options;
  scaler_options.enabled = c.amp == "f16";
  amp::GradScaler scaler(scaler_options);
  amp::GradScaler* const saved_scaler = scaler.is_enabled() ? &scaler : nullptr;
  const auto autocast = [&] {
    return std::make_unique<AutocastGuard>(
        device, c.amp == "off" ? DType::bf16 : parse_dtype(c.amp), c.amp != "off");
  };
  std::shared_ptr<data::Sampler> sampler;
  if (pg)
    sampler = std::make_shared<data::DistributedSampler>(train_set->size(), world, rank,
                                                         /*shuffle=*/true, c.seed);
  else
    sampler = std::make_shared<data::RandomSampler>(train_set->size(), c.seed);
  data::DataLoader loader(train_set, sampler,
                          {.batch_size = c.batch_size, .drop_last = false, .workers = c.workers});
  const int64_t steps_per_epoch = c.steps_per_epoch > 0
                                      ? std::min(c.steps_per_epoch, loader.num_batches())
                                      : loader.num_batches();

  // What must match for a checkpoint to continue this run, causes before consequences
  // (steps_per_epoch follows from the others). Paths, workers, tracing and --max-steps may differ;
  // so may the world size (and with it steps_per_epoch): see the resume below.
  std::vector<std::pair<std::string, std::string>> run_shape = {
      {"model", c.model},
      {"dataset", c.dataset},
      {"augment", c.augment ? "1" : "0"},
      {"world_size", std::to_string(world)},
      {"batch_size", std::to_string(c.batch_size)},
      {"grad_accum_steps", std::to_string(c.grad_accum_steps)},
      {"seed", std::to_string(c.seed)},
      {"epochs", std::to_string(c.epochs)},
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
      {"model.dropout", c.dropout ? "1" : "0"},
      {"model.tie_weights", c.tie_weights ? "1" : "0"},
      {"optimizer.groups", c.weight_decay_groups},
      {"optimizer.betas", fmt::format("{},{}", c.adam_beta1, c.adam_beta2)},
      {"steps_per_epoch", std::to_string(steps_per_epoch)}};
  if (text_set) {
    run_shape.emplace_back("text.block_size", std::to_string(c.block_size));
    run_shape.emplace_back("text.val_fraction", fmt::format("{}", c.val_fraction));
    run_shape.emplace_back("text.vocab", text_set->vocab().to_utf8());
  }

  int first_epoch = 1;
  int64_t step = 0;
  // Early stopping's state; rank 0 decides and every rank follows (see below). Saved in every
  // checkpoint, so a resumed run keeps counting.
  int best_epoch = 0, bad_evals = 0;
  double best_metric = 0;
  // A snapshot that exists is where this run continues (a restarted identical command).
  const bool from_snapshot = !c.snapshot_path.empty() && std::filesystem::exists(c.snapshot_path);
  RG_CHECK(!from_snapshot || c.resume_path.empty(), "--resume ", c.resume_path, " and --snapshot ",
           c.snapshot_path, " (which exists) both say where to continue; give one");
  const std::string resume_from = from_snapshot ? c.snapshot_path : c.resume_path;
  // Mid-epoch position of a snapshot: steps done in first_epoch, their loss sum and samples.
  int64_t resume_epoch_steps = 0, resume_samples = 0;
  double resume_loss_sum = 0;
  // The world size the checkpoint was written at; how many leading samples of first_epoch's order
  // (data::epoch_order) all ranks had trained on; and, when that epoch runs re-split batches (a
  // resume at another world size), the position its re-split started from (-1: the sampler's).
  int saved_world = world;
  int64_t resume_consumed = 0, resplit_from = -1;
  std::vector<int64_t> resume_bucket_order;
  // What the file holds beyond the model and optimizer (DDP's state, comm/reducer_snapshot.h).
  nn::Metadata resume_metadata;
  NamedTensors resume_tensors;
  bool snapshot_finished = false;
  if (!resume_from.empty()) {
    RG_CHECK(c.comm_hook != "powersgd" || from_snapshot,
             "--resume with --comm-hook powersgd is not supported: epoch checkpoints do not carry "
             "PowerSGD's error feedback and factors (--snapshot files do)");
    const auto check_run = [&](const nn::Metadata& saved) {
      const std::string where = (from_snapshot ? "--snapshot " : "--resume ") + resume_from;
      // Keys added after the first checkpoints: one that is missing was the default.
      const std::map<std::string, std::string> added_later = {{"loss", "cross-entropy"},
                                                              {"clip_grad", "norm=0 value=0"},
                                                              {"sync_bn", "0"},
                                                              {"model.dropout", "1"},
                                                              {"model.tie_weights", "0"},
                                                              {"optimizer.groups", "auto"},
                                                              {"optimizer.betas", "0.9,0.999"}};
      const auto saved_world_entry = saved.find("run.world_size");
      if (saved_world_entry != saved.end())
        saved_world = int(std::strtol(saved_world_entry->second.c_str(), nullptr, 10));
      RG_CHECK(saved_world >= 1, where, ": the checkpoint's world size '",
               saved_world_entry->second, "' is not a count");
      for (const auto& [key, value] : run_shape) {
        // Another world size resumes too (the rest of the epoch is re-split below), and changes
        // the steps per epoch.
        if (saved_world != world && (key == "world_size" || key == "steps_per_epoch")) continue;
        const auto it = saved.find("run." + key);
        const auto later = added_later.find(key);
        const bool was_default =
            it == saved.end() && later != added_later.end() && later->second == value;
        RG_CHECK(was_default || (it != saved.end() && it->second == value), where,
                 ": the checkpoint's ", key, " is ",
                 it == saved.end() ? "missing" : "'" + it->second + "'", ", this run's is '", value,
                 "' (resuming continues the same run)");
      }
      const auto number = [&](const char* key) {
        const auto it = saved.find(key);
        RG_CHECK(it != saved.end() && !it->second.empty() &&
                     it->second.find_first_not_of("0123456789") == std::string::npos &&
                     it->second.size() < 16,
                 where, ": the checkpoint's ", key, " entry is missing or not a count");
        return std::stoll(it->second);
      };
      first_epoch = int(number("epoch")) + 1;
      step = number("step");
      if (saved.count("snapshot.epoch_steps")) {  // taken mid-epoch: continue that epoch
        resume_epoch_steps = number("snapshot.epoch_steps");
        resume_samples = number("snapshot.samples");
        resume_loss_sum = std::strtod(saved.at("snapshot.loss_sum").c_str(), nullptr);
        // Snapshots before re-splitting existed held full steps of the sampler's layout only.
        resume_consumed = saved.count("snapshot.epoch_consumed")
                              ? number("snapshot.epoch_consumed")
                              : resume_epoch_steps * c.batch_size * saved_world;
        if (saved.count("snapshot.resplit_from")) resplit_from = number("snapshot.resplit_from");
        RG_CHECK(resume_epoch_steps > 0 && resume_consumed > 0 &&
                     resume_consumed < train_set->size() && resplit_from < resume_consumed,
                 where, ": the snapshot's position (", resume_epoch_steps, " steps, ",
                 resume_consumed, " samples) is not inside an epoch of ", train_set->size(),
                 " samples");
        RG_CHECK(saved_world != world || resplit_from >= 0 || resume_epoch_steps < steps_per_epoch,
                 where, ": the snapshot's position ", resume_epoch_steps,
                 " is not inside an epoch of ", steps_per_epoch, " steps");
      }
      if (const auto order = saved.find("snapshot.bucket_order");
          order != saved.end() && !order->second.empty()) {
        std::stringstream in(order->second);
        for (std::string item; std::getline(in, item, ',');)
          resume_bucket_order.push_back(std::stoll(item));
      }
      const auto metric = saved.find("early_stop.metric");
      if (c.early_stop_patience > 0 && metric != saved.end() &&
          metric->second == c.early_stop_metric) {
        best_epoch = int(number("early_stop.best_epoch"));
        bad_evals = int(number("early_stop.bad_evals"));
        const auto value = saved.find("early_stop.best_metric");
        RG_CHECK(value != saved.end(), where,
                 ": the checkpoint's early_stop.best_metric is missing");
        best_metric = std::strtod(value->second.c_str(), nullptr);
      }
      // A snapshot of a finished run: a restarted command has nothing left to do (the recipe's
      // loop would not run); --resume of one is a mistake worth saying.
      const bool finished = first_epoch > c.epochs || (c.max_steps >= 0 && c.max_steps <= step);
      RG_CHECK(from_snapshot || first_epoch <= c.epochs, where, ": the run is complete (",
               first_epoch - 1, " of ", c.epochs, " epochs)");
      RG_CHECK(from_snapshot || c.max_steps < 0 || c.max_steps > step, where, ": --max-steps ",
               c.max_steps, " is not beyond the checkpoint's step ", step);
      snapshot_finished = from_snapshot && finished;
    };
    // Restored before DDP is built, so its broadcast from rank 0 sends the restored weights.
    resume_metadata = nn::load_checkpoint(resume_from, *model, opt.get(), saved_scaler, check_run,
                                          &resume_tensors);
    if (snapshot_finished) {
      out << fmt::format(
          "ringgrad-train: the snapshot {} is of a finished run (step {}); nothing left to do\n",
          resume_from, step);
      TrainResult done;
      done.total_steps = step;
      return done;
    }
    if (resume_epoch_steps > 0) {
      out << fmt::format(
          "ringgrad-train: resumed from {} in epoch {} after {} of its steps (step {})\n",
          resume_from, first_epoch, resume_epoch_steps, step);
    } else {
      out << fmt::format("ringgrad-train: resumed from {} after epoch {} (step {})\n", resume_from,
                         first_epoch - 1, step);
    }
  }
  // The rest of a mid-epoch snapshot's epoch at another world size: the samples of the epoch's
  // order past what every rank had trained on, re-split over this run's ranks (each exactly once,
  // every rank the same number of steps). A snapshot taken inside such an epoch at this world size
  // rebuilds the same re-split and continues it, so restarts there are exact too.
  std::optional<data::RankBatches> resplit;
  if (resume_epoch_steps > 0 && (saved_world != world || resplit_from >= 0)) {
    RG_CHECK(c.steps_per_epoch == 0, "--snapshot ", resume_from,
             ": resuming an epoch at another "
             "world size (",
             saved_world, " ranks, now ", world,
             ") re-splits the rest of the "
             "whole epoch, which --steps-per-epoch cuts short; resume at ",
             saved_world, " ranks or from an epoch end");
    if (saved_world != world) resplit_from = resume_consumed;
    const std::vector<int64_t> order =
        data::epoch_order(train_set->size(), c.seed, first_epoch - 1);
    resplit = data::resplit_remaining(std::span(order).subspan(size_t(resplit_from)), world, rank,
                                      c.batch_size);
    if (saved_world != world) {
      resume_epoch_steps = 0;
      out << fmt::format(
          "ringgrad-train: the snapshot is from {} ranks, this run has {}: the {} samples left of "
          "epoch {} are re-split into {} steps of {} to {} samples per rank\n",
          saved_world, world, train_set->size() - resume_consumed, first_epoch, resplit->size(),
          (train_set->size() - resume_consumed) / (resplit->size() * world),
          (train_set->size() - resume_consumed + resplit->size() * world - 1) /
              (resplit->size() * world));
    }
    RG_CHECK(resume_epoch_steps < resplit->size(), "--snapshot ", resume_from,
             ": the snapshot's position ", resume_epoch_steps,
             " is not inside the re-split epoch's ", resplit->size(), " steps");
  } else if (!resume_from.empty() && saved_world != world) {
    out << fmt::format(
        "ringgrad-train: the checkpoint is from {} ranks, this run has {}: {} steps per epoch from "
        "epoch {} on\n",
        saved_world, world, steps_per_epoch, first_epoch);
  }
  if (c.sync_bn) {
    // Before DDP wraps the model, as torch.nn.SyncBatchNorm.convert_sync_batchnorm; its
    // collectives run on DDP's group, in issue order with the buckets' all-reduces.
    if (!pg) {
      out << "ringgrad-train: --sync-bn with one process: plain batch norm\n";
    } else if (const int64_t n = dist::convert_sync_batchnorm(*model, pg); n == 0) {
      out << fmt::format(
          "ringgrad-train: warning: --sync-bn: model {} has no batch norm, nothing "
          "to synchronize\n",
          c.model);
    } else {
      out << fmt::format(
          "ringgrad-train: --sync-bn: {} batch norm layers synchronized over {} "
          "ranks\n",
          n, world);
    }
  }
  // --mode dp: one process, the batch scattered over several devices (torch.nn.DataParallel).
  std::unique_ptr<nn::DataParallel> dp;
  if (c.mode == "dp") {
    const int visible = cuda::runtime().device_count();
    const int n = c.dp_devices > 0 ? c.dp_devices : visible;
    RG_CHECK(n <= visible, "--dp-devices ", n, ": this process sees ", visible, " CUDA device",
             visible == 1 ? "" : "s");
    std::vector<Device> devices;
    for (int k = 0; k < n; ++k) devices.push_back(Device::cuda(k));
    RG_CHECK(device == devices[0], "--mode dp keeps the module on cuda:0 (got ", device.str(), ")");
    dp = std::make_unique<nn::DataParallel>(model, devices,
                                            [&] { return nn::make_model(model_spec); });
    out << fmt::format(
        "ringgrad-train: DataParallel over {} devices (batch {} split along dim 0)\n", n,
        c.batch_size);
  }
  std::unique_ptr<dist::DistributedDataParallel> ddp;
  if (pg) {
    dist::DdpOptions o;
    o.bucket_cap_mb = c.bucket_cap_mb;
    o.first_bucket_mb = c.first_bucket_mb;
    o.overlap = c.overlap;
    o.comm_hook = dist::parse_comm_hook(c.comm_hook);
    o.powersgd.rank = c.powersgd_rank;
    o.powersgd.start_iter = c.powersgd_start_iter;
    o.powersgd.seed = c.seed;
    o.find_unused_parameters = c.find_unused_parameters;
    o.gradient_as_bucket_view = c.gradient_as_bucket_view;
    o.static_graph = c.static_graph;
    ddp = std::make_unique<dist::DistributedDataParallel>(model, pg, o);
    // The buckets the interrupted run had rebuilt, so every all-reduce sums as it did there.
    if (!resume_bucket_order.empty() && (!c.find_unused_parameters || c.static_graph))
      ddp->reducer().restore_rebuilt_order(resume_bucket_order);
    // Then what DDP carries between iterations (PowerSGD's errors and factors, the iteration
    // count), into those buckets.
    if (!resume_from.empty())
      dist::restore_reducer(ddp->reducer(), resume_tensors, resume_metadata, rank, world, out);
  }

  // Steps in an epoch (the first may be re-split) and in the run: what is left from `step` on.
  const auto epoch_total = [&](int epoch) {
    return epoch == first_epoch && resplit ? resplit->size() : steps_per_epoch;
  };
  const int64_t steps_left = epoch_total(first_epoch) - resume_epoch_steps +
                             steps_per_epoch * int64_t(c.epochs - first_epoch);
  const int64_t planned_steps =
      c.max_steps >= 0 ? std::min<int64_t>(c.max_steps, step + steps_left) : step + steps_left;
  // How many leading samples of an epoch's order all ranks have trained on after `steps` steps.
  const auto consumed_after = [&](int epoch, int64_t steps) -> int64_t {
    if (epoch == first_epoch && resplit)
      return resplit_from + (steps > 0 ? resplit->consumed[size_t(steps - 1)] : 0);
    return std::min(steps * c.batch_size * world, train_set->size());
  };
  // The LR schedule counts steps of this world size: epoch e's steps start at (e - 1) times
  // steps_per_epoch (the global step itself when the world size never changed). In a re-split
  // epoch a step's place is its share of the epoch's samples, so the schedule stays on course
  // (and inside its horizon) whatever the world size was before.
  const auto schedule_step = [&](int epoch, int64_t epoch_steps) {
    const int64_t base = int64_t(epoch - 1) * steps_per_epoch;
    if (epoch == first_epoch && resplit)
      return base + consumed_after(epoch, epoch_steps) * steps_per_epoch / train_set->size();
    return base + epoch_steps;
  };
  std::vector<int64_t> milestones;
  for (int64_t m : c.lr_milestones) milestones.push_back(m * steps_per_epoch);
  auto schedule =
      optim::make_schedule(c.lr_schedule, c.lr, steps_per_epoch * c.epochs,
                           int64_t(std::llround(c.warmup_epochs * double(steps_per_epoch))), 0.1,
                           c.lr_step_size * steps_per_epoch, milestones, c.lr_gamma);

  std::unique_ptr<std::ofstream> metrics;
  if (!c.metrics_path.empty() && rank == 0) {
    metrics = std::make_unique<std::ofstream>(c.metrics_path);
    RG_CHECK(metrics->good(), "--metrics: cannot write ", c.metrics_path);
  }

  out << fmt::format(
      "ringgrad-train: {} on {} ({} train / {} test samples), {} parameters, "
      "{} lr={} batch={} epochs={} on {}\n",
      c.model, c.dataset, train_set->size(), test_set->size(), model->parameter_count(),
      opt->name(), c.lr, c.batch_size, c.epochs, device.str());
  if (text_set)
    out << fmt::format(
        "ringgrad-train: text {}: vocabulary of {} characters, blocks of {} tokens ({} per step "
        "in all), {} steps per epoch\n",
        c.data_file, text_set->vocab().size(), c.block_size, c.batch_size * c.block_size * world,
        steps_per_epoch);
  if (const auto groups = weight_decay_groups(c, *model); groups.size() > 1 && c.weight_decay > 0) {
    std::vector<std::string> parts;
    for (const auto& g : groups) {
      int64_t n = 0;
      for (const Tensor& p : g.params) n += p.numel();
      parts.push_back(fmt::format("{} on {} tensors ({} values)", g.weight_decay.value_or(0),
                                  g.params.size(), n));
    }
    out << fmt::format("ringgrad-train: weight decay {}\n", fmt::join(parts, ", "));
  }
  if (pg)
    out << fmt::format(
        "ringgrad-train: DDP over {} ranks ({} {}, buckets {} MiB / first {} MiB, "
        "{}, hook {}), batch {} per rank = {} in all{}\n",
        world, pg->backend(), c.allreduce, c.bucket_cap_mb, c.first_bucket_mb,
        c.overlap ? "overlapped with backward" : "after backward", c.comm_hook, c.batch_size,
        c.batch_size * world,
        c.grad_accum_steps > 1 ? fmt::format(", {} accumulation steps", c.grad_accum_steps) : "");
  if (device.is_cuda())
    out << fmt::format(
        "ringgrad-train: f32 precision on CUDA (--tf32 {}): convolutions {}, "
        "matrix products {}\n",
        c.tf32, cuda::allow_tf32_conv() ? "TF32" : "f32",
        cuda::allow_tf32_matmul() ? "TF32" : "f32");
  else if (c.tf32 != "default")
    out << "ringgrad-train: note: --tf32 has no effect on the CPU (TF32 is a CUDA precision)\n";
  if (c.cudnn_benchmark && !device.is_cuda())
    out << "ringgrad-train: note: --cudnn-benchmark has no effect on the CPU (cuDNN is CUDA's)\n";
  if (c.cudnn_benchmark && c.deterministic && device.is_cuda())
    out << "ringgrad-train: note: --cudnn-benchmark times deterministic algorithms only, but two "
           "runs may choose different ones (and round differently); leave it off for bit-identical "
           "runs\n";
  if (c.eval_on_rank0 && !pg)
    out << "ringgrad-train: note: --eval-on-rank0 has no effect without DDP (one process "
           "evaluates the whole test set anyway)\n";
  out.flush();

  if (!c.trace_path.empty()) {
    trace::take_events();  // start from an empty buffer
    trace::set_enabled(true);
  }
  // Rank 0 writes; every rank learns whether that worked, so a failed save stops the whole job
  // instead of leaving the other ranks waiting in the next collective.
  const auto save_epoch_checkpoint = [&](int epoch, bool complete, const std::string& path,
                                         const nn::Metadata& extra, const char* what = "checkpoint",
                                         const NamedTensors& extra_tensors = {}) {
    if (!complete) {
      out << fmt::format(
          "epoch {} | no checkpoint: the epoch was cut short by --max-steps "
          "(checkpoints are taken at epoch ends)\n",
          epoch);
      return;
    }
    std::string error;
    if (rank == 0) {
      nn::Metadata meta;
      for (const auto& [key, value] : run_shape) meta["run." + key] = value;
      meta["epoch"] = std::to_string(epoch);
      meta["step"] = std::to_string(step);
      meta.insert(extra.begin(), extra.end());
      try {
        nn::save_checkpoint(path, *model, opt.get(), saved_scaler, meta, extra_tensors);
      } catch (const Error& e) {
        error = e.what();
      }
    }
    std::vector<double> failed = {error.empty() ? 0.0 : 1.0};
    sum_over_ranks(pg.get(), failed);
    RG_CHECK(failed[0] == 0.0, "--", what, ": ",
             rank == 0 ? error : fmt::format("rank 0 could not save the {}", what));
    if (std::string_view(what) == "checkpoint")
      out << fmt::format("epoch {} | checkpoint saved to {}\n", epoch, path);
    out.flush();
  };
  const bool early_stop = c.early_stop_patience > 0;
  const auto early_stop_metadata = [&] {
    nn::Metadata m;
    if (early_stop) {
      m = {{"early_stop.metric", c.early_stop_metric},
           {"early_stop.best_epoch", std::to_string(best_epoch)},
           {"early_stop.best_metric", fmt::format("{}", best_metric)},
           {"early_stop.bad_evals", std::to_string(bad_evals)}};
    }
    return m;
  };
  // A snapshot: as an epoch checkpoint, plus the position inside the epoch (when mid-epoch) and
  // DDP's rebuilt bucket order. Every rank takes part (the save's success is all-reduced), so
  // they agree on the step it belongs to before any goes on.
  const auto save_snapshot = [&](int epoch, int64_t epoch_steps, double loss_sum, int64_t samples,
                                 const nn::Metadata& extra) {
    nn::Metadata meta = extra;
    const bool mid_epoch = epoch_steps < epoch_total(epoch);
    if (mid_epoch) {
      // The epoch's loss so far over all ranks; a resumed run hands it to rank 0.
      std::vector<double> totals = {loss_sum, double(samples)};
      sum_over_ranks(pg.get(), totals);
      meta["snapshot.epoch_steps"] = std::to_string(epoch_steps);
      meta["snapshot.epoch_consumed"] = std::to_string(consumed_after(epoch, epoch_steps));
      if (epoch == first_epoch && resplit)
        meta["snapshot.resplit_from"] = std::to_string(resplit_from);
      meta["snapshot.samples"] = fmt::format("{}", int64_t(totals[1]));
      meta["snapshot.loss_sum"] = fmt::format("{}", totals[0]);  // shortest exact form
    }
    dist::ReducerSnapshot reducer_state;
    if (ddp) {
      meta["snapshot.bucket_order"] =
          fmt::format("{}", fmt::join(ddp->reducer().rebuilt_order(), ","));
      reducer_state = dist::snapshot_reducer(ddp->reducer(), *pg);  // collective
      meta.insert(reducer_state.metadata.begin(), reducer_state.metadata.end());
    }
    test_fault("snapshot", step);
    if (fault_at("snapshot-write", step)) set_partial_write_hook([] { ::raise(SIGKILL); });
    // A write killed before its rename left its temporary file; this job is the path's only
    // writer, so whatever is there is such a leftover.
    if (rank == 0)
      if (const int n = remove_save_temporaries(c.snapshot_path); n > 0)
        out << fmt::format(
            "ringgrad-train: removed {} temporary file(s) of an unfinished write of {}\n", n,
            c.snapshot_path);
    save_epoch_checkpoint(mid_epoch ? epoch - 1 : epoch, true, c.snapshot_path, meta, "snapshot",
                          reducer_state.tensors);
  };
  const std::vector<Tensor> params = model->parameters();
  // --check-consistency: the tensors every check hashes. Buffers follow each rank's own batch
  // between DDP's broadcasts (running statistics) unless --sync-bn keeps them equal, so only then
  // are they compared.
  const auto named_params = model->named_parameters();
  const bool check_buffers = c.sync_bn || model->named_buffers().empty();
  if (pg && c.check_consistency > 0 && !check_buffers)
    out << fmt::format(
        "ringgrad-train: --check-consistency {}: parameters are compared, buffers not (each rank's "
        "running statistics follow its own batches between broadcasts; --sync-bn keeps them "
        "equal)\n",
        c.check_consistency);
  dist::ConsistencyCheck consistency;
  int64_t optimizer_steps = 0;  // taken by this process (the checks count from its start)
  const bool early_stop_top1 = c.early_stop_metric == "top1";
  // On the accumulated gradients, averaged over ranks (DDP's all-reduce has finished when
  // backward returns) and unscaled (as clip_grad_norm_ after scaler.unscale_ in PyTorch).
  const auto optimizer_step = [&] {
    ++optimizer_steps;
    if (c.clip_grad_norm > 0 || c.clip_grad_value > 0) {
      trace::Scope t("clip gradients", "step");
      if (scaler.is_enabled()) scaler.unscale_(*opt);
      if (c.clip_grad_norm > 0) nn::utils::clip_grad_norm_(params, c.clip_grad_norm);
      if (c.clip_grad_value > 0) nn::utils::clip_grad_value_(params, c.clip_grad_value);
    }
    trace::Scope t("optimizer step", "step");
    scaler.step(*opt);  // opt->step() unless f16 gradients overflowed
    scaler.update();
  };
  // Rates count targets: images, or with token data every predicted token.
  const char* const rate_unit = text_set ? "tok/s" : "img/s";
  TrainResult result;
  const auto run_start = Clock::now();
  for (int epoch = first_epoch; epoch <= c.epochs && step < planned_steps; ++epoch) {
    // A snapshot taken mid-epoch continues that epoch where it stopped.
    const bool resumed_here = epoch == first_epoch && resume_epoch_steps > 0;
    if (epoch == first_epoch && resplit)
      loader.start_epoch(epoch - 1, *resplit, resume_epoch_steps);
    else
      loader.start_epoch(epoch - 1, resumed_here ? resume_epoch_steps : 0);
    const auto epoch_start = Clock::now();
    // The epoch's loss so far (all ranks' sum) goes to rank 0 and the epoch total stays right; it
    // is added in another order than without the interruption (last digits of the logged loss).
    double loss_sum = resumed_here && rank == 0 ? resume_loss_sum : 0;
    int64_t samples = resumed_here && rank == 0 ? resume_samples : 0;
    int64_t epoch_steps = resumed_here ? resume_epoch_steps : 0;
    // What this process ran of the epoch (rates and ETA leave out what a snapshot restored).
    const int64_t samples_before = samples, steps_before = epoch_steps;
    const int64_t epoch_planned = std::min(epoch_total(epoch), planned_steps - step + epoch_steps);
    const int64_t plain_every = std::max<int64_t>(1, epoch_planned / 10);
    // The progress output's loss: the mean over every rank's samples of the steps since the last
    // plain line, all-reduced at each plain line's step (the same steps on every rank, whatever
    // the output is).
    double window_loss = 0, shown_loss = std::nan("");
    int64_t window_samples = 0;
    // This rank's batches in the epoch: all of them, or with --uneven-data the last `rank` left
    // out (at least one kept).
    const int64_t my_planned =
        c.uneven_data && pg
            ? std::max<int64_t>(std::min<int64_t>(1, epoch_planned), epoch_planned - rank)
            : epoch_planned;
    const auto report_step = [&](int64_t n) { return n % plain_every == 0 || n == epoch_planned; };
    // --join: the epoch runs inside a Join context. A rank that ran out shadows each remaining
    // iteration of the others: DDP's collectives (its joinable, first), then this loop's own:
    // the same optimizer step on the averaged gradients that its shadow all-reduce received (so
    // parameters and optimizer state stay those of the other ranks) and zeros for the loss sums
    // at the same report steps.
    std::unique_ptr<dist::CallbackJoinable> loop_joinable;
    std::optional<dist::Join> join;
    if (ddp && c.join) {
      loop_joinable = std::make_unique<dist::CallbackJoinable>([&](const dist::JoinRound& r) {
        if (epoch_steps % c.grad_accum_steps == 0)
          opt->set_lr(schedule->lr_at(schedule_step(epoch, epoch_steps)));
        if (r.sync) {
          optimizer_step();
          opt->zero_grad();
        }
        ++step;
        ++epoch_steps;
        if (report_step(epoch_steps)) {
          std::vector<double> w = {0, 0};
          sum_over_ranks(pg.get(), w);
        }
      });
      join.emplace(std::vector<dist::Joinable*>{ddp.get(), loop_joinable.get()}, pg);
    }
    while (step < planned_steps && epoch_steps < my_planned) {
      if (trace::enabled() && step >= c.trace_steps) trace::set_enabled(false);
      std::optional<data::Batch> batch;
      {
        trace::Scope t("data wait", "data");
        batch = loader.next();
      }
      if (!batch) break;
      if (sample_log)
        *sample_log << fmt::format("{} {} {}", epoch, step + 1, fmt::join(batch->indices, " "))
                    << std::endl;
      // Gradient accumulation: micro-batches until the k-th (or the epoch's last) step the
      // optimizer; the earlier ones skip DDP's all-reduce through no_sync().
      const int64_t micro = epoch_steps % c.grad_accum_steps;
      // Under Join every rank synchronizes at the same steps (Join needs the active ranks to
      // agree), so a rank that runs out inside an accumulation window drops that window's
      // micro-batches (it joins and sends zeros); without Join its last batch synchronizes.
      const bool sync =
          micro + 1 == c.grad_accum_steps || epoch_steps + 1 == (join ? epoch_planned : my_planned);
      // Without Join DDP compares, in this backward's status element, whether every rank's data
      // ends here: a rank that runs out before the others is an error naming it on every rank.
      if (ddp && !join && sync && (epoch_steps + 1 == my_planned || step + 1 == planned_steps))
        ddp->announce_last_iteration();
      const bool check_now =
          pg && c.check_consistency > 0 && sync && (optimizer_steps + 1) % c.check_consistency == 0;
      if (micro == 0) {
        opt->set_lr(schedule->lr_at(schedule_step(epoch, epoch_steps)));
        opt->zero_grad();
      }
      Tensor loss;
      {
        std::optional<dist::DistributedDataParallel::NoSync> no_sync;
        if (ddp && !sync) no_sync.emplace(*ddp);
        {
          trace::Scope t("forward", "step");
          const auto amp_scope = autocast();
          // DataParallel scatters the host batch itself.
          const Tensor inputs = dp ? batch->inputs : batch_to_device(batch->inputs, device);
          const Tensor logits = ddp  ? ddp->forward(inputs)
                                : dp ? dp->forward(inputs)
                                     : model->forward(inputs);
          loss = training_loss(c, logits, batch->targets);
        }
        trace::Scope t("backward", "step");
        scaler.scale(c.grad_accum_steps > 1 ? loss * (1.0 / double(c.grad_accum_steps)) : loss)
            .backward();
      }
      // In DETAIL the averaged gradients too, as backward left them (before clipping or a step).
      if (check_now && dist::debug_level() == dist::DebugLevel::detail)
        consistency.add_gradients(named_params);
      if (sync) optimizer_step();
      const double l = loss.item();
      RG_CHECK(std::isfinite(l), "training diverged: loss is ", l, " at step ", step,
               " (try a lower --lr)");
      const int64_t b = batch->targets.numel();
      loss_sum += l * double(b);
      samples += b;
      window_loss += l * double(b);
      window_samples += b;
      ++step;
      ++epoch_steps;
      test_fault("step", step);
      if (fault_at("perturb", step)) {
        NoGradGuard no_grad;
        Tensor first = params.front().flat_narrow(0, 1);
        first.fill_(first.item() + 1e-3);
      }
      if (check_now) {
        trace::Scope t("consistency check", "step");
        consistency.add(named_params);
        if (check_buffers) consistency.add(model->named_buffers());
        consistency.run(*pg, step);
      }
      // Mid-epoch snapshots on optimizer-step boundaries (the epoch's end has its own below).
      if (!c.snapshot_path.empty() && c.snapshot_every > 0 && sync &&
          step % c.snapshot_every == 0 && epoch_steps < epoch_total(epoch) && step < planned_steps)
        save_snapshot(epoch, epoch_steps, loss_sum, samples, early_stop_metadata());
      const bool report = report_step(epoch_steps);
      if (report) {
        std::vector<double> w = {window_loss, double(window_samples)};
        sum_over_ranks(pg.get(), w);
        shown_loss = w[1] > 0 ? w[0] / w[1] : 0;
        window_loss = 0;
        window_samples = 0;
      }
      const double elapsed = seconds_since(epoch_start);
      // The job's rate: every rank runs the same number of equally sized steps.
      const double ips = double(samples - samples_before) * world / std::max(elapsed, 1e-9);
      const double eta =
          elapsed / double(epoch_steps - steps_before) * double(epoch_planned - epoch_steps);
      if (c.progress_bar) {
        const int width = 30;
        const int filled = int(double(width) * double(epoch_steps) / double(epoch_planned));
        // Until the first all-reduced window, no loss to show.
        const std::string shown =
            std::isnan(shown_loss) ? std::string("--") : fmt::format("{:.4f}", shown_loss);
        out << fmt::format("\repoch {} [{}{}] {}/{} loss {} {:.0f} {} ETA {}  ", epoch,
                           std::string(size_t(filled), '='),
                           std::string(size_t(width - filled), ' '), epoch_steps, epoch_planned,
                           shown, ips, rate_unit, format_duration(eta));
        out.flush();
      } else if (report) {
        out << fmt::format("epoch {} step {}/{} loss {:.4f} {:.0f} {} ETA {}\n", epoch, epoch_steps,
                           epoch_planned, shown_loss, ips, rate_unit, format_duration(eta));
        out.flush();
      }
    }
    // The trace holds the first --trace-steps training steps, not the evaluation after them.
    if (trace::enabled() && step >= c.trace_steps) trace::set_enabled(false);
    if (join) {
      // What it accumulated past its last optimizer step is not the others' (they zeroed theirs).
      opt->zero_grad();
      join->finish();
      join.reset();
    } else if (ddp) {
      ddp->end_of_data();  // a no-op when every rank announced its last batch above
    }
    if (c.progress_bar) out << "\n";
    EpochSummary s;
    s.epoch = epoch;
    s.steps = epoch_steps;
    s.seconds = seconds_since(epoch_start);
    std::vector<double> totals = {loss_sum, double(samples), double(samples - samples_before)};
    sum_over_ranks(pg.get(), totals);
    s.train_loss = totals[1] > 0 ? totals[0] / totals[1] : 0;
    s.img_per_s = totals[2] / std::max(s.seconds, 1e-9);
    const bool last = epoch == c.epochs || step >= planned_steps;
    if ((c.eval_every > 0 && epoch % c.eval_every == 0) || last) {
      test_fault("eval", epoch);
      const auto amp_scope = autocast();  // evaluated as trained
      const EvalResult e = pg && c.eval_on_rank0
                               ? evaluate_on_rank0(*model, *test_set, c.test_batch_size, c.workers,
                                                   *pg, device, epoch, c.eval_samples)
                               : evaluate(*model, *test_set, c.test_batch_size, c.workers, pg.get(),
                                          device, c.eval_samples);
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
    out << fmt::format(" | {:.0f} {} | {:.1f} s\n", s.img_per_s, rate_unit, s.seconds);
    out.flush();
    if (metrics) {
      nlohmann::json j = {{"type", "epoch"},  {"epoch", epoch},
                          {"steps", s.steps}, {"train_loss", s.train_loss},
                          {"step", step},     {"seconds", s.seconds}};
      j[text_set ? "tokens_per_s" : "img_per_s"] = s.img_per_s;
      if (s.evaluated) {
        j["test_loss"] = s.test_loss;
        j["top1"] = s.top1;
        j["top5"] = s.top5;
      }
      *metrics << j.dump() << "\n";
      metrics->flush();
    }
    result.epochs.push_back(s);
    // Early stopping: rank 0 judges its metrics (the same on every rank after evaluate's sums,
    // but one rank deciding makes disagreement impossible) and every rank learns the verdict.
    bool improved = false, stop = false;
    if (early_stop && s.evaluated) {
      const double m = early_stop_top1 ? s.top1 : s.test_loss;
      std::vector<double> verdict = {0, 0};
      if (rank == 0) {
        improved = best_epoch == 0 || (early_stop_top1 ? m > best_metric : m < best_metric);
        verdict = {improved ? 1.0 : 0.0,
                   !improved && bad_evals + 1 >= c.early_stop_patience ? 1.0 : 0.0};
      }
      sum_over_ranks(pg.get(), verdict);
      improved = verdict[0] > 0;
      stop = verdict[1] > 0;
      if (improved) {
        best_epoch = epoch;
        best_metric = m;
        bad_evals = 0;
      } else {
        ++bad_evals;
      }
    }
    const nn::Metadata early_stop_state = early_stop_metadata();
    const bool complete = epoch_steps == epoch_total(epoch);
    if (!c.checkpoint_path.empty())
      save_epoch_checkpoint(epoch, complete, c.checkpoint_path, early_stop_state);
    if (!c.checkpoint_path.empty() && improved)
      save_epoch_checkpoint(epoch, complete, best_checkpoint_path(c.checkpoint_path),
                            early_stop_state);
    if (!c.snapshot_path.empty())
      save_snapshot(epoch, epoch_steps, loss_sum, samples, early_stop_state);
    if (stop) {
      result.stopped_early = true;
      out << fmt::format(
          "ringgrad-train: stopped early after epoch {}: {} did not improve for {} evaluation{}\n",
          epoch, early_stop_top1 ? "top-1" : "test loss", c.early_stop_patience,
          c.early_stop_patience == 1 ? "" : "s");
    }
    if (s.evaluated) {
      result.final_top1 = s.top1;
      result.final_top5 = s.top5;
      result.final_test_loss = s.test_loss;
    }
    if (stop) break;
  }
  result.best_epoch = best_epoch;
  result.best_metric = best_metric;
  result.total_steps = step;
  result.total_seconds = seconds_since(run_start);
  nlohmann::json final_line = {{"type", "final"},
                               {"model", c.model},
                               {"dataset", c.dataset},
                               {"world_size", world},
                               {"epochs", int(result.epochs.size())},
                               {"steps", result.total_steps},
                               {"test_loss", result.final_test_loss},
                               {"top1", result.final_top1},
                               {"top5", result.final_top5},
                               {"seconds", result.total_seconds}};
  // Peak memory of this process (rank 0's under DDP): resident set, and per CUDA device it used
  // the caching allocator's high-water mark of live blocks (ringgrad-bench compare reads these).
  {
    rusage ru{};
    getrusage(RUSAGE_SELF, &ru);
    final_line["peak_rss_mb"] = double(ru.ru_maxrss) / 1024.0;
    if (device.is_cuda()) {
      nlohmann::json per_device = nlohmann::json::array();
      const int used = dp ? int(dp->devices().size()) : 1;
      for (int k = 0; k < used; ++k) {
        const int index = dp ? dp->devices()[size_t(k)].index : device.index;
        per_device.push_back(double(cuda::memory_stats(index).peak_allocated_bytes) / (1 << 20));
      }
      final_line["peak_device_mb"] = per_device;
    }
  }
  if (early_stop) {
    final_line["best_epoch"] = result.best_epoch;
    final_line["best_" + c.early_stop_metric] = result.best_metric;
    final_line["stopped_early"] = result.stopped_early;
    out << fmt::format(
        "ringgrad-train: best epoch {} ({} {}){}{}\n", result.best_epoch,
        early_stop_top1 ? "top-1" : "test loss",
        early_stop_top1 ? fmt::format("{:.2f}%", 100 * result.best_metric)
                        : fmt::format("{:.4f}", result.best_metric),
        result.stopped_early ? ", stopped early" : "",
        c.checkpoint_path.empty() ? "" : ", saved to " + best_checkpoint_path(c.checkpoint_path));
  }
  out << final_line.dump() << "\n";
  if (metrics) *metrics << final_line.dump() << "\n";
  if (!c.trace_path.empty()) {
    trace::set_enabled(false);
    write_trace(c.trace_path, pg.get());
    out << fmt::format(
        "ringgrad-train: wrote the trace of the first {} steps to {} (open it in "
        "https://ui.perfetto.dev or chrome://tracing)\n",
        std::min(c.trace_steps, result.total_steps), c.trace_path);
  }
  ddp.reset();
  if (pg && pg == dist::default_group()) pg->barrier()->wait();  // nobody leaves early
  return result;
}

}  // namespace rg::app
