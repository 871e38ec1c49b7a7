// Reducer: the engine of DistributedDataParallel, following PyTorch's c10d Reducer. Gradients are
// copied (scaled by 1/world_size) into flat per-dtype buckets as autograd produces them; a full
// bucket is all-reduced at once, strictly in bucket order, while backward goes on; a final
// autograd callback waits for every bucket and writes the averages back into .grad. A parameter
// without a gradient or marked ready twice, on any rank, ends in one error naming it per rank on
// every rank (see Reducer::State::finalize for how that avoids a hang).
#pragma once

#include <chrono>
#include <cstdint>
#include <iosfwd>
#include <memory>
#include <string>
#include <vector>

#include "comm/powersgd.h"
#include "comm/process_group.h"
#include "engine/tensor.h"

namespace rg::cuda {
class Event;
}

namespace rg::dist {

// How DDP sends a bucket, as PyTorch's built-in comm hooks: plain all-reduce, compressed to
// f16/bf16 for the all-reduce, or PowerSGD's low-rank factors.
enum class CommHook { allreduce, fp16, bf16, powersgd };
const char* comm_hook_name(CommHook hook);
// "allreduce", "fp16", "bf16" or "powersgd"; anything else is an rg::Error naming the choices.
CommHook parse_comm_hook(const std::string& name);

struct DdpOptions {
  double bucket_cap_mb = 25.0;
  double first_bucket_mb = 1.0;
  bool broadcast_buffers = true;
  bool find_unused_parameters = false;
  bool gradient_as_bucket_view = false;
  bool overlap = true;  // false: every bucket is all-reduced after backward (for comparison)
  // As PyTorch's static_graph=True: the set of used parameters, and how often each one's
  // gradient hook fires in a backward, are the same every iteration. The first iteration records
  // them (its buckets are all-reduced after backward); later ones mark the recorded unused
  // parameters ready at once (no graph traversal, even with find_unused_parameters) and reduce a
  // parameter after its last hook firing, so reentrant activation checkpointing (a hook firing
  // twice in one backward) works. The buckets are rebuilt once, with unused parameters too.
  bool static_graph = false;
  CommHook comm_hook = CommHook::allreduce;
  PowerSgdOptions powersgd;  // with CommHook::powersgd
  // Where rank 0 writes DDP's reports (the unused-parameter summary at INFO, the warning that
  // find_unused_parameters found nothing to do); null: nowhere. Errors are thrown, not logged.
  std::ostream* log = default_log();
  static std::ostream* default_log();  // std::cerr
};

// What happened to each bucket in the last synchronized backward (steady-clock times).
struct BucketTimeline {
  using Time = std::chrono::steady_clock::time_point;
  Time ready{};       // its last gradient arrived
  Time issued{};      // all-reduce handed to the process group
  Time comm_start{};  // the process group started it
  Time comm_end{};    // and finished it
};

struct IterationTimeline {
  using Time = std::chrono::steady_clock::time_point;
  Time backward_start{};  // first gradient hook
  Time wait_start{};      // final callback began waiting (before launching any bucket itself)
  Time wait_end{};
  // CUDA: timing events on the current stream at those two points, so elapsed_ms between them
  // (once reached) is how long the device's compute stream waited for communication (on the
  // host the wait only queues stream waits); null on the CPU.
  std::shared_ptr<cuda::Event> device_wait_start, device_wait_end;
  std::vector<BucketTimeline> buckets;
  std::vector<int> launch_order;  // bucket indices in the order they were issued
  // The iteration was a CUDA graph replay (cuda::Graph, --cuda-graphs): one launch, nothing timed
  // apart; the times are empty, `buckets` and `launch_order` too, and the device events keep an
  // earlier eager iteration's marks.
  bool replayed = false;
};

// The parameters are on one device, the one `pg` reduces (tensor_device()); a clear rg::Error
// otherwise.
void check_module_device(const std::vector<std::pair<std::string, Tensor>>& params,
                         const ProcessGroup& pg);

class Reducer {
 public:
  using NamedParams = std::vector<std::pair<std::string, Tensor>>;

  Reducer(NamedParams params, std::shared_ptr<ProcessGroup> pg, DdpOptions options);
  ~Reducer();
  Reducer(const Reducer&) = delete;
  Reducer& operator=(const Reducer&) = delete;

  // Called by every forward before anything else: when the previous synchronized forward's
  // backward never finished reduction (no parameter got a gradient on this rank, or backward
  // never ran), sends that iteration's buckets anyway so the other ranks' collectives complete,
  // and throws the named error that every rank then throws too. A no-op otherwise.
  void finish_abandoned_iteration();

  // Called after each forward that will be followed by a synchronized backward: arms the hooks,
  // rebuilds the buckets once after the first iteration, and with find_unused_parameters marks
  // the parameters the outputs do not depend on as ready.
  void prepare_for_backward(const std::vector<Tensor>& outputs);

  // Parameter names per bucket, in bucket order.
  std::vector<std::vector<std::string>> bucket_names() const;
  std::vector<size_t> bucket_bytes() const;
  int rebuild_count() const;
  // The parameter order the one-time rebuild built the buckets from (rank 0's first-iteration
  // order, the same on every rank); after one iteration but before the rebuild, the order it will
  // use on this rank (rank 0's is the one it broadcasts); empty before any iteration and with
  // find_unused_parameters (no rebuild). A snapshot keeps it: a resumed run restores
  // it, so its buckets, and with them the order in which each all-reduce sums, equal the
  // uninterrupted run's from its first step on.
  std::vector<int64_t> rebuilt_order() const;
  // Builds the buckets from `order` (a permutation of the parameter indices, as rebuilt_order
  // gave) as the rebuild would have, and marks the rebuild done. Every rank must call it alike.
  void restore_rebuilt_order(const std::vector<int64_t>& order);
  const IterationTimeline& last_timeline() const;

  // Uneven inputs without Join: this rank's next synchronized backward is its last in this pass
  // over its data. The ranks compare it in the status element of that backward's last bucket (no
  // extra collective), which every rank reads one synchronized iteration late, at the same point
  // (the copy to the host then never stalls it): when some ranks ended and others did not, every
  // rank throws an error naming them and the iteration, in the next synchronized backward (the
  // ranks still training) or in end_of_data() (the others). Missing or doubled gradients are
  // reported the same way, one iteration late, as PyTorch reports them at the next forward.
  void announce_last_iteration();
  // After this rank's loop over its data (DistributedDataParallel::end_of_data, in a loop):
  // reads the pending status; true when it says every rank's data ended (announced), with no
  // findings. Otherwise the buffer broadcast and then end_of_data(), which runs the buckets of
  // one iteration with zeros, flagged "out of data", writing nothing back: ranks still training
  // get them in their backward, and its finalize (like theirs) raises the named error when the
  // pending status says so.
  bool consume_all_ended();
  void end_of_data();
  // Reads the pending status now (waiting for its copy) and raises what it reports, on every rank
  // alike: all ranks call it at the same point (the end of a Join, DistributedDataParallel's
  // join_post_hook), so a finding of the last iteration is not carried past it.
  void check_pending_status();
  // Join (comm/join.h): the divisor of the gradient sums from now on (the world size when not
  // joined), whether a Join context is active (no end-of-data check then), and one iteration
  // shadowed with zero gradients by a joined rank, `synced` being the active ranks' count of
  // synchronized iterations (so the one-time rebuild happens on the same iteration everywhere).
  void set_divisor(int divisor);
  void set_join_active(bool active);
  void shadow_iteration(int64_t synced);
  const DdpOptions& options() const;
  // Synchronized backwards so far. PowerSGD starts when it reaches start_iter, so a resumed run
  // restores the count (after restore_rebuilt_order: with a count >= 1 the rebuild is not
  // redone from this process's first iteration).
  int64_t synced_iterations() const;
  void restore_synced_iterations(int64_t n);
  // CUDA graphs (train::GraphStep): a synchronized iteration (DDP's forward, backward and the
  // final callback) can be captured on the CUDA device, its collectives with it; each replay then
  // is one synchronized iteration, whose status (missing or doubled gradients, uneven ends) is
  // read one iteration late as an eager one's, by hooks of the graph (cuda::Graph::on_replay and
  // after_replay). Why this reducer can never be captured ("" when it can): on the CPU, with the
  // powersgd hook, under Join, or find_unused_parameters without static_graph.
  std::string not_capturable() const;
  // Whether the next iteration may be captured: after the one-time rebuild and static_graph's
  // first iteration; it then reads the pending status (waiting for it, once), which a capture
  // could not. An rg::Error when not_capturable() says why not at all.
  bool ready_to_capture();
  // Changes whenever the buckets are built anew (a capture holds their memory).
  uint64_t buckets_version() const;
  // PowerSGD's state (comm/powersgd.h), empty without the powersgd hook or before it started;
  // every error is defined (zeros where a restored one was not). Restoring checks each entry
  // against the current buckets (an f32 bucket of that index and size) and is done after the
  // buckets have their final layout (restore_rebuilt_order, or a Reducer that never rebuilds);
  // it is an error without the powersgd hook when `state` is not empty.
  PowerSgd::State powersgd_state() const;
  void restore_powersgd_state(PowerSgd::State state);

 private:
  struct State;
  std::shared_ptr<State> state_;
};

}  // namespace rg::dist
