// Join: training with uneven inputs, as torch.distributed.algorithms.Join. Ranks whose data runs
// out first "join": until every rank has joined they shadow the collectives that the ranks still
// training run in each iteration, so nobody waits for a collective that never comes. Each
// participant in those collectives is a Joinable (DistributedDataParallel is one; a training loop
// with its own collectives adds a CallbackJoinable):
//   - each iteration, the first joinable of an active rank (DDP's forward) calls notify(): one
//     small all-reduce (MAX) in which every active rank sets its slot, and says whether this
//     iteration's backward is synchronized; a joined rank takes part with zeros;
//   - a joined rank runs every joinable's main hook once per such round, in joinable order
//     (the order of the active ranks' collectives in an iteration);
//   - when a round finds no active rank, every rank runs the post hooks (DDP broadcasts the model
//     from the last rank to join, as PyTorch's _DDPJoinHook).
// Averaging: by default DDP divides the gradient sums by the number of ranks still active in the
// iteration, so gradients are averaged over the ranks that had data (joined ranks send zeros).
// PyTorch's default is the opposite (divide_by_initial_world_size=True); set it for PyTorch's.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "comm/process_group.h"

namespace rg::dist {

struct JoinOptions {
  // true: divide by the world size whatever the number of active ranks (PyTorch's default), so
  // an iteration with fewer active ranks has smaller gradients; false: by the active ranks.
  bool divide_by_initial_world_size = false;
};

// What the active ranks told one round.
struct JoinRound {
  std::vector<int> active;  // the ranks that still had data, ascending
  bool sync = false;        // their backward is synchronized (not inside no_sync)
  int64_t synced = 0;       // synchronized iterations they had finished before this one
  int authoritative() const { return active.empty() ? 0 : active.back(); }
};

class Join;

class Joinable {
 public:
  virtual ~Joinable() = default;
  // One round on a rank that has joined: the collectives an active rank's iteration runs.
  virtual void join_main_hook(const JoinRound& round) = 0;
  // After every rank has joined; is_last_joiner: this rank never had to shadow a round.
  virtual void join_post_hook(bool is_last_joiner) = 0;
  // Join tells each joinable that a context begins (the join) or ends (null).
  virtual void set_join(Join* join) { (void)join; }
};

// A joinable made of two functions (a training loop's own collectives, e.g. its loss sums).
class CallbackJoinable : public Joinable {
 public:
  CallbackJoinable(std::function<void(const JoinRound&)> main, std::function<void(bool)> post = {})
      : main_(std::move(main)), post_(std::move(post)) {}
  void join_main_hook(const JoinRound& round) override {
    if (main_) main_(round);
  }
  void join_post_hook(bool is_last_joiner) override {
    if (post_) post_(is_last_joiner);
  }

 private:
  std::function<void(const JoinRound&)> main_;
  std::function<void(bool)> post_;
};

// The context: construct it before the loop over this rank's batches (every rank alike), call
// finish() after it. Destroying it without finish() (an exception left the loop) only detaches
// the joinables: no collective runs in a destructor.
class Join {
 public:
  Join(std::vector<Joinable*> joinables, std::shared_ptr<ProcessGroup> pg,
       JoinOptions options = {});
  ~Join();
  Join(const Join&) = delete;
  Join& operator=(const Join&) = delete;

  // By an active rank once per iteration, before the iteration's other collectives (DDP's
  // forward does it). Collective with the joined ranks' rounds.
  JoinRound notify(bool sync, int64_t synced);
  // This rank is out of data: shadow the others' iterations until all have joined, then run the
  // post hooks. Returns the number of rounds shadowed.
  int64_t finish();
  const JoinOptions& options() const { return options_; }
  ProcessGroup& process_group() { return *pg_; }

 private:
  JoinRound round(bool active, bool sync, int64_t synced);
  std::vector<Joinable*> joinables_;
  std::shared_ptr<ProcessGroup> pg_;
  JoinOptions options_;
  bool finished_ = false;
};

}  // namespace rg::dist
