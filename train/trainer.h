// rg::train::Trainer: trains a module with its optimizer on a data set, one process or DDP under
// ringgrad-run / dist::spawn, with evaluation, checkpoints, snapshots and exact resume (another
// world size included), early stopping, progress, metrics and tracing. It composes the parts
// (Distributed, Feeder, Step, Evaluator, Snapshots) and runs the loop; everything else is a
// callback (train/callbacks.h, or your own):
//
//   rg::train::Trainer trainer(model, optimizer, train_data,
//                              {.snapshot = "run.safetensors", .snapshot_every = 100});
//   trainer.fit(epochs);
#pragma once

#include <deque>
#include <iosfwd>
#include <memory>
#include <optional>
#include <ostream>

#include "comm/join.h"
#include "engine/device_checks.h"
#include "train/callback.h"
#include "train/callbacks.h"
#include "train/distributed.h"
#include "train/evaluation.h"
#include "train/feeder.h"
#include "train/graph_step.h"
#include "train/options.h"
#include "train/snapshots.h"
#include "train/step.h"

namespace rg::train {

// Where the best checkpoint of early stopping goes: ".best" inserted before the file name's
// extension (run.safetensors -> run.best.safetensors; run -> run.best).
std::string best_checkpoint_path(const std::string& checkpoint_path);

class Trainer {
 public:
  // Joins the launch's process group (when there is one) and moves the model to the device; the
  // optimizer may be built before (Module::to keeps parameter handles).
  Trainer(std::shared_ptr<nn::Module> model, std::shared_ptr<optim::Optimizer> optimizer,
          std::shared_ptr<const data::Dataset> train_data, Options options = {});
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;
  ~Trainer();

  // Callbacks run in the order added, before the trainer's own.
  void add_callback(std::shared_ptr<Callback> callback);
  const State& state() const { return state_; }
  // Trains until `epochs` epochs (or max_steps) are done, continuing from the snapshot or resume
  // file when there is one; throws rg::Error.
  TrainResult fit(int epochs);

 private:
  bool prepare(int epochs);
  void resume_from_file();
  void continue_resplit();
  void wrap_model();
  void make_graph_step();
  void add_builtin_callbacks();
  void begin_epoch(int epoch);
  bool run_epoch(int epoch);
  bool train_step();
  void joined_step(const dist::JoinRound& round);
  void collect_losses(bool wait);
  void end_epoch_data(std::optional<dist::Join>& join);
  EpochSummary summarize(int epoch);
  void save_epoch_files(int epoch);
  void save_checkpoint(int epoch, bool complete, const std::string& path);
  void save_snapshot(int epoch);
  void finish();
  template <class F>
  void fire(F&& f) {
    user_callbacks_.each(f);
    builtin_callbacks_.each(f);
  }
  bool should_stop() const {
    return user_callbacks_.should_stop() || builtin_callbacks_.should_stop();
  }

  Options options_;
  std::ostream silent_{nullptr};
  std::ostream* out_;
  std::shared_ptr<nn::Module> model_;
  std::shared_ptr<optim::Optimizer> optimizer_;
  Distributed distributed_;
  Feeder feeder_;
  Step step_;
  std::unique_ptr<GraphStep> graph_step_;  // with cuda_graphs
  std::optional<Evaluator> evaluator_;
  std::unique_ptr<Snapshots> snapshots_;
  Resume resume_;
  CallbackList user_callbacks_, builtin_callbacks_;
  std::shared_ptr<EarlyStopping> early_stopping_;
  State state_;
  TrainResult result_;
  int64_t samples_before_ = 0;
  // The epoch re-split over another world size (its ranks' batches may differ in size), or -1:
  // with cuda_graphs its steps run eagerly on every rank alike.
  int resplit_epoch_ = -1;
  // Step losses on their way to the host (read without stalling; collect_losses).
  struct PendingLoss {
    AsyncScalar loss;
    int64_t step;
    int64_t samples;
  };
  std::deque<PendingLoss> pending_losses_;
  std::chrono::steady_clock::time_point epoch_start_;
  bool join_ = false;
};

}  // namespace rg::train
