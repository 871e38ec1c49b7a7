// ringgrad-bench overlap. For each model: the compute time of an iteration without DDP (forward,
// backward, SGD step), then for each bucket size an iteration with DDP, overlapped and not.
// Communication time is the time the link was busy with the iteration's buckets; exposed
// communication is what backward's final callback spent waiting for them; overlap efficiency =
// (communication - exposed) / communication. Medians over the timed iterations (--stat min: the
// fastest iteration), then the mean over ranks.
//
// --device cuda: each iteration ends with a device synchronization, so its host time is the GPU's
// time. The host cannot see when the GPU waits, so communication is the link's time for the
// iteration's buckets (the modelled transfers' total with --sim-link; with real NCCL the same
// buckets all-reduced back to back on their own) and exposed communication is how long the
// compute stream waited for the buckets in DDP's final callback (CUDA events around the wait).
// Step profiles take their times from CUDA events on the compute stream (the GPU timeline).
#include "apps/overlap_bench.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <numeric>

#include "apps/common/plot.h"
#include "apps/scale_sim.h"
#include "comm/ddp.h"
#include "comm/init.h"
#include "comm/process_group_nccl.h"
#include "comm/sim_link.h"
#include "data/synthetic.h"
#include "engine/cuda/device_guard.h"
#include "engine/cuda/event.h"
#include "comm/reducer.h"
#include "engine/cuda/stream.h"
#include "engine/ops/factory.h"
#include "engine/trace.h"
#include "train/trace_writer.h"
#include "engine/ops/loss.h"
#include "kernels/error.h"
#include "layers/models/registry.h"
#include "layers/optim/optimizer.h"

namespace rg::apps {
namespace {

using Clock = std::chrono::steady_clock;
constexpr int64_t kVocab = 65;  // gpt-*: minGPT's character vocabulary size

double ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// The index of the fastest iteration.
size_t fastest(const std::vector<double>& v) {
  return size_t(std::min_element(v.begin(), v.end()) - v.begin());
}

// The mean of each value over the ranks (on the group's device: NCCL reduces device tensors).
std::vector<double> mean_over_ranks(dist::ProcessGroup& pg, const std::vector<double>& v) {
  Tensor t = dist::on_group_device(pg, from_vector(v, {int64_t(v.size())}, DType::f64));
  pg.all_reduce(t, dist::ReduceOp::sum)->wait();
  std::vector<double> out = t.to(Device::cpu()).to_vector<double>();
  for (double& x : out) x /= pg.size();
  return out;
}

struct Row {
  std::string model, buckets;
  size_t num_buckets = 0;
  bool overlap = false;
  double iter_ms = 0, compute_ms = 0, comm_ms = 0, exposed_ms = 0;
  double total_bytes = 0;  // of the buckets
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

// Step profiles (apps/scale_sim.h), as ringgrad-bench scale reads them: forward (with zero_grad
// and the loss), backward, the optimizer step, and each parameter's gradient-ready time after
// backward began (its post-accumulate hook). The hooks are registered once, before DDP's, and do
// nothing (one load) outside a sampled iteration. A sample is a compute-only iteration, or a DDP
// iteration whose all-reduces cost nothing (SimulatedLinkGroup::set_free): then backward ends
// where DDP's final callback starts waiting for the buckets, and what follows the wait (the
// gradients copied back from the buckets) counts with the optimizer, as it follows the last
// transfer in a real iteration. So the profile holds DDP's own costs (bucket copies, hooks),
// which scale's link model does not add. On CUDA every mark is an event recorded on the compute
// stream (a gradient's when its hook runs, after its accumulation was queued; DDP's wait from the
// Reducer's events), and the times are the GPU's between them.
class Profiler {
 public:
  Profiler(nn::Module& model, Device device)
      : params_(model.named_parameters()), marks_(std::make_shared<Marks>()) {
    marks_->device = device;
    marks_->at.resize(params_.size());
    marks_->fired.resize(params_.size());
    if (device.is_cuda()) {
      for (size_t i = 0; i < params_.size(); ++i) marks_->events.emplace_back(true);
    }
    for (size_t i = 0; i < params_.size(); ++i)
      params_[i].second.register_post_accumulate_grad_hook([m = marks_, i](Tensor&) {
        if (!m->armed) return;
        m->fired[i] = 1;
        if (m->device.is_cuda()) {
          m->events[i].record(cuda::current_stream(m->device.index));
        } else {
          m->at[i] = Clock::now();
        }
      });
  }

  // One iteration: `loss_of_batch` runs the forward and the loss; `ddp`: the Reducer of a DDP
  // forward in it (the iteration synchronizes, on a free link), or null for a compute-only one.
  void sample(optim::Optimizer& opt, const std::function<Tensor()>& loss_of_batch,
              const dist::Reducer* ddp = nullptr) {
    const bool gpu = marks_->device.is_cuda();
    std::vector<cuda::Event> ev;
    auto mark = [&] {
      if (!gpu) return;
      ev.emplace_back(true);
      ev.back().record(cuda::current_stream(marks_->device.index));
    };
    mark();
    const auto t0 = Clock::now();
    opt.zero_grad();
    Tensor loss = loss_of_batch();
    mark();
    const auto t1 = Clock::now();
    std::fill(marks_->fired.begin(), marks_->fired.end(), 0);
    marks_->armed = true;
    loss.backward();
    marks_->armed = false;
    mark();
    const auto t2 = Clock::now();
    opt.step();
    mark();
    const auto t3 = Clock::now();
    std::vector<double> s;
    if (gpu) {
      ev.back().synchronize();
      s = {ev[0].elapsed_ms(ev[1]), ev[1].elapsed_ms(ev[2]), ev[2].elapsed_ms(ev[3])};
      // A parameter without a gradient this time counts as ready when backward ends.
      if (ddp != nullptr) {
        const dist::IterationTimeline& t = checked_timeline(*ddp, t1, t2);
        RG_CHECK(t.device_wait_start && t.device_wait_end,
                 "Profiler::sample: the DDP iteration has no device wait events");
        s[2] += t.device_wait_end->elapsed_ms(ev[2]);
        s[1] = ev[1].elapsed_ms(*t.device_wait_start);
      }
      for (size_t i = 0; i < marks_->events.size(); ++i)
        s.push_back(marks_->fired[i] ? ev[1].elapsed_ms(marks_->events[i]) : s[1]);
    } else {
      s = {ms(t1 - t0), ms(t2 - t1), ms(t3 - t2)};
      if (ddp != nullptr) {
        const dist::IterationTimeline& t = checked_timeline(*ddp, t1, t2);
        s[1] = ms(t.wait_start - t1);
        s[2] += ms(t2 - t.wait_end);
      }
      for (size_t i = 0; i < marks_->at.size(); ++i)
        s.push_back(marks_->fired[i] ? ms(marks_->at[i] - t1) : s[1]);
    }
    samples_.push_back(std::move(s));
  }

  // The Reducer's timeline of the backward between t1 and t2 (its final callback waited then).
  static const dist::IterationTimeline& checked_timeline(const dist::Reducer& ddp,
                                                         Clock::time_point t1,
                                                         Clock::time_point t2) {
    const dist::IterationTimeline& t = ddp.last_timeline();
    RG_CHECK(t1 <= t.wait_start && t.wait_start <= t.wait_end && t.wait_end <= t2,
             "Profiler::sample: DDP's final callback did not run in the sampled backward");
    return t;
  }

  // The samples so far as one profile, then forgets them: per field the median over samples, or
  // with `fastest_only` the fields of the fastest sample; then the mean over ranks.
  scale::StepProfile take(dist::ProcessGroup& pg, const std::string& name, int64_t batch,
                          bool fastest_only, const std::string& when) {
    RG_CHECK(!samples_.empty(), "Profiler::take: no sampled iteration");
    std::vector<double> v;
    if (fastest_only) {
      std::vector<double> total;
      for (const auto& s : samples_) total.push_back(s[0] + s[1] + s[2]);
      v = samples_[fastest(total)];
    } else {
      for (size_t f = 0; f < samples_.front().size(); ++f) {
        std::vector<double> x;
        for (const auto& s : samples_) x.push_back(s[f]);
        v.push_back(median(x));
      }
    }
    v = mean_over_ranks(pg, v);  // one all-reduce for every field
    scale::StepProfile p;
    p.model = name;
    p.source = fmt::format(
        "ringgrad-bench overlap: {}, batch {} per rank, {} of {}, mean over {} ranks, times "
        "from {}",
        when, batch, fastest_only ? "fastest" : "median", samples_.size(), pg.size(),
        marks_->device.is_cuda() ? "CUDA events on " + marks_->device.str() + "'s compute stream"
                                 : "the host clock");
    p.measured_ranks = pg.size();
    p.forward_ms = v[0];
    p.backward_ms = v[1];
    p.optimizer_ms = v[2];
    for (size_t i = 0; i < params_.size(); ++i)
      p.grads.push_back({params_[i].first, int64_t(params_[i].second.nbytes()), v[3 + i]});
    std::stable_sort(p.grads.begin(), p.grads.end(),
                     [](const auto& a, const auto& c) { return a.ready_ms < c.ready_ms; });
    samples_.clear();
    return p;
  }

 private:
  struct Marks {
    bool armed = false;
    Device device = Device::cpu();
    std::vector<Clock::time_point> at;
    std::vector<cuda::Event> events;  // CUDA: one per parameter, timing enabled
    std::vector<char> fired;          // this sample's hook ran
  };
  NamedTensors params_;
  std::shared_ptr<Marks> marks_;
  std::vector<std::vector<double>> samples_;
};

}  // namespace

namespace {

// The same buckets as one iteration's, all-reduced back to back on their own over `pg` (f32,
// the buckets' sizes): the link's busy time for an iteration, for real NCCL, whose transfers the
// host cannot time inside the iteration. The fastest of `reps`, after one untimed round: a rep
// can only be slowed (a rank arriving late, the host descheduled), never sped up.
double standalone_comm_ms(dist::ProcessGroup& pg, const std::vector<size_t>& bytes, Device device,
                          int reps) {
  std::vector<Tensor> t;
  for (size_t b : bytes)
    t.push_back(zeros({int64_t(std::max<size_t>(b / 4, 1))}, DType::f32, device));
  std::vector<double> v;
  for (int r = 0; r <= reps; ++r) {
    cuda::synchronize(device.index);
    const auto t0 = Clock::now();
    for (Tensor& x : t) pg.all_reduce(x)->wait();
    cuda::synchronize(device.index);
    if (r > 0) v.push_back(ms(Clock::now() - t0));
  }
  return *std::min_element(v.begin(), v.end());
}

// A --bucket-mb value other than inf/single: a positive number of MiB, else an rg::Error.
double cap_mb(const std::string& cap) {
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(cap, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  RG_CHECK(used == cap.size() && used > 0 && v > 0, "--bucket-mb '", cap,
           "': expected a positive number of MiB, 'inf' or 'single'");
  return v;
}

std::string with_model(std::string path, const std::string& model, size_t models,
                       const char* flag) {
  const auto at = path.find("{model}");
  RG_CHECK(at != std::string::npos || models == 1, flag, " '", path,
           "' needs '{model}' in it when several models run");
  if (at != std::string::npos) path.replace(at, 7, model);
  return path;
}

// Every bad value before any work.
void check_options(const OverlapBenchOptions& o) {
  for (const std::string& cap : o.bucket_mb)
    if (cap != "inf" && cap != "single") cap_mb(cap);
  RG_CHECK(o.sim_ranks == 0 || !o.sim_link.empty(), "--sim-ranks ", o.sim_ranks,
           " needs --sim-link (the link model whose ring it sizes)");
}

// The device the model trains on (made current on CUDA).
Device job_device(const OverlapBenchOptions& o, const dist::ProcessGroup& real) {
  if (o.device != "cuda") return Device::cpu();
  const Device device = real.tensor_device();
  cuda::set_device(device.index);
  RG_CHECK(!o.sim_link.empty() || real.size() > 1,
           "ringgrad-bench overlap --device cuda in one process: give --sim-link (a link model, "
           "e.g. nvlink-h100) and --sim-ranks N to model N GPUs on this one, or run one process "
           "per GPU under ringgrad-run for real NCCL");
  return device;
}

// --sim-link: the link model (into `link`) and the simulated group over `real`; else null.
std::shared_ptr<dist::SimulatedLinkGroup> simulated_link(
    const OverlapBenchOptions& o, const std::shared_ptr<dist::ProcessGroup>& real,
    dist::SimLink& link) {
  if (o.sim_link.empty()) return nullptr;
  link = dist::parse_sim_link(o.sim_link);
  link.ranks = o.sim_ranks;
  RG_CHECK(link.ranks > 1 || real->size() > 1,
           "--sim-link with one process: give --sim-ranks N (N >= 2), the ranks the modelled "
           "ring spans");
  return std::make_shared<dist::SimulatedLinkGroup>(real, link);
}

// DDP's options for one bucket cap of the table ("single", "inf" or MiB).
dist::DdpOptions ddp_options(const std::string& cap, bool overlap) {
  dist::DdpOptions d;
  d.overlap = overlap;
  d.broadcast_buffers = false;  // the same data every iteration: nothing to keep in sync
  if (cap == "single") {        // truly one bucket: nothing can overlap
    d.bucket_cap_mb = d.first_bucket_mb = 1e6;
  } else if (cap == "inf") {  // no cap, but DDP's small first bucket still goes early
    d.bucket_cap_mb = 1e6;
    d.first_bucket_mb = 1.0;
  } else {
    d.bucket_cap_mb = cap_mb(cap);
    d.first_bucket_mb = std::min(1.0, d.bucket_cap_mb);
  }
  return d;
}

// The simulated link is free while this lives (one sampled iteration), whatever happens in it.
struct FreeLink {
  dist::SimulatedLinkGroup& g;
  explicit FreeLink(dist::SimulatedLinkGroup& group) : g(group) { g.set_free(true); }
  ~FreeLink() { g.set_free(false); }
  FreeLink(const FreeLink&) = delete;
  FreeLink& operator=(const FreeLink&) = delete;
};

// On CUDA, the link's time for buckets of these sizes: the link model's (link given), else the
// buckets all-reduced back to back on their own over the real group.
double link_time_ms(const std::vector<size_t>& bytes, const dist::SimLink* link, int model_ranks,
                    dist::ProcessGroup& real, Device device, int reps) {
  if (link == nullptr) return standalone_comm_ms(real, bytes, device, reps);
  double total = 0;
  for (size_t x : bytes) total += link->allreduce_us(double(x), model_ranks) / 1e3;
  return total;
}

// A step profile to `path_template` with "{bucket}" (if any) replaced by the cap.
void write_step_profile(std::string path, const std::string& cap, const scale::StepProfile& p) {
  if (const auto at = path.find("{bucket}"); at != std::string::npos) path.replace(at, 8, cap);
  std::ofstream f(path);
  RG_CHECK(f.good(), "--profile-out: cannot write ", path);
  f << scale::step_profile_json(p) << "\n";
  fmt::print("# wrote the step profile of {} to {}\n", p.model, path);
}

void print_row(const Row& r) {
  fmt::print("  {:<9} {:>7} {:>4} {:>8} {:>9.1f} {:>9.1f} {:>9.1f} {:>9.1f} {:>7.0f}%\n", r.model,
             r.buckets, r.num_buckets, r.overlap ? "yes" : "no", r.iter_ms, r.compute_ms,
             r.comm_ms, r.exposed_ms, 100 * r.efficiency());
  std::fflush(stdout);
}

// The run's header line and the table's column names.
void print_header(const OverlapBenchOptions& o, const dist::ProcessGroup& real, Device device,
                  const dist::SimLink* link, int model_ranks) {
  const bool gpu = o.device == "cuda";
  const std::string where =
      gpu ? (real.size() == 1 ? fmt::format("1 process on {}", device.str())
                              : fmt::format("{} processes, one GPU each", real.size()))
          : fmt::format("{} ranks", real.size());
  const std::string how =
      link == nullptr
          ? fmt::format("real {} all-reduce ({})", gpu ? "NCCL" : "gloo", o.allreduce)
      : gpu ? fmt::format("modelled link {} among {} ranks, transfers on the NCCL stream (no "
                          "data moved)",
                          link->describe(), model_ranks)
            : fmt::format("simulated link {} among {} ranks (no data moved)", link->describe(),
                          model_ranks);
  fmt::print("# ringgrad-bench overlap: {}, {}\n", where, how);
  fmt::print("# {:<9} {:>7} {:>4} {:>8} {:>9} {:>9} {:>9} {:>9} {:>8}\n", "model", "bucket", "#",
             "overlap", "iter ms", "compute", "comm ms", "exposed", "hidden");
}

struct ModelInputs {
  int64_t batch;
  data::Batch b;
  std::shared_ptr<nn::Module> model;
};

// One model on `device` and its batch. gpt-*: random token ids (minGPT's character vocabulary
// size) and the loss over every position; the image models: SyntheticDataset's images.
ModelInputs make_inputs(const OverlapBenchOptions& o, const std::string& name, Device device) {
  const bool gpt = name.starts_with("gpt-");
  const Shape shape = gpt                  ? Shape{o.block_size}
                      : name == "resnet18" ? Shape{3, 32, 32}
                                           : Shape{1, 28, 28};
  const int64_t batch = o.batch_size > 0 ? o.batch_size : (name == "resnet18" || gpt ? 16 : 64);
  data::Batch b;
  if (gpt) {
    b = data::random_token_batch(batch, o.block_size, kVocab, 7);
  } else {
    data::SyntheticDataset data(batch, shape, 10, 7);
    std::vector<int64_t> idx(static_cast<size_t>(batch));
    std::iota(idx.begin(), idx.end(), 0);
    b = data.get_batch(idx, 0);
  }
  auto model =
      nn::make_model({.name = name, .sample_shape = shape, .num_classes = gpt ? kVocab : 10});
  if (device.is_cuda()) {
    model->to(device);
    b.inputs = b.inputs.to(device);
    b.targets = b.targets.to(device);
  }
  return {batch, std::move(b), std::move(model)};
}

// Iteration time against mean bucket size, overlapped and not, for one model's rows.
void plot_model(const std::string& path, const std::string& name, const std::vector<Row>& rows,
                const std::string& link_note) {
  std::vector<Series> series = {{"overlapped", {}, {}}, {"not overlapped", {}, {}}};
  for (const Row& r : rows) {
    if (r.model != name || r.num_buckets == 0) continue;
    Series& s = series[r.overlap ? 0 : 1];
    s.x.push_back(r.total_bytes / double(r.num_buckets));
    s.y.push_back(r.iter_ms);
  }
  plot_png(path,
           {fmt::format("{}: DDP iteration time{}", name, link_note), "mean bucket size",
            "iteration (ms)", true, false, true},
           series);
  fmt::print("# wrote {}\n", path);
}

void write_csv(const std::string& path, const std::vector<Row>& rows) {
  std::ofstream f(path);
  RG_CHECK(f.good(), "cannot write ", path);
  f << "model,bucket_mb,buckets,overlap,iter_ms,compute_ms,comm_ms,exposed_ms,efficiency\n";
  for (const Row& r : rows)
    f << fmt::format("{},{},{},{},{:.3f},{:.3f},{:.3f},{:.3f},{:.4f}\n", r.model, r.buckets,
                     r.num_buckets, r.overlap ? 1 : 0, r.iter_ms, r.compute_ms, r.comm_ms,
                     r.exposed_ms, r.efficiency());
  fmt::print("# wrote {}\n", path);
}

}  // namespace

int run_overlap_bench(const OverlapBenchOptions& o) {
  const bool gpu = o.device == "cuda";
  const bool sim = !o.sim_link.empty();
  check_options(o);
  dist::InitOptions init;
  init.backend = gpu ? "nccl" : "gloo";
  init.group.algorithm = dist::parse_algorithm(o.allreduce);
  auto real = dist::init_process_group(init);
  // Leaves the job however this returns: an error must not leave the group's threads running
  // into the process's exit.
  struct LeaveJob {
    ~LeaveJob() {
      trace::set_enabled(false);
      if (dist::is_initialized()) dist::destroy_process_group();
    }
  } leave_job;
  const Device device = job_device(o, *real);
  dist::SimLink link;
  std::shared_ptr<dist::SimulatedLinkGroup> sim_pg = simulated_link(o, real, link);
  std::shared_ptr<dist::ProcessGroup> pg = sim_pg ? sim_pg : real;
  const int model_ranks = link.ranks > 0 ? link.ranks : real->size();
  const bool root = real->rank() == 0;
  if (root) print_header(o, *real, device, sim ? &link : nullptr, model_ranks);
  std::vector<Row> rows;
  for (const std::string& name : o.models) {
    const bool gpt = name.starts_with("gpt-");
    const auto [batch, b, model] = make_inputs(o, name, device);
    model->train();
    optim::Sgd opt(model->parameters(), {.lr = 0.001, .momentum = 0.9});
    // On CUDA each iteration ends with a device synchronization: its host time is the GPU's.
    auto finish = [&] {
      if (gpu) cuda::synchronize(device.index);
    };
    auto loss_of = [&](const std::function<Tensor(const Tensor&)>& fwd) {
      const Tensor out = fwd(b.inputs);
      return gpt ? cross_entropy(out.view({-1, out.size(2)}), b.targets.view({-1}))
                 : cross_entropy(out, b.targets);
    };
    auto timed = [&](const std::function<Tensor(const Tensor&)>& fwd, int n,
                     const std::function<void()>& after) {
      std::vector<double> times;
      for (int i = 0; i < n; ++i) {
        const auto t0 = Clock::now();
        opt.zero_grad();
        loss_of(fwd).backward();
        opt.step();
        finish();
        times.push_back(ms(Clock::now() - t0));
        if (after) after();
      }
      return times;
    };
    auto local = [&](const Tensor& x) { return model->forward(x); };
    timed(local, o.warmup, nullptr);
    const bool use_min = o.stat == "min";
    const auto compute_times = timed(local, o.iters, nullptr);
    const double compute = use_min ? compute_times[fastest(compute_times)] : median(compute_times);
    // --profile-out: with "{bucket}" in the path, one profile per bucket cap, sampled between
    // that cap's overlapped DDP iterations (so both see the same load of a shared machine);
    // otherwise one, right after the compute measurement.
    std::unique_ptr<Profiler> profiler;
    std::string profile_path;
    const bool per_bucket = o.profile_out.find("{bucket}") != std::string::npos;
    auto write_profile = [&](const scale::StepProfile& p, const std::string& cap) {
      if (root) write_step_profile(profile_path, cap, p);
    };
    if (!o.profile_out.empty()) {
      profile_path = with_model(o.profile_out, name, o.models.size(), "--profile-out");
      profiler = std::make_unique<Profiler>(*model, device);
      if (!per_bucket) {
        for (int i = 0; i < o.iters; ++i) profiler->sample(opt, [&] { return loss_of(local); });
        write_profile(profiler->take(*real, name, batch, use_min,
                                     "compute-only iteration without DDP"),
                      "");
      }
    }
    for (const std::string& cap : o.bucket_mb) {
      for (bool overlap : {true, false}) {
        dist::DistributedDataParallel ddp(model, pg, ddp_options(cap, overlap));
        auto fwd = [&](const Tensor& x) { return ddp.forward(x); };
        timed(fwd, std::max(o.warmup, 2), nullptr);
        const bool sample = profiler && per_bucket && overlap;
        // The profile's iterations: with a link model, DDP iterations on the free link (every
        // cost but the transfers); with real communication, compute-only iterations inside DDP
        // under no_sync() (no all-reduce, no bucket copies).
        auto unsynced = [&](const Tensor& x) {
          auto guard = ddp.no_sync();
          return ddp.forward(x);
        };
        auto take_sample = [&] {
          if (sim_pg == nullptr) return profiler->sample(opt, [&] { return loss_of(unsynced); });
          const FreeLink free(*sim_pg);
          profiler->sample(opt, [&] { return loss_of(fwd); }, &ddp.reducer());
        };
        // CUDA: the link's time for this configuration's buckets (see the file comment).
        const double link_ms =
            gpu ? link_time_ms(ddp.reducer().bucket_bytes(), sim ? &link : nullptr, model_ranks,
                               *real, device, std::max(o.iters, 3))
                : 0;
        if (!o.trace.empty()) trace::set_enabled(true);
        std::vector<double> comm, exposed;
        const auto iters = timed(fwd, o.iters, [&] {
          const auto& t = ddp.reducer().last_timeline();
          if (gpu) {
            // The compute stream's wait for the buckets (events; the iteration was synchronized).
            comm.push_back(link_ms);
            exposed.push_back(t.device_wait_start->elapsed_ms(*t.device_wait_end));
          } else {
            comm.push_back(link_busy_ms(t));
            exposed.push_back(ms(t.wait_end - t.wait_start));
          }
          if (sample) take_sample();
        });
        if (!o.trace.empty()) trace::set_enabled(false);
        if (sample)
          write_profile(
              profiler->take(*real, name, batch, use_min,
                             (sim_pg ? "DDP iteration on a free link (no transfer time)"
                                     : "compute-only iteration (DDP under no_sync)") +
                                 std::string(" between DDP iterations with bucket cap ") + cap),
              cap);
        const size_t at = use_min ? fastest(iters) : 0;
        const std::vector<double> m = mean_over_ranks(
            *real, {use_min ? iters[at] : median(iters), use_min ? comm[at] : median(comm),
                    use_min ? exposed[at] : median(exposed)});
        Row r{name, cap, ddp.reducer().bucket_names().size(), overlap, m[0], compute, m[1], m[2]};
        r.total_bytes = 0;
        for (size_t x : ddp.reducer().bucket_bytes()) r.total_bytes += double(x);
        if (root) print_row(r);
        rows.push_back(r);
      }
    }
    if (root && !o.plot.empty()) {
      plot_model(with_model(o.plot, name, o.models.size(), "--plot"), name, rows,
                 sim ? " (" + link.describe() + ", " + std::to_string(model_ranks) + " ranks)"
                     : "");
    }
  }
  if (root && !o.csv.empty()) write_csv(o.csv, rows);
  if (!o.trace.empty()) {
    train::write_trace(o.trace, real.get());
    if (root) fmt::print("# wrote the trace of the timed DDP iterations to {}\n", o.trace);
  }
  real->barrier()->wait();
  pg.reset();
  sim_pg.reset();
  dist::destroy_process_group();
  return 0;
}

}  // namespace rg::apps
