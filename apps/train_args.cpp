// ringgrad-train's command line: every flag, its check and the usage errors of combinations, in
// one function that the program and its fuzzer (fuzz/train_args.cpp) call.
#include "apps/train_args.h"

#include <CLI/CLI.hpp>

namespace rg::app {

int parse_train_args(int argc, const char* const* argv, TrainConfig& c, int& threads,
                     std::ostream& out, std::ostream& err) {
  CLI::App app{"ringgrad-train: train a model with ringgrad"};
  app.option_defaults()->always_capture_default();
  app.add_option("--model", c.model,
                 "toynet | mlp | resnet18 | resnet18-imagenet | gpt-nano | gpt-micro | gpt-mini");
  app.add_option("--dataset", c.dataset,
                 "mnist | fashion-mnist | cifar10 | cifar100 | synthetic | synthetic-cifar | text");
  app.add_option("--data-file", c.data_file,
                 "--dataset text: the UTF-8 text to model character by character")
      ->check(CLI::ExistingFile);
  app.add_option("--block-size", c.block_size, "--dataset text: tokens per sample (context)")
      ->check(CLI::PositiveNumber);
  app.add_option("--val-fraction", c.val_fraction,
                 "--dataset text: the share of the file's end held out for validation")
      ->check(CLI::Range(0.0, 1.0));
  bool no_dropout = false;
  app.add_flag("--no-dropout", no_dropout, "set the model's dropout rates to 0 (toynet, gpt-*)");
  app.add_flag("--tie-weights", c.tie_weights,
               "gpt-*: the head's weight is the token embedding's (one parameter)");
  app.add_option("--data-dir", c.data_dir,
                 "directory of the dataset files (default data/<dataset>)");
  app.add_option("--checkpoint", c.checkpoint_path,
                 "save model, optimizer and RNG state to this safetensors file after every epoch");
  app.add_option("--resume", c.resume_path,
                 "continue the run saved in this checkpoint with its next epoch")
      ->check(CLI::ExistingFile);
  app.add_option("--snapshot", c.snapshot_path,
                 "snapshot FILE: everything that decides the rest of the run, written by rank 0 "
                 "every --snapshot-every steps and at epoch ends; when FILE exists at start the "
                 "run continues from it (a restarted identical command resumes)");
  app.add_option("--snapshot-every", c.snapshot_every,
                 "optimizer steps between snapshots (0: at epoch ends only)")
      ->check(CLI::NonNegativeNumber);
  bool no_augment = false;
  app.add_flag("--no-augment", no_augment,
               "CIFAR: train without the random crop (padding 4) and horizontal flip");
  app.add_option("--epochs", c.epochs, "number of epochs")->check(CLI::PositiveNumber);
  app.add_option("--steps-per-epoch", c.steps_per_epoch,
                 "end each epoch after N steps (0: when the data runs out); for data too large "
                 "for whole epochs")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--eval-samples", c.eval_samples,
                 "evaluate on the first N test samples only (0: all)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--batch-size", c.batch_size, "training batch size")->check(CLI::PositiveNumber);
  app.add_option("--test-batch-size", c.test_batch_size, "evaluation batch size")
      ->check(CLI::PositiveNumber);
  app.add_option("--optimizer", c.optimizer, "sgd | adam | adamw")
      ->check(CLI::IsMember({"sgd", "adam", "adamw"}));
  app.add_option("--lr", c.lr, "learning rate")->check(CLI::NonNegativeNumber);
  app.add_option("--momentum", c.momentum, "SGD momentum")->check(CLI::NonNegativeNumber);
  app.add_flag("--nesterov", c.nesterov, "Nesterov momentum (SGD)");
  app.add_option("--weight-decay", c.weight_decay, "weight decay")->check(CLI::NonNegativeNumber);
  app.add_option("--weight-decay-groups", c.weight_decay_groups,
                 "which parameters decay: all | linear (Linear weights only, minGPT's rule) | "
                 "auto (linear for gpt-*, all otherwise)")
      ->check(CLI::IsMember({"auto", "all", "linear"}));
  app.add_option("--adam-beta1", c.adam_beta1, "Adam/AdamW beta1")->check(CLI::Range(0.0, 1.0));
  app.add_option("--adam-beta2", c.adam_beta2, "Adam/AdamW beta2 (minGPT: 0.95)")
      ->check(CLI::Range(0.0, 1.0));
  app.add_option("--lr-schedule", c.lr_schedule, "constant | step | multistep | cosine")
      ->check(CLI::IsMember({"constant", "step", "multistep", "cosine"}));
  app.add_option("--warmup-epochs", c.warmup_epochs,
                 "linear warm-up length in epochs (may be "
                 "fractional)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--lr-step-size", c.lr_step_size, "epochs between decays (step schedule)")
      ->check(CLI::PositiveNumber);
  app.add_option("--lr-milestones", c.lr_milestones, "epochs at which to decay (multistep)");
  app.add_option("--lr-gamma", c.lr_gamma, "decay factor (step, multistep)");
  app.add_option("--label-smoothing", c.label_smoothing, "cross-entropy label smoothing")
      ->check(CLI::Range(0.0, 1.0));
  app.add_option("--seed", c.seed, "seed for initialization, shuffling and dropout");
  app.add_option("--workers", c.workers, "data loader threads (0: load on the training thread)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--threads", threads, "compute threads (default: RG_NUM_THREADS or all cores)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--eval-every", c.eval_every, "evaluate every N epochs (0: only at the end)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--max-steps", c.max_steps, "stop after this many training steps (-1: none)");
  app.add_option("--metrics", c.metrics_path, "write per-epoch metrics as JSON lines to FILE");
  app.add_option("--device", c.device,
                 "cpu | cuda | cuda:N (with DDP, cuda is each rank's GPU and needs --backend nccl "
                 "or auto)");
  app.add_option("--amp", c.amp,
                 "off | f16 | bf16: autocast the forward and the loss (f16 adds a GradScaler)")
      ->check(CLI::IsMember({"off", "f16", "bf16"}));
  app.add_flag("--cuda-graphs", c.cuda_graphs,
               "CUDA: after 2 warm-up steps, capture forward, backward and the optimizer step as "
               "one CUDA graph and replay it for each full batch (one device or DDP over NCCL; f16 "
               "with SGD, or Adam/AdamW whose betas' bias corrections reach 1 within 2^20 steps; "
               "not with accumulation)");
  app.add_flag("--channels-last", c.channels_last,
               "the model's 4-d weights and the batches channels last (NHWC, as PyTorch's "
               "torch.channels_last): cuDNN's NHWC convolutions, no layout conversion per step");
  // Data parallelism (under ringgrad-run or any launcher that sets the torchrun variables).
  app.add_option("--init-method", c.init_method,
                 "where the ranks meet: env:// (MASTER_ADDR/MASTER_PORT; rank 0 hosts the store "
                 "unless ringgrad-run does), tcp://HOST:PORT or file:///PATH");
  app.add_option("--backend", c.backend, "gloo | nccl | auto (DDP's process group)")
      ->check(CLI::IsMember({"gloo", "nccl", "auto"}));
  app.add_option("--allreduce", c.allreduce,
                 "auto (gloo: shm when every rank is on this host, else native) | native (the "
                 "backend's) | ring (ours) | shm (gloo, one host)")
      ->check(CLI::IsMember({"auto", "native", "ring", "shm"}));
  app.add_option("--bucket-cap-mb", c.bucket_cap_mb, "DDP bucket size (MiB)")
      ->check(CLI::PositiveNumber);
  app.add_option("--first-bucket-mb", c.first_bucket_mb, "size of DDP's first bucket (MiB)")
      ->check(CLI::PositiveNumber);
  bool no_overlap = false;
  app.add_flag("--no-overlap", no_overlap,
               "all-reduce the buckets after backward instead of during it (for comparison)");
  app.add_option("--comm-hook", c.comm_hook,
                 "allreduce | fp16 | bf16 | powersgd (gradient compression)")
      ->check(CLI::IsMember({"allreduce", "fp16", "bf16", "powersgd"}));
  app.add_option("--powersgd-rank", c.powersgd_rank, "PowerSGD matrix approximation rank")
      ->check(CLI::PositiveNumber);
  app.add_option("--powersgd-start-iter", c.powersgd_start_iter,
                 "plain all-reduce for the first N iterations (>= 2)");
  app.add_option("--grad-accum-steps", c.grad_accum_steps,
                 "micro-batches per optimizer step (DDP no_sync for all but the last)")
      ->check(CLI::PositiveNumber);
  app.add_flag("--find-unused-parameters", c.find_unused_parameters,
               "allow parameters that get no gradient in some iterations");
  app.add_flag("--static-graph", c.static_graph,
               "DDP static_graph: every iteration uses the same parameters, each hook firing as "
               "often (reentrant activation checkpointing)");
  app.add_flag("--uneven-data", c.uneven_data,
               "test option: rank r leaves out the last r batches of each epoch (at least one "
               "stays); fails naming the rank that ran out unless --join");
  app.add_flag("--join", c.join,
               "train each epoch inside dist::Join so that ranks with fewer batches shadow the "
               "others until all are done");
  app.add_option("--timeout-s", c.timeout_s,
                 "seconds a collective may take before it fails naming the ranks that never "
                 "joined it (the flight recorder is dumped then)")
      ->check(CLI::PositiveNumber);
  app.add_option("--mode", c.mode,
                 "single | dp (DataParallel: one process, several CUDA devices) | ddp | auto "
                 "(ddp under a launcher with several ranks, else single)")
      ->check(CLI::IsMember({"single", "dp", "ddp", "auto"}));
  app.add_option("--dp-devices", c.dp_devices,
                 "--mode dp: how many CUDA devices (0: every device this process sees)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--check-consistency", c.check_consistency,
                 "every N optimizer steps compare hashes of the parameters across ranks and stop "
                 "naming the first that differs (0: off)");
  app.add_option("--debug-distributed", c.debug_distributed,
                 "OFF | INFO | DETAIL: as RG_DISTRIBUTED_DEBUG (DETAIL checks every collective's "
                 "fingerprint across ranks)")
      ->check(CLI::IsMember({"OFF", "INFO", "DETAIL", "off", "info", "detail"}));
  app.add_option("--trace", c.trace_path,
                 "write a Chrome/Perfetto trace (one process per rank) of the first steps to FILE");
  app.add_option("--trace-steps", c.trace_steps, "how many steps --trace records")
      ->check(CLI::PositiveNumber);
  app.add_flag("--gradient-as-bucket-view", c.gradient_as_bucket_view,
               "gradients live in DDP's buckets (saves a copy and memory)");
  app.add_option("--loss", c.loss,
                 "cross-entropy | mse | smooth-l1 (regression losses on the logits against "
                 "one-hot targets)")
      ->check(CLI::IsMember({"cross-entropy", "mse", "smooth-l1"}));
  app.add_option("--clip-grad-norm", c.clip_grad_norm,
                 "clip the total 2-norm of the gradients to MAX after backward (0: off)");
  app.add_option("--clip-grad-value", c.clip_grad_value,
                 "clamp every gradient element to [-V, V] after backward (0: off)");
  app.add_option("--early-stop-patience", c.early_stop_patience,
                 "stop when --early-stop-metric has not improved for N evaluations (0: off; "
                 "needs --eval-every 1; with --checkpoint FILE the best epoch goes to "
                 "FILE with .best before its extension)");
  app.add_option("--early-stop-metric", c.early_stop_metric, "loss (test loss) | top1")
      ->check(CLI::IsMember({"loss", "top1"}));
  app.add_flag("--deterministic", c.deterministic,
               "only deterministic algorithms (torch.use_deterministic_algorithms + "
               "cudnn.deterministic): an op without one is an error");
  app.add_flag("--cudnn-benchmark", c.cudnn_benchmark,
               "CUDA: choose cuDNN convolution algorithms by timing them, once per shape "
               "(torch.backends.cudnn.benchmark; a no-op with a note on the CPU)");
  app.add_option("--cudnn-conv-api", c.cudnn_conv_api,
                 "CUDA: the cuDNN API of the convolutions: graph (its engines, as PyTorch; the "
                 "legacy API where it has none) or legacy (for comparison)")
      ->check(CLI::IsMember({"graph", "legacy"}));
  app.add_option("--tf32", c.tf32,
                 "CUDA f32 precision: default (convolutions may use TF32, matrix products not, "
                 "as PyTorch), on (both may), off (full f32 everywhere)")
      ->check(CLI::IsMember({"default", "on", "off"}));
  app.add_flag("--eval-on-rank0", c.eval_on_rank0,
               "DDP: rank 0 evaluates the whole test set while the others wait (default: each "
               "rank its shard, sums all-reduced)");
  app.add_flag("--sync-bn", c.sync_bn,
               "SyncBatchNorm: batch norm statistics over every rank's batch");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e, out, err);
  } catch (const CLI::ParseError& e) {
    err << "ringgrad-train: " << e.what() << "\nRun with --help for usage.\n";
    return 2;
  }
  c.overlap = !no_overlap;
  c.augment = !no_augment;
  c.dropout = !no_dropout;
  if (const std::string error = config_error(c); !error.empty()) {
    err << "ringgrad-train: " << error << "\nRun with --help for usage.\n";
    return 2;
  }
  return -1;
}

}  // namespace rg::app
