#include "engine/device_checks.h"

#include <utility>

#include "engine/cuda/event.h"
#include "engine/cuda/graph.h"
#include "engine/cuda/stream.h"
#include "kernels/error.h"

namespace rg {

AsyncScalar::AsyncScalar(const Tensor& value) {
  RG_CHECK(value.defined() && value.numel() >= 1 && value.numel() <= kMaxValues,
           "AsyncScalar: expected a tensor of 1 to ", kMaxValues, " elements");
  if (value.device().is_cpu()) {
    host_ = value.detach().clone();
    return;
  }
  host_ = Tensor::empty_pinned(value.shape(), value.dtype());
  host_.copy_(value.detach(), /*non_blocking=*/true);
  done_ = std::make_unique<cuda::Event>();
  done_->record(cuda::current_stream(value.device().index));
}

AsyncScalar::AsyncScalar(AsyncScalar&&) noexcept = default;
AsyncScalar& AsyncScalar::operator=(AsyncScalar&&) noexcept = default;
AsyncScalar::~AsyncScalar() = default;

bool AsyncScalar::ready() const { return !done_ || done_->query(); }

double AsyncScalar::get(int64_t i) const {
  RG_CHECK(defined(), "AsyncScalar::get: nothing was read");
  RG_CHECK(i >= 0 && i < host_.numel(), "AsyncScalar::get: element ", i, " of ", host_.numel());
  if (!ready()) done_->synchronize();
  return host_.numel() == 1 ? host_.item() : host_.flat_narrow(i, 1).item();
}

int64_t AsyncScalar::get_i64(int64_t i) const {
  RG_CHECK(defined() && host_.dtype() == DType::i64, "AsyncScalar::get_i64: not an i64 value");
  RG_CHECK(i >= 0 && i < host_.numel(), "AsyncScalar::get_i64: element ", i, " of ", host_.numel());
  if (!ready()) done_->synchronize();
  return host_.data<int64_t>()[i];
}

namespace {
thread_local DeferredChecks* t_current = nullptr;
}

DeferredChecks::DeferredChecks() {
  RG_CHECK(t_current == nullptr, "DeferredChecks: a scope is already open on this thread");
  t_current = this;
}

DeferredChecks::~DeferredChecks() { t_current = nullptr; }

DeferredChecks* DeferredChecks::current() { return t_current; }

void DeferredChecks::post(const Tensor& flag, int64_t limit, Describe describe) {
  RG_CHECK(flag.defined() && flag.dtype() == DType::i64 && (flag.numel() == 1 || flag.numel() == 2),
           "DeferredChecks::post: the flag must be one or two i64 values");
  if (flag.device().is_cuda() && cuda::Graph::capturing(flag.device().index) != nullptr) {
    // Reading it back now would be captured, and its event could not be queried.
    captured_.push_back({flag, limit, std::move(describe)});
    return;
  }
  pending_.push_back({AsyncScalar(flag), limit, std::move(describe), context_});
}

void DeferredChecks::check(Pending& p) {
  const int64_t first = p.flag.get_i64();
  if (first >= p.limit) return;
  std::string message = p.describe(first, p.flag.size() > 1 ? p.flag.get_i64(1) : 0);
  if (!p.context.empty()) message += " (" + p.context + ")";
  pending_.clear();  // one error is enough; the later checks belong to work now abandoned
  RG_FAIL(message);
}

void DeferredChecks::poll() {
  while (!pending_.empty() && pending_.front().flag.ready()) {
    Pending p = std::move(pending_.front());
    pending_.pop_front();
    check(p);
  }
}

void DeferredChecks::flush() {
  while (!pending_.empty()) {
    Pending p = std::move(pending_.front());
    pending_.pop_front();
    check(p);
  }
}

}  // namespace rg
