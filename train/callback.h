// Callbacks: the named events of a Trainer's run and the read-only view of its state that each
// event receives. Progress output, metrics, early stopping, consistency checks and tracing are
// callbacks; so are a user's own and the tests' fault injection.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/dataset.h"
#include "engine/device.h"
#include "layers/checkpoint.h"
#include "train/options.h"

namespace rg::dist {
class ProcessGroup;
}
namespace rg::optim {
class Optimizer;
}

namespace rg::train {

// The trainer's state as callbacks see it.
struct State {
  // The run: model (the module itself, not its DDP wrapper), optimizer, group (nullptr: one
  // process), the devices the model runs on.
  const nn::Module* model = nullptr;
  const optim::Optimizer* optimizer = nullptr;
  dist::ProcessGroup* pg = nullptr;
  int rank = 0, world = 1;
  Device device = Device::cpu();
  std::vector<Device> devices;
  int epochs = 0, first_epoch = 1;
  int64_t steps_per_epoch = 0, planned_steps = 0;
  int64_t dataset_size = 0;
  // Where the run is: epoch, optimizer-visible steps in all and in this epoch, this epoch's plan
  // (all ranks) and this rank's share of it; optimizer steps this process took.
  int epoch = 0;
  int64_t step = 0, epoch_steps = 0, epoch_planned = 0, my_planned = 0;
  int64_t optimizer_steps = 0;
  bool sync = false;    // the current step ends with an optimizer step
  bool joined = false;  // this rank ran out and shadows the others' step (dist::Join)
  // The current batch (on_batch .. on_step_end) and its samples (0 while joined).
  const data::Batch* batch = nullptr;
  int64_t batch_samples = 0;
  // Losses are read from the device without stalling the host (engine/device_checks.h's
  // AsyncScalar): batch_loss is the loss of step loss_step, the newest step whose loss has
  // arrived. On the CPU that is always the current step; on CUDA it lags by the steps still queued
  // on the GPU, and every loss of the epoch has arrived by on_train_epoch_end (-1: none yet).
  double batch_loss = 0;
  int64_t loss_step = -1;
  // The epoch so far on this rank (rank 0 also holds what a mid-epoch snapshot restored): samples
  // trained on, and the sum of loss * samples over the steps whose loss has arrived (loss_samples
  // of them; equal to epoch_samples at the epoch's end and at snapshots).
  double epoch_loss_sum = 0;
  int64_t epoch_samples = 0;
  int64_t epoch_loss_samples = 0;
  EpochSummary summary;  // on_eval_end, on_epoch_end
  const TrainResult* result = nullptr;
};

// Override the events you need; each gets the state after the event's work.
class Callback {
 public:
  virtual ~Callback() = default;
  virtual void on_train_start(const State&) {}
  virtual void on_epoch_start(const State&) {}
  virtual void on_step_start(const State&) {}             // before the next batch is read
  virtual void on_batch(const State&) {}                  // the batch was read
  // Gradients averaged, not yet clipped (with cuda_graphs, after a replayed step: its gradients,
  // its optimizer step queued already).
  virtual void on_before_optimizer_step(const State&) {}
  virtual void on_step_end(const State&) {}               // also on a joined rank (joined)
  virtual void on_train_epoch_end(const State&) {}        // the epoch's steps are done
  virtual void on_eval_start(const State&) {}
  virtual void on_eval_end(const State&) {}   // the epoch's summary, evaluated or not
  virtual void on_snapshot(const State&) {}   // a snapshot is about to be written
  virtual void on_epoch_end(const State&) {}  // after the epoch's checkpoints and snapshot
  virtual void on_train_end(const State&) {}
  // State that checkpoints carry: added to every checkpoint's metadata, read back on resume.
  virtual void save_state(nn::Metadata&) const {}
  virtual void load_state(const nn::Metadata&, const std::string& where) {}
  // Asked after on_epoch_end: true ends the run.
  virtual bool should_stop() const { return false; }
};

// Callbacks in the order they run: the user's (added first), then the trainer's own.
class CallbackList {
 public:
  void add(std::shared_ptr<Callback> c) { callbacks_.push_back(std::move(c)); }
  template <class F>
  void each(F&& f) const {
    for (const auto& c : callbacks_) f(*c);
  }
  bool should_stop() const {
    for (const auto& c : callbacks_)
      if (c->should_stop()) return true;
    return false;
  }

 private:
  std::vector<std::shared_ptr<Callback>> callbacks_;
};

}  // namespace rg::train
