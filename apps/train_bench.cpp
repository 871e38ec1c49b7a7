// ringgrad-bench train (see train_bench.h).
#include "apps/train_bench.h"

#include <fmt/format.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "comm/ddp.h"
#include "comm/init.h"
#include "data/synthetic.h"
#include "engine/autocast.h"
#include "engine/cuda.h"
#include "engine/cuda/device_guard.h"
#include "engine/cuda/memory.h"
#include "engine/cuda/runtime.h"
#include "engine/device_checks.h"
#include "engine/dtype.h"
#include "engine/ops/cudnn.h"
#include "engine/ops/factory.h"
#include "engine/ops/loss.h"
#include "engine/storage.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/runtime_env.h"
#include "kernels/error.h"
#include "layers/amp/grad_scaler.h"
#include "layers/batch_norm.h"
#include "layers/models/registry.h"
#include "layers/optim/optimizer.h"
#include "layers/optim/param_groups.h"
#include "train/graph_step.h"

namespace rg::apps {
namespace {

constexpr double kMiB = 1024.0 * 1024.0;

// The device's name and the CUDA libraries' versions; the emulated runtime (kernels/emu, which
// the tests use) has neither.
std::string device_name(Device device) {
  return cuda::built_with_cuda() ? cuda::device_name(device.index) : "emulated";
}
std::string library_versions() {
  return cuda::built_with_cuda() ? cuda::library_versions() : "emulated CUDA (kernels/emu)";
}

struct Batch {
  Tensor inputs, targets;
};

// Four fixed batches on `device`, so that the benchmark measures compute, not data loading:
// images from SyntheticDataset, or (gpt-*) uniformly random token ids with next-token targets of
// the same shape.
std::vector<Batch> make_batches(const TrainBenchOptions& o, const Shape& shape, bool tokens,
                                int rank, Device device) {
  std::vector<Batch> batches;
  if (tokens) {
    for (int b = 0; b < 4; ++b) {
      const data::Batch t = data::random_token_batch(o.batch_size, o.block_size, o.vocab_size,
                                                     7 + uint64_t(rank) + 1000 * uint64_t(b));
      batches.push_back({t.inputs.to(device), t.targets.to(device)});
    }
    return batches;
  }
  data::SyntheticDataset data(o.batch_size * 4, shape, 10, 7 + uint64_t(rank));
  for (int b = 0; b < 4; ++b) {
    std::vector<int64_t> idx(static_cast<size_t>(o.batch_size));
    for (int64_t i = 0; i < o.batch_size; ++i) idx[size_t(i)] = b * o.batch_size + i;
    data::Batch batch = data.get_batch(idx, 0);
    // Laid out once here (as a channels_last loader's workers would), not in the timed steps.
    const MemoryFormat format =
        o.channels_last ? MemoryFormat::channels_last : MemoryFormat::contiguous;
    batches.push_back({batch.inputs.to(device).contiguous(format), batch.targets.to(device)});
  }
  return batches;
}

// SGD with momentum 0.9 for the image models; minGPT's AdamW (lr 5e-4, betas (0.9, 0.95), weight
// decay 0.1 on the Linear weights only) for gpt-*, as bench/pytorch/train_bench.py.
std::unique_ptr<optim::Optimizer> make_optimizer(const nn::Module& model, bool gpt) {
  if (gpt) {
    return optim::make_adamw(optim::linear_weight_decay_groups(model, 0.1),
                             {.lr = 5e-4, .beta1 = 0.9, .beta2 = 0.95, .weight_decay = 0.1});
  }
  return std::make_unique<optim::Sgd>(model.parameters(),
                                      optim::SgdOptions{.lr = 0.01, .momentum = 0.9});
}

// The median of the windows' rates, peak memory, and (rank 0, --json) the figures as JSON.
void report_results(const TrainBenchOptions& o, const std::vector<double>& rates,
                    const nn::Module& model, Device device, const char* unit, bool print,
                    const train::GraphStep* graph) {
  const bool gpt = o.model.starts_with("gpt-");
  std::vector<double> sorted = rates;
  std::sort(sorted.begin(), sorted.end());
  const double median = sorted[sorted.size() / 2];
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  const double rss_mb = double(ru.ru_maxrss) / 1024.0;
  nlohmann::json j = {{"tool", "ringgrad"},
                      {"model", o.model},
                      {"device", device.str()},
                      {"amp", o.amp},
                      {"batch_size", o.batch_size},
                      {"unit", unit},
                      {"warmup", o.warmup},
                      {"deferred_checks", o.deferred_checks},
                      {"cudnn_benchmark", o.cudnn_benchmark},
                      {"cudnn_conv_api", o.cudnn_conv_api},
                      {"cudnn", o.cudnn},
                      {"fuse_bn_relu", o.fuse_bn_relu},
                      {"channels_last", o.channels_last},
                      {"cuda_graphs", o.cuda_graphs},
                      {"ddp", o.ddp},
                      {"window_steps", o.window_steps},
                      {"rates", rates},
                      {"median", median},
                      {"params", model.parameter_count()},
                      {"peak_rss_mb", rss_mb}};
  if (gpt) j["block_size"] = o.block_size;
  if (graph != nullptr) {
    j["cuda_graph_captures"] = graph->captures();
    j["cuda_graph_replays"] = graph->replays();
    j["cuda_graph_eager_steps"] = graph->eager_steps();
  }
  if (device.is_cuda()) {
    const cuda::DeviceMemoryStats mem = cuda::memory_stats(device.index);
    j["device_name"] = device_name(device);
    j["peak_device_mb"] = double(mem.peak_allocated_bytes) / kMiB;
    j["peak_reserved_mb"] = double(mem.peak_reserved_bytes) / kMiB;
    if (print) {
      fmt::print(
          "median {:.1f} {} | peak RSS {:.0f} MB | peak device memory {:.0f} MB | allocator "
          "reserved {:.0f} MB\n",
          median, unit, rss_mb, j["peak_device_mb"].get<double>(),
          j["peak_reserved_mb"].get<double>());
    }
  } else {
    const auto mem = cpu_memory_stats();
    j["peak_tensor_mb"] = double(mem.peak_bytes) / kMiB;
    if (print) {
      fmt::print(
          "median {:.1f} {} | peak RSS {:.0f} MB | peak tensor memory {:.0f} MB | "
          "allocator reserved {:.0f} MB\n",
          median, unit, rss_mb, double(mem.peak_bytes) / kMiB, double(mem.reserved_bytes) / kMiB);
    }
  }
  if (print && !o.json_path.empty()) {
    std::ofstream f(o.json_path);
    RG_CHECK(f.good(), "--json ", o.json_path, ": cannot open for writing");
    f << j.dump() << "\n";
    RG_CHECK(f.good(), "--json ", o.json_path, ": write failed");
  }
}

}  // namespace

int run_train_bench(const TrainBenchOptions& o) {
  if (o.threads > 0) kernels::cpu::set_num_threads(o.threads);
  Device device = parse_device(o.device);
  // With --ddp every rank trains on its own batches and the job's throughput is reported by
  // rank 0: world size x batch x steps over the window's time (DDP's all-reduces keep the ranks
  // in step, so rank 0's clock is the job's). On CUDA each rank runs on its NCCL group's GPU.
  std::shared_ptr<dist::ProcessGroup> pg;
  if (o.ddp) {
    dist::InitOptions init;
    init.backend = device.is_cuda() ? "nccl" : "gloo";
    pg = dist::init_process_group(init);
    if (device.is_cuda()) {
      RG_CHECK(o.device == "cuda" || device == pg->tensor_device(), "--ddp --device ", o.device,
               ": each rank runs on its NCCL group's GPU, ", pg->tensor_device().str(), " on rank ",
               pg->rank(), " (use --device cuda)");
      device = pg->tensor_device();
    }
  }
  if (device.is_cuda()) {
    const int n = cuda::runtime().device_count();
    RG_CHECK(n > 0, "no CUDA device: ", cuda::unavailable_reason());
    RG_CHECK(device.index < n, o.device, ": that device does not exist (", n,
             " CUDA device(s) visible)");
    cuda::set_device(device.index);
  }
  set_cudnn_benchmark(o.cudnn_benchmark);
  set_cudnn_conv_api(o.cudnn_conv_api == "legacy" ? CudnnConvApi::legacy : CudnnConvApi::graph);
  set_cudnn_enabled(o.cudnn);
  nn::set_batch_norm_relu_fusion(o.fuse_bn_relu);
  const int rank = pg ? pg->rank() : 0;
  const int world = pg ? pg->size() : 1;
  const bool gpt = o.model.starts_with("gpt-");
  const Shape shape = gpt                   ? Shape{o.block_size}
                      : o.model == "toynet" ? Shape{1, 28, 28}
                                            : Shape{3, 32, 32};
  auto model = nn::make_model(
      {.name = o.model, .sample_shape = shape, .num_classes = gpt ? o.vocab_size : 10});
  model->to(device);
  if (o.channels_last) model->to(MemoryFormat::channels_last);
  model->train();
  std::unique_ptr<dist::DistributedDataParallel> ddp;
  if (pg) ddp = std::make_unique<dist::DistributedDataParallel>(model, pg);
  const std::unique_ptr<optim::Optimizer> opt = make_optimizer(*model, gpt);
  const std::vector<Batch> batches = make_batches(o, shape, gpt, rank, device);
  amp::GradScalerOptions scaler_options;
  scaler_options.enabled = o.amp == "f16";
  amp::GradScaler scaler(scaler_options);
  std::optional<DeferredChecks> checks;
  if (o.deferred_checks && device.is_cuda()) checks.emplace();
  // Forward, loss, backward and the optimizer step; with --cuda-graphs captured once and replayed.
  auto body = [&](const Tensor& inputs, const Tensor& targets) {
    Tensor loss;
    {
      const AutocastGuard autocast(device, o.amp == "off" ? DType::bf16 : parse_dtype(o.amp),
                                   o.amp != "off");
      Tensor out = ddp ? ddp->forward(inputs) : model->forward(inputs);
      loss = gpt ? cross_entropy(out.view({-1, out.size(2)}), targets.view({-1}))
                 : cross_entropy(out, targets);
    }
    scaler.scale(loss).backward();
    scaler.step(*opt);
    scaler.update();
    return loss;
  };
  std::optional<train::GraphStep> graph;
  if (o.cuda_graphs) {
    RG_CHECK(o.deferred_checks,
             "--cuda-graphs needs --deferred-checks true (a check read back "
             "at once cannot be captured)");
    graph.emplace(*opt, device);
    if (scaler.is_enabled())
      graph->add_dependency([&] { return scaler.decides_on_device(*opt); },
                            [] { return uint64_t(0); });
    // DDP's iterations are captured with their collectives once its buckets are rebuilt.
    if (ddp) {
      const std::string why = ddp->reducer().not_capturable();
      RG_CHECK(why.empty(), "--cuda-graphs: ", why);
      graph->add_dependency([&ddp] { return ddp->reducer().ready_to_capture(); },
                            [&ddp] { return ddp->reducer().buckets_version(); });
    }
  }
  auto step = [&](int i) {
    if (checks) checks->poll();
    const Batch& b = batches[size_t(i % 4)];
    opt->zero_grad();
    if (graph) {
      graph->run(body, b.inputs, b.targets);
    } else {
      body(b.inputs, b.targets);
    }
  };
  // Host timestamps measure the device's work only when nothing is still queued at either end.
  auto sync = [&] {
    if (device.is_cuda()) cuda::synchronize(device.index);
    if (checks) checks->flush();
  };
  const bool print = rank == 0;
  const char* unit = gpt ? "tok/s" : "img/s";
  const int64_t per_sample = gpt ? o.block_size : 1;
  if (print) {
    if (device.is_cuda()) {
      fmt::print(
          "ringgrad-bench train: model={} amp={} batch={}{}{}{}{} device={} ({}) params={} | {}\n",
          o.model, o.amp, o.batch_size, gpt ? fmt::format(" block={}", o.block_size) : "",
          o.cuda_graphs ? " cuda-graphs" : "", o.channels_last ? " channels-last" : "",
          pg ? fmt::format(" ddp=nccl world={} (img/s of the whole job)", world) : "", device.str(),
          device_name(device), model->parameter_count(), library_versions());
    } else {
      fmt::print("ringgrad-bench train: model={} amp={} batch={} threads={} params={} blas={}{}\n",
                 o.model, o.amp, o.batch_size, kernels::cpu::num_threads(),
                 model->parameter_count(), kernels::cpu::blas_core_name(),
                 pg ? fmt::format(" ddp=gloo world={} (img/s of the whole job)", world) : "");
    }
  }
  for (int i = 0; i < o.warmup; ++i) step(i);
  sync();
  std::vector<double> rates;
  if (print) fmt::print("{:>8} {:>10} {:>10}\n", "window", "seconds", unit);
  for (int w = 0; w < o.windows; ++w) {
    if (pg) pg->barrier()->wait();
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < o.window_steps; ++i) step(i);
    sync();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    rates.push_back(double(o.window_steps * o.batch_size * per_sample * world) / s);
    if (print) fmt::print("{:>8} {:>10.3f} {:>10.1f}\n", w, s, rates.back());
  }
  if (graph && print)
    fmt::print("cuda graphs: {} capture(s), {} replayed steps, {} eager steps\n", graph->captures(),
               graph->replays(), graph->eager_steps());
  report_results(o, rates, *model, device, unit, print, graph ? &*graph : nullptr);
  if (pg) {
    ddp.reset();
    dist::destroy_process_group();
  }
  return 0;
}

}  // namespace rg::apps
