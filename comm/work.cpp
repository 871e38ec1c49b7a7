// Work's completion state, waits and callbacks.
#include "comm/work.h"

#include "kernels/error.h"

namespace rg::dist {

Work::Work(std::string op, uint64_t seq) : op_(std::move(op)), seq_(seq) {}

bool Work::is_completed() const {
  std::lock_guard lock(mu_);
  return done_;
}

void Work::wait(std::optional<Millis> timeout) {
  std::unique_lock lock(mu_);
  if (timeout) {
    RG_CHECK(cv_.wait_for(lock, *timeout, [&] { return done_; }), op_, " #", seq_,
             " did not complete within ", timeout->count(), " ms");
  } else {
    cv_.wait(lock, [&] { return done_; });
  }
  if (error_) std::rethrow_exception(error_);
}

std::exception_ptr Work::exception() const {
  std::lock_guard lock(mu_);
  return error_;
}

void Work::on_complete(std::function<void(const Work&)> fn) {
  {
    std::lock_guard lock(mu_);
    if (!done_) {
      callbacks_.push_back(std::move(fn));
      return;
    }
  }
  fn(*this);  // already complete: run here
}

Work::Clock::time_point Work::start_time() const {
  std::lock_guard lock(mu_);
  return start_;
}

Work::Clock::time_point Work::end_time() const {
  std::lock_guard lock(mu_);
  return end_;
}

void Work::mark_started() {
  std::lock_guard lock(mu_);
  start_ = Clock::now();
}

void Work::finish(std::exception_ptr error) {
  std::unique_lock lock(mu_);
  RG_CHECK(!done_ && !finishing_, op_, " #", seq_, " finished twice");
  finishing_ = true;
  error_ = std::move(error);
  end_ = Clock::now();
  if (start_ == Clock::time_point{}) start_ = end_;
  // Callbacks run before waiters wake, so wait() returning means they have all run; a callback
  // registered meanwhile is run in the next round.
  while (!callbacks_.empty()) {
    std::vector<std::function<void(const Work&)>> callbacks;
    callbacks.swap(callbacks_);
    lock.unlock();
    for (auto& cb : callbacks) cb(*this);
    lock.lock();
  }
  done_ = true;
  lock.unlock();
  cv_.notify_all();
}

}  // namespace rg::dist
