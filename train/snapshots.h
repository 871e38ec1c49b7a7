// Snapshots, checkpoints and resume of a Trainer: the run's shape that a file must match to
// continue it (another world size included), where a file says the run continues (epoch, step,
// mid-epoch position, DDP's rebuilt buckets), and saving: rank 0 writes (atomically) and every
// rank learns whether that worked.
#pragma once

#include <functional>
#include <iosfwd>
#include <optional>
#include <string>
#include <vector>

#include "comm/ddp.h"
#include "engine/serialization.h"
#include "layers/amp/grad_scaler.h"
#include "layers/checkpoint.h"
#include "layers/optim/optimizer.h"
#include "train/options.h"

namespace rg::train {

// Where a loaded file says the run continues.
struct Resume {
  std::string path;
  bool from_snapshot = false;
  bool finished = false;  // a snapshot of a run with nothing left to do
  int first_epoch = 1;
  int64_t step = 0;
  // Mid-epoch (snapshots): steps done in first_epoch, the loss sum and samples of all ranks, how
  // many leading samples of its order they had consumed and where its re-split started (-1: none).
  int64_t epoch_steps = 0, samples = 0;
  double loss_sum = 0;
  int saved_world = 1;
  int64_t consumed = 0, resplit_from = -1;
  std::vector<int64_t> bucket_order;  // DDP's rebuilt buckets
  nn::Metadata metadata;
  NamedTensors tensors;  // beyond model and optimizer (comm/reducer_snapshot.h)
};

// A mid-epoch snapshot's position inside its epoch (sums over all ranks).
struct EpochPosition {
  int64_t epoch_steps = 0, consumed = 0, resplit_from = -1, samples = 0;
  double loss_sum = 0;
};

struct SnapshotOptions {
  std::string snapshot, checkpoint, resume, name = "trainer", comm_hook = "allreduce";
  int64_t snapshot_every = 0, batch_size = 64, max_steps = -1;
  int epochs = 1;
};

class Snapshots {
 public:
  // `shape` is the run's, with world_size and steps_per_epoch filled in.
  Snapshots(const SnapshotOptions& options, RunShape shape, dist::ProcessGroup* pg);
  // The file this run continues from: the snapshot when it exists, else the resume path ("").
  const std::string& resume_path() const { return resume_path_; }
  bool from_snapshot() const { return from_snapshot_; }
  // Loads resume_path() into the model, optimizer and scaler after checking the run's shape;
  // `load_state` gets the metadata first (the callbacks' state). Restore before DDP is built.
  Resume load(nn::Module& model, optim::Optimizer* optimizer, amp::GradScaler* scaler,
              int64_t dataset_size, int64_t steps_per_epoch,
              const std::function<void(const nn::Metadata&, const std::string&)>& load_state);
  // Rank 0 saves `path` with the run's shape, epoch and step; every rank takes part and throws
  // when the save failed. `what` names it in errors ("checkpoint", "snapshot").
  void save(const std::string& path, int epoch, int64_t step, nn::Module& model,
            const optim::Optimizer* optimizer, const amp::GradScaler* scaler,
            const nn::Metadata& extra, const std::string& what,
            const NamedTensors& tensors = {}) const;
  // The snapshot's metadata and tensors beyond a checkpoint's: the position when mid-epoch and
  // DDP's state (a collective).
  void snapshot_state(const std::optional<EpochPosition>& position,
                      dist::DistributedDataParallel* ddp, nn::Metadata& meta,
                      NamedTensors& tensors) const;

 private:
  void check_shape(const nn::Metadata& saved, Resume& r) const;
  void read_position(const nn::Metadata& saved, Resume& r, int64_t dataset_size,
                     int64_t steps_per_epoch) const;

  SnapshotOptions options_;
  RunShape shape_;
  dist::ProcessGroup* pg_;
  int world_ = 1;
  std::string resume_path_;
  bool from_snapshot_ = false;
};

// Reads a count entry ("<where>: the checkpoint's <key> entry is missing or not a count").
int64_t metadata_count(const nn::Metadata& saved, const std::string& key, const std::string& where);

}  // namespace rg::train
