// Reading device values without stalling the host. A CUDA training step that reads anything
// back (a flag an op's kernel set, the loss to log) waits there until the device has caught up, so
// the host can no longer queue the next kernels while the GPU runs the current ones. Instead:
//   - AsyncScalar copies one value (or a few read together: a flag and its detail) into pinned
//     host memory on the current stream and records an event: ready() asks without blocking, get()
//     waits only when it must.
//   - DeferredChecks: inside such a scope, ops whose kernels find bad input on the device (a
//     class target out of range in cross_entropy/nll_loss, an embedding index) post their flag
//     here instead of reading it at once; poll() raises the first failed check whose flag has
//     arrived (never waiting), flush() waits for all of them. The error is the op's own message,
//     followed by the scope's context ("(training step 12 of epoch 1)"). Outside a scope, and on
//     the CPU, ops check at once, as before. Checks posted while a CUDA graph captures
//     (engine/cuda/graph.h) are kept apart (take_captured): their flags are the graph's outputs,
//     set again by each replay, and whoever replays it posts them again after each replay.
//     PyTorch's CUDA ops report such input through an asynchronous device-side assert that ends the
//     process; here it stays a catchable rg::Error.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/tensor.h"

namespace rg {

namespace cuda {
class Event;
}

class AsyncScalar {
 public:
  AsyncScalar() = default;
  // Starts reading `value`: a tensor of 1 to kMaxValues elements, any dtype (CPU tensors are read
  // at once).
  static constexpr int64_t kMaxValues = 8;
  explicit AsyncScalar(const Tensor& value);
  AsyncScalar(AsyncScalar&&) noexcept;
  AsyncScalar& operator=(AsyncScalar&&) noexcept;
  ~AsyncScalar();

  bool defined() const { return host_.defined(); }
  int64_t size() const { return host_.numel(); }  // elements read
  bool ready() const;                             // the value has arrived (never blocks)
  // Element i of the value (flat index); waits for it when not ready() (a host stall).
  double get(int64_t i = 0) const;
  // The same, exactly, for an i64 value (a double holds integers exactly only up to 2^53).
  int64_t get_i64(int64_t i = 0) const;

 private:
  Tensor host_;                        // pinned for a CUDA value
  std::unique_ptr<cuda::Event> done_;  // recorded after the copy (CUDA only)
};

class DeferredChecks {
 public:
  // Opens the scope on the calling thread (scopes do not nest: opening a second is an error).
  DeferredChecks();
  // Closes it; checks still pending are dropped (flush() first to have them raised).
  ~DeferredChecks();
  DeferredChecks(const DeferredChecks&) = delete;
  DeferredChecks& operator=(const DeferredChecks&) = delete;

  // The scope open on this thread, or null.
  static DeferredChecks* current();

  // Appended to the errors of checks posted from now on, e.g. "training step 12 of epoch 1".
  void set_context(std::string context) { context_ = std::move(context); }
  // For ops: the check failed when `flag` (i64 on a CUDA device: {first, detail}, or {first})
  // has a first value below `limit`; describe(first, detail) is the op's error message then
  // (detail is 0 for a one-element flag). The kernel writes the detail (the bad value) beside the
  // first bad position, so the message quotes what that step saw even when the input buffer has
  // been overwritten since (a CUDA graph's static input holds the next batch by then).
  using Describe = std::function<std::string(int64_t first, int64_t detail)>;
  void post(const Tensor& flag, int64_t limit, Describe describe);
  // A check posted during a CUDA graph capture, to post again after each replay.
  struct Captured {
    Tensor flag;
    int64_t limit;
    Describe describe;
  };
  // The checks posted during captures since the last call.
  std::vector<Captured> take_captured() { return std::exchange(captured_, {}); }
  void post(const Captured& c) { post(c.flag, c.limit, c.describe); }
  // Raises (rg::Error) the first failed check among those whose flags have arrived, in posting
  // order; never blocks. Checks that passed are dropped.
  void poll();
  // Waits for every pending flag, then raises the first failed check, if any.
  void flush();
  size_t pending() const { return pending_.size(); }

 private:
  struct Pending {
    AsyncScalar flag;
    int64_t limit;
    Describe describe;
    std::string context;
  };
  void check(Pending& p);
  std::deque<Pending> pending_;
  std::vector<Captured> captured_;
  std::string context_;
};

}  // namespace rg
