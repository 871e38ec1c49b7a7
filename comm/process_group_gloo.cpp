// ProcessGroupGloo: gloo's TCP transport and algorithms behind our ProcessGroup/Work, a worker
// thread that runs collectives in issue order, our ring over unbound buffers, and error messages
// that name the operation and the ranks that never joined it.
#include "comm/process_group_gloo.h"

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>

#include <csignal>
#include <cstring>
#include <deque>
#include <thread>

#include "comm/prefix_store.h"
#include "comm/progress_board.h"
#include "comm/ring_allreduce.h"
#include "comm/shm_group.h"
#include "engine/dispatch.h"
#include "kernels/cpu/collective_reduce.h"
#include "kernels/error.h"

namespace rg::dist {
namespace {

using Clock = std::chrono::steady_clock;
namespace kcpu = rg::kernels::cpu;

// Gloo's rendezvous goes through our store.
class GlooStoreAdapter : public gloo::rendezvous::Store {
 public:
  GlooStoreAdapter(std::shared_ptr<dist::Store> store, Millis timeout)
      : store_(std::move(store)), timeout_(timeout) {}
  void set(const std::string& key, const std::vector<char>& data) override {
    store_->set(key, Bytes(data.begin(), data.end()));
  }
  std::vector<char> get(const std::string& key) override {
    Bytes b = store_->get(key, timeout_);
    return {b.begin(), b.end()};
  }
  void wait(const std::vector<std::string>& keys) override { store_->wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& t) override {
    store_->wait(keys, t);
  }

 private:
  std::shared_ptr<dist::Store> store_;
  Millis timeout_;
};

std::chrono::milliseconds until(Clock::time_point deadline) {
  if (deadline == Clock::time_point::max()) return gloo::transport::kUnsetTimeout;
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return std::max(ms, std::chrono::milliseconds(1));
}

class GlooOp : public P2POp {
 public:
  GlooOp(std::unique_ptr<gloo::transport::UnboundBuffer> buf, bool is_send)
      : buf_(std::move(buf)), is_send_(is_send) {}
  void wait(Clock::time_point deadline) override {
    const bool ok = is_send_ ? buf_->waitSend(until(deadline)) : buf_->waitRecv(until(deadline));
    RG_CHECK(ok, is_send_ ? "send" : "recv", " was aborted");
  }

 private:
  std::unique_ptr<gloo::transport::UnboundBuffer> buf_;
  bool is_send_;
};

class GlooP2P : public PointToPoint {
 public:
  explicit GlooP2P(std::shared_ptr<gloo::Context> ctx) : ctx_(std::move(ctx)) {}
  int rank() const override { return ctx_->rank; }
  int size() const override { return ctx_->size; }
  std::unique_ptr<P2POp> isend(const void* data, size_t bytes, int peer, uint64_t slot) override {
    auto buf = ctx_->createUnboundBuffer(const_cast<void*>(data), bytes);
    buf->send(peer, slot);
    return std::make_unique<GlooOp>(std::move(buf), true);
  }
  std::unique_ptr<P2POp> irecv(void* data, size_t bytes, int peer, uint64_t slot) override {
    auto buf = ctx_->createUnboundBuffer(data, bytes);
    buf->recv(peer, slot);
    return std::make_unique<GlooOp>(std::move(buf), false);
  }

 private:
  std::shared_ptr<gloo::Context> ctx_;
};

kcpu::CollectiveOp collective_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::max:
      return kcpu::CollectiveOp::max;
    case ReduceOp::min:
      return kcpu::CollectiveOp::min;
    default:
      return kcpu::CollectiveOp::sum;  // avg = sum, then divide
  }
}

// Gloo's algorithms only look at an element's size; these stand in for our 2-byte floats.
template <class T>
using GlooType =
    std::conditional_t<std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>, uint16_t, T>;

std::string tensor_detail(const Tensor& t) {
  return detail::cat(dtype_name(t.dtype()), "[", t.numel(), "]");
}

class P2PWork : public Work {
 public:
  // Holds `tensor` so its memory outlives the transfer.
  P2PWork(std::string op, Tensor tensor, std::unique_ptr<P2POp> p2p, Millis default_timeout)
      : Work(std::move(op), 0),
        tensor_(std::move(tensor)),
        p2p_(std::move(p2p)),
        default_timeout_(default_timeout) {}
  void wait(std::optional<Millis> timeout) override {
    {
      std::lock_guard lock(wait_mu_);
      if (p2p_) {
        std::exception_ptr error;
        try {
          p2p_->wait(Clock::now() + timeout.value_or(default_timeout_));
        } catch (const std::exception& e) {
          error = std::make_exception_ptr(Error(op() + " failed: " + e.what()));
        }
        p2p_.reset();
        tensor_ = Tensor();
        finish(error);
      }
    }
    Work::wait(std::nullopt);
  }

 private:
  std::mutex wait_mu_;
  Tensor tensor_;
  std::unique_ptr<P2POp> p2p_;
  Millis default_timeout_;
};

}  // namespace

struct ProcessGroupGloo::Impl {
  struct Task {
    WorkPtr work;
    std::string detail;
    std::function<void(uint64_t seq, Clock::time_point deadline)> run;
  };

  ProcessGroupGloo& pg;
  std::shared_ptr<Store> store;
  std::shared_ptr<gloo::transport::Device> device;
  std::shared_ptr<gloo::rendezvous::Context> context;
  std::unique_ptr<GlooP2P> p2p;
  std::unique_ptr<ShmGroup> shm;  // null unless every rank is on this host
  std::unique_ptr<ProgressBoard> board;

  std::mutex mu;
  std::condition_variable cv;
  std::deque<Task> queue;
  uint64_t next_seq = 1;
  bool stop = false;
  std::string broken;  // the first failure; later operations fail with it
  std::thread worker;

  explicit Impl(ProcessGroupGloo& p) : pg(p) {}

  WorkPtr enqueue(const char* op, std::string detail,
                  std::function<void(uint64_t, Clock::time_point)> fn) {
    std::lock_guard lock(mu);
    auto work = std::make_shared<Work>(op, next_seq++);
    queue.push_back(Task{work, std::move(detail), std::move(fn)});
    cv.notify_one();
    return work;
  }

  void loop() {
    for (;;) {
      Task task;
      {
        std::unique_lock lock(mu);
        cv.wait(lock, [&] { return stop || !queue.empty(); });
        if (queue.empty()) return;
        task = std::move(queue.front());
        queue.pop_front();
      }
      execute(task);
    }
  }

  void execute(Task& task) {
    Work& w = *task.work;
    if (!broken.empty()) {
      w.finish(std::make_exception_ptr(Error(pg.describe(w.op(), w.seq(), task.detail) +
                                             " was not run: process group '" + pg.options().name +
                                             "' is unusable after an earlier failure: " + broken)));
      return;
    }
    w.mark_started();
    board->started(w.seq());
    try {
      task.run(w.seq(), w.start_time() + pg.options().timeout);
      w.finish();
    } catch (const std::exception& e) {
      broken = failure_message(w, task.detail, e.what());
      w.finish(std::make_exception_ptr(Error(broken)));
    }
  }

  std::string failure_message(const Work& w, const std::string& detail, std::string cause) {
    const bool timed_out = cause.find("imed out") != std::string::npos;
    std::string msg = pg.describe(w.op(), w.seq(), detail);
    if (timed_out)
      msg += detail::cat(" timed out after ", pg.options().timeout.count(), " ms");
    else
      msg += " failed: lost the connection to a peer (did a rank exit or crash?)";
    if (auto behind = board->ranks_behind(w.seq()))
      msg += behind->empty() ? "; every rank had started it"
                             : "; ranks that have not joined it: " + format_ranks(*behind);
    else
      msg += "; the other ranks' progress could not be read from the store";
    // Gloo's messages start with a source location; keep its last line, shortened.
    if (cause.size() > 300) cause = cause.substr(0, 300) + "...";
    return msg + " [" + cause + "]";
  }

  void join(int rank, int size) {
    const auto& opt = pg.options();
    store->set("joined/" + std::to_string(rank), "1");
    std::vector<std::string> keys;
    for (int r = 0; r < size; ++r) keys.push_back("joined/" + std::to_string(r));
    try {
      store->wait(keys, opt.timeout);
    } catch (const std::exception&) {
      std::vector<int> missing;
      for (int r = 0; r < size; ++r)
        if (!store->check({keys[size_t(r)]})) missing.push_back(r);
      RG_FAIL("process group '", opt.name, "' (gloo): rank ", rank, " of ", size, " waited ",
              opt.timeout.count(),
              " ms for the others to join; missing ranks: ", format_ranks(missing));
    }
    gloo::transport::tcp::attr attr;
    attr.hostname = opt.hostname.empty() ? "127.0.0.1" : opt.hostname;
    device = gloo::transport::tcp::CreateDevice(attr);
    context = std::make_shared<gloo::rendezvous::Context>(rank, size);
    context->setTimeout(opt.timeout);
    GlooStoreAdapter adapter(std::make_shared<PrefixStore>("gloo", store), opt.timeout);
    try {
      context->connectFullMesh(adapter, device);
    } catch (const std::exception& e) {
      RG_FAIL("process group '", opt.name, "' (gloo): rank ", rank,
              " could not connect to its peers: ", e.what());
    }
  }

  // ---- the operations, run on the worker thread -------------------------------------------

  // The ring's receive buffer, kept between operations: allocating (and zeroing) tens of MiB per
  // all-reduce cost more than a fifth of the time of a large one.
  std::unique_ptr<uint8_t[]> scratch;
  size_t scratch_bytes = 0;
  void* scratch_of(size_t bytes) {
    if (bytes > scratch_bytes) {
      scratch.reset(new uint8_t[bytes]);  // uninitialized on purpose
      scratch_bytes = bytes;
    }
    return scratch.get();
  }

  template <class T>
  void native_all_reduce(T* data, size_t n, ReduceOp op, uint32_t tag, Clock::time_point dl) {
    if (n == 0 || pg.size() == 1) return;
    gloo::AllreduceOptions o(context);
    o.setOutput(reinterpret_cast<GlooType<T>*>(data), n);
    const auto cop = collective_op(op);
    o.setReduceFunction([cop](void* c, const void* a, const void* b, size_t count) {
      kcpu::collective_reduce(cop, static_cast<T*>(c), static_cast<const T*>(a),
                              static_cast<const T*>(b), int64_t(count));
    });
    o.setTag(tag);
    o.setTimeout(until(dl));
    gloo::allreduce(o);
  }

  // The average's division of each fully reduced block (empty for the other ops), for our
  // algorithms.
  template <class T>
  std::function<void(void*, size_t)> finalizer(ReduceOp op) const {
    if (op != ReduceOp::avg) return {};
    const int64_t world = pg.size();
    return [world](void* d, size_t k) { kcpu::divide_by(static_cast<T*>(d), int64_t(k), world); };
  }

  template <class T>
  void shm_all_reduce(T* data, size_t n, ReduceOp op, Clock::time_point dl) {
    ShmReduceArgs a;
    a.data = data;
    a.count = n;
    a.element_size = sizeof(T);
    const auto cop = collective_op(op);
    a.reduce = [cop](void* out, const void* x, const void* y, size_t k) {
      kcpu::collective_reduce(cop, static_cast<T*>(out), static_cast<const T*>(x),
                              static_cast<const T*>(y), int64_t(k));
    };
    a.finalize = finalizer<T>(op);
    a.deadline = dl;
    shm->all_reduce(a);
  }

  template <class T>
  RingArgs ring_args(T* data, size_t n, ReduceOp op, uint64_t seq, Clock::time_point dl) {
    RingArgs a;
    a.data = data;
    a.count = n;
    a.element_size = sizeof(T);
    const auto cop = collective_op(op);
    a.reduce = [cop](void* dst, const void* src, size_t k) {
      kcpu::collective_reduce(cop, static_cast<T*>(dst), static_cast<const T*>(dst),
                              static_cast<const T*>(src), int64_t(k));
    };
    a.finalize = finalizer<T>(op);
    a.scratch = scratch_of(ring_scratch_bytes(n, pg.size(), sizeof(T)));
    a.chunk_bytes = pg.options().ring_chunk_bytes;
    a.slot_base = ring_slot_base(seq);
    a.deadline = dl;
    return a;
  }
};

ProcessGroupGloo::ProcessGroupGloo(std::shared_ptr<Store> store, int rank, int size,
                                   ProcessGroupOptions options)
    : ProcessGroup(rank, size, std::move(options)), impl_(std::make_unique<Impl>(*this)) {
  RG_CHECK(store != nullptr, "ProcessGroupGloo needs a store");
  // Gloo writes to peer sockets without MSG_NOSIGNAL: a peer that died must give us an error
  // naming it, not a SIGPIPE that kills this rank too.
  std::signal(SIGPIPE, SIG_IGN);
  impl_->store = std::make_shared<PrefixStore>("pg/" + options_.name, std::move(store));
  impl_->join(rank, size);
  impl_->p2p = std::make_unique<GlooP2P>(impl_->context);
  impl_->shm = ShmGroup::create(*impl_->store, rank, size, options_.shm_chunk_bytes,
                                options_.timeout);
  impl_->board = std::make_unique<ProgressBoard>(impl_->store, rank, size);
  impl_->worker = std::thread([this] { impl_->loop(); });
}

ProcessGroupGloo::~ProcessGroupGloo() {
  {
    std::lock_guard lock(impl_->mu);
    impl_->stop = true;
  }
  impl_->cv.notify_all();
  impl_->worker.join();  // runs what was issued: every rank issued the same collectives
}

bool ProcessGroupGloo::has_shared_memory() const { return impl_->shm != nullptr; }

// `automatic` resolved: shm where the group has it, else native. An explicit shm without a
// segment is refused on the caller's thread (a group of one has nothing to share: native).
Algorithm ProcessGroupGloo::effective_algorithm(const char* op) const {
  switch (algorithm()) {
    case Algorithm::automatic:
      return has_shared_memory() ? Algorithm::shm : Algorithm::native;
    case Algorithm::shm:
      RG_CHECK(has_shared_memory() || size() == 1, op,
               ": algorithm shm needs every rank of the group on one host (and /dev/shm); "
               "use native or ring");
      return size() == 1 ? Algorithm::native : Algorithm::shm;
    default:
      return algorithm();
  }
}

WorkPtr ProcessGroupGloo::all_reduce(const Tensor& t, ReduceOp op) {
  check_tensor(t, "all_reduce", "input");
  const Algorithm algo = effective_algorithm("all_reduce");
  std::string detail =
      detail::cat(tensor_detail(t), ", ", reduce_op_name(op), ", ", algorithm_name(algo));
  return impl_->enqueue("all_reduce", std::move(detail),
                        [this, t, op, algo](uint64_t seq, Clock::time_point dl) {
                          dispatch_all(t.dtype(), [&]<class T>() {
                            T* data = t.data<T>();
                            const size_t n = size_t(t.numel());
                            if (algo == Algorithm::native) {
                              impl_->native_all_reduce(data, n, op, uint32_t(seq), dl);
                              if (op == ReduceOp::avg) kcpu::divide_by(data, int64_t(n), size());
                            } else if (algo == Algorithm::shm) {
                              impl_->shm_all_reduce(data, n, op, dl);
                            } else {
                              ring_all_reduce(*impl_->p2p, impl_->ring_args(data, n, op, seq, dl));
                            }
                          });
                        });
}

WorkPtr ProcessGroupGloo::broadcast(const Tensor& t, int root) {
  check_tensor(t, "broadcast", "input");
  check_rank(root, "broadcast", "root");
  // Gloo's broadcast unless shared memory is asked for (or picked by auto).
  const bool shm = effective_algorithm("broadcast") == Algorithm::shm;
  std::string detail = detail::cat(tensor_detail(t), ", root ", root, shm ? ", shm" : "");
  return impl_->enqueue(
      "broadcast", std::move(detail), [this, t, root, shm](uint64_t seq, Clock::time_point dl) {
        if (t.numel() == 0 || size() == 1) return;
        if (shm) return impl_->shm->broadcast(t.raw_data(), t.nbytes(), root, dl);
        dispatch_all(t.dtype(), [&]<class T>() {
          gloo::BroadcastOptions o(impl_->context);
          o.setOutput(reinterpret_cast<GlooType<T>*>(t.data<T>()), size_t(t.numel()));
          o.setRoot(root);
          o.setTag(uint32_t(seq));
          o.setTimeout(until(dl));
          gloo::broadcast(o);
        });
      });
}

WorkPtr ProcessGroupGloo::all_gather(const Tensor& output, const Tensor& input) {
  check_tensor(output, "all_gather", "output");
  check_tensor(input, "all_gather", "input");
  RG_CHECK(output.dtype() == input.dtype(), "all_gather: output dtype ", dtype_name(output.dtype()),
           " differs from input dtype ", dtype_name(input.dtype()));
  RG_CHECK(output.numel() == input.numel() * size(), "all_gather: output has ", output.numel(),
           " elements; expected group size ", size(), " x input ", input.numel());
  const Algorithm algo = effective_algorithm("all_gather");
  std::string detail = detail::cat(tensor_detail(input), ", ", algorithm_name(algo));
  return impl_->enqueue("all_gather", std::move(detail),
                        [this, output, input, algo](uint64_t seq, Clock::time_point dl) {
                          dispatch_all(input.dtype(), [&]<class T>() {
                            const size_t n = size_t(input.numel());
                            T* out = output.data<T>();
                            if (n == 0) return;
                            if (size() == 1) {
                              std::memcpy(out, input.data<T>(), n * sizeof(T));
                            } else if (algo == Algorithm::native) {
                              gloo::AllgatherOptions o(impl_->context);
                              o.setInput(reinterpret_cast<GlooType<T>*>(input.data<T>()), n);
                              o.setOutput(reinterpret_cast<GlooType<T>*>(out), n * size_t(size()));
                              o.setTag(uint32_t(seq));
                              o.setTimeout(until(dl));
                              gloo::allgather(o);
                            } else if (algo == Algorithm::shm) {
                              impl_->shm->all_gather(input.data<T>(), out, n * sizeof(T), dl);
                            } else {
                              std::memcpy(out + n * size_t(rank()), input.data<T>(), n * sizeof(T));
                              RingArgs a =
                                  impl_->ring_args(out, n * size_t(size()), ReduceOp::sum, seq, dl);
                              ring_all_gather(*impl_->p2p, a);
                            }
                          });
                        });
}

WorkPtr ProcessGroupGloo::reduce_scatter(const Tensor& output, const Tensor& input, ReduceOp op) {
  check_tensor(output, "reduce_scatter", "output");
  check_tensor(input, "reduce_scatter", "input");
  RG_CHECK(output.dtype() == input.dtype(), "reduce_scatter: output dtype ",
           dtype_name(output.dtype()), " differs from input dtype ", dtype_name(input.dtype()));
  RG_CHECK(input.numel() == output.numel() * size(), "reduce_scatter: input has ", input.numel(),
           " elements; expected group size ", size(), " x output ", output.numel());
  const Algorithm algo = effective_algorithm("reduce_scatter");
  std::string detail =
      detail::cat(tensor_detail(input), ", ", reduce_op_name(op), ", ", algorithm_name(algo));
  return impl_->enqueue(
      "reduce_scatter", std::move(detail),
      [this, output, input, op, algo](uint64_t seq, Clock::time_point dl) {
        dispatch_all(input.dtype(), [&]<class T>() {
          const size_t m = size_t(output.numel()), n = m * size_t(size());
          if (m == 0) return;
          // Both algorithms reduce a copy: the caller's input stays as it was.
          std::vector<T> work(input.data<T>(), input.data<T>() + n);
          if (algo == Algorithm::native) {
            // Gloo has no reduce-scatter with unbound buffers; like PyTorch, all-reduce and keep
            // our block.
            impl_->native_all_reduce(work.data(), n, op, uint32_t(seq), dl);
            if (op == ReduceOp::avg)
              kcpu::divide_by(work.data() + m * size_t(rank()), int64_t(m), size());
          } else if (algo == Algorithm::shm) {
            impl_->shm_all_reduce(work.data(), n, op, dl);  // as native: all-reduce, keep ours
          } else {
            ring_reduce_scatter(*impl_->p2p, impl_->ring_args(work.data(), n, op, seq, dl));
          }
          std::memcpy(output.data<T>(), work.data() + m * size_t(rank()), m * sizeof(T));
        });
      });
}

WorkPtr ProcessGroupGloo::barrier() {
  const bool shm = effective_algorithm("barrier") == Algorithm::shm;
  return impl_->enqueue("barrier", shm ? "shm" : "", [this, shm](uint64_t seq, Clock::time_point dl) {
    if (size() == 1) return;
    if (shm) return impl_->shm->barrier(dl);
    gloo::BarrierOptions o(impl_->context);
    o.setTag(uint32_t(seq));
    o.setTimeout(until(dl));
    gloo::barrier(o);
  });
}

namespace {
uint64_t p2p_slot(uint32_t tag) { return (uint64_t(0x53) << 56) | tag; }
}  // namespace

WorkPtr ProcessGroupGloo::send(const Tensor& t, int dst, uint32_t tag) {
  check_tensor(t, "send", "input");
  check_rank(dst, "send", "destination");
  RG_CHECK(dst != rank(), "send: rank ", rank(), " cannot send to itself");
  const std::string op =
      detail::cat("send of ", tensor_detail(t), " to rank ", dst, " (tag ", tag, ")");
  if (t.numel() == 0) {
    auto w = std::make_shared<Work>(op, 0);
    w->finish();
    return w;
  }
  return std::make_shared<P2PWork>(
      op, t, impl_->p2p->isend(t.raw_data(), t.nbytes(), dst, p2p_slot(tag)), options().timeout);
}

WorkPtr ProcessGroupGloo::recv(const Tensor& t, int src, uint32_t tag) {
  check_tensor(t, "recv", "output");
  check_rank(src, "recv", "source");
  RG_CHECK(src != rank(), "recv: rank ", rank(), " cannot receive from itself");
  const std::string op =
      detail::cat("recv of ", tensor_detail(t), " from rank ", src, " (tag ", tag, ")");
  if (t.numel() == 0) {
    auto w = std::make_shared<Work>(op, 0);
    w->finish();
    return w;
  }
  return std::make_shared<P2PWork>(
      op, t, impl_->p2p->irecv(t.raw_data(), t.nbytes(), src, p2p_slot(tag)), options().timeout);
}

}  // namespace rg::dist
