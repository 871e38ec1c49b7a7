// SimulatedLinkGroup: a timer thread completes simulated all-reduces at their computed times.
#include "comm/sim_link.h"

#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include "kernels/error.h"

namespace rg::dist {

SimLink parse_sim_link(const std::string& spec) {
  const auto comma = spec.find(',');
  SimLink l;
  try {
    RG_CHECK(comma != std::string::npos, "");
    size_t used = 0;
    l.gbps = std::stod(spec.substr(0, comma), &used);
    RG_CHECK(used == comma, "");
    const std::string lat = spec.substr(comma + 1);
    l.latency_us = std::stod(lat, &used);
    RG_CHECK(used == lat.size(), "");
  } catch (const std::exception&) {
    RG_FAIL("--sim-link '", spec, "' must be GBPS,LATENCY_US (for example 1,50)");
  }
  RG_CHECK(l.gbps > 0 && l.latency_us >= 0, "--sim-link '", spec,
           "': bandwidth must be positive and latency non-negative");
  return l;
}

struct SimulatedLinkGroup::Impl {
  using Clock = std::chrono::steady_clock;
  struct Pending {
    WorkPtr work;
    Clock::time_point done_at;
  };
  SimLink link;
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Pending> queue;  // completion times only grow: the link is sequential
  Clock::time_point link_free{};
  uint64_t seq = 0;
  bool stop = false;
  std::thread timer;

  void loop() {
    std::unique_lock lock(mu);
    for (;;) {
      cv.wait(lock, [&] { return stop || !queue.empty(); });
      if (queue.empty()) return;
      const Clock::time_point t = queue.front().done_at;
      if (cv.wait_until(lock, t, [&] { return stop; })) continue;  // drains at once on stop
      Pending p = std::move(queue.front());
      queue.pop_front();
      lock.unlock();
      p.work->finish();
      lock.lock();
    }
  }
};

SimulatedLinkGroup::SimulatedLinkGroup(std::shared_ptr<ProcessGroup> real, SimLink link)
    : ProcessGroup(real->rank(), real->size(), real->options()),
      real_(std::move(real)),
      impl_(std::make_unique<Impl>()) {
  impl_->link = link;
  impl_->timer = std::thread([this] { impl_->loop(); });
}

SimulatedLinkGroup::~SimulatedLinkGroup() {
  {
    std::lock_guard lock(impl_->mu);
    impl_->stop = true;
  }
  impl_->cv.notify_all();
  impl_->timer.join();
}

WorkPtr SimulatedLinkGroup::all_reduce(const Tensor& tensor, ReduceOp) {
  check_tensor(tensor, "all_reduce", "input");
  const int n = size();
  const double bus_bytes = double(tensor.nbytes()) * (n > 1 ? 2.0 * (n - 1) / n : 0.0);
  const auto duration =
      std::chrono::duration_cast<Impl::Clock::duration>(std::chrono::duration<double, std::micro>(
          impl_->link.latency_us + bus_bytes / (impl_->link.gbps * 1e3)));
  std::lock_guard lock(impl_->mu);
  auto work = std::make_shared<Work>("all_reduce", ++impl_->seq);
  const auto now = Impl::Clock::now();
  const auto start = std::max(now, impl_->link_free);
  impl_->link_free = start + duration;
  work->mark_started();
  impl_->queue.push_back({work, impl_->link_free});
  impl_->cv.notify_all();
  return work;
}

WorkPtr SimulatedLinkGroup::broadcast(const Tensor& t, int root) {
  return real_->broadcast(t, root);
}
WorkPtr SimulatedLinkGroup::all_gather(const Tensor& o, const Tensor& i) {
  return real_->all_gather(o, i);
}
WorkPtr SimulatedLinkGroup::reduce_scatter(const Tensor& o, const Tensor& i, ReduceOp op) {
  return real_->reduce_scatter(o, i, op);
}
WorkPtr SimulatedLinkGroup::barrier() { return real_->barrier(); }
WorkPtr SimulatedLinkGroup::send(const Tensor& t, int dst, uint32_t tag) {
  return real_->send(t, dst, tag);
}
WorkPtr SimulatedLinkGroup::recv(const Tensor& t, int src, uint32_t tag) {
  return real_->recv(t, src, tag);
}

}  // namespace rg::dist
