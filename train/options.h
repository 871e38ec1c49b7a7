// rg::train's options and results: what a Trainer is asked to do (Options, grouped by the part
// that owns each field) and what it reports back (EpochSummary per epoch, TrainResult at the end).
#pragma once

#include <cstdint>
#include <functional>
#include <iosfwd>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "data/dataset.h"
#include "engine/tensor.h"
#include "layers/optim/lr_schedule.h"

namespace rg::nn {
class Module;
}

namespace rg::train {

// Keys and values that must match for a checkpoint to continue a run (saved as "run.<key>").
// The trainer fills in the values of "world_size" and "steps_per_epoch" (appended when absent).
using RunShape = std::vector<std::pair<std::string, std::string>>;
// The training loss of a batch: the model's output and the batch's targets (on the host).
using LossFn = std::function<Tensor(const Tensor& output, const Tensor& targets)>;
// The learning-rate schedule, built once the steps per epoch are known (over `epochs` epochs).
using ScheduleFn =
    std::function<std::shared_ptr<const optim::LrSchedule>(int64_t steps_per_epoch, int epochs)>;

// The distributed wiring (Distributed): the process group of the launch and how the model is
// wrapped (DDP under a launcher with several ranks, DataParallel, SyncBatchNorm).
struct DistributedOptions {
  std::string backend = "auto";  // gloo | nccl | auto
  std::string mode = "auto";     // single | dp | ddp | auto
  int dp_devices = 0;
  std::string init_method = "env://";
  std::string allreduce = "auto";
  double bucket_cap_mb = 25.0, first_bucket_mb = 1.0;
  bool overlap = true;
  std::string comm_hook = "allreduce";  // allreduce | fp16 | bf16 | powersgd
  int powersgd_rank = 1;
  int64_t powersgd_start_iter = 10;
  bool find_unused_parameters = false, static_graph = false, gradient_as_bucket_view = false;
  bool sync_bn = false;
  bool join = false;       // train each epoch inside dist::Join (uneven inputs)
  std::string debug;       // OFF | INFO | DETAIL; "": RG_DISTRIBUTED_DEBUG's
  double timeout_s = 300;  // collectives and joining the group
  // --mode dp: builds the replicas (a fresh model of the same architecture).
  std::function<std::shared_ptr<nn::Module>()> make_replica;
};

struct Options {
  // Snapshots (Snapshots): everything that decides the rest of the run, written by rank 0 every
  // snapshot_every optimizer steps (0: epoch ends only) and at every epoch end; when the file
  // exists at start the run continues from it, mid-epoch included, bit for bit.
  std::string snapshot;
  int64_t snapshot_every = 0;
  std::string checkpoint;  // epoch checkpoints (complete epochs); "" = off
  std::string resume;      // continue from this checkpoint; "" = start fresh
  // The feeder (Feeder): batches per rank, loader workers, the shuffle's seed.
  int64_t batch_size = 64;
  int workers = 0;
  uint64_t seed = 1;
  int64_t steps_per_epoch = 0;  // 0: when the data runs out
  int64_t max_steps = -1;       // -1: no limit
  bool uneven_data = false;     // test option: rank r leaves out the last r batches of an epoch
  // The step (Step).
  int grad_accum_steps = 1;
  double clip_grad_norm = 0, clip_grad_value = 0;
  std::string amp = "off";  // off | f16 | bf16
  LossFn loss;              // default: cross-entropy
  // Each step's forward, backward and optimizer step as one replayed CUDA graph after a warm-up
  // (train/graph_step.h): one device or DDP over NCCL (its collectives captured), no accumulation,
  // f16's GradScaler with SGD, Adam or AdamW (train::Trainer refuses the rest by name:
  // cuda_graphs_refusal below, then the optimizer and DDP when it starts).
  bool cuda_graphs = false;
  // The model's 4-d parameters and the batches channels last (Module::to(MemoryFormat)):
  // convolutions, batch norm and pooling run in NHWC with no layout conversion per step.
  bool channels_last = false;
  ScheduleFn schedule;  // default: the optimizer's learning rate throughout
  // Evaluation (Evaluator): on eval_data every eval_every epochs (0: after the last only).
  std::shared_ptr<const data::Dataset> eval_data;
  int64_t eval_batch_size = 1000;
  int eval_every = 1;
  int64_t eval_samples = 0;  // 0: all
  bool eval_on_rank0 = false;
  // Early stopping (EarlyStopping): patience in evaluations; 0 = off.
  int early_stop_patience = 0;
  std::string early_stop_metric = "loss";  // loss | top1
  int64_t check_consistency = 0;           // every N optimizer steps; 0 = off
  // Where and how.
  std::string device = "cpu";
  DistributedOptions distributed;
  RunShape run_shape;
  // Reporting (ProgressReporter, MetricsLog, TraceRecorder): progress and summaries go to `out`
  // on rank 0 (nullptr: none), messages start with `name`.
  std::ostream* out = nullptr;
  std::string name = "trainer";
  std::string model_name, dataset_name;  // for messages and the final line
  bool progress_bar = false;
  bool tokens = false;  // rates count tokens (tok/s, tokens_per_s) instead of images
  std::string metrics;  // JSONL path; "" = off
  std::string trace;    // Chrome trace of the first trace_steps steps; "" = off
  int64_t trace_steps = 30;
};

// Why a replayed CUDA graph step cannot run with these options (o.cuda_graphs is not read), as a
// message naming the ringgrad-train flags; "" when nothing stands in the way. What depends on the
// objects built later is checked when the Trainer starts: the optimizer (f16 needs SGD, or
// Adam/AdamW whose step counts fit on the device) and DDP's own (dist::Reducer::not_capturable).
// ringgrad-train calls it for its usage errors, the Trainer before it captures.
std::string cuda_graphs_refusal(const Options& o);

struct EpochSummary {
  int epoch = 0;
  int64_t steps = 0;
  // Losses and accuracies are over all ranks' samples (sums and counts all-reduced); img_per_s is
  // the whole job's throughput.
  double train_loss = 0, test_loss = 0, top1 = 0, top5 = 0, img_per_s = 0, seconds = 0;
  bool evaluated = false;
};

struct TrainResult {
  std::vector<EpochSummary> epochs;
  double final_top1 = 0, final_top5 = 0, final_test_loss = 0;
  int64_t total_steps = 0;
  double total_seconds = 0;
  // Early stopping (when on): the best evaluation's epoch and metric, and whether it stopped.
  int best_epoch = 0;
  double best_metric = 0;
  bool stopped_early = false;
  // With cuda_graphs: how often the step was captured and replayed, and the steps run eagerly.
  int64_t graph_captures = 0, graph_replays = 0, graph_eager_steps = 0;
};

}  // namespace rg::train
