// ProcessGroupNCCL over NCCL: the real library in CUDA builds, and in rg_comm_emu the emulated one
// (kernels/emu/shim/nccl.h) on emulated devices, which is how CI runs it. all_reduce with
// Algorithm::ring runs our ring (comm/ring_allreduce.h) over grouped ncclSend/ncclRecv and the
// CUDA reduction kernel; the other collectives always use NCCL's own.
#include "comm/process_group_nccl.h"

#include <cuda_runtime_api.h>
#include <nccl.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <iostream>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

#include "comm/gpu_per_rank.h"
#include "comm/prefix_store.h"
#include "comm/progress_board.h"
#include "comm/ring_allreduce.h"
#include "engine/cuda/device_guard.h"
#include "engine/cuda/event.h"
#include "engine/cuda/graph.h"
#include "engine/cuda/memory.h"
#include "engine/cuda/runtime.h"
#include "engine/cuda/stream.h"
#include "engine/cuda/stream_trace.h"
#include "engine/dispatch.h"
#include "engine/trace.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/collective_reduce.h"
#include "kernels/error.h"
#include "kernels/nccl_error.h"

namespace rg::dist {
namespace {

using Clock = std::chrono::steady_clock;

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::f32:
      return ncclFloat32;
    case DType::f64:
      return ncclFloat64;
    case DType::f16:
      return ncclFloat16;
    case DType::bf16:
      return ncclBfloat16;
    case DType::i64:
      return ncclInt64;
    case DType::i32:
      return ncclInt32;
    case DType::u8:
      return ncclUint8;
  }
  RG_FAIL("nccl: unsupported dtype");
}

kernels::cpu::CollectiveOp ring_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::max:
      return kernels::cpu::CollectiveOp::max;
    case ReduceOp::min:
      return kernels::cpu::CollectiveOp::min;
    default:
      return kernels::cpu::CollectiveOp::sum;  // avg = sum, then divide
  }
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      return ncclSum;
    case ReduceOp::avg:
      return ncclAvg;
    case ReduceOp::max:
      return ncclMax;
    case ReduceOp::min:
      return ncclMin;
  }
  RG_FAIL("nccl: unsupported reduce op");
}

cudaStream_t as_cuda(const cuda::Stream& s) { return static_cast<cudaStream_t>(s.handle()); }

// RG_NCCL_NONBLOCKING: 1 (default) makes the communicator nonblocking, 0 blocking (NCCL's default).
bool nonblocking_from_env() {
  const char* v = std::getenv("RG_NCCL_NONBLOCKING");
  if (v == nullptr || *v == '\0' || std::strcmp(v, "1") == 0) return true;
  RG_CHECK(std::strcmp(v, "0") == 0, "RG_NCCL_NONBLOCKING=", v,
           " must be 1 (nonblocking NCCL communicators, the default) or 0 (blocking ones)");
  return false;
}

// Checks the result of an NCCL call on the group's communicator. A nonblocking communicator's call
// returns ncclInProgress until NCCL has queued its work on the stream, which lasts as long as a
// peer that NCCL connects this rank to at first use (at its first collective, at its first send
// to or receive from that peer) has not made its own such call: polled until then, at most until
// the deadline, or until the group is given up. A blocking communicator waits inside the call.
struct NcclCall {
  ncclComm_t comm = nullptr;
  Clock::time_point deadline;
  Millis timeout{};
  const std::atomic<bool>* give_up = nullptr;
  uint64_t seq = 0;  // of the work being issued

  void check(ncclResult_t r, const char* call, const char* file, int line) const {
    for (int polls = 0; r == ncclInProgress; ++polls) {
      const std::string name(call, std::strcspn(call, "("));
      RG_CHECK(give_up == nullptr || !give_up->load(), name,
               " was abandoned while NCCL was still queuing it: the group failed meanwhile");
      RG_CHECK(Clock::now() < deadline, "NCCL was still connecting this rank to its peers ",
               timeout.count(), " ms after ", name,
               " (it connects them at first use, at the first collective and at the first send "
               "to or receive from each peer, and waits there until each of those peers makes its "
               "own such call)");
      if (polls < 64) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(std::min(1000, 10 * (polls - 63))));
      }
      if (const ncclResult_t q = ncclCommGetAsyncError(comm, &r); q != ncclSuccess) r = q;
    }
    RG_CHECK(r == ncclSuccess, file, ":", line, ": ", call,
             " failed: ", kernels::nccl_error_text(ncclGetErrorString(r), ncclGetLastError(comm)));
  }
};
#define RG_NCCL(nccl_call, expr) (nccl_call).check((expr), #expr, __FILE__, __LINE__)

// This rank's GPU as the other ranks must see it: NCCL refuses two ranks on one GPU only inside
// ncclCommInitRank, with "invalid usage", so the ranks compare UUIDs first and say what to do.
RankGpu this_rank_gpu(int device, int devices) {
  cudaDeviceProp prop{};
  RG_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  RankGpu g;
  g.uuid = format_gpu_uuid(prop.uuid.bytes);
  g.device = device;
  g.device_count = devices;
  char host[256] = {};
  g.host = gethostname(host, sizeof(host) - 1) == 0 ? host : "?";
  return g;
}

// Completed by the watchdog when its end event is reached (or failed by it). wait() orders the
// caller's current stream after the collective without blocking the host, as PyTorch's does.
class NcclWork : public Work {
 public:
  NcclWork(std::string op, uint64_t seq, std::vector<Tensor> keep, int device)
      : Work(std::move(op), seq), keep_(std::move(keep)), device_(device) {}
  void wait(std::optional<Millis> timeout) override {
    if (std::exception_ptr e = exception()) std::rethrow_exception(e);
    end.wait(cuda::current_stream(device_));
    if (blocking_) Work::wait(timeout);  // barrier: the host waits too
  }
  cuda::Event end;
  Clock::time_point issued = Clock::now();
  bool blocking_ = false;
  std::vector<Tensor> keep_;  // inputs and outputs stay alive until the collective is done
  std::string replay;         // a CUDA graph's replay: what it runs (its watchdog message)

 private:
  int device_;
};

// Our ring's transport over NCCL: everything is queued on the communication stream, so a wait
// is a no-op (what follows on the stream runs after the transfer), and a send and a receive that
// depend on each other go into one NCCL group so that neighbours cannot deadlock.
class StreamOrderedOp : public P2POp {
 public:
  void wait(Clock::time_point) override {}
};

class NcclP2P : public PointToPoint {
 public:
  NcclP2P(const NcclCall& nccl, cudaStream_t stream, int rank, int size)
      : nccl_(nccl), stream_(stream), rank_(rank), size_(size) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::unique_ptr<P2POp> isend(const void* data, size_t bytes, int peer, uint64_t) override {
    RG_NCCL(nccl_, ncclSend(data, bytes, ncclUint8, peer, nccl_.comm, stream_));
    return std::make_unique<StreamOrderedOp>();
  }
  std::unique_ptr<P2POp> irecv(void* data, size_t bytes, int peer, uint64_t) override {
    RG_NCCL(nccl_, ncclRecv(data, bytes, ncclUint8, peer, nccl_.comm, stream_));
    return std::make_unique<StreamOrderedOp>();
  }
  OpPair exchange(const void* send, size_t send_bytes, int to, void* recv, size_t recv_bytes,
                  int from, uint64_t slot) override {
    RG_CUDA_CHECK(ncclGroupStart());
    OpPair ops;
    try {
      ops = PointToPoint::exchange(send, send_bytes, to, recv, recv_bytes, from, slot);
    } catch (...) {
      // The group is the thread's: left open, every later NCCL call of this thread would only be
      // collected into it. (The enqueue that called this marks the group unusable.)
      (void)ncclGroupEnd();
      throw;
    }
    RG_NCCL(nccl_, ncclGroupEnd());  // a nonblocking communicator: polled until queued
    return ops;
  }

 private:
  const NcclCall& nccl_;
  cudaStream_t stream_;
  int rank_, size_;
};

}  // namespace

bool nccl_available() { return cuda::runtime().device_count() > 0; }

struct ProcessGroupNCCL::Impl {
  ProcessGroupNCCL& pg;
  int device = 0;
  std::shared_ptr<Store> store;
  ncclComm_t comm = nullptr;
  std::unique_ptr<cuda::Stream> stream;
  std::unique_ptr<ProgressBoard> board;
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::shared_ptr<NcclWork>> pending;
  uint64_t next_seq = 1;
  std::string broken;
  bool stop = false;
  std::thread watchdog;
  bool nonblocking = true;  // RG_NCCL_NONBLOCKING
  // NCCL takes one call at a time on a communicator (a nonblocking one: up to the poll that says
  // it is queued). Issuers take turns on issue_mu, and count themselves in `issuing` (under mu)
  // for the time they call NCCL, which they do without mu: the watchdog reads the communicator's
  // error only while no one issues, and aborts it only once the issuer has stopped (`give_up`
  // ends an issuer's polling).
  std::mutex issue_mu;
  int issuing = 0;
  Clock::time_point issue_started;  // of the issue in flight (under mu)
  std::string issue_what;           // its description
  std::atomic<bool> give_up{false};

  explicit Impl(ProcessGroupNCCL& p) : pg(p) {}

  // The collectives captured into one CUDA graph, which the watchdog watches at each replay.
  struct Captured {
    std::vector<std::string> ops;
    uint64_t replays = 0;
  };
  std::shared_ptr<Captured> captured;  // of the graph capturing now (null: none)
  uint64_t captured_by = 0;            // its cuda::Graph::id
  // The graph whose capture the communication stream joined last (under issue_mu; set before the
  // join, so a capture whose collective then failed is still known as this one).
  uint64_t joined_capture = 0;
  std::shared_ptr<bool> alive = std::make_shared<bool>(true);  // hooks outliving the group

  // Collectives queued during a CUDA graph capture on this device are recorded into the graph
  // (the communication stream joins the capture through the event it waits on, and rejoins the
  // caller's stream when the work is waited on). Each replay runs them again without any host
  // code: so the group registers with the graph, once, a check before each replay (a group that
  // failed since refuses it) and, after it, one watched work for the whole replay, which the
  // watchdog completes or fails (timeout, NCCL error) like a collective.
  std::shared_ptr<Captured> capture_for(cuda::Graph& g, const std::string& what) {
    if (captured_by != g.id()) {
      captured = std::make_shared<Captured>();
      captured_by = g.id();
      std::weak_ptr<bool> token = alive;
      std::shared_ptr<Captured> info = captured;  // each graph's own, watched at its replays
      auto held = std::make_shared<const uint64_t>(g.id());  // expires with the graph's hooks
      graphs.push_back(held);
      g.on_replay([this, token, held] {
        RG_CHECK(!token.expired(),
                 "a CUDA graph replays NCCL collectives of a process group "
                 "that was destroyed");
        std::lock_guard lock(mu);
        RG_CHECK(broken.empty(),
                 "the NCCL group is unusable after an earlier failure, so the "
                 "CUDA graph of its collectives is not replayed: ",
                 broken);
      });
      g.after_replay([this, token, info] {
        if (!token.expired()) watch_replay(*info);
      });
    }
    captured->ops.push_back(what);
    return captured;
  }

  // The CUDA graphs that captured the group's collectives and still exist (under mu).
  std::vector<std::weak_ptr<const uint64_t>> graphs;
  size_t live_graphs() {
    std::erase_if(graphs, [](const auto& g) { return g.expired(); });
    return graphs.size();
  }

  void watch_replay(Captured& c) {
    std::lock_guard lock(mu);
    if (!broken.empty()) return;
    auto work = std::make_shared<NcclWork>("graph replay", 0, std::vector<Tensor>{}, device);
    std::string ops;
    for (size_t i = 0; i < c.ops.size() && i < 8; ++i) ops += (i ? ", " : "") + c.ops[i];
    if (c.ops.size() > 8) ops += rg::detail::cat(", ... (", c.ops.size(), " in all)");
    work->replay = rg::detail::cat("replay ", ++c.replays, " of a CUDA graph with ", c.ops.size(),
                                   " captured collective", c.ops.size() == 1 ? "" : "s", " (", ops,
                                   ") on rank ", pg.rank());
    work->end.record(cuda::current_stream(device));
    work->mark_started();
    pending.push_back(work);
    cv.notify_all();
  }

  void check_tensor(const Tensor& t, const char* op, const char* what) {
    pg.ProcessGroup::check_tensor(t, op, what);
    RG_CHECK(t.device() == Device::cuda(device), op, ": the ", what, " tensor is on ",
             t.device().str(), "; this NCCL group uses cuda:", device);
  }

  // Queues `launch` on the communication stream after the current stream's work so far, and
  // returns a Work that the watchdog completes.
  WorkPtr enqueue(const char* op, const std::string& detail, std::vector<Tensor> keep,
                  const std::function<void(cudaStream_t, const NcclCall&)>& launch,
                  bool blocking = false) {
    // Captured when the caller's stream is (not merely when a graph captures on this thread):
    // the collective is then part of `graph`, whose replays the group watches.
    cuda::Graph* const graph = cuda::Graph::capturing(device);
    std::unique_lock turn(issue_mu);
    refuse_foreign_capture(op, detail, graph);
    std::unique_lock lock(mu);
    const uint64_t seq = next_seq++;
    auto work = std::make_shared<NcclWork>(op, seq, keep, device);
    work->blocking_ = blocking;
    if (!broken.empty()) {
      lock.unlock();
      work->finish(std::make_exception_ptr(Error(pg.describe(op, seq, detail) +
                                                 " was not run: the NCCL group is unusable after "
                                                 "an earlier failure: " +
                                                 broken)));
      return work;
    }
    ++issuing;
    issue_started = Clock::now();
    issue_what = pg.describe(op, seq, detail);
    // Started as soon as it is issued: a peer that waits for this rank to connect names only the
    // ranks that never called.
    if (graph == nullptr) board->started(seq);
    lock.unlock();
    std::string failure;
    try {
      cuda::DeviceGuard guard(device);
      cuda::Event inputs_ready;
      inputs_ready.record(cuda::current_stream(device));
      if (graph != nullptr) joined_capture = graph->id();
      inputs_ready.wait(*stream);
      {
        // On the trace, the collective's time on the communication stream (its own lane).
        std::optional<cuda::StreamSpan> span;
        if (trace::enabled())
          span.emplace(rg::detail::cat(op, " ", detail), "nccl", *stream,
                       rg::detail::cat("cuda:", device, " NCCL stream"),
                       rg::detail::cat("{\"seq\":", seq, "}"));
        // Before the launch: a launch that fails midway (a ring's later step) may leave earlier
        // parts queued that still use the tensors.
        for (const Tensor& t : keep) cuda::record_stream(t, *stream);
        const NcclCall nccl{comm, Clock::now() + pg.options().timeout, pg.options().timeout,
                            &give_up, seq};
        launch(as_cuda(*stream), nccl);
      }
      // After the launch returned: a nonblocking call has queued its work only then, and its
      // time on the device starts then (its connection may have taken most of the timeout).
      work->end.record(*stream);
      work->issued = Clock::now();
    } catch (const std::exception& e) {
      failure = e.what();
    } catch (...) {
      failure = "an exception that is not a std::exception";
    }
    lock.lock();
    --issuing;
    cv.notify_all();
    if (!failure.empty() || !broken.empty()) {
      turn.unlock();  // done with NCCL: a failed work's callbacks may issue again
      // NCCL refused the call, or did not queue it in time (a peer that never connects), or the
      // group failed meanwhile: the group is unusable (the watchdog aborts the communicator), and
      // the work fails with the reason instead of the caller's thread throwing mid-collective.
      std::string msg =
          failure.empty() ? pg.describe(op, seq, detail) +
                                " was queued, but the NCCL group failed during its issue: " + broken
                          : pg.describe(op, seq, detail) + " could not be queued: " + failure;
      if (!failure.empty() && graph == nullptr) msg = with_ranks_behind(lock, msg, seq);
      fail_group(lock, msg);
      lock.unlock();
      work->finish(std::make_exception_ptr(Error(msg)));
      return work;
    }
    work->mark_started();
    if (graph != nullptr) {
      // Captured: done as far as the host is concerned (wait() joins the streams in the graph);
      // the watchdog watches its replays instead (capture_for).
      capture_for(*graph, rg::detail::cat(op, " ", detail));
      lock.unlock();
      work->finish();
      return work;
    }
    pending.push_back(work);
    details[seq] = detail;
    cv.notify_all();
    return work;
  }

  // Once a captured collective has made the communication stream join a graph's capture, it
  // stays in that capture until the capture ends: a collective issued meanwhile from a stream that
  // is not in that capture (another thread's) would be recorded into the graph instead of running,
  // and one from another graph's capture would tie the two captures together. Refused before
  // anything is queued or numbered, so the group stays usable (under issue_mu, which a capturing
  // thread holds while its issue makes the stream join).
  void refuse_foreign_capture(const char* op, const std::string& detail, cuda::Graph* graph) {
    if (!cuda::runtime().backend().stream_capturing(device, stream->handle())) return;
    if (graph != nullptr && graph->id() == joined_capture) return;
    RG_FAIL(op, " (", detail, ") on rank ", pg.rank(), " of ", pg.size(),
            graph == nullptr
                ? " was issued from a stream outside the CUDA graph capture that this group's "
                  "communication stream belongs to now (another thread captures collectives of "
                  "this group, or this thread issued it from a stream that is not capturing): it "
                  "would be recorded into that graph instead of running. Issue it after the "
                  "capture ends, or on the capturing stream"
                : " is captured into one CUDA graph while another graph's capture holds this "
                  "group's communication stream: capture the collectives of one group into one "
                  "graph at a time");
  }

  // `msg` + "; ranks that have not joined it: 1, 2" for collective `seq`, from the progress
  // board: store round trips, so without the lock, which it releases meanwhile. The group is
  // marked failed with `msg` first (unless it failed already), so that no one issues on the
  // failed communicator meanwhile, and given the whole reason after if that is still its reason.
  std::string with_ranks_behind(std::unique_lock<std::mutex>& lock, const std::string& msg,
                                uint64_t seq) {
    if (broken.empty()) broken = msg;
    give_up = true;
    lock.unlock();
    const std::string full = msg + ranks_behind(seq);
    lock.lock();
    if (broken == msg) broken = full;
    return full;
  }

  // "; ranks that have not joined it: 1, 2" for collective `seq`, from the progress board (store
  // round trips: called without `mu`).
  std::string ranks_behind(uint64_t seq) {
    auto behind = board->ranks_behind(seq);
    if (!behind) return "";
    return behind->empty() ? "; every rank had started it"
                           : "; ranks that have not joined it: " + format_ranks(*behind);
  }

  // Makes the group unusable with `msg` (the first reason stays) and fails every pending work
  // with it; an issuer polling a nonblocking call stops at `give_up`. The communicator is
  // aborted by the watchdog once no issuer is inside NCCL (maybe_abort), or by the destructor:
  // never on the thread that issues, since NCCL 2.26 and later keep an abort waiting until the
  // CUDA graphs that captured the communicator's calls are destroyed, which that thread does.
  // Under `lock`, which it releases meanwhile.
  void fail_group(std::unique_lock<std::mutex>& lock, const std::string& msg) {
    if (broken.empty()) broken = msg;
    give_up = true;
    auto failed = std::move(pending);
    pending.clear();
    for (const auto& w : failed) details.erase(w->seq());
    lock.unlock();
    for (auto& w : failed) w->finish(std::make_exception_ptr(Error(msg)));
    lock.lock();
    cv.notify_all();
  }

  // The watchdog's abort of a failed group, once no issuer is inside NCCL (an issuer blocked in a
  // blocking communicator's call may never return: the watchdog goes on meanwhile). Without the
  // lock: the abort may wait for the training thread to destroy CUDA graphs (see fail_group),
  // which it does once its next replay check has seen `broken` (and thrown).
  void maybe_abort(std::unique_lock<std::mutex>& lock) {
    if (broken.empty() || comm == nullptr || issuing > 0) return;
    ncclComm_t aborted = std::exchange(comm, nullptr);
    lock.unlock();
    ncclCommAbort(aborted);
    lock.lock();
  }
  std::unordered_map<uint64_t, std::string> details;

  // A pending work as errors name it, e.g. "all_reduce #3 (f32[1000]) on rank 0" (under mu).
  std::string describe(const NcclWork& w) {
    return w.replay.empty() ? pg.describe(w.op(), w.seq(), details[w.seq()]) : w.replay;
  }

  void watch() {
    std::unique_lock lock(mu);
    while (!stop) {
      cv.wait_for(lock, std::chrono::milliseconds(20));
      try {
        watch_once(lock);
      } catch (const std::exception& e) {
        // A sticky CUDA error (an event's poll), a callback that threw: the group fails with it
        // instead of the thread ending the process.
        if (!lock.owns_lock()) lock.lock();
        fail_group(lock, rg::detail::cat("the NCCL group's watchdog failed: ", e.what()));
      }
    }
  }

  // One pass of the watchdog, under `lock` (which it may release meanwhile).
  void watch_once(std::unique_lock<std::mutex>& lock) {
    maybe_abort(lock);
    watch_pending(lock);
    // A blocking communicator's issuer can stay inside NCCL without end (a peer that never
    // connects); the group fails at the timeout, so that no one waits for it without a word
    // (a nonblocking issuer polls with its own deadline).
    if (issuing > 0 && !nonblocking && broken.empty() &&
        Clock::now() - issue_started > pg.options().timeout) {
      fail_group(lock,
                 issue_what + detail::cat(" was still inside NCCL ", pg.options().timeout.count(),
                                          " ms after its issue (a blocking communicator "
                                          "waits there for peers without end)"));
    }
  }

  // Completes the pending works whose end is reached, or fails the group with the first error or
  // timeout (under `lock`, which it may release meanwhile).
  void watch_pending(std::unique_lock<std::mutex>& lock) {
    if (pending.empty()) return;
    // Works whose end event is reached, in issue order. An aborted or failed NCCL call also
    // reaches its end event, so the communicator's error is read after the events: an error
    // set by any of them is seen here, and they fail with it instead of completing.
    size_t reached = 0;
    // Polls: the watchdog's view of the stream must not order the program's host work.
    while (reached < pending.size() && pending[reached]->end.poll()) ++reached;
    // The communicator's error can be read only while no issuer is inside NCCL (NCCL takes one
    // call at a time); meanwhile no work is completed, since a failed one reaches its end too.
    // ncclInProgress is no error.
    const bool readable = issuing == 0 && comm != nullptr;
    ncclResult_t async = ncclSuccess;
    if (readable) ncclCommGetAsyncError(comm, &async);
    if (async == ncclInProgress) async = ncclSuccess;
    if (async == ncclSuccess && readable) {
      // Taken off together, then finished without the lock (an issuer's fail_group may run
      // meanwhile and empty `pending`).
      std::vector<std::shared_ptr<NcclWork>> done(pending.begin(), pending.begin() + reached);
      pending.erase(pending.begin(), pending.begin() + reached);
      for (const auto& w : done) details.erase(w->seq());
      reached = 0;
      lock.unlock();
      for (const auto& w : done) w->finish();
      lock.lock();
      if (pending.empty()) return;
    }
    // The oldest work not reached times out (reached ones wait above for a readable error).
    const bool timed_out =
        reached < pending.size() && Clock::now() - pending[reached]->issued > pg.options().timeout;
    if (async == ncclSuccess && !timed_out) return;
    const auto& oldest = timed_out ? pending[reached] : pending.front();
    // Abort: the communicator cannot recover, every pending work fails with the reason.
    std::string msg = describe(*oldest);
    if (timed_out)
      msg += detail::cat(" timed out after ", pg.options().timeout.count(), " ms");
    else
      msg +=
          " failed: " + kernels::nccl_error_text(ncclGetErrorString(async), ncclGetLastError(comm));
    if (oldest->replay.empty()) msg = with_ranks_behind(lock, msg, oldest->seq());
    fail_group(lock, msg);
    maybe_abort(lock);
  }
};

ProcessGroupNCCL::ProcessGroupNCCL(std::shared_ptr<Store> store, int rank, int size,
                                   ProcessGroupOptions options, int device)
    : ProcessGroup(rank, size, std::move(options)), impl_(std::make_unique<Impl>(*this)) {
  RG_CHECK(store != nullptr, "ProcessGroupNCCL needs a store");
  const int devices = cuda::runtime().device_count();
  RG_CHECK(devices > 0,
           "the nccl backend needs a CUDA device and none is visible; use "
           "--backend gloo");
  Impl& s = *impl_;
  s.device = device >= 0 ? device : rank % devices;
  s.store = std::make_shared<PrefixStore>("pg/" + options_.name, std::move(store));
  // Before NCCL: every rank learns every rank's GPU, so ranks that share one all fail here with the
  // same message instead of inside ncclCommInitRank (or some of them waiting there).
  check_one_gpu_per_rank(*s.store, "nccl/gpu", rank, size, this_rank_gpu(s.device, devices),
                         options_.timeout);
  ncclUniqueId id;
  if (rank == 0) {
    RG_CUDA_CHECK(ncclGetUniqueId(&id));
    s.store->set("nccl/unique_id", Bytes(reinterpret_cast<uint8_t*>(&id),
                                         reinterpret_cast<uint8_t*>(&id) + sizeof(id)));
  } else {
    const Bytes b = s.store->get("nccl/unique_id", options_.timeout);
    RG_CHECK(b.size() == sizeof(id), "nccl: malformed unique id in the store");
    std::memcpy(&id, b.data(), sizeof(id));
  }
  {
    cuda::DeviceGuard guard(s.device);
    // Nonblocking, the communicator's creation, like every later call, can wait for peers only
    // as long as the group's timeout (a blocking one can wait inside NCCL without end).
    s.nonblocking = nonblocking_from_env();
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = s.nonblocking ? 0 : 1;
    const NcclCall nccl{nullptr, Clock::now() + options_.timeout, options_.timeout, nullptr};
    try {
      const ncclResult_t r = ncclCommInitRankConfig(&s.comm, size, id, rank, &config);
      NcclCall{s.comm, nccl.deadline, nccl.timeout, nullptr}.check(
          r, "ncclCommInitRankConfig(&s.comm, size, id, rank, &config)", __FILE__, __LINE__);
    } catch (const std::exception& e) {
      if (s.comm != nullptr) ncclCommAbort(std::exchange(s.comm, nullptr));
      RG_FAIL("ProcessGroupNCCL: rank ", rank, " of ", size,
              " could not create its NCCL communicator: ", e.what());
    }
  }
  try {
    {
      cuda::DeviceGuard guard(s.device);
      s.stream = std::make_unique<cuda::Stream>(cuda::pooled_stream(s.device));
    }
    s.board = std::make_unique<ProgressBoard>(s.store, rank, size);
    s.watchdog = std::thread([this] { impl_->watch(); });
  } catch (...) {
    ncclCommAbort(std::exchange(s.comm, nullptr));  // the destructor does not run
    throw;
  }
}

ProcessGroupNCCL::~ProcessGroupNCCL() {
  {
    // What is pending first finishes, or times out under the watchdog, which then aborts the
    // communicator: NCCL's kernels wait for their peers without a timeout (over NVLink or shared
    // memory nothing notices a peer that left or went elsewhere), so waiting for the device here
    // could never end.
    // A wait of more than a second says what it waits for (up to the timeout: minutes, by default).
    std::unique_lock lock(impl_->mu);
    if (const size_t n = impl_->live_graphs(); n > 0) {
      std::cerr << "ringgrad: the NCCL group of rank " << rank() << " is destroyed while " << n
                << " CUDA graph(s) that captured its collectives still exist: NCCL (2.26 and "
                   "later) keeps its destroy or abort waiting until they are destroyed (destroy "
                   "them first)"
                << std::endl;
    }
    if (std::uncaught_exceptions() > 0 && !impl_->pending.empty()) {
      // Destroyed by an exception's unwinding: nothing will read what is pending, and its peers
      // may be gone too. Aborted at once, as the rank's exit would, instead of waiting up to the
      // timeout.
      const std::string msg = detail::cat(
          "ringgrad: the NCCL group of rank ", rank(), " is aborted with ", impl_->pending.size(),
          " pending collective(s), the oldest ", impl_->describe(*impl_->pending.front()),
          ", as it is destroyed by an exception");
      std::cerr << msg << std::endl;
      impl_->fail_group(lock, msg.substr(std::strlen("ringgrad: ")));
    }
    const Clock::time_point start = Clock::now();
    bool said = false;
    while (!impl_->pending.empty()) {
      if (!said && Clock::now() - start > std::chrono::seconds(1)) {
        said = true;
        std::cerr << "ringgrad: destroying the NCCL group waits for " << impl_->pending.size()
                  << " pending collective(s), the oldest "
                  << impl_->describe(*impl_->pending.front()) << ", until they finish or time out ("
                  << options_.timeout.count() << " ms after their issue)" << std::endl;
      }
      impl_->cv.wait_for(lock, std::chrono::milliseconds(20));
    }
    impl_->stop = true;
  }
  impl_->cv.notify_all();
  impl_->watchdog.join();
  if (!impl_->comm) return;  // aborted by the watchdog
  if (!impl_->broken.empty()) {
    // Failed (a call NCCL refused or did not queue in time, a timeout, destroyed by an exception):
    // what it queued may wait for peers that never come, so it is aborted, not waited for. CUDA
    // graphs that captured its collectives are destroyed before it (see the docs).
    ncclCommAbort(impl_->comm);
    return;
  }
  // Finalizing flushes what NCCL still holds; nonblocking, it is polled like any call. If it
  // fails or does not end within the timeout, the communicator is aborted instead of destroyed.
  try {
    // The work of replayed CUDA graphs runs on the streams they were launched on, not ours.
    cuda::synchronize(impl_->device);
    const NcclCall nccl{impl_->comm, Clock::now() + options_.timeout, options_.timeout, nullptr};
    RG_NCCL(nccl, ncclCommFinalize(nccl.comm));
  } catch (const std::exception& e) {
    // A sticky CUDA error, or NCCL's: aborted, since a destructor must not throw.
    std::cerr << "ringgrad: the NCCL group of rank " << rank()
              << " is aborted, as finalizing it failed: " << e.what() << std::endl;
    ncclCommAbort(impl_->comm);
    return;
  }
  ncclCommDestroy(impl_->comm);
}

int ProcessGroupNCCL::device() const { return impl_->device; }

namespace {

// The host function of a modelled transfer: holds the stream for the time (a sleep, then a spin
// for the last stretch, which a sleep would overshoot by tens of microseconds).
void hold_stream(void* arg) {
  using C = std::chrono::steady_clock;
  const std::unique_ptr<double> us(static_cast<double*>(arg));
  const auto until = C::now() + std::chrono::duration_cast<C::duration>(
                                    std::chrono::duration<double, std::micro>(*us));
  constexpr auto kSpin = std::chrono::microseconds(200);
  if (until - C::now() > kSpin) std::this_thread::sleep_until(until - kSpin);
  while (C::now() < until) {
  }
}

}  // namespace

WorkPtr ProcessGroupNCCL::modelled_all_reduce(const Tensor& t, double us) {
  impl_->check_tensor(t, "all_reduce", "input");
  RG_CHECK(cuda::Graph::capturing() == nullptr && cuda::Graph::capturing(impl_->device) == nullptr,
           "all_reduce: a modelled transfer cannot be captured into a CUDA graph");
  RG_CHECK(us >= 0, "modelled_all_reduce: the time must be non-negative, got ", us);
  const std::string d = detail::cat(dtype_name(t.dtype()), "[", t.numel(), "], modelled ",
                                    static_cast<int64_t>(us + 0.5), " us");
  return impl_->enqueue("all_reduce", d, {t}, [&](cudaStream_t s, const NcclCall& nccl) {
    auto arg = std::make_unique<double>(us);
    (void)nccl;
    RG_CUDA_CHECK(cudaLaunchHostFunc(s, &hold_stream, arg.get()));
    arg.release();  // hold_stream owns it now
  });
}

WorkPtr ProcessGroupNCCL::all_reduce(const Tensor& t, ReduceOp op) {
  impl_->check_tensor(t, "all_reduce", "input");
  RG_CHECK(algorithm() != Algorithm::shm,
           "all_reduce: algorithm shm is gloo's (NCCL uses shared memory within a node itself)");
  const bool ring = algorithm() == Algorithm::ring;  // auto: native
  const std::string d = detail::cat(dtype_name(t.dtype()), "[", t.numel(), "], ",
                                    reduce_op_name(op), ring ? ", ring" : ", native");
  if (!ring) {
    return impl_->enqueue("all_reduce", d, {t}, [&](cudaStream_t s, const NcclCall& nccl) {
      RG_NCCL(nccl, ncclAllReduce(t.raw_data(), t.raw_data(), size_t(t.numel()),
                                  nccl_type(t.dtype()), nccl_op(op), nccl.comm, s));
    });
  }
  // Our ring: every exchange, reduction and the average's division queued on the communication
  // stream, with the receive buffer allocated for that stream (outside the capture's pool, so
  // not capturable).
  RG_CHECK(cuda::Graph::capturing() == nullptr && cuda::Graph::capturing(impl_->device) == nullptr,
           "all_reduce: algorithm ring cannot be captured into a CUDA graph (its receive buffer "
           "is allocated for the communication stream); use the native algorithm");
  Tensor scratch;
  {
    cuda::StreamGuard on_comm(*impl_->stream);
    const size_t bytes = ring_scratch_bytes(size_t(t.numel()), size(), element_size(t.dtype()));
    scratch = Tensor::empty({int64_t(bytes)}, DType::u8, Device::cuda(impl_->device));
  }
  return impl_->enqueue("all_reduce", d, {t, scratch}, [&](cudaStream_t s, const NcclCall& nccl) {
    NcclP2P p2p(nccl, s, rank(), size());
    dispatch_all(t.dtype(), [&]<class T>() {
      RingArgs a;
      a.data = t.raw_data();
      a.count = size_t(t.numel());
      a.element_size = sizeof(T);
      const auto cop = ring_op(op);
      a.reduce = [cop, s](void* dst, const void* src, size_t k) {
        kernels::cuda::collective_reduce(cop, static_cast<T*>(dst), static_cast<const T*>(dst),
                                         static_cast<const T*>(src), int64_t(k), s);
      };
      if (op == ReduceOp::avg) {
        const int64_t world = size();
        a.finalize = [world, s](void* x, size_t k) {
          kernels::cuda::divide_by(static_cast<T*>(x), int64_t(k), world, s);
        };
      }
      a.scratch = scratch.raw_data();
      a.chunk_bytes = options().ring_chunk_bytes;
      a.slot_base = ring_slot_base(nccl.seq);
      ring_all_reduce(p2p, a);
    });
  });
}

WorkPtr ProcessGroupNCCL::broadcast(const Tensor& t, int root) {
  impl_->check_tensor(t, "broadcast", "input");
  check_rank(root, "broadcast", "root");
  const std::string d = detail::cat(dtype_name(t.dtype()), "[", t.numel(), "], root ", root);
  return impl_->enqueue("broadcast", d, {t}, [&](cudaStream_t s, const NcclCall& nccl) {
    RG_NCCL(nccl, ncclBroadcast(t.raw_data(), t.raw_data(), size_t(t.numel()), nccl_type(t.dtype()),
                                root, nccl.comm, s));
  });
}

WorkPtr ProcessGroupNCCL::all_gather(const Tensor& output, const Tensor& input) {
  impl_->check_tensor(output, "all_gather", "output");
  impl_->check_tensor(input, "all_gather", "input");
  RG_CHECK(output.dtype() == input.dtype() && output.numel() == input.numel() * size(),
           "all_gather: output must hold group size ", size(), " x input ", input.numel(),
           " elements of the input's dtype");
  const std::string d = detail::cat(dtype_name(input.dtype()), "[", input.numel(), "]");
  return impl_->enqueue(
      "all_gather", d, {output, input}, [&](cudaStream_t s, const NcclCall& nccl) {
        RG_NCCL(nccl, ncclAllGather(input.raw_data(), output.raw_data(), size_t(input.numel()),
                                    nccl_type(input.dtype()), nccl.comm, s));
      });
}

WorkPtr ProcessGroupNCCL::reduce_scatter(const Tensor& output, const Tensor& input, ReduceOp op) {
  impl_->check_tensor(output, "reduce_scatter", "output");
  impl_->check_tensor(input, "reduce_scatter", "input");
  RG_CHECK(output.dtype() == input.dtype() && input.numel() == output.numel() * size(),
           "reduce_scatter: input must hold group size ", size(), " x output ", output.numel(),
           " elements of the output's dtype");
  const std::string d =
      detail::cat(dtype_name(input.dtype()), "[", input.numel(), "], ", reduce_op_name(op));
  return impl_->enqueue(
      "reduce_scatter", d, {output, input}, [&](cudaStream_t s, const NcclCall& nccl) {
        RG_NCCL(nccl, ncclReduceScatter(input.raw_data(), output.raw_data(), size_t(output.numel()),
                                        nccl_type(input.dtype()), nccl_op(op), nccl.comm, s));
      });
}

WorkPtr ProcessGroupNCCL::barrier() {
  // A captured barrier would not hold the host at its replays.
  RG_CHECK(cuda::Graph::capturing() == nullptr && cuda::Graph::capturing(impl_->device) == nullptr,
           "barrier: cannot be captured into a CUDA graph (a replay would not hold the host)");
  Tensor one = Tensor::empty({1}, DType::f32, Device::cuda(impl_->device));
  one.fill_(1.0);
  return impl_->enqueue(
      "barrier", "", {one},
      [&](cudaStream_t s, const NcclCall& nccl) {
        RG_NCCL(nccl, ncclAllReduce(one.raw_data(), one.raw_data(), 1, ncclFloat32, ncclSum,
                                    nccl.comm, s));
      },
      /*blocking=*/true);
}

WorkPtr ProcessGroupNCCL::send(const Tensor& t, int dst, uint32_t tag) {
  impl_->check_tensor(t, "send", "input");
  check_rank(dst, "send", "destination");
  // As Gloo does: NCCL takes a send to self only grouped with its receive; alone it would be
  // refused at enqueue and leave the whole group unusable.
  RG_CHECK(dst != rank(), "send: rank ", rank(), " cannot send to itself");
  RG_CHECK(tag == 0, "send: NCCL matches sends and receives by order, not by tag (tag ", tag, ")");
  const std::string d = detail::cat(dtype_name(t.dtype()), "[", t.numel(), "] to ", dst);
  return impl_->enqueue("send", d, {t}, [&](cudaStream_t s, const NcclCall& nccl) {
    RG_NCCL(nccl,
            ncclSend(t.raw_data(), size_t(t.numel()), nccl_type(t.dtype()), dst, nccl.comm, s));
  });
}

WorkPtr ProcessGroupNCCL::recv(const Tensor& t, int src, uint32_t tag) {
  impl_->check_tensor(t, "recv", "output");
  check_rank(src, "recv", "source");
  RG_CHECK(src != rank(), "recv: rank ", rank(), " cannot receive from itself");
  RG_CHECK(tag == 0, "recv: NCCL matches sends and receives by order, not by tag (tag ", tag, ")");
  const std::string d = detail::cat(dtype_name(t.dtype()), "[", t.numel(), "] from ", src);
  return impl_->enqueue("recv", d, {t}, [&](cudaStream_t s, const NcclCall& nccl) {
    RG_NCCL(nccl,
            ncclRecv(t.raw_data(), size_t(t.numel()), nccl_type(t.dtype()), src, nccl.comm, s));
  });
}

}  // namespace rg::dist
