// Multi-process tests (label dist), started by ctest through ringgrad-run exactly as users start
// jobs: every rank runs this binary, joins the default group from the launch environment and
// checks every collective; the DistFaults tests make one rank exit or stay away and check that
// the others fail promptly with an error naming it. RG_TEST_BACKEND=nccl runs the same checks on
// ProcessGroupNCCL (in rg_emu_dist_collectives_tests: the emulated NCCL on emulated devices), and
// DistNcclFaults its watchdog and the emulated NCCL's named mismatches.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>

#include "comm/init.h"
#include "comm/process_group_gloo.h"
#include "engine/ops/factory.h"
#include "support/collective_checks.h"
#include "support/errors.h"

namespace rg::dist {
namespace {

using namespace std::chrono_literals;

std::string test_backend() {
  const char* b = std::getenv("RG_TEST_BACKEND");
  return b != nullptr && *b != '\0' ? b : "gloo";
}

class DistEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    InitOptions o;
    o.backend = test_backend();
    o.group.timeout = 60s;
    // Every test of this binary shares the group (DDP, SyncBatchNorm, ... link these objects):
    // 64 KiB ring chunks still pipeline 8 or more chunks per block of their MiB buckets, at 1/16
    // of the messages of the 4 KiB the collectives' own checks use (below).
    o.group.ring_chunk_bytes = 64 << 10;
    init_process_group(o);
  }
  void TearDown() override { destroy_process_group(); }
};

const auto* const kEnv = ::testing::AddGlobalTestEnvironment(new DistEnvironment);

// A group over the default store, of every rank, with `chunk` bytes per ring chunk.
std::shared_ptr<ProcessGroup> group_of(const char* name, Algorithm algorithm, size_t chunk) {
  ProcessGroupOptions o;
  o.name = name;
  o.timeout = 60s;
  o.algorithm = algorithm;
  o.ring_chunk_bytes = chunk;
  const auto& pg = *default_group();
  return make_process_group(test_backend(), default_store(), pg.rank(), pg.size(), o);
}

// The collectives' checks through 4 KiB ring chunks, so that small tensors cross chunk
// boundaries too.
constexpr size_t kSmallChunk = 4096;

TEST(DistCollectives, Native) {
  ASSERT_GE(default_group()->size(), 2) << "run through ringgrad-run --nproc-per-node N (N >= 2)";
  auto pg = group_of("native-small-chunks", Algorithm::native, kSmallChunk);
  rg::testing::check_everything(*pg, /*heavy=*/true);
  rg::testing::check_64_mib(*pg);
}

TEST(DistCollectives, Ring) {
  rg::testing::check_everything(*group_of("ring-small-chunks", Algorithm::ring, kSmallChunk),
                                /*heavy=*/true);
  // 64 MiB through 4 KiB chunks is ~16k exchanges per rank (3/4 of this test on the emulated
  // NCCL); a group with the default chunking still pipelines 16-32 chunks a block.
  rg::testing::check_64_mib(
      *group_of("ring-default-chunks", Algorithm::ring, ProcessGroupOptions{}.ring_chunk_bytes));
}

// A group of its own with a short timeout, so the default group stays healthy.
std::unique_ptr<ProcessGroupGloo> fault_group(const char* name, Millis timeout) {
  ProcessGroupOptions o;
  o.name = name;
  o.timeout = timeout;
  o.algorithm = Algorithm::ring;
  return std::make_unique<ProcessGroupGloo>(default_store(), default_group()->rank(),
                                            default_group()->size(), o);
}

TEST(DistFaults, RankThatExits) {
  auto pg = fault_group("exits", 60s);
  const int last = pg->size() - 1;
  pg->barrier()->wait();
  if (pg->rank() == last) _exit(0);  // no goodbye: its sockets close as in a crash
  const auto t0 = std::chrono::steady_clock::now();
  const std::string e = rg::testing::error_of([&] { pg->all_reduce(ones({1 << 20}))->wait(); });
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 15s) << "a dead peer must not take the 60 s "
                                                           "timeout to notice";
  EXPECT_NE(e.find("all_reduce #2"), std::string::npos) << e;
  EXPECT_NE(e.find(std::to_string(last)), std::string::npos) << e;
  std::cout << "rank " << pg->rank() << " saw: " << e << "\n";
}

TEST(DistFaults, RankThatNeverCalls) {
  auto pg = fault_group("never", 2s);
  const int last = pg->size() - 1;
  auto store = default_store();
  if (pg->rank() == last) {
    // Stays alive (its connections open) without joining, until the others have checked.
    store->wait({"never/checked"}, 60s);
    return;
  }
  const auto t0 = std::chrono::steady_clock::now();
  const std::string e = rg::testing::error_of([&] { pg->all_reduce(ones({1000}))->wait(); });
  const auto waited = std::chrono::steady_clock::now() - t0;
  EXPECT_GE(waited, 1500ms);
  EXPECT_LT(waited, 10s);
  EXPECT_NE(e.find("all_reduce #1"), std::string::npos) << e;
  // The first rank to time out closes its connections, so a neighbour may see that first; both
  // must still name the rank that never came.
  EXPECT_TRUE(e.find("timed out after 2000 ms") != std::string::npos ||
              e.find("lost the connection") != std::string::npos)
      << e;
  EXPECT_NE(e.find("ranks that have not joined it: " + std::to_string(last)), std::string::npos)
      << e;
  std::cout << "rank " << pg->rank() << " saw: " << e << "\n";
  // Keep the group (and its connections) alive until every caller has seen its own timeout;
  // otherwise a rank that finished first would close its sockets under a slower one.
  if (store->add("never/errors", 1) == last) store->set("never/checked", "1");
  store->wait({"never/checked"}, 60s);
}

// NCCL works complete from the group's watchdog (wait() only orders the caller's stream), so a
// failure is awaited on the host.
std::string nccl_error_of(Work& w) {
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  while (!w.is_completed() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(10ms);
  }
  if (!w.is_completed()) return "(the work never completed)";
  std::exception_ptr e = w.exception();
  if (!e) return "(no error)";
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return x.what();
  }
}

std::shared_ptr<ProcessGroup> nccl_fault_group(const char* name, Millis timeout) {
  ProcessGroupOptions o;
  o.name = name;
  o.timeout = timeout;
  return make_process_group("nccl", default_store(), default_group()->rank(),
                            default_group()->size(), o);
}

Tensor device_ones(const ProcessGroup& pg, int64_t n) {
  Tensor t = Tensor::empty({n}, DType::f32, pg.tensor_device());
  t.fill_(1.0);
  return t;
}

// After a first collective (which connects the ranks), the last rank never calls the second: the
// others' collective waits on the device until the watchdog's timeout.
TEST(DistNcclFaults, RankThatNeverCallsEndsInANamedTimeoutAndAbort) {
  auto pg = nccl_fault_group("nccl-never", 2s);
  const int last = pg->size() - 1;
  auto store = default_store();
  pg->all_reduce(device_ones(*pg, 10))->wait();
  if (pg->rank() != last) {
    const auto t0 = std::chrono::steady_clock::now();
    auto w = pg->all_reduce(device_ones(*pg, 1000));
    const std::string e = nccl_error_of(*w);
    const auto waited = std::chrono::steady_clock::now() - t0;
    EXPECT_GE(waited, 1500ms);
    EXPECT_LT(waited, 30s);
    EXPECT_NE(e.find("all_reduce #2"), std::string::npos) << e;
    // The first rank to time out aborts the communicator, so a neighbour may see that first.
    const bool timed_out = e.find("timed out after 2000 ms") != std::string::npos;
    EXPECT_TRUE(timed_out || e.find("aborted the communicator") != std::string::npos) << e;
    if (timed_out) {
      EXPECT_NE(e.find("ranks that have not joined it: " + std::to_string(last)), std::string::npos)
          << e;
    }
    // The group is aborted: later work fails at once, naming the first error.
    const std::string later = nccl_error_of(*pg->all_reduce(device_ones(*pg, 10)));
    EXPECT_TRUE(later.find("unusable after an earlier failure") != std::string::npos ||
                later.find("could not be queued") != std::string::npos)
        << later;
    std::cout << "rank " << pg->rank() << " saw: " << e << "\n";
    store->add("nccl-never/checked", 1);
  }
  // Everyone (the absent rank too) keeps its communicator until the callers have checked.
  while (store->add("nccl-never/checked", 0) < last) std::this_thread::sleep_for(10ms);
}

// The last rank never makes its first collective, where NCCL connects the ranks on the host: the
// others' all_reduce is not queued within the timeout, the call returns with the work failed (a
// blocking communicator would wait inside NCCL for good), and the group is aborted.
TEST(DistNcclFaults, RankThatNeverMakesTheFirstCollectiveEndsInATimeoutAtIssue) {
  auto pg = nccl_fault_group("nccl-never-first", 2s);
  const int last = pg->size() - 1;
  auto store = default_store();
  if (pg->rank() != last) {
    const auto t0 = std::chrono::steady_clock::now();
    auto w = pg->all_reduce(device_ones(*pg, 1000));
    const auto returned = std::chrono::steady_clock::now() - t0;
    const std::string e = nccl_error_of(*w);
    EXPECT_LT(returned, 30s);
    EXPECT_NE(e.find("all_reduce #1 (f32[1000], sum, native) on rank " +
                     std::to_string(pg->rank()) + " of 3 could not be queued: "),
              std::string::npos)
        << e;
    // The first rank to time out aborts the communicator, so a neighbour may see that first.
    const bool timed_out =
        e.find("NCCL was still connecting this rank to its peers 2000 ms after ncclAllReduce") !=
        std::string::npos;
    EXPECT_TRUE(timed_out || e.find("aborted the communicator") != std::string::npos) << e;
    if (timed_out) {
      EXPECT_GE(returned, 1500ms);
      EXPECT_NE(e.find("ranks that have not joined it: " + std::to_string(last)), std::string::npos)
          << e;
    }
    const std::string later = nccl_error_of(*pg->all_reduce(device_ones(*pg, 10)));
    EXPECT_NE(later.find("unusable after an earlier failure"), std::string::npos) << later;
    std::cout << "rank " << pg->rank() << " saw: " << e << "\n";
    store->add("nccl-never-first/checked", 1);
  }
  while (store->add("nccl-never-first/checked", 0) < last) std::this_thread::sleep_for(10ms);
}

TEST(DistNcclFaults, MismatchedCollectivesAreNamedInsteadOfHanging) {
  auto pg = nccl_fault_group("nccl-mismatch", 60s);
  Tensor t = device_ones(*pg, 64);
  auto w = pg->rank() == 0 ? pg->all_reduce(t) : pg->broadcast(t, 0);
  const std::string e = nccl_error_of(*w);
  EXPECT_NE(e.find("ncclAllReduce"), std::string::npos) << e;
  EXPECT_NE(e.find("ncclBroadcast"), std::string::npos) << e;
  std::cout << "rank " << pg->rank() << " saw: " << e << "\n";
  default_group()->barrier()->wait();
}

}  // namespace
}  // namespace rg::dist
