// SimulatedLinkGroup: a timer thread completes simulated all-reduces at their computed times.
#include "comm/sim_link.h"

#include <atomic>
#include <cctype>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include "comm/process_group_nccl.h"
#include "kernels/error.h"
#include "kernels/link_model.h"

namespace rg::dist {

namespace {

// Nominal per-direction peak figures from the vendors' specifications (not measurements); the
// latency is a typical small-message all-reduce start-up cost of that kind of link.
struct Preset {
  const char* name;
  double gbps, latency_us;
  const char* source;
};
const Preset kPresets[] = {
    {"nvlink-h100", 450, 2,
     "H100 SXM NVLink 4: 900 GB/s per GPU both directions together (NVIDIA H100 datasheet)"},
    {"ib-ndr", 50, 5,
     "InfiniBand NDR: 400 Gb/s per port (NVIDIA ConnectX-7 datasheet), one NIC per GPU"},
    {"pcie4", 31.5, 5,
     "PCIe 4.0 x16: 16 GT/s per lane, 128b/130b coding (PCI Express Base Specification 4.0)"},
    {"ethernet-100g", 12.5, 15, "100 Gigabit Ethernet: 100 Gb/s per port (IEEE 802.3ba)"},
};

const char* const kSyntax =
    "must be GBPS,LATENCY_US (for example 1,50 or 450GBps,2us) or a preset (nvlink-h100, ib-ndr, "
    "pcie4, ethernet-100g)";

// A number with an optional unit suffix among `units` (case-insensitive); rg::Error naming spec.
double number_with_unit(const std::string& text, std::initializer_list<const char*> units,
                        const std::string& spec) {
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  std::string rest = text.substr(used);
  for (char& c : rest) c = char(std::tolower(static_cast<unsigned char>(c)));
  bool ok = used > 0 && rest.empty();
  for (const char* u : units) ok = ok || (used > 0 && rest == u);
  RG_CHECK(ok, "--sim-link '", spec, "' ", kSyntax);
  return v;
}

}  // namespace

SimLink parse_sim_link(const std::string& spec) {
  for (const Preset& p : kPresets)
    if (spec == p.name) return SimLink(p.gbps, p.latency_us, 0, p.name);
  const auto comma = spec.find(',');
  RG_CHECK(comma != std::string::npos, "--sim-link '", spec, "' ", kSyntax);
  SimLink l;
  l.gbps = number_with_unit(spec.substr(0, comma), {"gbps", "gb/s"}, spec);
  l.latency_us = number_with_unit(spec.substr(comma + 1), {"us"}, spec);
  RG_CHECK(l.gbps > 0 && l.latency_us >= 0, "--sim-link '", spec,
           "': bandwidth must be positive and latency non-negative");
  return l;
}

std::string sim_link_presets_help() {
  std::string s;
  for (const Preset& p : kPresets) {
    s += rg::detail::cat("  ", p.name, ": ", p.gbps, " GB/s, ", p.latency_us, " us (", p.source,
                         ")\n");
  }
  return s;
}

double SimLink::allreduce_us(double bytes, int n) const {
  return ring_link_allreduce_us(bytes, n, gbps, latency_us);
}

std::string SimLink::describe() const {
  return rg::detail::cat(gbps, " GB/s + ", latency_us, " us per all-reduce",
                         name.empty() ? "" : " (" + name + ")");
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
  std::atomic<bool> free{false};  // see set_free
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
  const int n = impl_->link.ranks > 0 ? impl_->link.ranks : size();
  const double us = impl_->link.allreduce_us(double(tensor.nbytes()), n);
  if (impl_->free) {
    std::unique_lock lock(impl_->mu);
    auto work = std::make_shared<Work>("all_reduce", ++impl_->seq);
    lock.unlock();
    work->mark_started();
    work->finish();
    return work;
  }
  if (tensor.device().is_cuda()) {
    auto* nccl = dynamic_cast<ProcessGroupNCCL*>(&real_->backend_group());
    RG_CHECK(nccl != nullptr, "simulated link: an all-reduce of a ", tensor.device().str(),
             " tensor needs an NCCL group underneath (init_process_group with backend nccl), "
             "got ", real_->backend());
    return nccl->modelled_all_reduce(tensor, us);
  }
  const auto duration = std::chrono::duration_cast<Impl::Clock::duration>(
      std::chrono::duration<double, std::micro>(us));
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

void SimulatedLinkGroup::set_free(bool free) { impl_->free = free; }

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
