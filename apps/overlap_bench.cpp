// ringgrad-bench overlap. For each model: the compute time of an iteration without DDP (forward,
// backward, SGD step), then for each bucket size an iteration with DDP, overlapped and not.
// Communication time is the time the link was busy with the iteration's buckets; exposed
// communication is what backward's final callback spent waiting for them; overlap efficiency =
// (communication - exposed) / communication. Medians over the timed iterations, then the mean
// over ranks.
#include "apps/overlap_bench.h"

#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <fstream>
#include <numeric>

#include "apps/scale_sim.h"
#include "comm/ddp.h"
#include "comm/init.h"
#include "comm/sim_link.h"
#include "data/synthetic.h"
#include "engine/ops/factory.h"
#include "engine/ops/loss.h"
#include "kernels/error.h"
#include "layers/models/registry.h"
#include "layers/optim/optimizer.h"

namespace rg::apps {
namespace {

using Clock = std::chrono::steady_clock;

double ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

double mean_over_ranks(dist::ProcessGroup& pg, double x) {
  Tensor t = full({1}, x, DType::f64);
  pg.all_reduce(t, dist::ReduceOp::avg)->wait();
  return t.item();
}

struct Row {
  std::string model, buckets;
  size_t num_buckets = 0;
  bool overlap = false;
  double iter_ms = 0, compute_ms = 0, comm_ms = 0, exposed_ms = 0;
  // The final wait also holds a little bookkeeping, so with nothing hidden it can exceed the
  // link time by a hair; that is 0% hidden, not a negative share.
  double efficiency() const {
    return comm_ms > 0 ? std::max(0.0, (comm_ms - exposed_ms) / comm_ms) : 0;
  }
};

// Time the link was busy: the union of the buckets' [start, end] intervals.
double link_busy_ms(const dist::IterationTimeline& t) {
  std::vector<std::pair<Clock::time_point, Clock::time_point>> iv;
  for (const auto& b : t.buckets) iv.emplace_back(b.comm_start, b.comm_end);
  std::sort(iv.begin(), iv.end());
  double total = 0;
  Clock::time_point cur_end{};
  for (auto [s, e] : iv) {
    s = std::max(s, cur_end);
    if (e > s) total += ms(e - s);
    cur_end = std::max(cur_end, e);
  }
  return total;
}

// The step profile of a compute-only iteration (no DDP), as ringgrad-bench scale reads it:
// medians over `iters` iterations of forward (with zero_grad and the loss), backward, the
// optimizer step, and each parameter's gradient-ready time after backward began (its
// post-accumulate hook), then the mean over ranks. The hooks are registered once and do nothing
// (one load) outside this measurement.
scale::StepProfile measure_profile(dist::ProcessGroup& pg, const std::string& name,
                                   nn::Module& model, optim::Optimizer& opt, const data::Batch& b,
                                   int iters) {
  const NamedTensors params = model.named_parameters();
  struct Marks {
    bool armed = false;
    std::vector<Clock::time_point> at;
  };
  auto marks = std::make_shared<Marks>();
  marks->at.resize(params.size());
  for (size_t i = 0; i < params.size(); ++i)
    params[i].second.register_post_accumulate_grad_hook([marks, i](Tensor&) {
      if (marks->armed) marks->at[i] = Clock::now();
    });
  std::vector<std::vector<double>> ready(params.size());
  std::vector<double> fwd, bwd, upd;
  for (int it = 0; it < iters; ++it) {
    const auto t0 = Clock::now();
    opt.zero_grad();
    Tensor loss = cross_entropy(model.forward(b.inputs), b.targets);
    const auto t1 = Clock::now();
    marks->armed = true;
    loss.backward();
    marks->armed = false;
    const auto t2 = Clock::now();
    opt.step();
    const auto t3 = Clock::now();
    fwd.push_back(ms(t1 - t0));
    bwd.push_back(ms(t2 - t1));
    upd.push_back(ms(t3 - t2));
    for (size_t i = 0; i < params.size(); ++i) ready[i].push_back(ms(marks->at[i] - t1));
  }
  // One all-reduce for everything: forward, backward, optimizer, then the ready times.
  std::vector<double> v = {median(fwd), median(bwd), median(upd)};
  for (const auto& r : ready) v.push_back(median(r));
  Tensor t = from_vector(v, {int64_t(v.size())}, DType::f64);
  pg.all_reduce(t, dist::ReduceOp::avg)->wait();
  v = t.to_vector<double>();
  scale::StepProfile p;
  p.model = name;
  p.source = fmt::format(
      "ringgrad-bench overlap: compute-only iteration, batch {} per rank, "
      "median of {}, mean over {} ranks",
      b.targets.numel(), iters, pg.size());
  p.measured_ranks = pg.size();
  p.forward_ms = v[0];
  p.backward_ms = v[1];
  p.optimizer_ms = v[2];
  for (size_t i = 0; i < params.size(); ++i)
    p.grads.push_back({params[i].first, int64_t(params[i].second.nbytes()), v[3 + i]});
  std::stable_sort(p.grads.begin(), p.grads.end(),
                   [](const auto& a, const auto& c) { return a.ready_ms < c.ready_ms; });
  return p;
}

}  // namespace

CLI::App* add_overlap_command(CLI::App& app, OverlapBenchOptions& o) {
  CLI::App* c = app.add_subcommand(
      "overlap", "DDP all-reduce/backward overlap across bucket sizes (run under ringgrad-run)");
  c->option_defaults()->always_capture_default();
  c->add_option("--model", o.models, "models to run (toynet, mlp, resnet18)")->delimiter(',');
  c->add_option("--bucket-mb", o.bucket_mb,
                "bucket caps in MiB; 'inf' = no cap (1 MiB first bucket kept); 'single' = one "
                "bucket")
      ->delimiter(',');
  c->add_option("--batch-size", o.batch_size, "per rank (0: 64 for toynet/mlp, 16 for resnet18)")
      ->check(CLI::NonNegativeNumber);
  c->add_option("--warmup", o.warmup,
                "untimed iterations per configuration (>= 2: the "
                "buckets are rebuilt after the first)")
      ->check(CLI::NonNegativeNumber);
  c->add_option("--iters", o.iters, "timed iterations per configuration")
      ->check(CLI::PositiveNumber);
  c->add_option("--sim-link", o.sim_link,
                "GBPS,LATENCY_US: all-reduces take the time of such a link and move no data");
  c->add_option("--allreduce", o.allreduce, "auto | native | ring | shm (real all-reduces)");
  c->add_option("--csv", o.csv, "also write the rows as CSV to this file");
  c->add_option("--profile-out", o.profile_out,
                "write each model's step profile for ringgrad-bench scale ('{model}' in the path: "
                "the model's name)");
  return c;
}

int run_overlap_bench(const OverlapBenchOptions& o) {
  dist::InitOptions init;
  init.backend = "gloo";
  init.group.algorithm = dist::parse_algorithm(o.allreduce);
  auto real = dist::init_process_group(init);
  std::shared_ptr<dist::ProcessGroup> pg = real;
  if (!o.sim_link.empty())
    pg = std::make_shared<dist::SimulatedLinkGroup>(real, dist::parse_sim_link(o.sim_link));
  const bool root = real->rank() == 0;
  if (root) {
    fmt::print("# ringgrad-bench overlap: {} ranks, {}\n", real->size(),
               o.sim_link.empty() ? fmt::format("real gloo all-reduce ({})", o.allreduce)
                                  : fmt::format("simulated link {} GB/s + {} us per all-reduce "
                                                "(no data moved)",
                                                dist::parse_sim_link(o.sim_link).gbps,
                                                dist::parse_sim_link(o.sim_link).latency_us));
    fmt::print("# {:<9} {:>7} {:>4} {:>8} {:>9} {:>9} {:>9} {:>9} {:>8}\n", "model", "bucket", "#",
               "overlap", "iter ms", "compute", "comm ms", "exposed", "hidden");
  }
  std::vector<Row> rows;
  for (const std::string& name : o.models) {
    const Shape shape = name == "resnet18" ? Shape{3, 32, 32} : Shape{1, 28, 28};
    const int64_t batch = o.batch_size > 0 ? o.batch_size : (name == "resnet18" ? 16 : 64);
    data::SyntheticDataset data(batch, shape, 10, 7);
    std::vector<int64_t> idx(static_cast<size_t>(batch));
    std::iota(idx.begin(), idx.end(), 0);
    const data::Batch b = data.get_batch(idx, 0);
    auto model = nn::make_model({.name = name, .sample_shape = shape, .num_classes = 10});
    model->train();
    optim::Sgd opt(model->parameters(), {.lr = 0.001, .momentum = 0.9});
    auto timed = [&](const std::function<Tensor(const Tensor&)>& fwd, int n,
                     const std::function<void()>& after) {
      std::vector<double> times;
      for (int i = 0; i < n; ++i) {
        const auto t0 = Clock::now();
        opt.zero_grad();
        cross_entropy(fwd(b.inputs), b.targets).backward();
        opt.step();
        times.push_back(ms(Clock::now() - t0));
        if (after) after();
      }
      return times;
    };
    auto local = [&](const Tensor& x) { return model->forward(x); };
    timed(local, o.warmup, nullptr);
    double compute = median(timed(local, o.iters, nullptr));
    if (!o.profile_out.empty()) {
      const auto at = o.profile_out.find("{model}");
      RG_CHECK(at != std::string::npos || o.models.size() == 1, "--profile-out '", o.profile_out,
               "' needs '{model}' in it when several models run");
      std::string path = o.profile_out;
      if (at != std::string::npos) path.replace(at, 7, name);
      const auto p = measure_profile(*real, name, *model, opt, b, o.iters);
      if (root) {
        std::ofstream f(path);
        RG_CHECK(f.good(), "--profile-out: cannot write ", path);
        f << scale::step_profile_json(p) << "\n";
        fmt::print("# wrote the step profile of {} to {}\n", name, path);
      }
    }
    for (const std::string& cap : o.bucket_mb) {
      for (bool overlap : {true, false}) {
        dist::DdpOptions d;
        d.overlap = overlap;
        d.broadcast_buffers = false;  // the same data every iteration: nothing to keep in sync
        if (cap == "single") {        // truly one bucket: nothing can overlap
          d.bucket_cap_mb = d.first_bucket_mb = 1e6;
        } else if (cap == "inf") {  // no cap, but DDP's small first bucket still goes early
          d.bucket_cap_mb = 1e6;
          d.first_bucket_mb = 1.0;
        } else {
          d.bucket_cap_mb = std::stod(cap);
          d.first_bucket_mb = std::min(1.0, d.bucket_cap_mb);
        }
        dist::DistributedDataParallel ddp(model, pg, d);
        auto fwd = [&](const Tensor& x) { return ddp.forward(x); };
        timed(fwd, std::max(o.warmup, 2), nullptr);
        std::vector<double> comm, exposed;
        const auto iters = timed(fwd, o.iters, [&] {
          const auto& t = ddp.reducer().last_timeline();
          comm.push_back(link_busy_ms(t));
          exposed.push_back(ms(t.wait_end - t.wait_start));
        });
        Row r{name,
              cap,
              ddp.reducer().bucket_names().size(),
              overlap,
              mean_over_ranks(*real, median(iters)),
              compute,
              mean_over_ranks(*real, median(comm)),
              mean_over_ranks(*real, median(exposed))};
        if (root) {
          fmt::print("  {:<9} {:>7} {:>4} {:>8} {:>9.1f} {:>9.1f} {:>9.1f} {:>9.1f} {:>7.0f}%\n",
                     r.model, r.buckets, r.num_buckets, r.overlap ? "yes" : "no", r.iter_ms,
                     r.compute_ms, r.comm_ms, r.exposed_ms, 100 * r.efficiency());
          std::fflush(stdout);
        }
        rows.push_back(r);
      }
    }
  }
  if (root && !o.csv.empty()) {
    std::ofstream f(o.csv);
    RG_CHECK(f.good(), "cannot write ", o.csv);
    f << "model,bucket_mb,buckets,overlap,iter_ms,compute_ms,comm_ms,exposed_ms,efficiency\n";
    for (const Row& r : rows)
      f << fmt::format("{},{},{},{},{:.3f},{:.3f},{:.3f},{:.3f},{:.4f}\n", r.model, r.buckets,
                       r.num_buckets, r.overlap ? 1 : 0, r.iter_ms, r.compute_ms, r.comm_ms,
                       r.exposed_ms, r.efficiency());
    fmt::print("# wrote {}\n", o.csv);
  }
  real->barrier()->wait();
  pg.reset();
  dist::destroy_process_group();
  return 0;
}

}  // namespace rg::apps
