// DistributedDataParallel: wraps a Module so that backward averages its gradients across the
// ranks of a process group (PyTorch's semantics, see comm/reducer.h). Construction checks that
// every rank has the same parameters and copies rank 0's parameters and buffers to all.
#pragma once

#include <memory>

#include "comm/join.h"
#include "comm/process_group.h"
#include "comm/reducer.h"
#include "layers/module.h"

namespace rg::dist {

// A Joinable (comm/join.h): inside a Join context every forward first tells the context that
// this rank still has data, and a rank that joined shadows each iteration as PyTorch's
// _DDPJoinHook does (the buffer broadcast, from the highest active rank since lower ones may
// have joined with stale buffers; the bucket all-reduces with zeros; the unused-parameter
// all-reduce), then broadcasts the model from the last rank to join.
class DistributedDataParallel : public Joinable {
 public:
  // pg null: the default group (init_process_group). Collective: every rank must construct it.
  explicit DistributedDataParallel(std::shared_ptr<nn::Module> module,
                                   std::shared_ptr<ProcessGroup> pg = nullptr,
                                   DdpOptions options = {});

  // Broadcasts buffers from rank 0 (broadcast_buffers, training), runs the module, and arms
  // the reducer for the backward that follows (unless inside no_sync() or without grad mode).
  Tensor forward(const Tensor& x);
  Tensor operator()(const Tensor& x) { return forward(x); }

  nn::Module& module() { return *module_; }
  const std::shared_ptr<nn::Module>& module_ptr() const { return module_; }
  ProcessGroup& process_group() { return *pg_; }
  Reducer& reducer() { return *reducer_; }
  const DdpOptions& options() const { return options_; }

  // While a NoSync guard lives, backward only accumulates into .grad locally; the next
  // synchronized backward reduces the accumulated gradients (gradient accumulation).
  class NoSync {
   public:
    explicit NoSync(DistributedDataParallel& ddp) : ddp_(ddp), prev_(ddp.sync_) {
      ddp.sync_ = false;
    }
    ~NoSync() { ddp_.sync_ = prev_; }
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;

   private:
    DistributedDataParallel& ddp_;
    bool prev_;
  };
  [[nodiscard]] NoSync no_sync() { return NoSync(*this); }
  bool require_backward_grad_sync() const { return sync_; }

  // Uneven inputs without Join (see Reducer): the next synchronized backward is this rank's last
  // in this pass over its data; end_of_data() after the loop, on every rank (it also raises what
  // the last synchronized backward's status, read one iteration late, reports).
  void announce_last_iteration() { reducer_->announce_last_iteration(); }
  void end_of_data();

  void join_main_hook(const JoinRound& round) override;
  void join_post_hook(bool is_last_joiner) override;
  void set_join(Join* join) override;

 private:
  void verify_parameter_shapes();
  void broadcast_state(bool params, bool buffers, int src = 0);
  bool broadcasts_buffers() const;

  std::shared_ptr<nn::Module> module_;
  std::shared_ptr<ProcessGroup> pg_;
  DdpOptions options_;
  std::unique_ptr<Reducer> reducer_;
  bool sync_ = true;
  Join* join_ = nullptr;
};

}  // namespace rg::dist
