// Work: the handle of an asynchronous collective or point-to-point operation. It completes once,
// with or without an error; wait() rethrows the error on the waiting thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "comm/store.h"

namespace rg::dist {

class Work {
 public:
  using Clock = std::chrono::steady_clock;

  Work(std::string op, uint64_t seq);
  virtual ~Work() = default;
  Work(const Work&) = delete;
  Work& operator=(const Work&) = delete;

  const std::string& op() const { return op_; }  // "all_reduce", "broadcast", ...
  uint64_t seq() const { return seq_; }          // the group's sequence number of this op

  bool is_completed() const;
  // Blocks until the operation finished and rethrows its error. With a timeout, throws
  // rg::Error when the operation has not finished in time (the operation itself goes on).
  virtual void wait(std::optional<Millis> timeout = std::nullopt);
  // The error it failed with, or null (also null while it is still running).
  std::exception_ptr exception() const;
  // Runs `fn` once the work has completed (at once, on this thread, if it already has; otherwise
  // on the thread that completes it, before wait() returns anywhere). Callbacks must not throw.
  void on_complete(std::function<void(const Work&)> fn);

  // When the backend started and finished executing it (for traces and benchmarks).
  Clock::time_point start_time() const;
  Clock::time_point end_time() const;

  // Backends: mark the start of execution, and completion (exactly once).
  void mark_started();
  void finish(std::exception_ptr error = nullptr);

 private:
  const std::string op_;
  const uint64_t seq_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  bool finishing_ = false;
  std::exception_ptr error_;
  Clock::time_point start_{}, end_{};
  std::vector<std::function<void(const Work&)>> callbacks_;
};

using WorkPtr = std::shared_ptr<Work>;

}  // namespace rg::dist
