// The trainer's own callbacks: early stopping, progress, metrics, tracing, consistency checks.
#include "train/callbacks.h"

#include <fmt/format.h>
#include <sys/resource.h>

#include <nlohmann/json.hpp>
#include <ostream>

#include "comm/debug_level.h"
#include "comm/process_group.h"
#include "engine/cuda/memory.h"
#include "engine/trace.h"
#include "kernels/error.h"
#include "train/distributed.h"
#include "train/snapshots.h"
#include "train/trace_writer.h"

namespace rg::train {
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

}  // namespace

EarlyStopping::EarlyStopping(int patience, std::string metric, std::string name, std::ostream& out)
    : patience_(patience), metric_(std::move(metric)), name_(std::move(name)), out_(out) {}

// Rank 0 judges its metrics (the same on every rank after the evaluation's sums, but one rank
// deciding makes disagreement impossible) and every rank learns the verdict.
void EarlyStopping::on_eval_end(const State& s) {
  improved_ = stop_ = false;
  if (!s.summary.evaluated) return;
  const bool top1 = metric_ == "top1";
  const double m = top1 ? s.summary.top1 : s.summary.test_loss;
  std::vector<double> verdict = {0, 0};
  if (s.rank == 0) {
    const bool better = best_epoch_ == 0 || (top1 ? m > best_metric_ : m < best_metric_);
    verdict = {better ? 1.0 : 0.0, !better && bad_evals_ + 1 >= patience_ ? 1.0 : 0.0};
  }
  sum_over_ranks(s.pg, verdict);
  improved_ = verdict[0] > 0;
  stop_ = verdict[1] > 0;
  if (improved_) {
    best_epoch_ = s.epoch;
    best_metric_ = m;
    bad_evals_ = 0;
  } else {
    ++bad_evals_;
  }
}

void EarlyStopping::on_epoch_end(const State& s) {
  if (!stop_) return;
  out_ << fmt::format("{}: stopped early after epoch {}: {} did not improve for {} evaluation{}\n",
                      name_, s.epoch, metric_ == "top1" ? "top-1" : "test loss", patience_,
                      patience_ == 1 ? "" : "s");
}

void EarlyStopping::on_train_end(const State& s) {
  const bool top1 = metric_ == "top1";
  out_ << fmt::format(
      "{}: best epoch {} ({} {}){}{}\n", name_, best_epoch_, top1 ? "top-1" : "test loss",
      top1 ? fmt::format("{:.2f}%", 100 * best_metric_) : fmt::format("{:.4f}", best_metric_),
      s.result && s.result->stopped_early ? ", stopped early" : "",
      best_path_.empty() ? "" : ", saved to " + best_path_);
}

void EarlyStopping::save_state(nn::Metadata& meta) const {
  meta["early_stop.metric"] = metric_;
  meta["early_stop.best_epoch"] = std::to_string(best_epoch_);
  meta["early_stop.best_metric"] = fmt::format("{}", best_metric_);
  meta["early_stop.bad_evals"] = std::to_string(bad_evals_);
}

void EarlyStopping::load_state(const nn::Metadata& saved, const std::string& where) {
  const auto metric = saved.find("early_stop.metric");
  if (metric == saved.end() || metric->second != metric_) return;
  best_epoch_ = int(metadata_count(saved, "early_stop.best_epoch", where));
  bad_evals_ = int(metadata_count(saved, "early_stop.bad_evals", where));
  const auto value = saved.find("early_stop.best_metric");
  RG_CHECK(value != saved.end(), where, ": the checkpoint's early_stop.best_metric is missing");
  best_metric_ = std::strtod(value->second.c_str(), nullptr);
}

ProgressReporter::ProgressReporter(const Options& options, std::ostream& out)
    : options_(options), out_(out) {}

void ProgressReporter::on_epoch_start(const State& s) {
  epoch_start_ = Clock::now();
  // What this process ran of the epoch (rates and ETA leave out what a snapshot restored).
  samples_before_ = s.epoch_samples;
  steps_before_ = s.epoch_steps;
  plain_every_ = std::max<int64_t>(1, s.epoch_planned / 10);
  window_loss_ = s.epoch_loss_sum;  // what a snapshot restored is not this process's window
  window_samples_ = s.epoch_loss_samples;
  shown_loss_ = std::nan("");
}

void ProgressReporter::on_step_end(const State& s) {
  // The same steps on every rank, whatever the output is (a joined rank sends zeros).
  const bool report = s.epoch_steps % plain_every_ == 0 || s.epoch_steps == s.epoch_planned;
  if (s.joined) {
    if (!report) return;
    std::vector<double> zeros = {0, 0};
    sum_over_ranks(s.pg, zeros);
    return;
  }
  if (report) {
    // The losses that arrived since the last report (on CUDA they lag the step by what the GPU
    // still has queued; read without stalling the host).
    std::vector<double> w = {s.epoch_loss_sum - window_loss_,
                             double(s.epoch_loss_samples - window_samples_)};
    sum_over_ranks(s.pg, w);
    if (w[1] > 0) shown_loss_ = w[0] / w[1];
    window_loss_ = s.epoch_loss_sum;
    window_samples_ = s.epoch_loss_samples;
  }
  show_step(s, report);
}

void ProgressReporter::show_step(const State& s, bool report) {
  const char* const unit = options_.tokens ? "tok/s" : "img/s";
  const double elapsed = seconds_since(epoch_start_);
  // The job's rate: every rank runs the same number of equally sized steps.
  const double ips = double(s.epoch_samples - samples_before_) * s.world / std::max(elapsed, 1e-9);
  const double eta =
      elapsed / double(s.epoch_steps - steps_before_) * double(s.epoch_planned - s.epoch_steps);
  // Until the first all-reduced window with an arrived loss, no loss to show.
  const std::string shown =
      std::isnan(shown_loss_) ? std::string("--") : fmt::format("{:.4f}", shown_loss_);
  if (options_.progress_bar) {
    const int width = 30;
    const int filled = int(double(width) * double(s.epoch_steps) / double(s.epoch_planned));
    out_ << fmt::format("\repoch {} [{}{}] {}/{} loss {} {:.0f} {} ETA {}  ", s.epoch,
                        std::string(size_t(filled), '='), std::string(size_t(width - filled), ' '),
                        s.epoch_steps, s.epoch_planned, shown, ips, unit, format_duration(eta));
    out_.flush();
  } else if (report) {
    out_ << fmt::format("epoch {} step {}/{} loss {} {:.0f} {} ETA {}\n", s.epoch, s.epoch_steps,
                        s.epoch_planned, shown, ips, unit, format_duration(eta));
    out_.flush();
  }
}

void ProgressReporter::on_train_epoch_end(const State&) {
  if (options_.progress_bar) out_ << "\n";
}

void ProgressReporter::on_eval_end(const State& s) {
  const EpochSummary& e = s.summary;
  out_ << fmt::format("epoch {} | train loss {:.4f}", e.epoch, e.train_loss);
  if (e.evaluated)
    out_ << fmt::format(" | test loss {:.4f} | top-1 {:.2f}% | top-5 {:.2f}%", e.test_loss,
                        100 * e.top1, 100 * e.top5);
  out_ << fmt::format(" | {:.0f} {} | {:.1f} s\n", e.img_per_s, options_.tokens ? "tok/s" : "img/s",
                      e.seconds);
  out_.flush();
}

void ProgressReporter::on_train_end(const State& s) { out_ << final_line(options_, s) << "\n"; }

MetricsLog::MetricsLog(const Options& options, int rank) : options_(options) {
  if (options.metrics.empty() || rank != 0) return;
  file_ = std::make_unique<std::ofstream>(options.metrics);
  RG_CHECK(file_->good(), "--metrics: cannot write ", options.metrics);
}

void MetricsLog::on_eval_end(const State& s) {
  if (!file_) return;
  const EpochSummary& e = s.summary;
  nlohmann::json j = {{"type", "epoch"},  {"epoch", e.epoch},
                      {"steps", e.steps}, {"train_loss", e.train_loss},
                      {"step", s.step},   {"seconds", e.seconds}};
  j[options_.tokens ? "tokens_per_s" : "img_per_s"] = e.img_per_s;
  if (e.evaluated) {
    j["test_loss"] = e.test_loss;
    j["top1"] = e.top1;
    j["top5"] = e.top5;
  }
  *file_ << j.dump() << "\n";
  file_->flush();
}

void MetricsLog::on_train_end(const State& s) {
  if (file_) *file_ << final_line(options_, s) << "\n";
}

std::string final_line(const Options& o, const State& s) {
  const TrainResult& r = *s.result;
  nlohmann::json j = {{"type", "final"},
                      {"model", o.model_name},
                      {"dataset", o.dataset_name},
                      {"world_size", s.world},
                      {"epochs", int(r.epochs.size())},
                      {"steps", r.total_steps},
                      {"test_loss", r.final_test_loss},
                      {"top1", r.final_top1},
                      {"top5", r.final_top5},
                      {"seconds", r.total_seconds}};
  // Peak memory of this process (rank 0's under DDP): resident set, and per CUDA device it used
  // the caching allocator's high-water mark of live blocks (ringgrad-bench compare reads these).
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  j["peak_rss_mb"] = double(ru.ru_maxrss) / 1024.0;
  if (s.device.is_cuda()) {
    nlohmann::json per_device = nlohmann::json::array();
    for (const Device& d : s.devices)
      per_device.push_back(double(cuda::memory_stats(d.index).peak_allocated_bytes) / (1 << 20));
    j["peak_device_mb"] = per_device;
  }
  if (o.early_stop_patience > 0) {
    j["best_epoch"] = r.best_epoch;
    j["best_" + o.early_stop_metric] = r.best_metric;
    j["stopped_early"] = r.stopped_early;
  }
  return j.dump();
}

TraceRecorder::TraceRecorder(std::string path, int64_t steps, std::string name, std::ostream& out)
    : path_(std::move(path)), name_(std::move(name)), steps_(steps), out_(out) {}

void TraceRecorder::on_train_start(const State&) {
  trace::take_events();  // start from an empty buffer
  trace::set_enabled(true);
}

void TraceRecorder::on_step_start(const State& s) {
  if (trace::enabled() && s.step >= steps_) trace::set_enabled(false);
}

// The trace holds the first steps, not the evaluation after them.
void TraceRecorder::on_train_epoch_end(const State& s) { on_step_start(s); }

// Nor any evaluation between them: ringgrad-bench profile counts what a trace holds per training
// step, and an evaluation after the last traced step would join that step.
void TraceRecorder::on_eval_start(const State&) {
  paused_ = trace::enabled();
  if (paused_) trace::set_enabled(false);
}

void TraceRecorder::on_eval_end(const State& s) {
  if (paused_ && s.step < steps_) trace::set_enabled(true);
  paused_ = false;
}

void TraceRecorder::on_train_end(const State& s) {
  trace::set_enabled(false);
  write_trace(path_, s.pg);
  out_ << fmt::format(
      "{}: wrote the trace of the first {} steps to {} (open it in "
      "https://ui.perfetto.dev or chrome://tracing)\n",
      name_, std::min(steps_, s.result->total_steps), path_);
}

ConsistencyChecks::ConsistencyChecks(int64_t every, bool check_buffers, std::string name,
                                     std::ostream& out)
    : every_(every), check_buffers_(check_buffers), name_(std::move(name)), out_(out) {}

void ConsistencyChecks::on_train_start(const State& s) {
  if (s.pg && !check_buffers_)
    out_ << fmt::format(
        "{}: --check-consistency {}: parameters are compared, buffers not (each rank's "
        "running statistics follow its own batches between broadcasts; --sync-bn keeps them "
        "equal)\n",
        name_, every_);
}

// In DETAIL the averaged gradients too, as backward left them (before clipping or a step).
void ConsistencyChecks::on_before_optimizer_step(const State& s) {
  if (s.pg && (s.optimizer_steps + 1) % every_ == 0 &&
      dist::debug_level() == dist::DebugLevel::detail)
    check_.add_gradients(s.model->named_parameters());
}

void ConsistencyChecks::on_step_end(const State& s) {
  if (!s.pg || !s.sync || s.optimizer_steps % every_ != 0) return;
  trace::Scope t("consistency check", "step");
  check_.add(s.model->named_parameters());
  if (check_buffers_) check_.add(s.model->named_buffers());
  check_.run(*s.pg, s.step);
}

}  // namespace rg::train
