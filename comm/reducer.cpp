// The Reducer: buckets, the per-parameter gradient hooks, in-order launches, the final callback
// and the one-time rebuild. Hooks and the callback run on the thread running backward; the
// all-reduces run on the process group's worker thread, which is where the overlap comes from.
#include "comm/reducer.h"

#include <algorithm>
#include <iostream>
#include <optional>
#include <unordered_set>

#include "comm/bucket_assignment.h"
#include "comm/debug_level.h"
#include "engine/autograd/engine.h"
#include "engine/autograd/grad_mode.h"
#include "engine/autograd/node.h"
#include "engine/cuda/event.h"
#include "engine/cuda/graph.h"
#include "engine/cuda/memory.h"
#include "engine/cuda/stream.h"
#include "engine/device_checks.h"
#include "engine/ops/binary.h"
#include "engine/ops/factory.h"
#include "engine/trace.h"
#include "kernels/error.h"

namespace rg::dist {
namespace {

using Clock = std::chrono::steady_clock;

bool aliases(const Tensor& a, const Tensor& b) {
  return a.defined() && b.defined() && a.storage() == b.storage() &&
         a.storage_offset() == b.storage_offset() && a.numel() == b.numel();
}

// What a rank found wrong with a parameter in one backward (exchanged between ranks as i64).
enum Finding : int64_t { kFine = 0, kNoGradient = 1, kMarkedTwice = 2 };
// Where a rank's data stood in a synchronized iteration (uneven inputs without Join): more to
// come, its announced last batch, or no batch at all (end_of_data's shadow iteration).
enum DataEnd : int64_t { kHasMore = 0, kLastBatch = 1, kNoBatch = 2 };
// The last bucket's extra elements: [ranks with findings, ranks whose data ends here].
constexpr int64_t kStatusElements = 2;

// "a, b, c" for at most 20 names, then how many there were.
std::string name_list(const std::vector<std::string>& names) {
  std::string out;
  for (size_t i = 0; i < names.size() && i < 20; ++i) out += (i ? ", " : "") + names[i];
  if (names.size() > 20) out += detail::cat(", ... (", names.size(), " in all)");
  return out;
}

// Ranks grouped by what each reports, the groups with something to say (not `fine`) first, each
// part in order of its groups' first ranks: "rank 1: x; ranks 0, 2: fine". Every rank builds the
// same text from the same gathered table.
std::string by_rank(const std::vector<std::string>& per_rank, const std::string& fine) {
  std::vector<std::pair<std::string, std::vector<int>>> groups;
  for (int r = 0; r < int(per_rank.size()); ++r) {
    auto it = std::find_if(groups.begin(), groups.end(),
                           [&](const auto& g) { return g.first == per_rank[size_t(r)]; });
    if (it == groups.end()) it = groups.insert(groups.end(), {per_rank[size_t(r)], {}});
    it->second.push_back(r);
  }
  std::stable_partition(groups.begin(), groups.end(),
                        [&](const auto& g) { return g.first != fine; });
  std::string out;
  for (const auto& [text, ranks] : groups) {
    out += out.empty() ? "" : "; ";
    out += ranks.size() == 1 ? "rank " : "ranks ";
    for (size_t i = 0; i < ranks.size(); ++i) out += (i ? ", " : "") + std::to_string(ranks[i]);
    out += ": " + text;
  }
  return out;
}

}  // namespace

struct Reducer::State : std::enable_shared_from_this<Reducer::State> {
  struct Bucket {
    DType dtype = DType::f32;
    Tensor flat;                 // the gradients of its parameters, back to back
    std::vector<size_t> params;  // parameter indices, in bucket order
    std::vector<Tensor> views;   // per position: a view of flat shaped like the parameter
    size_t bytes = 0;
    size_t pending = 0;     // gradients still missing this iteration
    Tensor comm;            // what is all-reduced: flat, or its compressed copy
    bool powersgd = false;  // this iteration went through PowerSGD's first phase
    WorkPtr work;
  };

  NamedParams params;
  std::shared_ptr<ProcessGroup> pg;
  DdpOptions opt;
  std::vector<Bucket> buckets;
  std::vector<size_t> bucket_of, pos_in_bucket;
  std::vector<char> ready, locally_used;
  std::vector<size_t> ready_order;  // this iteration's hook order
  std::vector<size_t> first_iteration_order;
  size_t next_launch = 0;
  bool armed = false, callback_queued = false;
  int rebuilds = 0;
  int64_t synced = 0;
  std::vector<size_t> rebuilt_order;  // what the rebuild used
  std::unique_ptr<PowerSgd> powersgd;
  IterationTimeline timeline;
  // This rank's findings (Finding per parameter) not yet reported to the group, and the
  // iteration (1-based) they were made in; see finalize().
  std::vector<int64_t> findings;
  bool has_findings = false;
  int64_t findings_iteration = 0;
  // Uneven inputs: this iteration's DataEnd for this rank.
  DataEnd data_end = kHasMore;
  // A synchronized iteration's summed status elements on their way to the host (a copy into
  // pinned memory: no stall), read at the next synchronized finalize, where every rank is at the
  // same point of the collective sequence, or by end_of_data; with this rank's DataEnd and the
  // iteration (1-based) they belong to.
  struct PendingStatus {
    AsyncScalar findings, ended;
    int64_t iteration = 0;
    DataEnd data_end = kHasMore;
    bool join_active = false;  // under Join the ends are not compared (joined ranks shadow)
  };
  std::optional<PendingStatus> pending_status;
  bool join_active = false;
  int divisor = 1;      // the gradient sums are divided by it (world size, or Join's active ranks)
  bool shadow = false;  // this iteration is a joined or out-of-data rank's, with zero gradients
  // static_graph: hook firings per parameter in this backward, and (once recorded by this rank's
  // first real synchronized iteration) the expected count; static_used is the first
  // iteration's used flags over all ranks. delay: the buckets go out in finalize (the first
  // iteration, when no count is known yet).
  std::vector<int> hook_count, expected_hooks;
  std::vector<int64_t> last_firing;
  int64_t firings = 0;
  bool static_recorded = false, delay = false;
  std::vector<char> static_used;
  // CUDA graphs (Reducer::ready_to_capture): the buckets' version (builds so far; a capture holds
  // their addresses), and in a capture, the replay slots the last bucket's status elements are
  // copied from, which a hook sets before each replay (the host values of that iteration).
  uint64_t builds = 0;
  Tensor status_source;
  uint64_t status_graph = 0;  // the cuda::Graph::id its slots belong to

  // The CUDA graph capturing this reducer's work now, or null.
  cuda::Graph* capturing_graph() const {
    const Device d = pg->tensor_device();
    return d.is_cuda() ? cuda::Graph::capturing(d.index) : nullptr;
  }

  size_t param_bytes(size_t i) const {
    return size_t(params[i].second.numel()) * element_size(params[i].second.dtype());
  }

  void build(const std::vector<std::vector<size_t>>& assignment) {
    NoGradGuard no_grad;
    // Backward may have run on another stream than the one that made the buckets (GraphStep's):
    // their memory is reused only after the current stream's work so far.
    for (const Bucket& b : buckets)
      if (b.flat.device().is_cuda())
        cuda::record_stream(b.flat, cuda::current_stream(b.flat.device().index));
    buckets.clear();
    bucket_of.assign(params.size(), 0);
    pos_in_bucket.assign(params.size(), 0);
    for (const auto& list : assignment) {
      Bucket b;
      b.dtype = params[list.front()].second.dtype();
      int64_t total = 0;
      for (size_t p : list) total += params[p].second.numel();
      if (&list == &assignment.back()) total += kStatusElements;  // see finalize()
      b.flat = zeros({total}, b.dtype, params[list.front()].second.device());
      int64_t offset = 0;
      for (size_t p : list) {
        const Tensor& t = params[p].second;
        RG_CHECK(t.dtype() == b.dtype, "DDP: bucket mixes dtypes");
        bucket_of[p] = buckets.size();
        pos_in_bucket[p] = b.params.size();
        b.params.push_back(p);
        // In the parameter's memory format: a gradient moves in and out by plain copies, and a
        // gradient that is the bucket's memory lies as its parameter does (the optimizer reads
        // them together, element by element).
        Tensor view = b.flat.flat_narrow(offset, t.numel()).view(t.shape());
        if (t.memory_format() != MemoryFormat::contiguous) {
          view = view.reinterpret_memory_format(t.memory_format());
        }
        b.views.push_back(view);
        offset += t.numel();
        b.bytes += param_bytes(p);
        // With gradient_as_bucket_view an existing gradient moves into the bucket, so .grad is
        // the bucket's memory from now on.
        if (opt.gradient_as_bucket_view && t.grad().defined()) {
          b.views.back().copy_(t.grad());
          t.set_grad(b.views.back());
        }
      }
      buckets.push_back(std::move(b));
    }
    ++builds;
  }

  std::vector<std::vector<size_t>> assignment_for(const std::vector<size_t>& order) const {
    BucketAssignmentInput in;
    in.order = order;
    for (size_t i = 0; i < params.size(); ++i) {
      in.bytes.push_back(param_bytes(i));
      in.key.push_back(int(params[i].second.dtype()));
    }
    in.first_cap_bytes = size_t(opt.first_bucket_mb * 1024 * 1024);
    in.cap_bytes = std::max<size_t>(1, size_t(opt.bucket_cap_mb * 1024 * 1024));
    return assign_buckets(in);
  }

  // The last bucket's extra elements, summed with the gradients: a rank's 1 when it has findings
  // to report, else 0; and 1 when its data ends in this iteration, else 0.
  Tensor status_slot() const {
    const Tensor& flat = buckets.back().flat;
    return flat.flat_narrow(flat.numel() - kStatusElements, kStatusElements);
  }

  void note(size_t i, Finding f) {
    if (!has_findings) {
      findings.assign(params.size(), kFine);
      findings_iteration = synced + 1;
      has_findings = true;
    }
    findings[i] = f;
  }

  // The first iteration's ready order, then the parameters that were not ready (reverse order).
  std::vector<size_t> completed_first_order() const {
    std::vector<size_t> order = first_iteration_order;
    std::vector<char> seen(params.size(), 0);
    for (size_t p : order) seen[p] = 1;
    for (size_t i = params.size(); i-- > 0;)
      if (!seen[i]) order.push_back(i);
    return order;
  }

  // Rebuild once, from the first iteration's order; PyTorch skips it with
  // find_unused_parameters because the set of used parameters may change between iterations.
  // static_graph rebuilds with unused parameters too: they are the same in every iteration.
  bool rebuilds_buckets() const { return !opt.find_unused_parameters || opt.static_graph; }
  bool rebuild_due() const { return rebuilds == 0 && synced >= 1 && rebuilds_buckets(); }

  // Rank 0's observed ready order, broadcast so that every rank builds the same buckets.
  void rebuild() {
    std::vector<size_t> order = completed_first_order();
    Tensor t = Tensor::empty({int64_t(order.size())}, DType::i64);
    for (size_t i = 0; i < order.size(); ++i) t.data<int64_t>()[i] = int64_t(order[i]);
    Tensor on_group = on_group_device(*pg, t);
    pg->broadcast(on_group, 0)->wait();
    t = on_group.to(Device::cpu());
    for (size_t i = 0; i < order.size(); ++i) {
      const int64_t p = t.data<int64_t>()[i];
      RG_CHECK(p >= 0 && size_t(p) < params.size(), "DDP: bad bucket order from rank 0");
      order[i] = size_t(p);
    }
    build(assignment_for(order));
    rebuilt_order = order;
    if (powersgd) powersgd->reset();
    ++rebuilds;
  }

  void reset_iteration() {
    ready.assign(params.size(), 0);
    locally_used.assign(params.size(), 1);
    hook_count.assign(params.size(), 0);
    last_firing.assign(params.size(), 0);
    firings = 0;
    ready_order.clear();
    next_launch = 0;
    for (auto& b : buckets) {
      b.pending = b.params.size();
      b.work.reset();
      b.comm = Tensor();
      b.powersgd = false;
    }
    reset_timeline(false);
    timeline.buckets.resize(buckets.size());
  }

  void mark_ready(size_t i, bool from_hook) {
    if (ready[i]) {
      // A second hook for this parameter in one backward: its bucket may be in flight already,
      // so the gradient is left alone; every rank learns of it at the end (finalize()).
      note(i, kMarkedTwice);
      return;
    }
    ready[i] = 1;
    Bucket& b = buckets[bucket_of[i]];
    Tensor& view = b.views[pos_in_bucket[i]];
    const Tensor& param = params[i].second;
    if (from_hook) {
      ready_order.push_back(i);
      const double scale = 1.0 / divisor;
      Tensor grad = param.grad();
      if (opt.gradient_as_bucket_view && aliases(grad, view)) {
        mul_(view, scale);
      } else {
        view.copy_(grad);
        mul_(view, scale);
        if (opt.gradient_as_bucket_view) param.set_grad(view);
      }
    } else {
      locally_used[i] = 0;
      view.zero_();
    }
    if (--b.pending == 0) {
      timeline.buckets[bucket_of[i]].ready = Clock::now();
      if (opt.overlap && !delay) launch_ready_buckets();
    }
  }

  // Buckets go out strictly in bucket order, so every rank issues the same sequence of
  // collectives even when gradients arrive in different orders on different ranks.
  void launch_ready_buckets() {
    while (next_launch < buckets.size() && buckets[next_launch].pending == 0) launch(next_launch++);
  }

  void launch(size_t k) {
    Bucket& b = buckets[k];
    const bool last = k + 1 == buckets.size();
    if (last) {
      // Written on the bucket's device by two fill kernels: a copy from the host would be a
      // pageable copy that stalls the host on CUDA. In a capture, copied from replay slots that
      // the host fills before each replay (capture_iteration).
      const Tensor slot = status_slot();
      if (cuda::Graph* g = capturing_graph()) {
        if (status_graph != g->id()) {
          status_source = g->replay_slots(kStatusElements);
          status_graph = g->id();
        }
        Tensor(slot).copy_(status_source);
      } else {
        Tensor(slot.flat_narrow(0, 1)).fill_(has_findings ? 1.0 : 0.0);
        Tensor(slot.flat_narrow(1, 1)).fill_(data_end != kHasMore ? 1.0 : 0.0);
      }
    }
    if (powersgd && synced >= opt.powersgd.start_iter && b.dtype == DType::f32) {
      std::vector<Shape> shapes;
      for (size_t p : b.params) shapes.push_back(params[p].second.shape());
      if (last) shapes.push_back({kStatusElements});  // a vector: PowerSGD sends it as it is
      b.comm = powersgd->begin(k, b.flat, shapes);
      b.powersgd = true;
    } else if (opt.comm_hook == CommHook::fp16)
      b.comm = b.flat.to(DType::f16);
    else if (opt.comm_hook == CommHook::bf16)
      b.comm = b.flat.to(DType::bf16);
    else
      b.comm = b.flat;
    timeline.buckets[k].issued = Clock::now();
    timeline.launch_order.push_back(int(k));
    b.work = pg->all_reduce(b.comm, ReduceOp::sum);
  }

  void hook(size_t i) {
    if (!armed) return;  // no_sync(), or a backward that no DDP forward prepared
    if (!callback_queued) {
      callback_queued = true;
      timeline.backward_start = Clock::now();
      std::weak_ptr<State> weak = weak_from_this();
      autograd::Engine::queue_callback([weak] {
        if (auto s = weak.lock()) s->finalize();
      });
    }
    if (opt.static_graph) {
      ++hook_count[i];
      last_firing[i] = ++firings;
      // The first iteration only counts (finalize takes the gradients); later ones reduce a
      // parameter at its last expected firing, when .grad holds every firing's sum. A firing
      // beyond the expected count finds it ready and is reported as marked twice.
      if (!static_recorded || hook_count[i] < expected_hooks[i]) return;
    }
    mark_ready(i, true);
  }

  // The iteration on the timeline: gradient readiness and issue on the compute lane, each
  // all-reduce on the communication lane, and the wait that was left at the end of backward.
  void trace_iteration() {
    trace::name_lane(1, "all-reduce (process group)");
    for (size_t k = 0; k < buckets.size(); ++k) {
      const auto& t = timeline.buckets[k];
      const std::string args = detail::cat("{\"bucket\":", k, ",\"bytes\":", buckets[k].bytes,
                                           ",\"params\":", buckets[k].params.size(), "}");
      trace::instant(detail::cat("bucket ", k, " ready"), "ddp", t.ready, 0, args);
      trace::instant(detail::cat("issue all_reduce ", k), "ddp", t.issued, 0, args);
      trace::span(detail::cat("all_reduce bucket ", k), "comm", t.comm_start, t.comm_end, 1, args);
    }
    trace::span("DDP wait for buckets", "ddp", timeline.wait_start, timeline.wait_end);
  }

  // Missing and doubled gradients end in the same named error on every rank, without a hang and
  // without a collective per iteration. A rank where some parameter got no gradient can never
  // launch that parameter's bucket (nor, buckets going out in order, any later one) while the
  // ranks that got every gradient wait in those all-reduces: if it threw here, they would time
  // out naming a collective instead of the parameter. So it zero-fills the missing gradients and
  // sends every bucket anyway, and each rank puts into the last bucket's status element a 1 when
  // it has findings to report, else 0. The element is summed with the gradients, so after the
  // usual wait every rank reads the same count of ranks with findings; only when that is not 0
  // do the ranks all_gather their per-parameter findings (every rank alike) and throw one error
  // naming each rank's parameters. Every rank reads the count one synchronized iteration late,
  // here (or in end_of_data): the copy into pinned memory has arrived by then, so the host is not
  // stalled waiting for the GPU. The normal path costs one element in one all-reduce and its
  // asynchronous copy. A rank where no parameter got a
  // gradient never gets here from a hook: its next forward calls this instead
  // (finish_abandoned_iteration), before the buffer broadcast, so its collectives line up with
  // the ranks waiting here. A parameter marked twice after the last bucket left travels with the
  // next iteration's status, two iterations late.
  void finalize() {
    NoGradGuard no_grad;
    callback_queued = false;
    armed = false;
    if (delay) {
      // static_graph's first iteration: the gradients in the order of their last firing (the
      // order the rebuild uses); a parameter whose hook never fired is unused, not an error.
      std::vector<size_t> fired;
      for (size_t i = 0; i < params.size(); ++i)
        if (hook_count[i] > 0 && !ready[i]) fired.push_back(i);
      std::sort(fired.begin(), fired.end(),
                [&](size_t a, size_t b) { return last_firing[a] < last_firing[b]; });
      for (size_t i : fired) mark_ready(i, true);
      if (!shadow) {
        expected_hooks = hook_count;
        static_recorded = true;
      }
    }
    for (size_t i = 0; i < params.size(); ++i)
      if (!ready[i] && !delay) note(i, kNoGradient);
    for (size_t i = 0; i < params.size(); ++i)
      if (!ready[i]) mark_ready(i, false);
    cuda::Graph* const graph = capturing_graph();
    const Device device = pg->tensor_device();
    // The same two events every iteration (created once), recorded again: the timeline is the
    // last iteration's.
    auto device_mark = [&](std::shared_ptr<cuda::Event>& e) {
      if (!device.is_cuda() || graph != nullptr) return;
      if (!e) e = std::make_shared<cuda::Event>(true);
      e->record(cuda::current_stream(device.index));
    };
    // The wait starts when backward has ended, before the buckets launched only now (without
    // overlap): their copies and transfers all count as waited for, so none of them can look
    // hidden behind this callback's own launches.
    timeline.wait_start = Clock::now();
    device_mark(timeline.device_wait_start);
    if (!opt.overlap || delay) launch_ready_buckets();
    delay = false;
    for (size_t k = 0; k < buckets.size(); ++k) {
      buckets[k].work->wait();
      timeline.buckets[k].comm_start = buckets[k].work->start_time();
      timeline.buckets[k].comm_end = buckets[k].work->end_time();
    }
    // PowerSGD's second round (the Q factors), issued in bucket order on every rank.
    std::vector<std::pair<size_t, std::pair<Tensor, WorkPtr>>> second;
    for (size_t k = 0; k < buckets.size(); ++k)
      if (buckets[k].powersgd) {
        Tensor q = powersgd->middle(k, buckets[k].flat, buckets[k].comm);
        second.push_back({k, {q, pg->all_reduce(q, ReduceOp::sum)}});
      }
    for (auto& [k, qw] : second) {
      qw.second->wait();
      powersgd->finish(k, buckets[k].flat, qw.first);
    }
    timeline.wait_end = Clock::now();
    device_mark(timeline.device_wait_end);
    if (trace::enabled() && graph == nullptr) trace_iteration();
    for (auto& b : buckets)
      if (!b.powersgd && !b.comm.is_same(b.flat)) b.flat.copy_(b.comm);
    if (graph != nullptr) {
      capture_iteration(*graph);
    } else {
      end_status();
    }
    // end_of_data's shadow iteration (not Join's) runs the collectives of a normal iteration (the
    // ranks still training run one, and find out one iteration later) but writes nothing back: its
    // status decides what follows (every rank out of data, or an error).
    const bool write_back = !(shadow && !join_active);
    std::vector<char> globally_used(params.size(), 1);
    if (opt.static_graph) {
      // The first iteration, or the first after a resume (every rank is a fresh process then).
      if (static_used.empty()) static_used = first_iteration_used();
      globally_used = static_used;
    } else if (opt.find_unused_parameters) {
      if (synced == 0) {
        globally_used = first_iteration_used();
      } else {
        Tensor used = Tensor::empty({int64_t(params.size())}, DType::i32);
        for (size_t i = 0; i < params.size(); ++i) used.data<int32_t>()[i] = locally_used[i];
        Tensor on_group = on_group_device(*pg, used);
        pg->all_reduce(on_group, ReduceOp::max)->wait();
        used = on_group.to(Device::cpu());
        for (size_t i = 0; i < params.size(); ++i) globally_used[i] = char(used.data<int32_t>()[i]);
      }
    }
    for (size_t i = 0; i < params.size() && write_back; ++i) {
      const Tensor& param = params[i].second;
      const Tensor& view = buckets[bucket_of[i]].views[pos_in_bucket[i]];
      Tensor grad = param.grad();
      if (opt.gradient_as_bucket_view) {
        if (!aliases(grad, view) && globally_used[i]) param.set_grad(view);
      } else if (grad.defined()) {
        if (globally_used[i]) grad.copy_(view);
      } else if (globally_used[i]) {
        param.set_grad(view.clone());
      }
    }
    if (graph != nullptr) return;  // each replay counts itself (capture_iteration)
    if (synced == 0) first_iteration_order = ready_order;
    ++synced;
  }

  // The previous synchronized iteration's status first (its copy has long arrived), then this
  // one's goes on its way: reading it now would stall the host until the GPU catches up.
  void end_status() {
    if (pending_status) check_status();
    const Tensor slot = status_slot();
    pending_status =
        PendingStatus{AsyncScalar(slot.flat_narrow(0, 1)), AsyncScalar(slot.flat_narrow(1, 1)),
                      synced + 1, data_end, join_active};
    data_end = kHasMore;
  }

  // A fresh timeline, keeping its two device events (created once, recorded each time).
  void reset_timeline(bool replayed) {
    IterationTimeline fresh;
    fresh.device_wait_start = std::move(timeline.device_wait_start);
    fresh.device_wait_end = std::move(timeline.device_wait_end);
    fresh.replayed = replayed;
    timeline = std::move(fresh);
  }

  // An iteration captured into a CUDA graph (its forward, backward and finalize ran on the host
  // once, recording their device work): each replay is one synchronized iteration. Before it, the
  // status source gets this iteration's host values (findings, the end of this rank's data);
  // after it, its status goes on its way as end_status sends an eager iteration's, and the count
  // moves on.
  void capture_iteration(cuda::Graph& graph) {
    RG_CHECK(!pending_status,
             "DDP: a synchronized iteration was captured with the previous one's status still "
             "pending (Reducer::ready_to_capture reads it first)");
    RG_CHECK(status_source.defined(), "DDP: the captured iteration sent no last bucket");
    std::weak_ptr<State> weak = weak_from_this();
    graph.on_replay([weak] {
      auto s = weak.lock();
      RG_CHECK(s != nullptr, "a CUDA graph replays the iteration of a destroyed DDP");
      Tensor(s->status_source.flat_narrow(0, 1)).fill_(s->has_findings ? 1.0 : 0.0);
      Tensor(s->status_source.flat_narrow(1, 1)).fill_(s->data_end != kHasMore ? 1.0 : 0.0);
    });
    graph.after_replay([weak] {
      auto s = weak.lock();
      if (s == nullptr) return;
      s->end_status();
      ++s->synced;
      s->reset_timeline(/*replayed=*/true);
    });
  }

  // Every rank's table: row r = rank r's values (`width` each), gathered in one all_gather.
  std::vector<int64_t> gather_rows(const std::vector<int64_t>& mine) const {
    const int64_t width = int64_t(mine.size());
    Tensor t = Tensor::empty({width}, DType::i64);
    std::copy(mine.begin(), mine.end(), t.data<int64_t>());
    Tensor all = Tensor::empty({width * pg->size()}, DType::i64, pg->tensor_device());
    pg->all_gather(all, on_group_device(*pg, t))->wait();
    return all.to(Device::cpu()).to_vector<int64_t>();
  }

  // The pending status, read (waiting for its copy if need be): findings on some rank, or data
  // that ended on some ranks and not on others (never asked under Join, where joined ranks shadow
  // the others by design), end in the same error on every rank. Returns the ranks whose data
  // ended in that iteration.
  double check_status() {
    const PendingStatus p = std::move(*pending_status);
    pending_status.reset();
    const double with_findings = p.findings.get(), ended = p.ended.get();
    const bool uneven = !p.join_active && ended > 0.5 && ended < pg->size() - 0.5;
    if (with_findings > 0.5 || uneven) report_findings(p.iteration, p.data_end);
    return ended;
  }

  // Some rank had findings (the status element of `iteration` said so on every rank), or the
  // ranks' data ended unevenly there (this rank's DataEnd: my_end): gather them and throw the
  // same error everywhere.
  [[noreturn]] void report_findings(int64_t iteration, DataEnd my_end) {
    const size_t n = params.size();
    constexpr size_t kHead = 2;  // iteration, DataEnd
    std::vector<int64_t> mine(n + kHead, kFine);
    mine[0] = has_findings ? findings_iteration : iteration;
    mine[1] = my_end;
    if (has_findings) std::copy(findings.begin(), findings.end(), mine.begin() + kHead);
    has_findings = false;
    data_end = kHasMore;
    const std::vector<int64_t> all = gather_rows(mine);
    std::vector<int64_t> ends;
    for (int r = 0; r < pg->size(); ++r) ends.push_back(all[size_t(r) * (n + kHead) + 1]);
    const bool no_batch = std::count(ends.begin(), ends.end(), int64_t(kNoBatch)) > 0;
    const bool uneven = std::count(ends.begin(), ends.end(), int64_t(kHasMore)) != pg->size() &&
                        std::count(ends.begin(), ends.end(), int64_t(kHasMore)) > 0;
    const std::string kAllGot = "every parameter got one", kNone = "none";
    std::vector<std::string> missing(size_t(pg->size())), twice(missing);
    bool any_missing = false, any_twice = false;
    for (int r = 0; r < pg->size(); ++r) {
      const int64_t* row = all.data() + size_t(r) * (n + kHead);
      std::vector<std::string> m, t;
      for (size_t i = 0; i < n; ++i) {
        if (row[kHead + i] == kNoGradient) m.push_back(params[i].first);
        if (row[kHead + i] == kMarkedTwice) t.push_back(params[i].first);
      }
      const std::string late =
          row[0] != iteration ? detail::cat(" (in iteration ", row[0], ")") : std::string();
      any_missing = any_missing || !m.empty();
      any_twice = any_twice || !t.empty();
      missing[size_t(r)] = m.empty()       ? kAllGot
                           : m.size() == n ? "no parameter got one (did backward run after the "
                                             "forward?)"
                                           : name_list(m) + " got none" + late;
      twice[size_t(r)] = t.empty() ? kNone : name_list(t) + late;
    }
    std::string msg = detail::cat("DDP: reduction could not finish in iteration ", iteration, ".");
    if (uneven) {
      // Every rank learns who ran out: the ranks without a batch for this iteration (or whose
      // announced last batch it was) and the ranks that still have data.
      std::vector<std::string> where(size_t(pg->size()));
      const std::string more = no_batch
                                   ? detail::cat("had a batch for iteration ", iteration)
                                   : detail::cat("had more batches after iteration ", iteration);
      for (int r = 0; r < pg->size(); ++r)
        where[size_t(r)] =
            ends[size_t(r)] == kNoBatch
                ? detail::cat("ran out of data (no batch for iteration ", iteration,
                              ", its last was iteration ", iteration - 1, ")")
            : ends[size_t(r)] == kLastBatch
                ? detail::cat("ran out of data (its last batch was iteration ", iteration, ")")
                : more;
      msg += detail::cat(
          " The ranks ran out of data at different iterations (uneven inputs): ",
          by_rank(where, more),
          ". Every rank must run the same number of synchronized iterations: train inside "
          "dist::Join with DDP as a joinable (ringgrad-train --join), which lets the ranks that "
          "ran out shadow the others' collectives, or give every rank the same number of "
          "batches.");
    }
    if (any_missing)
      msg += detail::cat(
          " Parameters received no gradient in a backward: ", by_rank(missing, kAllGot),
          ". If the model does not use every parameter in every forward, construct "
          "DistributedDataParallel with find_unused_parameters=true (ringgrad-train "
          "--find-unused-parameters); a rank where no parameter got one may have run a training "
          "forward without backward (evaluate under NoGradGuard, in eval mode or in no_sync()).");
    if (any_twice)
      msg += detail::cat(
          " Parameters marked ready twice in one backward (their gradient hook fired twice): ",
          by_rank(twice, kNone),
          ". This happens when a parameter takes part in a reentrant backward (activation "
          "checkpointing's reentrant variant recomputes a segment and runs backward inside "
          "backward), in several reentrant calls, or in a module shared by two DDP instances "
          "whose backwards run in one pass. Fixes: non-reentrant checkpointing, or keep such "
          "parameters out of the checkpointed segment or in one DDP instance. If every "
          "iteration's graph is the same (the same parameters used, each hook firing as often), "
          "construct DistributedDataParallel with static_graph=true (ringgrad-train "
          "--static-graph): it counts the firings in the first iteration and reduces each "
          "parameter after its last one.");
    RG_FAIL(msg);
  }

  // With find_unused_parameters, the first iteration gathers every rank's used flags (instead
  // of their max) so that rank 0 can say which parameters were unused where: at INFO and DETAIL
  // a summary, and at any level PyTorch's warning when nothing was unused (the graph traversal
  // each forward is then time spent for nothing). Returns the flags' max over ranks.
  std::vector<char> first_iteration_used() {
    const size_t n = params.size();
    const std::vector<int64_t> all =
        gather_rows(std::vector<int64_t>(locally_used.begin(), locally_used.end()));
    std::vector<char> used(n, 0);
    std::vector<std::string> per_rank(size_t(pg->size()));
    const std::string kAllUsed = "every parameter used";
    bool any_unused = false;
    for (int r = 0; r < pg->size(); ++r) {
      std::vector<std::string> unused;
      for (size_t i = 0; i < n; ++i) {
        const bool u = all[size_t(r) * n + i] != 0;
        used[i] = char(used[i] || u);
        if (!u) unused.push_back(params[i].first);
      }
      any_unused = any_unused || !unused.empty();
      per_rank[size_t(r)] = unused.empty() ? kAllUsed : name_list(unused) + " unused";
    }
    if (pg->rank() != 0 || opt.log == nullptr) return used;
    // The warning is about the traversal, which static_graph never runs.
    if (!any_unused && (!opt.find_unused_parameters || opt.static_graph)) return used;
    if (!any_unused) {
      *opt.log << "DDP warning: find_unused_parameters=true, but no parameter was unused in the "
                  "first iteration on any rank; the graph traversal after each forward costs "
                  "time for nothing. If every forward uses every parameter, turn it off (drop "
                  "--find-unused-parameters).\n";
    } else if (debug_level() != DebugLevel::off) {
      std::vector<std::string> nowhere;
      for (size_t i = 0; i < n; ++i)
        if (!used[i]) nowhere.push_back(params[i].first);
      *opt.log << "DDP: unused parameters in the first iteration (find_unused_parameters): "
               << by_rank(per_rank, kAllUsed) << "."
               << (nowhere.empty() ? std::string()
                                   : " Unused on every rank (their .grad stays as it was): " +
                                         name_list(nowhere) + ".")
               << "\n";
    }
    opt.log->flush();
    return used;
  }
};

std::ostream* DdpOptions::default_log() { return &std::cerr; }

const char* comm_hook_name(CommHook hook) {
  switch (hook) {
    case CommHook::allreduce:
      return "allreduce";
    case CommHook::fp16:
      return "fp16";
    case CommHook::bf16:
      return "bf16";
    case CommHook::powersgd:
      return "powersgd";
  }
  return "?";
}

CommHook parse_comm_hook(const std::string& name) {
  for (CommHook h : {CommHook::allreduce, CommHook::fp16, CommHook::bf16, CommHook::powersgd})
    if (name == comm_hook_name(h)) return h;
  RG_FAIL("unknown DDP comm hook '", name, "' (expected allreduce, fp16, bf16 or powersgd)");
}

void check_module_device(const std::vector<std::pair<std::string, Tensor>>& params,
                         const ProcessGroup& pg) {
  if (params.empty()) return;
  const Device device = params.front().second.device();
  for (const auto& [name, t] : params) {
    RG_CHECK(t.device() == device, "DDP: parameter '", name, "' is on ", t.device().str(), " but '",
             params.front().first, "' is on ", device.str(), "; DDP takes a module on one device");
  }
  RG_CHECK(device == pg.tensor_device(), "DDP: the module is on ", device.str(), " but the ",
           pg.backend(), " process group works on ", pg.tensor_device().str(),
           device.is_cuda() ? " (use the nccl backend for CUDA modules)" : "");
}

Reducer::Reducer(NamedParams params, std::shared_ptr<ProcessGroup> pg, DdpOptions options)
    : state_(std::make_shared<State>()) {
  RG_CHECK(pg != nullptr, "DDP needs a process group");
  RG_CHECK(options.bucket_cap_mb > 0, "bucket_cap_mb must be positive");
  RG_CHECK(options.first_bucket_mb > 0, "first_bucket_mb must be positive");
  if (options.comm_hook == CommHook::powersgd) {
    RG_CHECK(options.powersgd.rank >= 1, "PowerSGD rank must be >= 1");
    // Its error and Q state belong to a bucket layout, which changes once after iteration 1.
    RG_CHECK(options.powersgd.start_iter >= 2,
             "PowerSGD start_iter must be >= 2 (the buckets "
             "are rebuilt after the first iteration), got ",
             options.powersgd.start_iter);
  }
  State& s = *state_;
  s.pg = std::move(pg);
  s.opt = options;
  if (options.comm_hook == CommHook::powersgd)
    s.powersgd = std::make_unique<PowerSgd>(options.powersgd, s.pg->size());
  for (auto& [name, t] : params)
    if (t.requires_grad()) s.params.emplace_back(name, t);
  RG_CHECK(!s.params.empty(), "DDP: the module has no parameters that require a gradient");
  for (const auto& [name, t] : s.params)
    RG_CHECK(is_floating(t.dtype()), "DDP: parameter '", name, "' is ", dtype_name(t.dtype()),
             "; only floating-point parameters can be reduced");
  check_module_device(s.params, *s.pg);
  // Until the first iteration shows the real order, assume gradients arrive in reverse
  // registration order (the last layer's first), as PyTorch does.
  std::vector<size_t> order;
  for (size_t i = s.params.size(); i-- > 0;) order.push_back(i);
  s.build(s.assignment_for(order));
  s.divisor = s.pg->size();
  s.reset_iteration();
  std::weak_ptr<State> weak = state_;
  for (size_t i = 0; i < s.params.size(); ++i)
    s.params[i].second.register_post_accumulate_grad_hook([weak, i](Tensor&) {
      if (auto st = weak.lock()) st->hook(i);
    });
}

Reducer::~Reducer() = default;

void Reducer::finish_abandoned_iteration() {
  if (state_->armed) state_->finalize();
}

void Reducer::prepare_for_backward(const std::vector<Tensor>& outputs) {
  State& s = *state_;
  RG_CHECK(!s.armed,
           "DDP: forward was called again before the previous forward's backward "
           "(run evaluation under NoGradGuard or in eval mode, or wrap it in no_sync())");
  if (s.rebuild_due()) s.rebuild();
  s.reset_iteration();
  s.armed = true;
  if (s.opt.static_graph) {
    s.delay = !s.static_recorded;
    if (s.static_recorded)
      for (size_t i = 0; i < s.params.size(); ++i)
        if (s.expected_hooks[i] == 0) s.mark_ready(i, false);
  } else if (s.opt.find_unused_parameters) {
    std::unordered_set<const TensorImpl*> reached;
    std::unordered_set<const autograd::Node*> visited;
    std::vector<std::shared_ptr<autograd::Node>> stack;
    for (const Tensor& out : outputs)
      if (out.defined() && out.grad_fn()) stack.push_back(out.grad_fn());
    while (!stack.empty()) {
      auto node = std::move(stack.back());
      stack.pop_back();
      if (!visited.insert(node.get()).second) continue;
      if (auto* acc = dynamic_cast<autograd::AccumulateGrad*>(node.get()))
        reached.insert(acc->leaf().get());
      for (const auto& e : node->next_edges())
        if (e.node) stack.push_back(e.node);
    }
    for (size_t i = 0; i < s.params.size(); ++i)
      if (!reached.count(s.params[i].second.impl())) s.mark_ready(i, false);
  }
}

std::vector<std::vector<std::string>> Reducer::bucket_names() const {
  std::vector<std::vector<std::string>> out;
  for (const auto& b : state_->buckets) {
    out.emplace_back();
    for (size_t p : b.params) out.back().push_back(state_->params[p].first);
  }
  return out;
}

std::vector<size_t> Reducer::bucket_bytes() const {
  std::vector<size_t> out;
  for (const auto& b : state_->buckets) out.push_back(b.bytes);
  return out;
}

int Reducer::rebuild_count() const { return state_->rebuilds; }

std::vector<int64_t> Reducer::rebuilt_order() const {
  const State& s = *state_;
  std::vector<size_t> order = s.rebuilt_order;
  if (order.empty() && s.synced >= 1 && s.rebuilds_buckets()) {
    // Not rebuilt yet (one iteration done): the order the rebuild will use on this rank, which
    // on rank 0 (the one that writes snapshots) is the one it will broadcast.
    order = s.completed_first_order();
  }
  return std::vector<int64_t>(order.begin(), order.end());
}

void Reducer::restore_rebuilt_order(const std::vector<int64_t>& order) {
  State& s = *state_;
  RG_CHECK(!s.armed, "DDP: restore_rebuilt_order between a forward and its backward");
  std::vector<char> seen(s.params.size(), 0);
  RG_CHECK(order.size() == s.params.size(), "DDP: a bucket order of ", order.size(),
           " parameters for a model with ", s.params.size(), " (a snapshot of another model?)");
  std::vector<size_t> o;
  for (int64_t p : order) {
    RG_CHECK(p >= 0 && size_t(p) < s.params.size() && !seen[size_t(p)],
             "DDP: the bucket order is not a permutation of the parameters");
    seen[size_t(p)] = 1;
    o.push_back(size_t(p));
  }
  s.build(s.assignment_for(o));
  s.rebuilt_order = o;
  if (s.powersgd) s.powersgd->reset();
  s.rebuilds = std::max(s.rebuilds, 1);
}
const IterationTimeline& Reducer::last_timeline() const { return state_->timeline; }
const DdpOptions& Reducer::options() const { return state_->opt; }
int64_t Reducer::synced_iterations() const { return state_->synced; }

void Reducer::restore_synced_iterations(int64_t n) {
  State& s = *state_;
  RG_CHECK(n >= 0, "DDP: a negative count of synchronized iterations (", n, ")");
  RG_CHECK(!s.armed, "DDP: restore_synced_iterations between a forward and its backward");
  RG_CHECK(n == 0 || s.rebuilds > 0 || s.opt.find_unused_parameters,
           "DDP: restore the bucket order (restore_rebuilt_order) before the iteration count");
  s.synced = n;
}

void Reducer::announce_last_iteration() { state_->data_end = kLastBatch; }

bool Reducer::consume_all_ended() {
  State& s = *state_;
  if (!s.pending_status) return false;
  // Read at the epoch's end, where waiting costs nothing. Findings, or data that has not ended on
  // every rank, leave the status pending: the next shadow iteration's finalize raises the error
  // (or, when no rank's data has ended yet, reads the next status), at the same point as the
  // other ranks' next finalize.
  if (s.pending_status->findings.get() > 0.5 ||
      s.pending_status->ended.get() < s.pg->size() - 0.5 || s.pending_status->join_active)
    return false;
  s.pending_status.reset();
  return true;
}

void Reducer::end_of_data() {
  State& s = *state_;
  RG_CHECK(!s.armed, "DDP: end_of_data() between a forward and its backward");
  RG_CHECK(!s.join_active, "DDP: end_of_data() under Join");
  s.data_end = kNoBatch;
  shadow_iteration(-1);
}

void Reducer::check_pending_status() {
  if (state_->pending_status) state_->check_status();
}

void Reducer::set_divisor(int divisor) {
  RG_CHECK(divisor >= 1 && divisor <= state_->pg->size(), "DDP: a gradient divisor of ", divisor,
           " with ", state_->pg->size(), " ranks");
  state_->divisor = divisor;
}

void Reducer::set_join_active(bool active) {
  State& s = *state_;
  RG_CHECK(!active || !s.powersgd,
           "Join: DDP's powersgd comm hook cannot run under Join (a joined rank's PowerSGD error "
           "feedback would add its old errors to the zeros it must send)");
  s.join_active = active;
  if (!active) s.divisor = s.pg->size();
}

void Reducer::shadow_iteration(int64_t synced) {
  State& s = *state_;
  RG_CHECK(!s.armed, "DDP: a shadow iteration between a forward and its backward");
  if (synced >= 0) s.synced = synced;
  // The active ranks' prepare_for_backward, then a backward in which no hook fires: every
  // bucket goes out with zeros, in bucket order.
  if (s.rebuild_due()) s.rebuild();
  s.reset_iteration();
  s.armed = true;
  s.shadow = true;
  s.delay = s.opt.static_graph && !s.static_recorded;
  struct Unshadow {
    State& s;
    ~Unshadow() { s.shadow = false; }
  } unshadow{s};
  for (size_t i = 0; i < s.params.size(); ++i) s.mark_ready(i, false);
  s.finalize();
}

std::string Reducer::not_capturable() const {
  const State& s = *state_;
  if (!s.pg->tensor_device().is_cuda())
    return detail::cat("DDP's ", s.pg->backend(),
                       " group reduces on the CPU (CUDA graphs need the nccl backend)");
  if (s.powersgd)
    return "DDP's powersgd comm hook is not captured (its factors and error feedback are new "
           "tensors every iteration)";
  if (s.join_active) return "DDP under Join is not captured (joined ranks shadow each iteration)";
  if (s.opt.find_unused_parameters && !s.opt.static_graph)
    return "DDP's find_unused_parameters all-reduces the used parameters and reads them back "
           "each iteration; with the same graph every iteration use static_graph too";
  return "";
}

bool Reducer::ready_to_capture() {
  State& s = *state_;
  const std::string why = not_capturable();
  RG_CHECK(why.empty(), "DDP: cannot capture an iteration into a CUDA graph: ", why);
  RG_CHECK(!s.armed, "DDP: ready_to_capture between a forward and its backward");
  // The one-time rebuild (a broadcast read back on the host) and static_graph's first iteration
  // run eagerly first.
  if (s.synced < 1 || s.rebuild_due() || (s.opt.static_graph && !s.static_recorded)) return false;
  // The last eager iteration's status is read now, once: in the capture it could not be.
  if (s.pending_status) s.check_status();
  return true;
}

uint64_t Reducer::buckets_version() const { return state_->builds; }

PowerSgd::State Reducer::powersgd_state() const {
  const State& s = *state_;
  if (!s.powersgd) return {};
  PowerSgd::State out = s.powersgd->state();
  for (auto& [k, b] : out)
    if (!b.error.defined())
      b.error = zeros({s.buckets.at(k).flat.numel()}, DType::f32, b.q.device());
  return out;
}

void Reducer::restore_powersgd_state(PowerSgd::State state) {
  State& s = *state_;
  if (state.empty() && !s.powersgd) return;
  RG_CHECK(s.powersgd, "DDP: PowerSGD state given to a DDP without the powersgd comm hook");
  RG_CHECK(!s.armed, "DDP: restore_powersgd_state between a forward and its backward");
  RG_CHECK(state.empty() || s.rebuilds > 0 || s.opt.find_unused_parameters,
           "DDP: PowerSGD state belongs to the rebuilt buckets; restore_rebuilt_order first");
  for (const auto& [k, b] : state) {
    RG_CHECK(k < s.buckets.size() && s.buckets[k].dtype == DType::f32,
             "DDP: PowerSGD state for bucket ", k, ", which is not an f32 bucket of this model (",
             s.buckets.size(), " buckets)");
    RG_CHECK(!b.error.defined() || b.error.numel() == s.buckets[k].flat.numel(),
             "DDP: PowerSGD's error for bucket ", k, " has ", b.error.numel(),
             " elements, the bucket ", s.buckets[k].flat.numel());
  }
  s.powersgd->load_state(std::move(state));
}

}  // namespace rg::dist
