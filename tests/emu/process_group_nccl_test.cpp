// ProcessGroupNCCL with threads as ranks, each on its own emulated device (RG_EMU_DEVICES=3, one
// process, one HashStore): a barrier that holds the host until every rank has arrived, argument
// errors refused before anything is queued, ranks given one device named before NCCL is called,
// and NCCL's own explanation in a failed call's error. The multi-process runs (emu.dist.*) check
// every collective and dtype, DDP and the watchdog's faults.
#include "comm/process_group_nccl.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "comm/ddp.h"
#include "comm/gpu_per_rank.h"
#include "comm/hash_store.h"
#include "engine/cuda/device_guard.h"
#include "engine/cuda/graph.h"
#include "engine/cuda/runtime.h"
#include "engine/cuda/stream.h"
#include "engine/device_checks.h"
#include "engine/ops/factory.h"
#include "engine/ops/loss.h"
#include "engine/tensor.h"
#include "kernels/emu/device_properties.h"
#include "kernels/emu/shim/nccl.h"
#include "layers/models/registry.h"
#include "layers/optim/optimizer.h"
#include "support/collective_checks.h"
#include "support/errors.h"
#include "support/run_ranks.h"

namespace rg::dist {
namespace {

using namespace std::chrono_literals;
using rg::testing::expect_error;
using rg::testing::run_ranks;

constexpr int kWorld = 3;

ProcessGroupOptions options() {
  ProcessGroupOptions o;
  o.timeout = 60s;
  return o;
}

class ProcessGroupNcclThreads : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(nccl_available());
    ASSERT_GE(cuda::runtime().device_count(), kWorld)
        << "run with RG_EMU_DEVICES=" << kWorld << " (ctest sets it)";
  }
};

// Collectives do not block the host (wait() orders the current stream); a barrier does, until
// the last rank has called it.
TEST_F(ProcessGroupNcclThreads, BarrierHoldsTheHostUntilEveryRankArrives) {
  auto store = std::make_shared<HashStore>();
  run_ranks(kWorld, [&](int rank) {
    ProcessGroupNCCL pg(store, rank, kWorld, options());
    pg.barrier()->wait();  // everyone has joined
    const auto t0 = std::chrono::steady_clock::now();
    if (rank == kWorld - 1) std::this_thread::sleep_for(300ms);
    WorkPtr w = pg.barrier();
    w->wait();
    EXPECT_TRUE(w->is_completed());
    if (rank != kWorld - 1) {
      EXPECT_GE(std::chrono::steady_clock::now() - t0, 250ms)
          << "rank " << rank << "'s barrier returned before the late rank arrived";
    }
  });
}

TEST_F(ProcessGroupNcclThreads, BadArgumentsAreRefusedAndLeaveTheGroupUsable) {
  constexpr int kPair = 2;
  auto store = std::make_shared<HashStore>();
  run_ranks(kPair, [&](int rank) {
    ProcessGroupNCCL pg(store, rank, kPair, options());
    const int peer = 1 - rank;
    const Device mine = Device::cuda(rank);
    const Tensor t = Tensor::empty({8}, DType::f32, mine);
    const std::string on = "; this NCCL group uses cuda:" + std::to_string(rank);
    expect_error([&] { pg.all_reduce(Tensor::empty({8})); },
                 "all_reduce: the input tensor is on cpu" + on);
    expect_error([&] { pg.broadcast(Tensor::empty({8}, DType::f32, Device::cuda(peer)), 0); },
                 "broadcast: the input tensor is on cuda:" + std::to_string(peer) + on);
    expect_error([&] { pg.all_reduce(Tensor()); }, "all_reduce: the input tensor is undefined");
    expect_error([&] { pg.broadcast(t, 2); },
                 "broadcast: root rank 2 is outside the group of size 2");
    expect_error([&] { pg.all_gather(Tensor::empty({8}, DType::f32, mine), t); },
                 "all_gather: output must hold group size 2 x input 8 elements");
    expect_error([&] { pg.all_gather(Tensor::empty({16}, DType::f64, mine), t); },
                 "of the input's dtype");
    expect_error([&] { pg.reduce_scatter(t, Tensor::empty({8}, DType::f32, mine)); },
                 "reduce_scatter: input must hold group size 2 x output 8 elements");
    expect_error([&] { pg.send(t, peer, 3); },
                 "send: NCCL matches sends and receives by order, not by tag (tag 3)");
    expect_error([&] { pg.recv(t, peer, 3); },
                 "recv: NCCL matches sends and receives by order, not by tag (tag 3)");
    expect_error([&] { pg.send(t, 5); }, "send: destination rank 5 is outside the group");
    expect_error([&] { pg.recv(t, -1); }, "recv: source rank -1 is outside the group");
    expect_error([&] { pg.send(t, rank); },
                 "send: rank " + std::to_string(rank) + " cannot send to itself");
    expect_error([&] { pg.recv(t, rank); },
                 "recv: rank " + std::to_string(rank) + " cannot receive from itself");
    // Shared memory is gloo's algorithm; automatic (the default) means native on NCCL.
    pg.set_algorithm(Algorithm::shm);
    expect_error([&] { pg.all_reduce(t); },
                 "all_reduce: algorithm shm is gloo's (NCCL uses shared memory within a node "
                 "itself)");
    pg.set_algorithm(Algorithm::automatic);
    // Nothing was queued: the next collective is #1 on both ranks, and the group works.
    Tensor one = Tensor::empty({1}, DType::f32, mine);
    one.fill_(1.0);
    WorkPtr w = pg.all_reduce(one);
    EXPECT_EQ(w->seq(), 1u);
    w->wait();
    EXPECT_EQ(one.to(Device::cpu()).item<float>(), 2.0f);
    rg::testing::check_all_reduce(pg, DType::f32, 100, ReduceOp::sum);
    rg::testing::check_send_recv(pg, DType::f32, 100);
  });
}

// The UUID of emulated device `device`, as the group prints it.
std::string uuid_of(int device) {
  cudaDeviceProp prop{};
  EXPECT_EQ(cudaGetDeviceProperties(&prop, device), cudaSuccess);
  return format_gpu_uuid(prop.uuid.bytes);
}

// Threads as ranks on the given devices: every rank's constructor must throw, within 30 s (no rank
// may wait in NCCL's init for a peer that gave up); returns each rank's message.
std::vector<std::string> construction_errors(const std::vector<int>& devices) {
  const int n = int(devices.size());
  auto store = std::make_shared<HashStore>();
  std::vector<std::string> errors(static_cast<size_t>(n));
  const auto t0 = std::chrono::steady_clock::now();
  run_ranks(n, [&](int rank) {
    try {
      ProcessGroupNCCL pg(store, rank, n, options(), devices[size_t(rank)]);
      ADD_FAILURE() << "rank " << rank << " made its NCCL group on a shared device";
    } catch (const Error& e) {
      errors[size_t(rank)] = e.what();
    }
  });
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 30s);
  return errors;
}

TEST_F(ProcessGroupNcclThreads, RanksSharingADeviceAreNamedOnEveryRankBeforeNcclIsCalled) {
  const std::string fix =
      ": NCCL needs one GPU per rank; start at most 3 ranks per node (--nproc-per-node) or use "
      "--backend gloo";
  const std::string pairs = "ranks 0 and 2 both use GPU 0 (" + uuid_of(0) +
                            "); ranks 1 and 3 both use GPU 1 (" + uuid_of(1) + ")" + fix;
  for (const std::string& e : construction_errors({0, 1, 0, 1})) EXPECT_EQ(e, pairs);
  const std::string three = "ranks 0, 1 and 2 all use GPU 2 (" + uuid_of(2) + ")" + fix;
  for (const std::string& e : construction_errors({2, 2, 2})) EXPECT_EQ(e, three);
  // A device of its own for each: the group works.
  auto store = std::make_shared<HashStore>();
  run_ranks(2, [&](int rank) {
    ProcessGroupNCCL pg(store, rank, 2, options(), 1 - rank);
    rg::testing::check_all_reduce(pg, DType::f32, 10, ReduceOp::sum);
  });
}

// Destroying a group with a collective pending that a peer has not joined (it is alive, but
// elsewhere) ends within the group's timeout: the watchdog times the collective out and aborts the
// communicator; after a second it says on stderr what it waits for. It used to wait for the
// device, which NCCL's kernels would hold until the peer came (here 4 s later; on a GPU possibly
// never).
TEST_F(ProcessGroupNcclThreads, DestroyingAGroupWithACollectiveAPeerNeverJoinedEndsInItsTimeout) {
  auto store = std::make_shared<HashStore>();
  ProcessGroupOptions o;
  o.timeout = 1500ms;
  std::atomic<bool> destroyed{false};
  std::chrono::steady_clock::duration took{};
  std::string error, said;
  run_ranks(2, [&](int rank) {
    cuda::DeviceGuard guard(rank);
    auto pg = std::make_unique<ProcessGroupNCCL>(store, rank, 2, o);
    pg->barrier()->wait();
    const Tensor t = full({16}, 1.0, DType::f32, Device::cuda(rank));
    if (rank == 0) {
      WorkPtr w = pg->all_reduce(t);
      const auto t0 = std::chrono::steady_clock::now();
      ::testing::internal::CaptureStderr();
      pg.reset();
      said = ::testing::internal::GetCapturedStderr();
      took = std::chrono::steady_clock::now() - t0;
      destroyed = true;
      error = testing::error_of([&] { w->wait(); });
      return;
    }
    // Rank 1 goes elsewhere for 4 s, then issues the collective rank 0 abandoned.
    for (int i = 0; i < 400 && !destroyed; ++i) std::this_thread::sleep_for(10ms);
    WorkPtr w = pg->all_reduce(t);
    (void)testing::error_of([&] { w->wait(); });  // fails: rank 0 aborted
  });
  EXPECT_LT(took, 3s) << "the destructor waited for the peer";
  EXPECT_NE(error.find("timed out after 1500 ms; ranks that have not joined it: 1"),
            std::string::npos)
      << error;
  EXPECT_NE(said.find("ringgrad: destroying the NCCL group waits for 1 pending collective(s), the "
                      "oldest all_reduce #2"),
            std::string::npos)
      << said;
  EXPECT_NE(said.find("until they finish or time out (1500 ms after their issue)"),
            std::string::npos)
      << said;
}

// Destroyed by an exception's unwinding, with a collective its peer has not joined: the group is
// aborted at once, saying so on stderr, instead of waiting for the collective's timeout (a minute
// here); the pending work fails with that reason.
TEST_F(ProcessGroupNcclThreads, DestroyingAGroupDuringAnExceptionAbortsItAtOnce) {
  auto store = std::make_shared<HashStore>();
  std::atomic<bool> destroyed{false};
  std::chrono::steady_clock::duration took{};
  std::string error, said;
  run_ranks(2, [&](int rank) {
    cuda::DeviceGuard guard(rank);
    auto pg = std::make_unique<ProcessGroupNCCL>(store, rank, 2, options());
    pg->barrier()->wait();  // connected
    const Tensor t = full({16}, 1.0, DType::f32, Device::cuda(rank));
    if (rank == 0) {
      WorkPtr w;
      std::chrono::steady_clock::time_point t0;
      ::testing::internal::CaptureStderr();
      try {
        const std::unique_ptr<ProcessGroupNCCL> owned = std::move(pg);
        w = owned->all_reduce(t);
        t0 = std::chrono::steady_clock::now();
        throw std::runtime_error("the step failed");
      } catch (const std::runtime_error&) {
        took = std::chrono::steady_clock::now() - t0;
      }
      said = ::testing::internal::GetCapturedStderr();
      destroyed = true;
      error = testing::error_of([&] { w->wait(); });
      return;
    }
    while (!destroyed) std::this_thread::sleep_for(10ms);
    (void)testing::error_of([&] { pg->all_reduce(t)->wait(); });  // fails: rank 0 aborted
  });
  EXPECT_LT(took, 5s) << "the destructor waited for the collective's timeout";
  const std::string want =
      "the NCCL group of rank 0 is aborted with 1 pending collective(s), the oldest all_reduce #2 "
      "(f32[16], sum, native) on rank 0 of 2, as it is destroyed by an exception";
  EXPECT_NE(said.find("ringgrad: " + want), std::string::npos) << said;
  EXPECT_NE(error.find(want), std::string::npos) << error;
}

// NCCL connects a rank to its peers on the host at first use (a communicator's first collective,
// its first send to or receive from a peer) and waits there for each peer's own such call. With
// the group's nonblocking communicator (the default) a peer that never makes it costs the
// collective's timeout, then the work fails naming the rank that never joined, and the group is
// aborted; a blocking communicator would wait inside that call for good, holding its issuer.
TEST_F(ProcessGroupNcclThreads, AFirstCollectiveAPeerNeverMakesFailsAtItsTimeoutWhenIssued) {
  auto store = std::make_shared<HashStore>();
  ProcessGroupOptions o;
  o.timeout = 1500ms;
  std::atomic<bool> checked{false};
  std::chrono::steady_clock::duration took{};
  std::string error, later;
  run_ranks(2, [&](int rank) {
    cuda::DeviceGuard guard(rank);
    ProcessGroupNCCL pg(store, rank, 2, o);
    if (rank == 1) {  // goes elsewhere, and leaves without a collective
      // At most 10 s: were the call to block without end, rank 1's leaving would end it.
      for (int i = 0; i < 1000 && !checked; ++i) std::this_thread::sleep_for(10ms);
      return;
    }
    const Tensor t = full({16}, 1.0, DType::f32, Device::cuda(rank));
    const auto t0 = std::chrono::steady_clock::now();
    WorkPtr w = pg.all_reduce(t);
    took = std::chrono::steady_clock::now() - t0;
    error = testing::error_of([&] { w->wait(); });
    later = testing::error_of([&] { pg.all_reduce(t)->wait(); });
    checked = true;
  });
  EXPECT_GE(took, 1400ms);
  EXPECT_LT(took, 5s);
  EXPECT_NE(error.find("all_reduce #1 (f32[16], sum, native) on rank 0 of 2 could not be queued: "
                       "NCCL was still connecting this rank to its peers 1500 ms after "
                       "ncclAllReduce"),
            std::string::npos)
      << error;
  EXPECT_NE(error.find("; ranks that have not joined it: 1"), std::string::npos) << error;
  EXPECT_NE(later.find("unusable after an earlier failure"), std::string::npos) << later;
}

// Sets an environment variable for its lifetime.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) { setenv(name, value, 1); }
  ~ScopedEnv() { unsetenv(name_); }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
};

// RG_NCCL_NONBLOCKING=0 makes the communicators blocking (NCCL's default): the same collectives,
// values and ring; but a first collective waits inside NCCL for its peers without end (here a
// peer 1.2 s late with a 0.5 s timeout: the call returns only when the peer comes, though the
// group failed at 0.5 s, as the watchdog says; nonblocking it returns at 0.5 s). Another value is
// refused naming the variable.
TEST_F(ProcessGroupNcclThreads, BlockingCommunicatorsRunTheSameCollectives) {
  const ScopedEnv blocking("RG_NCCL_NONBLOCKING", "0");
  auto store = std::make_shared<HashStore>();
  ProcessGroupOptions late = options();
  late.timeout = 500ms;
  late.name = "late";
  std::chrono::steady_clock::duration took{};
  std::string error;
  run_ranks(kWorld, [&](int rank) {
    cuda::DeviceGuard guard(rank);
    {
      ProcessGroupNCCL pg(store, rank, kWorld, late);
      Tensor one = full({1}, 1.0, DType::f32, Device::cuda(rank));
      if (rank == 2) std::this_thread::sleep_for(1200ms);
      const auto t0 = std::chrono::steady_clock::now();
      WorkPtr w = pg.all_reduce(one);
      if (rank == 0) {
        took = std::chrono::steady_clock::now() - t0;
        error = testing::error_of([&] { w->wait(); });
      }
    }
    ProcessGroupNCCL pg(store, rank, kWorld, options());
    rg::testing::check_all_reduce(pg, DType::f32, 1000, ReduceOp::sum);
    rg::testing::check_broadcast(pg, DType::bf16, 300, 2);
    rg::testing::check_all_gather(pg, DType::i64, 40);
    rg::testing::check_send_recv(pg, DType::f32, 100);
    pg.set_algorithm(Algorithm::ring);
    rg::testing::check_all_reduce(pg, DType::f32, 100000, ReduceOp::avg);
    pg.barrier()->wait();
  });
  EXPECT_GE(took, 1000ms) << "rank 0's first collective returned before rank 2 made its own";
  EXPECT_NE(error.find("all_reduce #1 (f32[1], sum, native) on rank 0 of 3 was still inside NCCL "
                       "500 ms after its issue"),
            std::string::npos)
      << error;
  const ScopedEnv bad("RG_NCCL_NONBLOCKING", "yes");
  expect_error([&] { ProcessGroupNCCL pg(std::make_shared<HashStore>(), 0, 1, options()); },
               "RG_NCCL_NONBLOCKING=yes must be 1 (nonblocking NCCL communicators, the default) "
               "or 0 (blocking ones)");
}

// With a blocking communicator an issuer can wait inside NCCL for as long as a peer does not
// connect (here rank 0's first send to rank 1, which rank 1 never receives); the watchdog still
// fails an older collective at its timeout meanwhile, and nothing waits for that issuer. Once rank
// 1 leaves, the send fails too.
TEST_F(ProcessGroupNcclThreads, WhileABlockingCallWaitsInNcclTheWatchdogStillTimesOutOlderWork) {
  const ScopedEnv blocking("RG_NCCL_NONBLOCKING", "0");
  auto store = std::make_shared<HashStore>();
  ProcessGroupOptions o = options();
  o.timeout = 1000ms;
  std::atomic<bool> checked{false};
  std::string older, send_error;
  std::chrono::steady_clock::duration older_after{};
  run_ranks(2, [&](int rank) {
    cuda::DeviceGuard guard(rank);
    ProcessGroupNCCL pg(store, rank, 2, o);
    pg.barrier()->wait();  // the collectives are connected
    if (rank == 1) {
      for (int i = 0; i < 1000 && !checked; ++i) std::this_thread::sleep_for(10ms);
      return;  // leaves: rank 0's send cannot connect
    }
    const Tensor t = full({16}, 1.0, DType::f32, Device::cuda(rank));
    const auto t0 = std::chrono::steady_clock::now();
    WorkPtr w = pg.all_reduce(t);  // rank 1 never joins
    std::thread sender([&] {
      cuda::DeviceGuard g(rank);
      send_error = testing::error_of([&] { pg.send(t, 1)->wait(); });
    });
    while (!w->is_completed() && std::chrono::steady_clock::now() - t0 < 10s)
      std::this_thread::sleep_for(10ms);
    older_after = std::chrono::steady_clock::now() - t0;
    older = testing::error_of([&] { w->wait(); });
    checked = true;
    sender.join();
  });
  EXPECT_LT(older_after, 5s) << "the watchdog waited for the issuer blocked in NCCL";
  EXPECT_NE(older.find("all_reduce #2 (f32[16], sum, native) on rank 0 of 2 timed out after "
                       "1000 ms; ranks that have not joined it: 1"),
            std::string::npos)
      << older;
  EXPECT_NE(send_error.find("send #3"), std::string::npos) << send_error;
}

// A collective that completed stays pending while an issuer is inside NCCL (its error cannot be
// read then), here rank 0's first send, which waits in a blocking communicator for rank 1's late
// first receive (1.2 s, timeout 0.5 s): when the group fails, the message names the send that
// outstayed the timeout, not the completed all-reduce.
TEST_F(ProcessGroupNcclThreads,
       ACompletedCollectiveIsNotBlamedWhenABlockingCallOutstaysTheTimeout) {
  const ScopedEnv blocking("RG_NCCL_NONBLOCKING", "0");
  auto store = std::make_shared<HashStore>();
  ProcessGroupOptions o = options();
  o.timeout = 500ms;
  std::string reduced_error, moved_error;
  run_ranks(2, [&](int rank) {
    cuda::DeviceGuard guard(rank);
    ProcessGroupNCCL pg(store, rank, 2, o);
    pg.barrier()->wait();  // the collectives are connected
    Tensor one = full({1}, 1.0, DType::f32, Device::cuda(rank));
    WorkPtr reduced = pg.all_reduce(one);
    Tensor x = full({4}, double(rank + 5), DType::f32, Device::cuda(rank));
    if (rank == 0) {
      WorkPtr moved = pg.send(x, 1);
      reduced_error = testing::error_of([&] { reduced->wait(); });
      moved_error = testing::error_of([&] { moved->wait(); });
    } else {
      std::this_thread::sleep_for(1200ms);
      (void)testing::error_of([&] { pg.recv(x, 0)->wait(); });
    }
  });
  const std::string want =
      "send #3 (f32[4] to 1) on rank 0 of 2 was still inside NCCL 500 ms after its issue";
  EXPECT_NE(reduced_error.find(want), std::string::npos) << reduced_error;
  EXPECT_EQ(reduced_error.find("timed out"), std::string::npos) << reduced_error;
  EXPECT_NE(moved_error.find(want), std::string::npos) << moved_error;
}

// A group destroyed before a CUDA graph that captured its collectives says so on stderr: NCCL's
// destroy waits until the graph is destroyed (destroyed here 300 ms later, on another thread).
TEST_F(ProcessGroupNcclThreads, DestroyingAGroupBeforeTheGraphOfItsCollectivesSaysSo) {
  auto store = std::make_shared<HashStore>();
  std::string said;
  run_ranks(2, [&](int rank) {
    cuda::DeviceGuard guard(rank);
    auto pg = std::make_unique<ProcessGroupNCCL>(store, rank, 2, options());
    pg->barrier()->wait();
    const cuda::Stream side = cuda::pooled_stream(rank);  // captured (not the legacy stream)
    const cuda::StreamGuard on(side);
    const Tensor t = full({8}, 1.0, DType::f32, Device::cuda(rank));
    auto graph =
        std::make_unique<cuda::Graph>(Device::cuda(rank), [&] { pg->all_reduce(t)->wait(); });
    graph->replay();
    cuda::synchronize(rank);
    EXPECT_EQ(t.to(Device::cpu()).to_vector<float>(), std::vector<float>(8, 2.0f));
    pg->barrier()->wait();
    if (rank == 1) {
      graph.reset();
      pg.reset();
      return;
    }
    std::thread later([&] {
      std::this_thread::sleep_for(300ms);
      graph.reset();
    });
    ::testing::internal::CaptureStderr();
    pg.reset();
    said = ::testing::internal::GetCapturedStderr();
    later.join();
  });
  EXPECT_NE(said.find("ringgrad: the NCCL group of rank 0 is destroyed while 1 CUDA graph(s) that "
                      "captured its collectives still exist"),
            std::string::npos)
      << said;
}

// While one thread captures a group's collectives into a CUDA graph, the group's communication
// stream belongs to that capture: a collective another thread issues meanwhile is refused by name
// (it would be recorded into the graph instead of running), before it is numbered, so the graph
// replays the captured collective alone and the group stays usable.
TEST_F(ProcessGroupNcclThreads, ACollectiveFromAnotherThreadDuringACaptureIsRefused) {
  auto store = std::make_shared<HashStore>();
  std::string refused;
  run_ranks(2, [&](int rank) {
    cuda::DeviceGuard guard(rank);
    ProcessGroupNCCL pg(store, rank, 2, options());
    pg.barrier()->wait();
    const Tensor t = full({8}, 1.0, DType::f32, Device::cuda(rank));
    const Tensor u = full({4}, 5.0, DType::f32, Device::cuda(rank));
    cuda::synchronize(rank);
    std::unique_ptr<cuda::Graph> graph;
    {
      const cuda::Stream side = cuda::pooled_stream(rank);
      const cuda::StreamGuard on(side);
      graph = std::make_unique<cuda::Graph>(Device::cuda(rank), [&] {
        pg.all_reduce(t)->wait();
        if (rank != 0) return;
        std::thread other([&] {
          cuda::DeviceGuard g(rank);
          try {
            pg.all_reduce(u)->wait();
          } catch (const Error& e) {
            refused = e.what();
          }
        });
        other.join();
      });
    }
    graph->replay();
    graph->replay();
    cuda::synchronize(rank);
    EXPECT_EQ(t.to(Device::cpu()).to_vector<float>(), std::vector<float>(8, 4.0f));
    EXPECT_EQ(u.to(Device::cpu()).to_vector<float>(), std::vector<float>(4, 5.0f));
    pg.all_reduce(u)->wait();  // the group is usable, its numbering unchanged
    cuda::synchronize(rank);
    EXPECT_EQ(u.to(Device::cpu()).to_vector<float>(), std::vector<float>(4, 10.0f));
    graph.reset();
  });
  EXPECT_NE(refused.find("all_reduce (f32[4], sum, native) on rank 0 of 2 was issued from a stream "
                         "outside the CUDA graph capture that this group's communication stream "
                         "belongs to now"),
            std::string::npos)
      << refused;
}

// A failed NCCL call's rg::Error carries ncclGetErrorString's words and ncclGetLastError's reason,
// not NCCL's "(run with NCCL_DEBUG=WARN for details)". Forced here through the emulated NCCL's
// refusal of a bad RG_EMU_NCCL_INIT_TIMEOUT_MS.
TEST_F(ProcessGroupNcclThreads, AFailedNcclCallSaysWhatNcclSaid) {
  ASSERT_EQ(setenv("RG_EMU_NCCL_INIT_TIMEOUT_MS", "soon", 1), 0);
  std::string msg;
  try {
    ProcessGroupNCCL pg(std::make_shared<HashStore>(), 0, 1, options());
    ADD_FAILURE() << "the NCCL group was made";
  } catch (const Error& e) {
    msg = e.what();
  }
  const std::string last = ncclGetLastError(nullptr);
  unsetenv("RG_EMU_NCCL_INIT_TIMEOUT_MS");
  EXPECT_EQ(last, "RG_EMU_NCCL_INIT_TIMEOUT_MS=soon is not a positive integer");
  EXPECT_NE(msg.find("ProcessGroupNCCL: rank 0 of 1 could not create its NCCL communicator: "),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("ncclCommInitRankConfig(&s.comm, size, id, rank, &config) failed: invalid "
                     "argument: " +
                     last),
            std::string::npos)
      << msg;
  EXPECT_NE(std::string(ncclGetErrorString(ncclInvalidArgument)).find("NCCL_DEBUG"),
            std::string::npos);
  EXPECT_EQ(msg.find("NCCL_DEBUG"), std::string::npos) << msg;
}

// Host stalls of a steady DDP step over NCCL (issue "ResNet-18 on Hopper"): none. The gradients'
// all-reduces order the compute stream without blocking, the loss's check is deferred, and the
// status element that DDP sums with the last bucket (findings and out-of-data flags) is written on
// the device and read one iteration late from pinned memory (it was a pageable write and a read
// back: 4 host-blocking calls per step), so the read waits only for work queued an iteration ago.
TEST_F(ProcessGroupNcclThreads, ASteadyDdpStepHasNoHostStall) {
  constexpr int kRanks = 2;
  auto store = std::make_shared<HashStore>();
  std::vector<int64_t> stalls(kRanks, -1);
  run_ranks(kRanks, [&](int rank) {
    cuda::set_device(rank);
    auto pg = std::make_shared<ProcessGroupNCCL>(store, rank, kRanks, options());
    auto model = nn::make_model({.name = "mlp", .sample_shape = {1, 28, 28}, .num_classes = 10});
    model->to(Device::cuda(rank));
    DistributedDataParallel ddp(model, pg);
    optim::Sgd opt(model->parameters(), {.lr = 0.01, .momentum = 0.9});
    const Tensor x = full({4, 1, 28, 28}, 0.5, DType::f32, Device::cuda(rank));
    const Tensor y = from_vector<int64_t>({1, 7, 3, 0}, {4}).to(Device::cuda(rank));
    DeferredChecks checks;
    auto step = [&] {
      checks.poll();
      opt.zero_grad();
      cross_entropy(ddp.forward(x), y).backward();
      opt.step();
    };
    for (int i = 0; i < 3; ++i) step();  // the first iterations rebuild the buckets
    // The device catches up first: the step reads the previous iteration's status, which waits
    // only when the GPU is more than an iteration behind the host (the emulator's always is).
    cuda::synchronize(rank);
    const int64_t before = cuda::runtime().backend().host_blocking_calls();
    step();
    stalls[size_t(rank)] = cuda::runtime().backend().host_blocking_calls() - before;
    checks.flush();
    cuda::synchronize(rank);
  });
  for (int r = 0; r < kRanks; ++r) EXPECT_EQ(stalls[size_t(r)], 0) << "rank " << r;
}

}  // namespace
}  // namespace rg::dist
