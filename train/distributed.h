// The distributed wiring of a Trainer: joins the launch's process group (ringgrad-run, torchrun
// variables, Slurm, Open MPI) when it describes several ranks, resolves the device ("cuda" is the
// rank's GPU), and wraps the model: SyncBatchNorm, DataParallel (--mode dp) or DDP.
#pragma once

#include <iosfwd>
#include <memory>
#include <string>
#include <vector>

#include "comm/ddp.h"
#include "engine/device.h"
#include "layers/data_parallel.h"
#include "train/options.h"

namespace rg::train {

// Sums `v` over the group's ranks, in place; a no-op without a group.
void sum_over_ranks(dist::ProcessGroup* pg, std::vector<double>& v);

class Distributed {
 public:
  Distributed(const DistributedOptions& options, const std::string& device);
  dist::ProcessGroup* pg() const { return pg_.get(); }
  const std::shared_ptr<dist::ProcessGroup>& group() const { return pg_; }
  int rank() const { return pg_ ? pg_->rank() : 0; }
  int world() const { return pg_ ? pg_->size() : 1; }
  Device device() const { return device_; }
  // The devices the model runs on (DataParallel's, else the one).
  std::vector<Device> devices() const;

  // Converts batch norms (sync_bn), builds DataParallel (mode dp) or DDP around `model`;
  // messages go to `out`, starting with `name`. Before the first step, after a resume.
  void wrap(const std::shared_ptr<nn::Module>& model, int64_t batch_size, uint64_t seed,
            const std::string& model_name, const std::string& name, std::ostream& out);
  dist::DistributedDataParallel* ddp() const { return ddp_.get(); }
  // DataParallel scatters the host batch itself: no copy to the device first.
  bool scatters_host_batch() const { return dp_ != nullptr; }
  // The model's forward through its wrapper.
  Tensor forward(const Tensor& inputs) const;
  // At the end of a run: DDP released, then every rank waits for the others.
  void finish();

 private:
  void wrap_sync_bn(nn::Module& model, const std::string& model_name, const std::string& name,
                    std::ostream& out);
  void wrap_data_parallel(const std::shared_ptr<nn::Module>& model, int64_t batch_size,
                          const std::string& name, std::ostream& out);
  void wrap_ddp(const std::shared_ptr<nn::Module>& model, uint64_t seed);

  DistributedOptions options_;
  std::shared_ptr<dist::ProcessGroup> pg_;
  Device device_;
  std::shared_ptr<nn::Module> model_;
  std::unique_ptr<nn::DataParallel> dp_;
  std::unique_ptr<dist::DistributedDataParallel> ddp_;
};

}  // namespace rg::train
