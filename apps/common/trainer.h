// ringgrad-train's flags as a configuration, and train(): the flags turned into a
// rg::train::Trainer (data sets, model, optimizer, schedule, loss, run shape) and run.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include "train/options.h"

namespace rg::app {

struct TrainConfig {
  std::string model = "toynet";
  std::string dataset = "mnist";
  std::string data_dir;  // default: data/<dataset>
  bool augment = true;   // CIFAR training sets: random crop and flip (false: --no-augment)
  // --dataset text (a character-level language model's data, data/text.h): the UTF-8 file, the
  // block size (tokens per sample) and the share of the file's end held out for validation.
  std::string data_file;
  int64_t block_size = 128;
  double val_fraction = 0.1;
  // The model's dropout (toynet, gpt-*); false (--no-dropout) sets every rate to 0.
  bool dropout = true;
  bool tie_weights = false;  // gpt-*: lm_head.weight is the token embedding's (--tie-weights)
  int epochs = 1;
  int64_t batch_size = 64;
  int64_t test_batch_size = 1000;
  std::string optimizer = "sgd";  // sgd | adam | adamw
  double lr = 0.01;
  double momentum = 0.9;
  double weight_decay = 0.0;
  // Which parameters weight decay applies to: all, linear (the weights of Linear layers only:
  // minGPT's configure_optimizers, biases, norms and embeddings get none) or auto (linear for
  // gpt-*, all otherwise).
  std::string weight_decay_groups = "auto";
  double adam_beta1 = 0.9, adam_beta2 = 0.999;  // adam, adamw (minGPT: 0.9, 0.95)
  bool nesterov = false;
  std::string lr_schedule = "constant";  // constant | step | multistep | cosine
  double warmup_epochs = 0.0;
  int64_t lr_step_size = 30;           // epochs (step schedule)
  std::vector<int64_t> lr_milestones;  // epochs (multistep schedule)
  double lr_gamma = 0.1;
  double label_smoothing = 0.0;
  uint64_t seed = 1;
  int workers = 2;
  int eval_every = 1;      // epochs; 0 = only after the last epoch
  int64_t max_steps = -1;  // stop training after this many steps in total (-1: no limit)
  // An epoch ends after this many steps (0: when the data runs out). For data sets too large for
  // whole epochs (the text data set has a sample at every character): epochs become the units of
  // evaluation, checkpoints and the LR schedule's horizon, each a fresh shuffle of all samples.
  int64_t steps_per_epoch = 0;
  // Evaluate on the first N samples of the test set only (0: all of them).
  int64_t eval_samples = 0;
  std::string metrics_path;   // JSONL, one line per epoch and a final line
  bool progress_bar = false;  // \r-updated bar (terminals); otherwise plain lines
  // cpu, cuda or cuda:N; under a launcher "cuda" is the rank's GPU (NCCL's choice: rank % GPUs).
  std::string device = "cpu";
  // Mixed precision: "off", or "f16"/"bf16" for autocast (engine/autocast.h) of the forward and
  // the loss, in training and evaluation; f16 also scales the loss with a dynamic GradScaler.
  std::string amp = "off";
  // --cuda-graphs: each step after a warm-up replays one captured CUDA graph (train/graph_step.h).
  bool cuda_graphs = false;
  // --channels-last: model and batches channels last (train::Options::channels_last).
  bool channels_last = false;

  // Data parallelism: used when the launch environment (ringgrad-run, torchrun variables, Slurm,
  // Open MPI) describes more than one rank. Batch sizes are per rank, as in PyTorch DDP.
  std::string backend = "auto";  // gloo | nccl | auto
  // single | dp | ddp | auto (ddp under a launcher with several ranks, else single). dp:
  // nn::DataParallel over --dp-devices CUDA devices of this process (0: all it sees).
  std::string mode = "auto";
  int dp_devices = 0;
  std::string init_method = "env://";  // env:// | tcp://HOST:PORT | file:///PATH (comm/init.h)
  std::string allreduce = "auto";      // auto | native | ring | shm (dist::parse_algorithm)
  double bucket_cap_mb = 25.0;
  double first_bucket_mb = 1.0;
  bool overlap = true;                  // false: --no-overlap
  std::string comm_hook = "allreduce";  // allreduce | fp16 | bf16 | powersgd
  int powersgd_rank = 1;
  int64_t powersgd_start_iter = 10;
  int grad_accum_steps = 1;  // micro-batches per optimizer step (no_sync for all but the last)
  bool find_unused_parameters = false;
  // DDP's static_graph (--static-graph): the first iteration's used parameters and hook counts
  // hold for every iteration (reentrant activation checkpointing works).
  bool static_graph = false;
  // A test option for uneven inputs (--uneven-data): rank r leaves out the last r batches of
  // each epoch (keeping at least one), so ranks run different numbers of steps. Without --join
  // that ends in DDP's error naming the rank that ran out and the iteration.
  bool uneven_data = false;
  // Train each epoch inside dist::Join (--join): ranks that ran out shadow the others'
  // collectives (DDP's and the loss sums of the progress output, with zeros) and take the same
  // optimizer steps on the gradients averaged over the ranks that still had data.
  bool join = false;
  // --check-consistency N: every N optimizer steps the ranks compare hashes of every parameter
  // (and buffer, with --sync-bn; in DETAIL also of the averaged gradients); 0: off.
  int64_t check_consistency = 0;
  // --debug-distributed OFF|INFO|DETAIL; empty: RG_DISTRIBUTED_DEBUG's (comm/debug_level.h).
  std::string debug_distributed;
  // --timeout-s: how long a collective (and joining the group) may take before it is an error
  // naming the ranks that did not join it (PyTorch's init_process_group timeout).
  double timeout_s = 300;
  bool gradient_as_bucket_view = false;
  // Every BatchNorm2d becomes a SyncBatchNorm over the DDP group (statistics of the global
  // batch); with one process it stays plain batch norm, a model without one is left alone.
  bool sync_bn = false;

  // Checkpoints (layers/checkpoint.h): rank 0 saves model, optimizer and dropout RNG state at
  // the end of every complete epoch; resuming continues with the next epoch and reproduces the
  // uninterrupted run bit for bit. The run's shape (model, dataset, batch size, ranks, seed,
  // accumulation) must match the checkpoint's.
  std::string checkpoint_path;  // "" = off
  std::string resume_path;      // "" = start fresh
  // Snapshots (the recipes' pattern): rank 0 writes everything that decides the rest of the run
  // to snapshot_path every snapshot_every optimizer steps (0: only at epoch ends) and at the end
  // of every epoch; when the file exists at start, the run continues from it, mid-epoch included,
  // so a restarted identical command (ringgrad-run --max-restarts) ends as the uninterrupted run
  // would have, bit for bit. Same run shape as for --resume (world size included).
  std::string snapshot_path;  // "" = off
  int64_t snapshot_every = 0;

  // Reproducibility and speed (engine/deterministic.h, engine/ops/cudnn.h), set for the run and
  // restored after it: only deterministic algorithms (an op without one is an error), and cuDNN
  // convolution algorithms chosen by timing (no effect on the CPU).
  bool deterministic = false;
  bool cudnn_benchmark = false;
  // Which cuDNN API runs the convolutions on CUDA (engine/ops/cudnn.h): "graph" (its engines, the
  // legacy API where it has none) or "legacy". Set for the run and restored after it.
  std::string cudnn_conv_api = "graph";
  // TF32 for f32 work on CUDA (engine/tf32.h): "default" (PyTorch's: convolutions may use TF32,
  // matrix products may not), "on" (both may) or "off" (neither: full f32). Set for the run and
  // restored after it; no effect on the CPU.
  std::string tf32 = "default";
  // With DDP: rank 0 evaluates the whole test set while the others wait, instead of each rank
  // its shard with the sums all-reduced (the default); the metrics are the same.
  bool eval_on_rank0 = false;

  // Chrome/Perfetto trace of the first trace_steps steps (one process per rank); "" = off.
  std::string trace_path;
  int64_t trace_steps = 30;

  // Training loss: cross-entropy on class indices, or a regression loss (mse, smooth-l1 with
  // beta 1) of the logits against one-hot targets. Evaluation's test loss stays cross-entropy.
  std::string loss = "cross-entropy";  // cross-entropy | mse | smooth-l1
  // Gradient clipping after backward (under DDP on the averaged gradients), before the step;
  // 0 = off. At most one of the two.
  double clip_grad_norm = 0;   // max total 2-norm (nn::utils::clip_grad_norm_)
  double clip_grad_value = 0;  // max |element| (nn::utils::clip_grad_value_)
  // Early stopping: evaluate every epoch (--eval-every must be 1) and stop when the metric has
  // not improved for this many evaluations in a row; 0 = off. With --checkpoint the best epoch is
  // also saved, to best_checkpoint_path(checkpoint_path).
  int early_stop_patience = 0;
  std::string early_stop_metric = "loss";  // loss (test loss, lower is better) | top1
};

// "" when the flags fit together, else the usage error (ringgrad-train exits 2 with it).
std::string config_error(const TrainConfig& config);

// Where the best checkpoint goes: ".best" inserted before the file name's extension
// (run.safetensors -> run.best.safetensors; run -> run.best).
std::string best_checkpoint_path(const std::string& checkpoint_path);

// Per epoch and at the end (rg::train's, train/options.h).
using EpochSummary = train::EpochSummary;
using TrainResult = train::TrainResult;

// Runs the whole training; progress and summaries go to `out` (rank 0 only when distributed).
// Throws rg::Error on bad config or data.
TrainResult train(const TrainConfig& config, std::ostream& out);

}  // namespace rg::app
