// Reading device values without stalling the host. A CUDA training step that reads anything
// back (a flag an op's kernel set, the loss to log) waits there until the device has caught up, so
// the host can no longer queue the next kernels while the GPU runs the current ones. Instead:
//   - AsyncScalar copies one value into pinned host memory on the current stream and records an
//     event: ready() asks without blocking, get() waits only when it must.
//   - DeferredChecks: inside such a scope, ops whose kernels find bad input on the device (a
//     class target out of range in cross_entropy/nll_loss, an embedding index) post their flag
//     here instead of reading it at once; poll() raises the first failed check whose flag has
//     arrived (never waiting), flush() waits for all of them. The error is the op's own message,
//     followed by the scope's context ("(training step 12 of epoch 1)"). Outside a scope, and on
//     the CPU, ops check at once, as before. Checks posted while a CUDA graph captures
//     (engine/cuda/graph.h) are kept apart (take_captured): their flags are the graph's outputs,
//     set again by each replay, and whoever replays it posts them again after each replay. PyTorch's CUDA ops report such input through an
//     asynchronous device-side assert that ends the process; here it stays a catchable rg::Error.
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
  // Starts reading the one-element tensor `value` (any dtype; CPU tensors are read at once).
  explicit AsyncScalar(const Tensor& value);
  AsyncScalar(AsyncScalar&&) noexcept;
  AsyncScalar& operator=(AsyncScalar&&) noexcept;
  ~AsyncScalar();

  bool defined() const { return host_.defined(); }
  bool ready() const;  // the value has arrived (never blocks)
  double get() const;  // the value; waits for it when not ready() (a host stall)

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
  // For ops: the check failed when `flag` (one integer on a CUDA device) holds a value below
  // `limit`; describe(value) is the op's error message then (it may read more from the device).
  void post(const Tensor& flag, int64_t limit, std::function<std::string(int64_t)> describe);
  // A check posted during a CUDA graph capture, to post again after each replay.
  struct Captured {
    Tensor flag;
    int64_t limit;
    std::function<std::string(int64_t)> describe;
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
    std::function<std::string(int64_t)> describe;
    std::string context;
  };
  void check(Pending& p);
  std::deque<Pending> pending_;
  std::vector<Captured> captured_;
  std::string context_;
};

}  // namespace rg
