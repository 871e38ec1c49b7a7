// The trainer's own callbacks: early stopping, progress output, JSONL metrics, tracing and the
// ranks' consistency checks. Each owns one concern and works alone (add it to any Trainer).
#pragma once

#include <chrono>
#include <cmath>
#include <fstream>
#include <iosfwd>
#include <memory>
#include <string>

#include "comm/consistency.h"
#include "train/callback.h"

namespace rg::train {

// Stops when the evaluation metric (test loss, lower is better, or top1) has not improved for
// `patience` evaluations in a row. Rank 0 judges and every rank follows; the state goes into
// every checkpoint, so a resumed run keeps counting.
class EarlyStopping : public Callback {
 public:
  EarlyStopping(int patience, std::string metric, std::string name, std::ostream& out);
  void on_eval_end(const State& s) override;
  void on_epoch_end(const State& s) override;
  void on_train_end(const State& s) override;
  void save_state(nn::Metadata& meta) const override;
  void load_state(const nn::Metadata& saved, const std::string& where) override;
  bool should_stop() const override { return stop_; }
  bool improved() const { return improved_; }
  int best_epoch() const { return best_epoch_; }
  double best_metric() const { return best_metric_; }
  // Where the best checkpoint goes, printed at the end ("" = none).
  void set_best_path(std::string path) { best_path_ = std::move(path); }

 private:
  int patience_;
  std::string metric_, name_, best_path_;
  std::ostream& out_;
  int best_epoch_ = 0, bad_evals_ = 0;
  double best_metric_ = 0;
  bool improved_ = false, stop_ = false;
};

// Progress output on rank 0: a line every tenth of an epoch (or a bar redrawn in place), the epoch's
// summary line and the final JSON line. The loss shown is the mean over all ranks' samples since
// the last line (all-reduced at those steps on every rank).
class ProgressReporter : public Callback {
 public:
  ProgressReporter(const Options& options, std::ostream& out);
  void on_epoch_start(const State& s) override;
  void on_step_end(const State& s) override;
  void on_train_epoch_end(const State& s) override;
  void on_eval_end(const State& s) override;
  void on_train_end(const State& s) override;

 private:
  void show_step(const State& s, bool report);
  const Options& options_;
  std::ostream& out_;
  std::chrono::steady_clock::time_point epoch_start_;
  int64_t samples_before_ = 0, steps_before_ = 0, plain_every_ = 1;
  double window_loss_ = 0, shown_loss_ = std::nan("");
  int64_t window_samples_ = 0;
};

// The metrics file (JSONL, rank 0): one line per epoch and the final line.
class MetricsLog : public Callback {
 public:
  MetricsLog(const Options& options, int rank);
  void on_eval_end(const State& s) override;
  void on_train_end(const State& s) override;

 private:
  const Options& options_;
  std::unique_ptr<std::ofstream> file_;
};

// The run's final JSON line (ProgressReporter and MetricsLog print it).
std::string final_line(const Options& options, const State& s);

// A Chrome/Perfetto trace of the first `steps` steps, gathered on rank 0 at the end.
class TraceRecorder : public Callback {
 public:
  TraceRecorder(std::string path, int64_t steps, std::string name, std::ostream& out);
  void on_train_start(const State& s) override;
  void on_step_start(const State& s) override;
  void on_train_epoch_end(const State& s) override;
  void on_eval_start(const State& s) override;
  void on_eval_end(const State& s) override;
  void on_train_end(const State& s) override;

 private:
  std::string path_, name_;
  int64_t steps_;
  std::ostream& out_;
  bool paused_ = false;  // tracing was on when the evaluation began
};

// Every `every` optimizer steps the ranks compare hashes of every parameter (and buffer, when
// they are kept equal; in DETAIL also of the averaged gradients).
class ConsistencyChecks : public Callback {
 public:
  ConsistencyChecks(int64_t every, bool check_buffers, std::string name, std::ostream& out);
  void on_train_start(const State& s) override;
  void on_before_optimizer_step(const State& s) override;
  void on_step_end(const State& s) override;

 private:
  int64_t every_;
  bool check_buffers_;
  std::string name_;
  std::ostream& out_;
  dist::ConsistencyCheck check_;
};

}  // namespace rg::train
