// RG_DISTRIBUTED_DEBUG=DETAIL's cross-rank check of every call (comm/debug_group.h), in a real
// job (ringgrad-run, 2 and 3 ranks) on Gloo and, in rg_emu_dist_collectives_tests with
// RG_TEST_BACKEND=nccl, on the emulated NCCL: a rank that calls another collective, passes
// another shape or dtype, skips a collective or never arrives ends with the named error on every
// rank (or, for the one that never arrives, on every rank that waits for it), while barriers,
// sends and receives of a correct program raise no false alarm.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <iostream>
#include <string>

#include "comm/debug_level.h"
#include "comm/init.h"
#include "engine/ops/factory.h"
#include "support/errors.h"

namespace rg::dist {
namespace {

using namespace std::chrono_literals;

std::string backend_under_test() {
  const char* b = std::getenv("RG_TEST_BACKEND");
  return b != nullptr && *b != '\0' ? b : "gloo";
}

// DETAIL for one test on this rank, on a group of its own; OFF again before the default group
// is used (every rank must run a group's calls at the same level).
class DetailTest : public ::testing::Test {
 protected:
  void SetUp() override { set_debug_level(DebugLevel::detail); }
  void TearDown() override {
    set_debug_level(DebugLevel::off);
    group_.reset();
    default_group()->barrier()->wait();
  }
  ProcessGroup& group(const std::string& name, Millis timeout = 30s) {
    ProcessGroupOptions o;
    o.name = name;
    o.timeout = timeout;
    group_ = make_process_group(backend_under_test(), default_store(), default_group()->rank(),
                                default_group()->size(), o);
    return *group_;
  }
  Tensor filled(int64_t n, DType dtype = DType::f32, double value = 1.0) {
    Tensor t = Tensor::empty({n}, dtype, group_->tensor_device());
    t.fill_(value);
    return t;
  }
  // Runs `call` on this rank and returns its error ("" when it has none); waits for the work.
  // Prints the message and how long the call took to fail (the fault table's figures).
  std::string error_of(const std::function<WorkPtr()>& call) {
    const auto t0 = std::chrono::steady_clock::now();
    try {
      call()->wait();
      return "";
    } catch (const std::exception& e) {
      std::cout << "detected after "
                << std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()
                << " s: " << e.what() << "\n";
      return e.what();
    }
  }
  std::shared_ptr<ProcessGroup> group_;
};

bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST_F(DetailTest, ADifferentCollectiveIsNamedOnEveryRank) {
  ProcessGroup& pg = group("detail-op");
  const int last = pg.size() - 1;
  Tensor t = filled(64);
  const std::string e =
      error_of([&] { return pg.rank() == last ? pg.broadcast(t, 0) : pg.all_reduce(t); });
  EXPECT_TRUE(has(e, "the ranks disagree on call #1 of group 'detail-op'")) << e;
  EXPECT_TRUE(has(e, "called all_reduce #1 (f32[64], sum)")) << e;
  EXPECT_TRUE(has(e, "rank " + std::to_string(last) + " called broadcast #1 (f32[64], root 0)"))
      << e;
  EXPECT_TRUE(has(e, "Rank(s) " + std::to_string(last) + " differ from rank 0")) << e;
}

TEST_F(DetailTest, ADifferentShapeOrDtypeIsNamed) {
  ProcessGroup& pg = group("detail-shape");
  const bool odd = pg.rank() == 1;
  const std::string shape = error_of([&] { return pg.all_reduce(filled(odd ? 65 : 64)); });
  EXPECT_TRUE(has(shape, "rank 1 called all_reduce #1 (f32[65], sum)")) << shape;
  EXPECT_TRUE(has(shape, "called all_reduce #1 (f32[64], sum)")) << shape;
  const std::string dtype =
      error_of([&] { return pg.all_reduce(filled(64, odd ? DType::f64 : DType::f32)); });
  EXPECT_TRUE(has(dtype, "disagree on call #2")) << dtype;
  EXPECT_TRUE(has(dtype, "rank 1 called all_reduce #2 (f64[64], sum)")) << dtype;
}

// The last rank skips the first of two all-reduces: its first call meets the others' first.
TEST_F(DetailTest, ASkippedCollectiveIsNamedAtItsSequenceNumber) {
  ProcessGroup& pg = group("detail-skip");
  const int last = pg.size() - 1;
  std::string e;
  if (pg.rank() != last) e = error_of([&] { return pg.all_reduce(filled(10)); });
  if (e.empty()) e = error_of([&] { return pg.all_reduce(filled(20)); });
  EXPECT_TRUE(has(e, "disagree on call #1")) << e;
  EXPECT_TRUE(has(e, "called all_reduce #1 (f32[10], sum)")) << e;
  EXPECT_TRUE(has(e, "rank " + std::to_string(last) + " called all_reduce #1 (f32[20], sum)")) << e;
}

// A rank that never makes the call: the others wait the group's timeout and name it.
TEST_F(DetailTest, ARankThatNeverArrivesIsNamedAfterTheTimeout) {
  ProcessGroup& pg = group("detail-absent", 2s);
  const int last = pg.size() - 1;
  auto store = default_store();
  if (pg.rank() != last) {
    const auto t0 = std::chrono::steady_clock::now();
    const std::string e = error_of([&] { return pg.all_reduce(filled(8)); });
    EXPECT_GE(std::chrono::steady_clock::now() - t0, 1500ms);
    EXPECT_TRUE(has(e, "waits in all_reduce #1 (f32[8], sum) of group 'detail-absent'")) << e;
    EXPECT_TRUE(has(e, "rank(s) " + std::to_string(last) + " did not reach call #1")) << e;
    store->add("detail-absent/checked", 1);
  }
  while (store->add("detail-absent/checked", 0) < last) std::this_thread::sleep_for(10ms);
}

// A correct program: barriers, a ring of sends and receives, every collective (all-reduce with
// the backend's algorithm and our ring): no alarm, and the results are the backend's.
TEST_F(DetailTest, BarriersSendsAndReceivesRaiseNoFalseAlarm) {
  ProcessGroup& pg = group("detail-ok");
  const int n = pg.size(), r = pg.rank();
  for (int i = 0; i < 3; ++i) pg.barrier()->wait();
  // The backend's algorithm and our ring (its point-to-point traffic is below this layer).
  for (Algorithm algorithm : {Algorithm::native, Algorithm::ring}) {
    pg.set_algorithm(algorithm);
    Tensor sum = filled(16, DType::f32, r + 1);
    pg.all_reduce(sum)->wait();
    EXPECT_EQ(sum.to(Device::cpu()).data<float>()[0], float(n * (n + 1) / 2));
  }
  Tensor b = filled(4, DType::f32, r == 1 ? 7 : 0);
  pg.broadcast(b, 1)->wait();
  EXPECT_EQ(b.to(Device::cpu()).data<float>()[3], 7.0f);
  Tensor gathered = filled(4 * n);
  pg.all_gather(gathered, filled(4, DType::f32, r))->wait();
  EXPECT_EQ(gathered.to(Device::cpu()).data<float>()[4 * (n - 1)], float(n - 1));
  // A ring: even ranks send first, odd ranks receive first (no deadlock on any backend).
  Tensor out = filled(5, DType::f32, r), in = filled(5, DType::f32, -1);
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  for (int round = 0; round < 2; ++round) {
    if (r % 2 == 0) {
      pg.send(out, next)->wait();
      pg.recv(in, prev)->wait();
    } else {
      pg.recv(in, prev)->wait();
      pg.send(out, next)->wait();
    }
    EXPECT_EQ(in.to(Device::cpu()).data<float>()[0], float(prev));
  }
  pg.barrier()->wait();
}

// A receive of another size than its send: the receiver names both calls (the sender's send
// does not wait for a check). The receiver then takes the send with the check off, so the send
// completes.
TEST_F(DetailTest, AReceiveOfAnotherSizeNamesTheSend) {
  ProcessGroup& pg = group("detail-p2p");
  if (pg.rank() == 0) {
    pg.send(filled(10), 1)->wait();
  } else if (pg.rank() == 1) {
    Tensor wrong = filled(12);
    const std::string e = error_of([&] { return pg.recv(wrong, 0); });
    EXPECT_TRUE(has(e, "rank 1 called recv #1 (f32[12] from 0, tag 0)")) << e;
    EXPECT_TRUE(has(e, "rank 0 called send #1 (f32[10] to 1, tag 0)")) << e;
    set_debug_level(DebugLevel::off);
    Tensor right = filled(10);
    pg.recv(right, 0)->wait();
  }
}

}  // namespace
}  // namespace rg::dist
