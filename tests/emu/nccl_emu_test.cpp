// Tests of the emulated NCCL (kernels/emu/nccl.cpp): collectives, sends and receives between
// processes (this binary re-executed as NcclEmuWorker.* workers) and between communicators of one
// process, mismatched calls, abort, dead peers and bad arguments.
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "kernels/emu/device_properties.h"
#include "kernels/emu/device_runtime.h"
#include "kernels/emu/shim/nccl.h"
#include "kernels/error.h"
#include "kernels/half.h"

extern char** environ;

namespace rg::nccl_emu_test {
namespace {

using Seconds = std::chrono::duration<double>;

// ---- Bounded waiting ----

// Runs f on another thread; a test that does not finish within `limit` stops the binary, so a
// deadlock fails fast instead of hanging ctest.
void within(Seconds limit, const std::function<void()>& f) {
  auto done = std::make_shared<std::promise<void>>();
  std::future<void> finished = done->get_future();
  std::thread([done, f] {
    try {
      f();
      done->set_value();
    } catch (...) {
      done->set_exception(std::current_exception());
    }
  }).detach();
  if (finished.wait_for(limit) != std::future_status::ready) {
    std::fprintf(stderr, "nccl_emu_test: still running after %.0f s: deadlock\n", limit.count());
    std::abort();
  }
  finished.get();
}

// Waits for the stream's work, at most `limit`; false on a timeout.
bool wait_stream(cudaStream_t stream, Seconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (cudaStreamQuery(stream) == cudaErrorNotReady) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return cudaStreamSynchronize(stream) == cudaSuccess;
}

// The buffers here are plain host memory read right after a stream synchronization, and a
// collective must not block the host: launch blocking stays off (another test file of the same
// binary may have turned it on).
class LaunchBlockingOff {
 public:
  LaunchBlockingOff() : saved_(rg::emu::launch_blocking()) { rg::emu::set_launch_blocking(false); }
  ~LaunchBlockingOff() { rg::emu::set_launch_blocking(saved_); }

 private:
  bool saved_;
};

// A non-blocking stream of `device` (the current device unless given).
cudaStream_t new_stream(int device = -1) {
  int saved = 0;
  EXPECT_EQ(cudaGetDevice(&saved), cudaSuccess);
  if (device >= 0) {
    EXPECT_EQ(cudaSetDevice(device), cudaSuccess);
  }
  cudaStream_t s = nullptr;
  EXPECT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  EXPECT_EQ(cudaSetDevice(saved), cudaSuccess);
  return s;
}

// NCCL refuses two ranks on one GPU: tests with n ranks in one process give rank r device r.
void expect_devices(int n) {
  int count = 0;
  ASSERT_EQ(cudaGetDeviceCount(&count), cudaSuccess);
  ASSERT_GE(count, n) << "run with RG_EMU_DEVICES=" << n << " or more (ctest sets 3)";
}

std::string last_error(ncclComm_t comm) { return ncclGetLastError(comm); }

ncclResult_t async_error(ncclComm_t comm) {
  ncclResult_t e = ncclInternalError;
  EXPECT_EQ(ncclCommGetAsyncError(comm, &e), ncclSuccess);
  return e;
}

// ---- Element types, independently of the implementation ----

enum class Cls { kSigned, kUnsigned, kFloat };
struct TypeInfo {
  ncclDataType_t type;
  const char* name;
  size_t size;
  Cls cls;
};
const TypeInfo kTypes[] = {
    {ncclInt8, "i8", 1, Cls::kSigned},          {ncclUint8, "u8", 1, Cls::kUnsigned},
    {ncclInt32, "i32", 4, Cls::kSigned},        {ncclUint32, "u32", 4, Cls::kUnsigned},
    {ncclInt64, "i64", 8, Cls::kSigned},        {ncclUint64, "u64", 8, Cls::kUnsigned},
    {ncclFloat16, "f16", 2, Cls::kFloat},       {ncclFloat32, "f32", 4, Cls::kFloat},
    {ncclFloat64, "f64", 8, Cls::kFloat},       {ncclBfloat16, "bf16", 2, Cls::kFloat},
    {ncclFloat8e4m3, "f8e4m3", 1, Cls::kFloat}, {ncclFloat8e5m2, "f8e5m2", 1, Cls::kFloat},
};
const TypeInfo& type_info(ncclDataType_t t) {
  for (const TypeInfo& i : kTypes) {
    if (i.type == t) return i;
  }
  std::abort();
}

// fp8 values from their bit fields; e4m3 (bias 7) has no infinities, e5m2 (bias 15) does.
double fp8_value(uint8_t code, bool e4m3) {
  const int man_bits = e4m3 ? 3 : 2, bias = e4m3 ? 7 : 15;
  const int exp = code >> man_bits & (e4m3 ? 0xf : 0x1f), man = code & ((1 << man_bits) - 1);
  const double sign = (code & 0x80) != 0 ? -1 : 1;
  if (e4m3 && exp == 0xf && man == 7) return NAN;
  if (!e4m3 && exp == 0x1f) return man == 0 ? sign * INFINITY : NAN;
  const double frac = man / double(1 << man_bits);
  return sign *
         (exp == 0 ? frac * std::pow(2.0, 1 - bias) : (1 + frac) * std::pow(2.0, exp - bias));
}

// The nearest finite fp8 value by search (ties to an even code), saturating as CUDA's
// __NV_SATFINITE conversions do.
uint8_t fp8_code(double v, bool e4m3) {
  int best = 0;
  double best_err = INFINITY;
  for (int c = 0; c < 256; ++c) {
    const double x = fp8_value(uint8_t(c), e4m3);
    if (!std::isfinite(x)) continue;
    const double err = std::fabs(x - v);
    if (err < best_err || (err == best_err && (c & 1) == 0 && (best & 1) != 0)) {
      best = c;
      best_err = err;
    }
  }
  return uint8_t(best);
}

// Stores v (an integer, or an exact value for floats) as type t, wrapping or rounding as the
// type does.
void store(double v, const TypeInfo& t, void* p) {
  const auto i = static_cast<int64_t>(v);
  switch (t.type) {
    case ncclInt8:
      *static_cast<int8_t*>(p) = int8_t(i);
      break;
    case ncclUint8:
      *static_cast<uint8_t*>(p) = uint8_t(i);
      break;
    case ncclInt32:
      *static_cast<int32_t*>(p) = int32_t(i);
      break;
    case ncclUint32:
      *static_cast<uint32_t*>(p) = uint32_t(i);
      break;
    case ncclInt64:
      *static_cast<int64_t*>(p) = i;
      break;
    case ncclUint64:
      *static_cast<uint64_t*>(p) = uint64_t(i);
      break;
    case ncclFloat16:
      *static_cast<Half*>(p) = float_to_half(float(v));
      break;
    case ncclFloat32:
      *static_cast<float*>(p) = float(v);
      break;
    case ncclFloat64:
      *static_cast<double*>(p) = v;
      break;
    case ncclBfloat16:
      *static_cast<BFloat16*>(p) = float_to_bfloat16(float(v));
      break;
    case ncclFloat8e4m3:
      *static_cast<uint8_t*>(p) = fp8_code(v, true);
      break;
    case ncclFloat8e5m2:
      *static_cast<uint8_t*>(p) = fp8_code(v, false);
      break;
    default:
      std::abort();
  }
}

double load(const TypeInfo& t, const void* p) {
  switch (t.type) {
    case ncclInt8:
      return *static_cast<const int8_t*>(p);
    case ncclUint8:
      return *static_cast<const uint8_t*>(p);
    case ncclInt32:
      return *static_cast<const int32_t*>(p);
    case ncclUint32:
      return *static_cast<const uint32_t*>(p);
    case ncclInt64:
      return double(*static_cast<const int64_t*>(p));
    case ncclUint64:
      return double(*static_cast<const uint64_t*>(p));
    case ncclFloat16:
      return half_to_float(*static_cast<const Half*>(p));
    case ncclFloat32:
      return *static_cast<const float*>(p);
    case ncclFloat64:
      return *static_cast<const double*>(p);
    case ncclBfloat16:
      return bfloat16_to_float(*static_cast<const BFloat16*>(p));
    case ncclFloat8e4m3:
      return fp8_value(*static_cast<const uint8_t*>(p), true);
    case ncclFloat8e5m2:
      return fp8_value(*static_cast<const uint8_t*>(p), false);
    default:
      std::abort();
  }
}

// What rank r contributes at index i: small integers, exact in every type (fp8 included); signed
// and float types get negative values too.
double input(int r, size_t i, const TypeInfo& t) {
  const auto v = double((size_t(r) * 7 + i * 3) % 11);
  return t.cls == Cls::kUnsigned ? v : v - 5;
}

// The exact reduction over ranks 0..n-1 (int64 for integer types), then stored as the type.
double expected(ncclRedOp_t op, const TypeInfo& t, int n, size_t i) {
  double acc = input(0, i, t);
  for (int r = 1; r < n; ++r) {
    const double v = input(r, i, t);
    switch (op) {
      case ncclSum:
      case ncclAvg:
        acc += v;
        break;
      case ncclProd:
        acc *= v;
        break;
      case ncclMax:
        acc = std::max(acc, v);
        break;
      case ncclMin:
        acc = std::min(acc, v);
        break;
      default:
        std::abort();
    }
  }
  if (op == ncclAvg) {
    acc = t.cls == Cls::kFloat ? acc / n : double(static_cast<int64_t>(acc) / n);
  }
  std::vector<uint8_t> b(t.size);
  store(acc, t, b.data());
  return load(t, b.data());
}

using Bytes = std::vector<uint8_t>;

Bytes filled(int rank, size_t count, const TypeInfo& t) {
  Bytes b(count * t.size);
  for (size_t i = 0; i < count; ++i) store(input(rank, i, t), t, &b[i * t.size]);
  return b;
}

double at(const Bytes& b, size_t i, const TypeInfo& t) { return load(t, &b[i * t.size]); }

const char* op_name(ncclRedOp_t op) {
  static const char* const kNames[] = {"sum", "prod", "max", "min", "avg"};
  return kNames[int(op)];
}

// Counts mismatches, reporting the first few.
class Checker {
 public:
  explicit Checker(std::string what) : what_(std::move(what)) {}
  void eq(double actual, double want, size_t i) {
    const bool same = actual == want || (std::isnan(actual) && std::isnan(want));
    if (same) return;
    if (++bad_ <= 3) ADD_FAILURE() << what_ << " [" << i << "]: " << actual << ", want " << want;
  }
  ~Checker() {
    if (bad_ > 3) ADD_FAILURE() << what_ << ": " << bad_ << " wrong elements in all";
  }

 private:
  std::string what_;
  size_t bad_ = 0;
};

// ---- Collectives, run by every rank of a communicator ----

constexpr ncclRedOp_t kOps[] = {ncclSum, ncclProd, ncclMax, ncclMin, ncclAvg};

void check_all_reduce_every_type(ncclComm_t comm, cudaStream_t stream, int rank, int n) {
  struct Case {
    const TypeInfo* t;
    ncclRedOp_t op;
    size_t count;
    bool in_place;
    Bytes send, recv;
  };
  std::vector<Case> cases;
  for (const TypeInfo& t : kTypes) {
    for (ncclRedOp_t op : kOps) {
      for (size_t count : {size_t(0), size_t(1), size_t(1000)}) {
        cases.push_back(
            Case{&t, op, count, false, filled(rank, count, t), Bytes(count * t.size, 0xcd)});
      }
    }
    cases.push_back(Case{&t, ncclSum, 1000, true, filled(rank, 1000, t), {}});
  }
  for (Case& c : cases) {
    void* out = c.in_place ? c.send.data() : c.recv.data();
    ASSERT_EQ(ncclAllReduce(c.send.data(), out, c.count, c.t->type, c.op, comm, stream),
              ncclSuccess)
        << last_error(comm);
  }
  ASSERT_TRUE(wait_stream(stream, Seconds(60)));
  ASSERT_EQ(async_error(comm), ncclSuccess) << last_error(comm);
  for (const Case& c : cases) {
    Checker check(std::string("all-reduce ") + c.t->name + " " + op_name(c.op) + " count " +
                  std::to_string(c.count) + (c.in_place ? " in place" : ""));
    const Bytes& out = c.in_place ? c.send : c.recv;
    for (size_t i = 0; i < c.count; ++i) check.eq(at(out, i, *c.t), expected(c.op, *c.t, n, i), i);
  }
}

// 64 MiB in one call: many steps through the shared-memory slots.
void check_large_all_reduce(ncclComm_t comm, cudaStream_t stream, int rank, int n) {
  const size_t count = (size_t(64) << 20) / sizeof(float);
  auto value = [](int r, size_t i) { return float((size_t(r) * 5 + i * 13) % 17) * 0.25f; };
  std::vector<float> send(count), recv(count, -1.0f);
  for (size_t i = 0; i < count; ++i) send[i] = value(rank, i);
  ASSERT_EQ(ncclAllReduce(send.data(), recv.data(), count, ncclFloat32, ncclSum, comm, stream),
            ncclSuccess);
  ASSERT_TRUE(wait_stream(stream, Seconds(120)));
  ASSERT_EQ(async_error(comm), ncclSuccess) << last_error(comm);
  Checker check("64 MiB all-reduce");
  for (size_t i = 0; i < count; ++i) {
    double want = 0;
    for (int r = 0; r < n; ++r) want += value(r, i);
    check.eq(recv[i], want, i);
  }
}

void check_broadcast_and_reduce(ncclComm_t comm, cudaStream_t stream, int rank, int n) {
  const TypeInfo& f64 = type_info(ncclFloat64);
  const TypeInfo& f32 = type_info(ncclFloat32);
  struct Bcast {
    int root;
    size_t count;
    int style;  // 0: ncclBroadcast, 1: ncclBroadcast in place, 2: ncclBcast
    Bytes send, recv;
  };
  std::vector<Bcast> bcasts;
  for (int root : {0, n - 1}) {
    for (size_t count : {size_t(1000), size_t(300001)}) {  // 300001 f64: 5 steps
      for (int style = 0; style < 3; ++style) {
        Bytes send = rank == root ? filled(root, count, f64) : Bytes(count * 8, 0xcd);
        bcasts.push_back(Bcast{root, count, style, std::move(send), Bytes(count * 8, 0xcd)});
      }
    }
  }
  for (Bcast& b : bcasts) {
    ncclResult_t r;
    if (b.style == 0) {
      r = ncclBroadcast(b.send.data(), b.recv.data(), b.count, ncclFloat64, b.root, comm, stream);
    } else if (b.style == 1) {
      r = ncclBroadcast(b.send.data(), b.send.data(), b.count, ncclFloat64, b.root, comm, stream);
    } else {
      r = ncclBcast(b.send.data(), b.count, ncclFloat64, b.root, comm, stream);
    }
    ASSERT_EQ(r, ncclSuccess) << last_error(comm);
  }
  // Reduce to the last rank; the others pass no receive buffer.
  const size_t big = 200001;  // f32: 2 steps
  Bytes rsend = filled(rank, big, f32), rsum(big * 4, 0xcd), rmax(big * 4, 0xcd);
  const int root = n - 1;
  ASSERT_EQ(ncclReduce(rsend.data(), rank == root ? rsum.data() : nullptr, big, ncclFloat32,
                       ncclSum, root, comm, stream),
            ncclSuccess);
  ASSERT_EQ(ncclReduce(rsend.data(), rank == root ? rmax.data() : nullptr, big, ncclFloat32,
                       ncclMax, root, comm, stream),
            ncclSuccess);
  ASSERT_TRUE(wait_stream(stream, Seconds(60)));
  ASSERT_EQ(async_error(comm), ncclSuccess) << last_error(comm);
  for (const Bcast& b : bcasts) {
    Checker check("broadcast root " + std::to_string(b.root) + " count " + std::to_string(b.count) +
                  " style " + std::to_string(b.style));
    const Bytes& out = b.style == 0 ? b.recv : b.send;
    for (size_t i = 0; i < b.count; ++i) check.eq(at(out, i, f64), input(b.root, i, f64), i);
  }
  if (rank == root) {
    Checker sum("reduce sum"), max("reduce max");
    for (size_t i = 0; i < big; ++i) {
      sum.eq(at(rsum, i, f32), expected(ncclSum, f32, n, i), i);
      max.eq(at(rmax, i, f32), expected(ncclMax, f32, n, i), i);
    }
  } else {
    EXPECT_EQ(rsum, Bytes(big * 4, 0xcd));  // untouched
  }
}

void check_gather_and_scatter(ncclComm_t comm, cudaStream_t stream, int rank, int n) {
  const TypeInfo& f32 = type_info(ncclFloat32);
  const TypeInfo& bf16 = type_info(ncclBfloat16);
  const size_t nn = size_t(n);
  for (size_t count : {size_t(1000), size_t(150001)}) {  // 150001 f32: 2 steps
    Bytes send = filled(rank, count, f32), recv(nn * count * 4, 0xcd);
    Bytes in_place(nn * count * 4, 0xcd);
    std::memcpy(&in_place[size_t(rank) * count * 4], send.data(), send.size());
    ASSERT_EQ(ncclAllGather(send.data(), recv.data(), count, ncclFloat32, comm, stream),
              ncclSuccess);
    ASSERT_EQ(ncclAllGather(&in_place[size_t(rank) * count * 4], in_place.data(), count,
                            ncclFloat32, comm, stream),
              ncclSuccess);
    ASSERT_TRUE(wait_stream(stream, Seconds(60)));
    ASSERT_EQ(async_error(comm), ncclSuccess) << last_error(comm);
    Checker check("all-gather count " + std::to_string(count));
    Checker check_in_place("all-gather in place count " + std::to_string(count));
    for (int r = 0; r < n; ++r) {
      for (size_t i = 0; i < count; ++i) {
        const size_t j = size_t(r) * count + i;
        check.eq(at(recv, j, f32), input(r, i, f32), j);
        check_in_place.eq(at(in_place, j, f32), input(r, i, f32), j);
      }
    }
  }
  // Reduce-scatter: rank r gets block r of the reduction; input element j = block * count + i.
  for (const TypeInfo* t : {&f32, &bf16}) {
    for (ncclRedOp_t op : {ncclSum, ncclAvg}) {
      for (size_t count : {size_t(1000), size_t(70001)}) {  // 70001 f32 takes 2+ steps at n=2
        Bytes send = filled(rank, nn * count, *t), recv(count * t->size, 0xcd);
        Bytes in_place = send;
        ASSERT_EQ(ncclReduceScatter(send.data(), recv.data(), count, t->type, op, comm, stream),
                  ncclSuccess);
        ASSERT_EQ(ncclReduceScatter(in_place.data(), &in_place[size_t(rank) * count * t->size],
                                    count, t->type, op, comm, stream),
                  ncclSuccess);
        ASSERT_TRUE(wait_stream(stream, Seconds(60)));
        ASSERT_EQ(async_error(comm), ncclSuccess) << last_error(comm);
        Checker check(std::string("reduce-scatter ") + t->name + " " + op_name(op) + " count " +
                      std::to_string(count));
        for (size_t i = 0; i < count; ++i) {
          const double want = expected(op, *t, n, size_t(rank) * count + i);
          check.eq(at(recv, i, *t), want, i);
          check.eq(at(in_place, size_t(rank) * count + i, *t), want, i);
        }
      }
    }
  }
}

// A ring exchange (send right, receive left) of a message larger than a channel's ring buffer,
// a send to self, two messages to the same peer (matched in order) and an empty one, in one group.
void check_send_recv(ncclComm_t comm, cudaStream_t stream, int rank, int n) {
  const TypeInfo& f32 = type_info(ncclFloat32);
  const TypeInfo& i64 = type_info(ncclInt64);
  const int right = (rank + 1) % n, left = (rank + n - 1) % n;
  const size_t big = 300001;  // 1.2 MB
  Bytes send = filled(rank, big, f32), recv(big * 4, 0xcd);
  Bytes self_send = filled(rank + 100, 1000, i64), self_recv(1000 * 8, 0xcd);
  Bytes first = filled(rank + 1, 10, f32), second = filled(rank + 2, 20, f32);
  Bytes got_first(10 * 4, 0xcd), got_second(20 * 4, 0xcd);
  // The small messages go first, so that the big one wraps around the ring buffer.
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  ASSERT_EQ(ncclSend(first.data(), 10, ncclFloat32, right, comm, stream), ncclSuccess);
  ASSERT_EQ(ncclSend(second.data(), 20, ncclFloat32, right, comm, stream), ncclSuccess);
  ASSERT_EQ(ncclSend(nullptr, 0, ncclFloat32, right, comm, stream), ncclSuccess);
  ASSERT_EQ(ncclSend(send.data(), big, ncclFloat32, right, comm, stream), ncclSuccess);
  ASSERT_EQ(ncclSend(self_send.data(), 1000, ncclInt64, rank, comm, stream), ncclSuccess);
  ASSERT_EQ(ncclRecv(self_recv.data(), 1000, ncclInt64, rank, comm, stream), ncclSuccess);
  ASSERT_EQ(ncclRecv(got_first.data(), 10, ncclFloat32, left, comm, stream), ncclSuccess);
  ASSERT_EQ(ncclRecv(got_second.data(), 20, ncclFloat32, left, comm, stream), ncclSuccess);
  ASSERT_EQ(ncclRecv(nullptr, 0, ncclFloat32, left, comm, stream), ncclSuccess);
  ASSERT_EQ(ncclRecv(recv.data(), big, ncclFloat32, left, comm, stream), ncclSuccess);
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << last_error(comm);
  ASSERT_TRUE(wait_stream(stream, Seconds(60)));
  ASSERT_EQ(async_error(comm), ncclSuccess) << last_error(comm);
  Checker check("ring send/recv");
  for (size_t i = 0; i < big; ++i) check.eq(at(recv, i, f32), input(left, i, f32), i);
  EXPECT_EQ(self_recv, self_send);
  Checker check_order("two messages to one peer");
  for (size_t i = 0; i < 10; ++i) check_order.eq(at(got_first, i, f32), input(left + 1, i, f32), i);
  for (size_t i = 0; i < 20; ++i) {
    check_order.eq(at(got_second, i, f32), input(left + 2, i, f32), i);
  }
}

// A count-0 collective returns at once, but keeps the numbering in step: the next one matches.
void check_count_zero_keeps_sequence(ncclComm_t comm, cudaStream_t stream, int rank, int n) {
  const TypeInfo& i32 = type_info(ncclInt32);
  Bytes send = filled(rank, 100, i32), recv(100 * 4, 0xcd);
  ASSERT_EQ(ncclBroadcast(nullptr, nullptr, 0, ncclInt32, 0, comm, stream), ncclSuccess);
  ASSERT_EQ(ncclAllGather(nullptr, nullptr, 0, ncclInt32, comm, stream), ncclSuccess);
  ASSERT_EQ(ncclAllReduce(send.data(), recv.data(), 100, ncclInt32, ncclMax, comm, stream),
            ncclSuccess);
  ASSERT_TRUE(wait_stream(stream, Seconds(60)));
  ASSERT_EQ(async_error(comm), ncclSuccess) << last_error(comm);
  Checker check("all-reduce after count-0 collectives");
  for (size_t i = 0; i < 100; ++i) check.eq(at(recv, i, i32), expected(ncclMax, i32, n, i), i);
}

void run_all_collectives(ncclComm_t comm, cudaStream_t stream, int rank, int n) {
  int count = 0, user_rank = -1, device = -1;
  ASSERT_EQ(ncclCommCount(comm, &count), ncclSuccess);
  ASSERT_EQ(ncclCommUserRank(comm, &user_rank), ncclSuccess);
  ASSERT_EQ(ncclCommCuDevice(comm, &device), ncclSuccess);
  EXPECT_EQ(count, n);
  EXPECT_EQ(user_rank, rank);
  int current = -1;
  ASSERT_EQ(cudaGetDevice(&current), cudaSuccess);
  EXPECT_EQ(device, current);  // the device current at ncclCommInitRank
  check_all_reduce_every_type(comm, stream, rank, n);
  check_broadcast_and_reduce(comm, stream, rank, n);
  check_gather_and_scatter(comm, stream, rank, n);
  check_send_recv(comm, stream, rank, n);
  check_count_zero_keeps_sequence(comm, stream, rank, n);
  check_large_all_reduce(comm, stream, rank, n);
}

// ---- Workers: this binary, re-executed by the driver tests ----

std::string to_hex(const ncclUniqueId& id) {
  static const char kDigits[] = "0123456789abcdef";
  std::string s;
  for (char c : id.internal) {
    s += kDigits[uint8_t(c) >> 4];
    s += kDigits[uint8_t(c) & 15];
  }
  return s;
}

ncclUniqueId from_hex(const std::string& s) {
  ncclUniqueId id{};
  for (size_t i = 0; i < sizeof(id.internal) && 2 * i + 1 < s.size(); ++i) {
    id.internal[i] = char(std::stoi(s.substr(2 * i, 2), nullptr, 16));
  }
  return id;
}

struct WorkerArgs {
  int rank, nranks;
  ncclUniqueId id;
};

// Set only in a process started by run_workers: the worker tests do nothing otherwise.
std::optional<WorkerArgs> worker_args() {
  if (std::getenv("RG_NCCL_EMU_WORKER") == nullptr) return std::nullopt;
  return WorkerArgs{std::atoi(std::getenv("RG_NCCL_EMU_RANK")),
                    std::atoi(std::getenv("RG_NCCL_EMU_NRANKS")),
                    from_hex(std::getenv("RG_NCCL_EMU_ID"))};
}

// The shared-memory objects of this process's unique ids (the driver's, for workers) are
// unlinked once every rank joined or the last one left: a finished job leaves nothing behind.
void expect_nothing_left_in_dev_shm() {
  const std::string prefix = "rg-nccl-" + std::to_string(getpid()) + "-";
  for (const auto& entry : std::filesystem::directory_iterator("/dev/shm")) {
    EXPECT_NE(entry.path().filename().string().rfind(prefix, 0), 0u)
        << entry.path() << " was left behind";
  }
}

// Starts `nranks` copies of this binary running the test `worker` (rank i with RG_NCCL_EMU_RANK=i
// and `extra_env`), waits for all at most `limit` (killing them then) and checks that each
// exited with 0 and that nothing of their communicator is left in /dev/shm.
void run_workers(const std::string& worker, int nranks, Seconds limit,
                 const std::vector<std::string>& extra_env = {}) {
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  std::vector<pid_t> pids;
  for (int r = 0; r < nranks; ++r) {
    // One emulated device per rank (NCCL refuses two ranks on one), unless extra_env says.
    std::vector<std::string> added = {"RG_EMU_DEVICES=" + std::to_string(nranks)};
    added.insert(added.end(), extra_env.begin(), extra_env.end());
    std::vector<std::string> env;
    for (char** e = environ; *e != nullptr; ++e) env.emplace_back(*e);
    env.push_back("RG_NCCL_EMU_WORKER=1");
    env.push_back("RG_NCCL_EMU_RANK=" + std::to_string(r));
    env.push_back("RG_NCCL_EMU_NRANKS=" + std::to_string(nranks));
    env.push_back("RG_NCCL_EMU_ID=" + to_hex(id));
    // Each of `added` replaces the variable of its name (extra_env's RG_EMU_DEVICES the default).
    for (const std::string& a : added) {
      const std::string name = a.substr(0, a.find('=') + 1);
      env.erase(std::remove_if(env.begin(), env.end(),
                               [&](const std::string& e) { return e.rfind(name, 0) == 0; }),
                env.end());
      env.push_back(a);
    }
    std::vector<std::string> args = {"/proc/self/exe", "--gtest_filter=NcclEmuWorker." + worker,
                                     "--gtest_brief=1"};
    std::vector<char*> argv, envp;
    for (std::string& a : args) argv.push_back(a.data());
    for (std::string& e : env) envp.push_back(e.data());
    argv.push_back(nullptr);
    envp.push_back(nullptr);
    pid_t pid = 0;
    ASSERT_EQ(posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv.data(), envp.data()), 0);
    pids.push_back(pid);
  }
  // Exited workers are reaped only when all have ended: until then they are zombies, which the
  // ranks still running must recognize as gone (as under a launcher that reaps late).
  const auto deadline = std::chrono::steady_clock::now() + limit;
  auto exited = [](pid_t pid) {
    siginfo_t info{};
    return waitid(P_PID, id_t(pid), &info, WEXITED | WNOHANG | WNOWAIT) == 0 && info.si_pid == pid;
  };
  while (!std::all_of(pids.begin(), pids.end(), exited) &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  for (size_t i = 0; i < pids.size(); ++i) {
    if (exited(pids[i])) continue;
    kill(pids[i], SIGKILL);
    ADD_FAILURE() << worker << " rank " << i << " still ran after " << limit.count()
                  << " s: killed";
  }
  for (size_t i = 0; i < pids.size(); ++i) {
    int status = 0;
    ASSERT_EQ(waitpid(pids[i], &status, 0), pids[i]);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << worker << " rank " << i << " ended with status " << status;
  }
  expect_nothing_left_in_dev_shm();
}

TEST(NcclEmuWorker, Collectives) {
  const std::optional<WorkerArgs> args = worker_args();
  if (!args) return;
  LaunchBlockingOff blocking_off;
  ASSERT_EQ(cudaSetDevice(args->rank), cudaSuccess);
  ncclComm_t comm = nullptr;
  ASSERT_EQ(ncclCommInitRank(&comm, args->nranks, args->id, args->rank), ncclSuccess)
      << ncclGetLastError(nullptr);
  cudaStream_t stream = new_stream();
  run_all_collectives(comm, stream, args->rank, args->nranks);
  EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
  EXPECT_EQ(cudaStreamDestroy(stream), cudaSuccess);
}

// Rank 1 exits after their first all-reduce (which connects them); rank 0's next all-reduce then
// fails on its stream instead of waiting forever.
TEST(NcclEmuWorker, PeerExits) {
  const std::optional<WorkerArgs> args = worker_args();
  if (!args) return;
  LaunchBlockingOff blocking_off;
  ASSERT_EQ(cudaSetDevice(args->rank), cudaSuccess);
  ncclComm_t comm = nullptr;
  ASSERT_EQ(ncclCommInitRank(&comm, 2, args->id, args->rank), ncclSuccess)
      << ncclGetLastError(nullptr);
  cudaStream_t stream = new_stream();
  std::vector<float> x(1000, 1.0f);
  ASSERT_EQ(ncclAllReduce(x.data(), x.data(), 1, ncclFloat32, ncclSum, comm, stream), ncclSuccess);
  ASSERT_TRUE(wait_stream(stream, Seconds(30)));
  if (args->rank == 1) _exit(0);
  x[0] = 1.0f;
  ASSERT_EQ(ncclAllReduce(x.data(), x.data(), x.size(), ncclFloat32, ncclSum, comm, stream),
            ncclSuccess);
  ASSERT_TRUE(wait_stream(stream, Seconds(30)));
  EXPECT_EQ(async_error(comm), ncclSystemError);
  const std::string msg = last_error(comm);
  EXPECT_NE(msg.find("rank 1 (pid "), std::string::npos) << msg;
  EXPECT_NE(msg.find(") exited"), std::string::npos) << msg;
  EXPECT_NE(msg.find("ncclAllReduce(f32[1000], sum)"), std::string::npos) << msg;
  EXPECT_EQ(x, std::vector<float>(1000, 1.0f));  // untouched
  // Later calls fail at once with the same error.
  EXPECT_EQ(ncclAllReduce(x.data(), x.data(), 1, ncclFloat32, ncclSum, comm, stream),
            ncclSystemError);
  EXPECT_EQ(ncclCommAbort(comm), ncclSuccess);
}

// Three communicators of one process on three emulated devices (RG_EMU_DEVICES=3), driven from
// three host threads, then from one thread through groups.
TEST(NcclEmuWorker, InitAll) {
  if (!worker_args()) return;
  LaunchBlockingOff blocking_off;
  constexpr int n = 3;
  ncclComm_t comms[n];
  ASSERT_EQ(ncclCommInitAll(comms, n, nullptr), ncclSuccess) << ncclGetLastError(nullptr);
  cudaStream_t streams[n];
  for (int d = 0; d < n; ++d) {
    int device = -1, rank = -1;
    ASSERT_EQ(ncclCommCuDevice(comms[d], &device), ncclSuccess);
    ASSERT_EQ(ncclCommUserRank(comms[d], &rank), ncclSuccess);
    EXPECT_EQ(device, d);
    EXPECT_EQ(rank, d);
    ASSERT_EQ(cudaSetDevice(d), cudaSuccess);
    streams[d] = new_stream();
  }
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);

  // One host thread per device, all collectives.
  std::vector<std::thread> threads;
  for (int d = 0; d < n; ++d) {
    threads.emplace_back([&, d] {
      ASSERT_EQ(cudaSetDevice(d), cudaSuccess);
      check_all_reduce_every_type(comms[d], streams[d], d, n);
      check_broadcast_and_reduce(comms[d], streams[d], d, n);
      check_gather_and_scatter(comms[d], streams[d], d, n);
    });
  }
  for (std::thread& t : threads) t.join();

  // One thread: a group with an all-reduce per device, on emulated device memory.
  const TypeInfo& f32 = type_info(ncclFloat32);
  const size_t count = 200001;
  float* buf[n];
  for (int d = 0; d < n; ++d) {
    ASSERT_EQ(cudaSetDevice(d), cudaSuccess);
    ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&buf[d]), count * 4), cudaSuccess);
    const Bytes in = filled(d, count, f32);
    std::memcpy(buf[d], in.data(), in.size());
  }
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  for (int d = 0; d < n; ++d) {
    ASSERT_EQ(cudaSetDevice(d), cudaSuccess);
    ASSERT_EQ(ncclAllReduce(buf[d], buf[d], count, ncclFloat32, ncclSum, comms[d], streams[d]),
              ncclSuccess);
  }
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << ncclGetLastError(nullptr);
  // A ring of sends between the devices, larger than a ring buffer, from one thread.
  std::vector<Bytes> out(n, Bytes(count * 4, 0xcd));
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  for (int d = 0; d < n; ++d) {
    ASSERT_EQ(ncclSend(buf[d], count, ncclFloat32, (d + 1) % n, comms[d], streams[d]), ncclSuccess);
    ASSERT_EQ(
        ncclRecv(out[size_t(d)].data(), count, ncclFloat32, (d + n - 1) % n, comms[d], streams[d]),
        ncclSuccess);
  }
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << ncclGetLastError(nullptr);
  for (int d = 0; d < n; ++d) ASSERT_TRUE(wait_stream(streams[d], Seconds(60)));
  Checker check("grouped all-reduce and ring on 3 devices");
  for (int d = 0; d < n; ++d) {
    EXPECT_EQ(async_error(comms[d]), ncclSuccess) << last_error(comms[d]);
    for (size_t i = 0; i < count; ++i) {
      const double want = expected(ncclSum, f32, n, i);
      check.eq(buf[d][i], want, i);
      check.eq(at(out[size_t(d)], i, f32), want, i);
    }
  }
  EXPECT_TRUE(rg::emu::race_reports().empty());
  for (int d = 0; d < n; ++d) {
    EXPECT_EQ(cudaFree(buf[d]), cudaSuccess);
    EXPECT_EQ(ncclCommDestroy(comms[d]), ncclSuccess);
  }
}

// ---- Drivers ----

TEST(NcclEmuMultiProcess, TwoRanks) { run_workers("Collectives", 2, Seconds(240)); }
TEST(NcclEmuMultiProcess, FourRanks) { run_workers("Collectives", 4, Seconds(300)); }
TEST(NcclEmuMultiProcess, PeerProcessExits) { run_workers("PeerExits", 2, Seconds(60)); }
TEST(NcclEmuMultiProcess, InitAllOnThreeDevices) {
  run_workers("InitAll", 1, Seconds(240), {"RG_EMU_DEVICES=3"});
}

// ---- One process, several communicators ----

// In-process tests: every communicator is gone at the end, and so is its shared memory.
class NcclEmu : public ::testing::Test {
 protected:
  void TearDown() override { expect_nothing_left_in_dev_shm(); }
};

// n communicators of this process, rank r on device r, initialized from one thread through a
// group. Use new_stream(r) for rank r.
std::vector<ncclComm_t> local_comms(int n) {
  expect_devices(n);
  ncclUniqueId id;
  EXPECT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  std::vector<ncclComm_t> comms(size_t(n), nullptr);
  EXPECT_EQ(ncclGroupStart(), ncclSuccess);
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(cudaSetDevice(r), cudaSuccess);
    EXPECT_EQ(ncclCommInitRank(&comms[size_t(r)], n, id, r), ncclSuccess);
  }
  EXPECT_EQ(cudaSetDevice(0), cudaSuccess);
  EXPECT_EQ(ncclGroupEnd(), ncclSuccess) << ncclGetLastError(nullptr);
  return comms;
}

// local_comms(n) with the connections NCCL makes at first use (see shim/nccl.h) already made, so
// that one thread can then call for one rank at a time: through one group, a one-element
// all-reduce (collective #1 of every rank) and a one-element send and receive each way between
// every pair.
std::vector<ncclComm_t> connected_comms(int n) {
  std::vector<ncclComm_t> comms = local_comms(n);
  std::vector<cudaStream_t> streams;
  for (int r = 0; r < n; ++r) streams.push_back(new_stream(r));
  std::vector<std::vector<float>> buf(size_t(n), std::vector<float>(size_t(1 + 2 * n), 1.0f));
  EXPECT_EQ(ncclGroupStart(), ncclSuccess);
  for (int r = 0; r < n; ++r) {
    float* b = buf[size_t(r)].data();
    const ncclComm_t c = comms[size_t(r)];
    const cudaStream_t s = streams[size_t(r)];
    EXPECT_EQ(ncclAllReduce(b, b, 1, ncclFloat32, ncclSum, c, s), ncclSuccess);
    for (int p = 0; p < n; ++p) {
      if (p == r) continue;
      EXPECT_EQ(ncclSend(b + 1 + p, 1, ncclFloat32, p, c, s), ncclSuccess);
      EXPECT_EQ(ncclRecv(b + 1 + n + p, 1, ncclFloat32, p, c, s), ncclSuccess);
    }
  }
  EXPECT_EQ(ncclGroupEnd(), ncclSuccess) << ncclGetLastError(nullptr);
  for (cudaStream_t s : streams) EXPECT_TRUE(wait_stream(s, Seconds(30)));
  for (ncclComm_t c : comms) EXPECT_EQ(async_error(c), ncclSuccess) << last_error(c);
  return comms;
}

TEST_F(NcclEmu, InitRankFromThreads) {
  within(Seconds(120), [] {
    LaunchBlockingOff blocking_off;
    constexpr int n = 3;
    expect_devices(n);
    ncclUniqueId id;
    ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
    std::vector<std::thread> threads;
    for (int r = 0; r < n; ++r) {
      threads.emplace_back([&, r] {
        ASSERT_EQ(cudaSetDevice(r), cudaSuccess);
        ncclComm_t comm = nullptr;
        ASSERT_EQ(ncclCommInitRank(&comm, n, id, r), ncclSuccess) << ncclGetLastError(nullptr);
        cudaStream_t stream = new_stream();
        check_all_reduce_every_type(comm, stream, r, n);
        check_send_recv(comm, stream, r, n);
        EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
        EXPECT_EQ(cudaStreamDestroy(stream), cudaSuccess);
      });
    }
    for (std::thread& t : threads) t.join();
  });
}

// Ops of one communicator run in the order they were issued, whatever streams they are on.
TEST_F(NcclEmu, OneCommunicatorOnSeveralStreams) {
  within(Seconds(60), [] {
    LaunchBlockingOff blocking_off;
    std::vector<ncclComm_t> comms = connected_comms(2);
    cudaStream_t a = new_stream(0), b = new_stream(0), c = new_stream(1);
    const TypeInfo& f32 = type_info(ncclFloat32);
    const size_t count = 150001;
    Bytes x0 = filled(0, count, f32), y0 = filled(0, count, f32);
    Bytes x1 = filled(1, count, f32), y1 = filled(1, count, f32);
    // Rank 0 issues its second all-reduce on another stream; it must still run second.
    ASSERT_EQ(ncclAllReduce(x0.data(), x0.data(), count, ncclFloat32, ncclSum, comms[0], a),
              ncclSuccess);
    ASSERT_EQ(ncclAllReduce(y0.data(), y0.data(), count, ncclFloat32, ncclMax, comms[0], b),
              ncclSuccess);
    ASSERT_EQ(ncclAllReduce(x1.data(), x1.data(), count, ncclFloat32, ncclSum, comms[1], c),
              ncclSuccess);
    ASSERT_EQ(ncclAllReduce(y1.data(), y1.data(), count, ncclFloat32, ncclMax, comms[1], c),
              ncclSuccess);
    // A group whose send and receive of one communicator are on two streams: the group joins
    // them, so the exchange (larger than a ring buffer) completes.
    Bytes s0 = filled(0, count, f32), r0(count * 4, 0xcd), s1 = filled(1, count, f32),
          r1(count * 4, 0xcd);
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    ASSERT_EQ(ncclSend(s0.data(), count, ncclFloat32, 1, comms[0], a), ncclSuccess);
    ASSERT_EQ(ncclRecv(r0.data(), count, ncclFloat32, 1, comms[0], b), ncclSuccess);
    ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << ncclGetLastError(nullptr);
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    ASSERT_EQ(ncclRecv(r1.data(), count, ncclFloat32, 0, comms[1], c), ncclSuccess);
    ASSERT_EQ(ncclSend(s1.data(), count, ncclFloat32, 0, comms[1], c), ncclSuccess);
    ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << ncclGetLastError(nullptr);
    for (cudaStream_t s : {a, b, c}) ASSERT_TRUE(wait_stream(s, Seconds(30)));
    for (ncclComm_t comm : comms) EXPECT_EQ(async_error(comm), ncclSuccess) << last_error(comm);
    Checker check("all-reduces on two streams"), exchange("send/recv on two streams");
    for (size_t i = 0; i < count; ++i) {
      check.eq(at(x0, i, f32), expected(ncclSum, f32, 2, i), i);
      check.eq(at(x1, i, f32), expected(ncclSum, f32, 2, i), i);
      check.eq(at(y0, i, f32), expected(ncclMax, f32, 2, i), i);
      check.eq(at(y1, i, f32), expected(ncclMax, f32, 2, i), i);
      exchange.eq(at(r0, i, f32), input(1, i, f32), i);
      exchange.eq(at(r1, i, f32), input(0, i, f32), i);
    }
    for (ncclComm_t comm : comms) EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
  });
}

// RG_EMU_NCCL_LINK: each all-reduce holds its stream for the flat ring model's time (2 ranks:
// latency + bytes / bandwidth) from when both ranks joined it, and still reduces; a bad value
// fails the init with what is expected.
TEST_F(NcclEmu, LinkModelHoldsEachAllReduceForTheRingTime) {
  within(Seconds(60), [] {
    LaunchBlockingOff blocking_off;
    ASSERT_EQ(setenv("RG_EMU_NCCL_LINK", "0.01,3000", 1), 0);  // 10 MB/s, 3 ms
    std::vector<ncclComm_t> comms = local_comms(2);
    unsetenv("RG_EMU_NCCL_LINK");
    cudaStream_t s0 = new_stream(0), s1 = new_stream(1);
    const TypeInfo& f32 = type_info(ncclFloat32);
    const size_t count = 50000;  // 200 kB: 3 ms + 20 ms
    const double model_ms = 3.0 + 4.0 * count / 0.01e6;
    Bytes x0 = filled(0, count, f32), x1 = filled(1, count, f32);
    const auto t0 = std::chrono::steady_clock::now();
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    ASSERT_EQ(ncclAllReduce(x0.data(), x0.data(), count, ncclFloat32, ncclSum, comms[0], s0),
              ncclSuccess);
    ASSERT_EQ(ncclAllReduce(x1.data(), x1.data(), count, ncclFloat32, ncclSum, comms[1], s1),
              ncclSuccess);
    ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << ncclGetLastError(nullptr);
    ASSERT_TRUE(wait_stream(s0, Seconds(30)));
    ASSERT_TRUE(wait_stream(s1, Seconds(30)));
    const double took_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_GE(took_ms, model_ms);
    EXPECT_LT(took_ms, model_ms + 2000) << "the link model holds the stream far too long";
    Checker check("all-reduce under the link model");
    for (size_t i = 0; i < count; ++i) {
      check.eq(at(x0, i, f32), expected(ncclSum, f32, 2, i), i);
      check.eq(at(x1, i, f32), expected(ncclSum, f32, 2, i), i);
    }
    for (ncclComm_t comm : comms) EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);

    for (const char* bad : {"fast", "0,10", "1", "1,-5", "1,5us", "1e-300,1", "inf,1", "1,1e9"}) {
      ASSERT_EQ(setenv("RG_EMU_NCCL_LINK", bad, 1), 0);
      ncclUniqueId id;
      ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
      ncclComm_t comm = nullptr;
      const ncclResult_t r = ncclCommInitRank(&comm, 1, id, 0);
      const std::string msg = ncclGetLastError(nullptr);
      unsetenv("RG_EMU_NCCL_LINK");
      EXPECT_EQ(r, ncclInvalidArgument) << bad;
      EXPECT_NE(msg.find("must be GBPS,LATENCY_US"), std::string::npos) << msg;
    }
  });
}

// A collective on a capturing stream is recorded into the CUDA graph, not run; each launch of the
// graph runs it as a fresh call (numbered and ordered among the communicator's other calls then),
// so replays and eager calls interleave on every rank as they were queued. A group spread over
// two streams cannot be captured and says so.
TEST_F(NcclEmu, ACapturedCollectiveRunsAtEachLaunchOfItsGraph) {
  within(Seconds(60), [] {
    LaunchBlockingOff blocking_off;
    std::vector<ncclComm_t> comms = connected_comms(2);
    std::vector<cudaStream_t> streams = {new_stream(0), new_stream(1)};
    std::vector<std::vector<float>> x = {std::vector<float>(6, 1.f), std::vector<float>(6, 2.f)};
    std::vector<cudaGraphExec_t> execs(2, nullptr);
    for (int r = 0; r < 2; ++r) {
      ASSERT_EQ(cudaSetDevice(r), cudaSuccess);
      const cudaStream_t s = streams[size_t(r)];
      ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed), cudaSuccess);
      ASSERT_EQ(ncclAllReduce(x[size_t(r)].data(), x[size_t(r)].data(), 6, ncclFloat32, ncclSum,
                              comms[size_t(r)], s),
                ncclSuccess)
          << ncclGetLastError(comms[size_t(r)]);
      cudaGraph_t graph = nullptr;
      ASSERT_EQ(cudaStreamEndCapture(s, &graph), cudaSuccess);
      ASSERT_EQ(cudaGraphInstantiate(&execs[size_t(r)], graph, 0), cudaSuccess);
      ASSERT_EQ(cudaGraphDestroy(graph), cudaSuccess);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    EXPECT_EQ(x[0][0], 1.f) << "the captured all-reduce ran at capture";
    EXPECT_EQ(x[1][0], 2.f);
    auto launch_all = [&] {
      for (int r = 0; r < 2; ++r) {
        ASSERT_EQ(cudaSetDevice(r), cudaSuccess);
        ASSERT_EQ(cudaGraphLaunch(execs[size_t(r)], streams[size_t(r)]), cudaSuccess);
      }
    };
    auto eager_all = [&] {
      for (int r = 0; r < 2; ++r) {
        ASSERT_EQ(cudaSetDevice(r), cudaSuccess);
        ASSERT_EQ(ncclAllReduce(x[size_t(r)].data(), x[size_t(r)].data(), 6, ncclFloat32, ncclSum,
                                comms[size_t(r)], streams[size_t(r)]),
                  ncclSuccess);
      }
    };
    launch_all();  // 1 + 2 = 3 everywhere
    eager_all();   // 6
    launch_all();  // 12
    launch_all();  // 24
    for (int r = 0; r < 2; ++r) ASSERT_TRUE(wait_stream(streams[size_t(r)], Seconds(30)));
    for (int r = 0; r < 2; ++r) {
      EXPECT_EQ(async_error(comms[size_t(r)]), ncclSuccess) << last_error(comms[size_t(r)]);
      for (float v : x[size_t(r)]) EXPECT_EQ(v, 24.f) << "rank " << r;
    }
    // A group over two streams of one rank, captured: refused, naming why.
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    cudaStream_t other = new_stream(0);
    ASSERT_EQ(cudaStreamBeginCapture(streams[0], cudaStreamCaptureModeRelaxed), cudaSuccess);
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    ASSERT_EQ(ncclSend(x[0].data(), 6, ncclFloat32, 1, comms[0], streams[0]), ncclSuccess);
    ASSERT_EQ(ncclRecv(x[0].data(), 6, ncclFloat32, 1, comms[0], other), ncclSuccess);
    EXPECT_EQ(ncclGroupEnd(), ncclInvalidUsage);
    const std::string msg = ncclGetLastError(comms[0]);
    EXPECT_NE(msg.find("cannot be captured into a CUDA graph"), std::string::npos) << msg;
    cudaGraph_t graph = nullptr;
    EXPECT_EQ(cudaStreamEndCapture(streams[0], &graph), cudaSuccess);
    EXPECT_EQ(cudaGraphDestroy(graph), cudaSuccess);
    for (int r = 0; r < 2; ++r) {
      ASSERT_EQ(cudaSetDevice(r), cudaSuccess);
      EXPECT_EQ(cudaGraphExecDestroy(execs[size_t(r)]), cudaSuccess);
    }
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    for (ncclComm_t c : comms) EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
  });
}

// As NCCL 2.26 and later: a communicator's abort waits until the CUDA graphs that captured its
// calls are destroyed (so a program must not abort on the thread that would destroy them).
TEST_F(NcclEmu, AbortWaitsUntilTheGraphsThatCapturedItsCallsAreDestroyed) {
  within(Seconds(60), [] {
    LaunchBlockingOff blocking_off;
    std::vector<ncclComm_t> comms = connected_comms(2);
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    const cudaStream_t s = new_stream(0);
    std::vector<float> x(6, 1.f);
    ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed), cudaSuccess);
    ASSERT_EQ(ncclAllReduce(x.data(), x.data(), 6, ncclFloat32, ncclSum, comms[0], s), ncclSuccess);
    cudaGraph_t graph = nullptr;
    ASSERT_EQ(cudaStreamEndCapture(s, &graph), cudaSuccess);
    cudaGraphExec_t exec = nullptr;
    ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
    std::atomic<bool> returned{false};
    std::thread aborter([&] {
      EXPECT_EQ(ncclCommAbort(comms[0]), ncclSuccess);
      returned = true;
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    EXPECT_FALSE(returned) << "the abort returned while a graph held the communicator's calls";
    ASSERT_EQ(cudaGraphDestroy(graph), cudaSuccess);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    EXPECT_FALSE(returned) << "the instantiated graph still holds them";
    ASSERT_EQ(cudaGraphExecDestroy(exec), cudaSuccess);
    aborter.join();
    EXPECT_TRUE(returned);
    EXPECT_EQ(ncclCommDestroy(comms[1]), ncclSuccess);
  });
}

TEST_F(NcclEmu, DifferentCollectivesAreNamedOnEveryRank) {
  within(Seconds(60), [] {
    LaunchBlockingOff blocking_off;
    std::vector<ncclComm_t> comms = local_comms(2);
    cudaStream_t s0 = new_stream(0), s1 = new_stream(1);
    std::vector<float> a(1000, 1.0f), b(1000, 2.0f), out(1000, -1.0f);
    // In one group: their first collectives connect the ranks on the host (see shim/nccl.h).
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    ASSERT_EQ(ncclAllReduce(a.data(), out.data(), 1000, ncclFloat32, ncclSum, comms[0], s0),
              ncclSuccess);
    ASSERT_EQ(ncclBroadcast(b.data(), b.data(), 1000, ncclFloat32, 0, comms[1], s1), ncclSuccess);
    ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << ncclGetLastError(nullptr);
    ASSERT_TRUE(wait_stream(s0, Seconds(30)));
    ASSERT_TRUE(wait_stream(s1, Seconds(30)));
    const std::string want =
        "collective #1 differs between ranks: rank 0 called ncclAllReduce(f32[1000], sum), "
        "rank 1 called ncclBroadcast(f32[1000], root 0)";
    for (ncclComm_t c : comms) {
      EXPECT_EQ(async_error(c), ncclInvalidUsage);
      EXPECT_NE(last_error(c).find(want), std::string::npos) << last_error(c);
    }
    EXPECT_EQ(out, std::vector<float>(1000, -1.0f));  // no data moved
    EXPECT_EQ(b, std::vector<float>(1000, 2.0f));
    // Later calls fail at once, and RG_CUDA_CHECK's message carries the reason.
    const ncclResult_t r = ncclAllReduce(a.data(), a.data(), 1, ncclFloat32, ncclSum, comms[0], s0);
    EXPECT_EQ(r, ncclInvalidUsage);
    try {
      rg::emu::check_status(r, "ncclAllReduce(...)", "x.cpp", 7);
      ADD_FAILURE() << "check_status did not throw";
    } catch (const rg::Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("x.cpp:7: ncclAllReduce(...) failed: invalid usage: "), std::string::npos)
          << msg;
      EXPECT_NE(msg.find(want), std::string::npos) << msg;
      EXPECT_EQ(msg.find("NCCL_DEBUG"), std::string::npos) << msg;
    }
    for (ncclComm_t c : comms) EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
  });
}

TEST_F(NcclEmu, SkippedCountZeroCollectiveIsNamedInAMismatch) {
  within(Seconds(60), [] {
    LaunchBlockingOff blocking_off;
    std::vector<ncclComm_t> comms = local_comms(2);
    cudaStream_t s0 = new_stream(0), s1 = new_stream(1);
    std::vector<float> x(10, 1.0f), y(10, 1.0f);
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);  // connects the ranks (see above)
    ASSERT_EQ(ncclAllReduce(x.data(), x.data(), 0, ncclFloat32, ncclSum, comms[0], s0),
              ncclSuccess);
    ASSERT_EQ(ncclBroadcast(x.data(), x.data(), 10, ncclFloat32, 1, comms[0], s0), ncclSuccess);
    ASSERT_EQ(ncclAllReduce(y.data(), y.data(), 10, ncclFloat32, ncclSum, comms[1], s1),
              ncclSuccess);
    ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << ncclGetLastError(nullptr);
    ASSERT_TRUE(wait_stream(s0, Seconds(30)));
    ASSERT_TRUE(wait_stream(s1, Seconds(30)));
    const std::string want =
        "collective #1 differs between ranks: rank 0 called ncclAllReduce(f32[0], sum), which "
        "returned at once (count 0), then #2 ncclBroadcast(f32[10], root 1), rank 1 called "
        "ncclAllReduce(f32[10], sum)";
    for (ncclComm_t c : comms) {
      EXPECT_EQ(async_error(c), ncclInvalidUsage);
      EXPECT_NE(last_error(c).find(want), std::string::npos) << last_error(c);
    }
    for (ncclComm_t c : comms) EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
  });
}

TEST_F(NcclEmu, DifferentSendAndReceiveAreNamed) {
  within(Seconds(60), [] {
    LaunchBlockingOff blocking_off;
    std::vector<ncclComm_t> comms = local_comms(2);
    cudaStream_t s0 = new_stream(0), s1 = new_stream(1);
    std::vector<float> x(100, 1.0f), y(100, -1.0f);
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);  // connects rank 0 to rank 1 (see above)
    ASSERT_EQ(ncclSend(x.data(), 100, ncclFloat32, 1, comms[0], s0), ncclSuccess);
    ASSERT_EQ(ncclRecv(y.data(), 50, ncclFloat32, 0, comms[1], s1), ncclSuccess);
    ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << ncclGetLastError(nullptr);
    ASSERT_TRUE(wait_stream(s0, Seconds(30)));
    ASSERT_TRUE(wait_stream(s1, Seconds(30)));
    const std::string want =
        "send/receive #1 from rank 0 to rank 1 differs: rank 0 called ncclSend(f32[100], peer 1), "
        "rank 1 called ncclRecv(f32[50], peer 0)";
    for (ncclComm_t c : comms) {
      EXPECT_EQ(async_error(c), ncclInvalidUsage);
      EXPECT_NE(last_error(c).find(want), std::string::npos) << last_error(c);
    }
    EXPECT_EQ(y, std::vector<float>(100, -1.0f));
    for (ncclComm_t c : comms) EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
  });
}

TEST_F(NcclEmu, AbortUnblocksARankWhosePeerNeverCalls) {
  within(Seconds(60), [] {
    LaunchBlockingOff blocking_off;
    std::vector<ncclComm_t> comms = connected_comms(2);
    cudaStream_t s0 = new_stream(0), s1 = new_stream(1);
    std::vector<float> x(1000, 1.0f);
    ASSERT_EQ(ncclAllReduce(x.data(), x.data(), 1000, ncclFloat32, ncclSum, comms[0], s0),
              ncclSuccess);
    // Rank 1 does not call: that is no error by itself (as in NCCL), rank 0 just waits.
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    EXPECT_EQ(cudaStreamQuery(s0), cudaErrorNotReady);
    EXPECT_EQ(async_error(comms[0]), ncclSuccess);
    // The host is not blocked: the watchdog's way out is to abort.
    ASSERT_EQ(ncclCommAbort(comms[0]), ncclSuccess);
    ASSERT_TRUE(wait_stream(s0, Seconds(10)));
    EXPECT_EQ(x, std::vector<float>(1000, 1.0f));
    ncclResult_t e;
    EXPECT_EQ(ncclCommGetAsyncError(comms[0], &e), ncclInvalidArgument);  // released
    // The peer's next collective stops too, naming who aborted.
    ASSERT_EQ(ncclAllReduce(x.data(), x.data(), 1000, ncclFloat32, ncclSum, comms[1], s1),
              ncclSuccess);
    ASSERT_TRUE(wait_stream(s1, Seconds(10)));
    EXPECT_EQ(async_error(comms[1]), ncclRemoteError);
    EXPECT_NE(last_error(comms[1]).find("rank 0 aborted the communicator"), std::string::npos)
        << last_error(comms[1]);
    EXPECT_EQ(ncclCommDestroy(comms[1]), ncclSuccess);
  });
}

// As NCCL 2.22 and later: a blocking communicator's first collective waits on the host until every
// rank has made its own (they connect then), and its first send to a peer until that peer's first
// receive from it; later calls do not wait on the host.
TEST_F(NcclEmu, AFirstCallWaitsOnTheHostUntilItsPeersConnect) {
  within(Seconds(60), [] {
    using std::chrono::milliseconds;
    LaunchBlockingOff blocking_off;
    std::vector<ncclComm_t> comms = local_comms(2);
    cudaStream_t s0 = new_stream(0), s1 = new_stream(1);
    std::vector<float> x(8, 1.0f), y(8, 2.0f);
    std::atomic<bool> returned{false};
    ncclResult_t r0 = ncclInternalError;
    auto on_rank0 = [&](const std::function<ncclResult_t()>& call) {
      returned = false;
      return std::thread([&, call] {
        EXPECT_EQ(cudaSetDevice(0), cudaSuccess);
        r0 = call();
        returned = true;
      });
    };
    std::thread t = on_rank0(
        [&] { return ncclAllReduce(x.data(), x.data(), 8, ncclFloat32, ncclSum, comms[0], s0); });
    std::this_thread::sleep_for(milliseconds(300));
    EXPECT_FALSE(returned) << "the first collective returned before its peer connected";
    ASSERT_EQ(ncclAllReduce(y.data(), y.data(), 8, ncclFloat32, ncclSum, comms[1], s1),
              ncclSuccess);
    t.join();
    EXPECT_EQ(r0, ncclSuccess) << last_error(comms[0]);
    ASSERT_TRUE(wait_stream(s0, Seconds(30)));
    ASSERT_TRUE(wait_stream(s1, Seconds(30)));
    EXPECT_EQ(x, std::vector<float>(8, 3.0f));
    EXPECT_EQ(y, std::vector<float>(8, 3.0f));
    // Connected: one thread calls for one rank, then for the other.
    ASSERT_EQ(ncclAllReduce(x.data(), x.data(), 8, ncclFloat32, ncclSum, comms[0], s0),
              ncclSuccess);
    ASSERT_EQ(ncclAllReduce(y.data(), y.data(), 8, ncclFloat32, ncclSum, comms[1], s1),
              ncclSuccess);
    ASSERT_TRUE(wait_stream(s0, Seconds(30)));
    ASSERT_TRUE(wait_stream(s1, Seconds(30)));
    EXPECT_EQ(x, std::vector<float>(8, 6.0f));
    // The collectives' connection does not make sends and receives: rank 0's first send waits
    // for rank 1's first receive from rank 0.
    std::fill(y.begin(), y.end(), -1.0f);
    t = on_rank0([&] { return ncclSend(x.data(), 8, ncclFloat32, 1, comms[0], s0); });
    std::this_thread::sleep_for(milliseconds(300));
    EXPECT_FALSE(returned) << "the first send returned before its peer connected";
    ASSERT_EQ(ncclRecv(y.data(), 8, ncclFloat32, 0, comms[1], s1), ncclSuccess);
    t.join();
    EXPECT_EQ(r0, ncclSuccess) << last_error(comms[0]);
    ASSERT_TRUE(wait_stream(s0, Seconds(30)));
    ASSERT_TRUE(wait_stream(s1, Seconds(30)));
    EXPECT_EQ(y, std::vector<float>(8, 6.0f));
    for (ncclComm_t c : comms) EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
  });
}

// A first call whose peer destroyed its communicator fails on the host, naming the call, the
// connection it waited for and why that cannot be made.
TEST_F(NcclEmu, AConnectionToAPeerThatLeftFailsOnTheHost) {
  within(Seconds(60), [] {
    LaunchBlockingOff blocking_off;
    std::vector<ncclComm_t> comms = local_comms(2);
    cudaStream_t s0 = new_stream(0);
    ASSERT_EQ(ncclCommDestroy(comms[1]), ncclSuccess);
    std::vector<float> x(8, 1.0f);
    EXPECT_EQ(ncclAllReduce(x.data(), x.data(), 8, ncclFloat32, ncclSum, comms[0], s0),
              ncclRemoteError);
    const std::string want =
        "ncclAllReduce(f32[8], sum) on rank 0 waited for its connection to every rank (made at "
        "first use), which cannot be made: rank 1 destroyed the communicator";
    EXPECT_NE(last_error(comms[0]).find(want), std::string::npos) << last_error(comms[0]);
    EXPECT_EQ(async_error(comms[0]), ncclRemoteError);
    EXPECT_EQ(ncclCommAbort(comms[0]), ncclSuccess);
  });
}

// A nonblocking communicator (ncclConfig_t::blocking = 0) returns from every call at once:
// ncclCommGetAsyncError says ncclInProgress while its creation waits for the other ranks or a call
// for its connections, and NCCL refuses the next call until then. ncclCommAbort ends a wait for a
// connection that never comes.
TEST_F(NcclEmu, ANonblockingCommunicatorIsInProgressUntilItsPeersJoinAndConnect) {
  within(Seconds(60), [] {
    using std::chrono::milliseconds;
    LaunchBlockingOff blocking_off;
    expect_devices(2);
    auto settle = [](ncclComm_t c) {
      ncclResult_t r = ncclInProgress;
      for (int i = 0; i < 10000 && r == ncclInProgress; ++i) {
        EXPECT_EQ(ncclCommGetAsyncError(c, &r), ncclSuccess);
        if (r == ncclInProgress) std::this_thread::sleep_for(milliseconds(1));
      }
      return r;
    };
    ncclUniqueId id;
    ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t c0 = nullptr, c1 = nullptr;
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    ASSERT_EQ(ncclCommInitRankConfig(&c0, 2, id, 0, &config), ncclInProgress);
    cudaStream_t s0 = new_stream(0), s1 = new_stream(1);
    std::vector<float> x(8, 1.0f), y(8, 2.0f);
    std::this_thread::sleep_for(milliseconds(100));
    EXPECT_EQ(async_error(c0), ncclInProgress) << "rank 1 has not joined";
    EXPECT_EQ(ncclAllReduce(x.data(), x.data(), 8, ncclFloat32, ncclSum, c0, s0),
              ncclInvalidArgument);
    EXPECT_NE(std::string(ncclGetLastError(nullptr)).find("before its previous operation"),
              std::string::npos)
        << ncclGetLastError(nullptr);
    ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
    ASSERT_EQ(ncclCommInitRankConfig(&c1, 2, id, 1, &config), ncclInProgress);
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    EXPECT_EQ(settle(c0), ncclSuccess) << last_error(c0);
    EXPECT_EQ(settle(c1), ncclSuccess) << last_error(c1);

    // The first collective stays in progress, with nothing on its stream, until the peer's.
    EXPECT_EQ(ncclAllReduce(x.data(), x.data(), 8, ncclFloat32, ncclSum, c0, s0), ncclInProgress);
    std::this_thread::sleep_for(milliseconds(200));
    EXPECT_EQ(async_error(c0), ncclInProgress);
    EXPECT_EQ(cudaStreamQuery(s0), cudaSuccess);
    EXPECT_EQ(ncclAllReduce(y.data(), y.data(), 8, ncclFloat32, ncclSum, c1, s1), ncclInProgress);
    EXPECT_EQ(settle(c0), ncclSuccess) << last_error(c0);
    EXPECT_EQ(settle(c1), ncclSuccess) << last_error(c1);
    ASSERT_TRUE(wait_stream(s0, Seconds(30)));
    ASSERT_TRUE(wait_stream(s1, Seconds(30)));
    EXPECT_EQ(x, std::vector<float>(8, 3.0f));
    EXPECT_EQ(y, std::vector<float>(8, 3.0f));
    // Connected calls too return ncclInProgress (NCCL queues them on a thread of its own).
    EXPECT_EQ(ncclAllReduce(x.data(), x.data(), 8, ncclFloat32, ncclSum, c0, s0), ncclInProgress);
    EXPECT_EQ(ncclAllReduce(y.data(), y.data(), 8, ncclFloat32, ncclSum, c1, s1), ncclInProgress);
    EXPECT_EQ(settle(c0), ncclSuccess) << last_error(c0);
    EXPECT_EQ(settle(c1), ncclSuccess) << last_error(c1);
    ASSERT_TRUE(wait_stream(s0, Seconds(30)));
    ASSERT_TRUE(wait_stream(s1, Seconds(30)));
    EXPECT_EQ(x, std::vector<float>(8, 6.0f));

    // A group may not mix blocking and nonblocking communicators; nothing of it is queued.
    std::vector<ncclComm_t> blocking = local_comms(2);
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    ASSERT_EQ(ncclAllReduce(x.data(), x.data(), 8, ncclFloat32, ncclSum, c0, s0), ncclSuccess);
    ASSERT_EQ(ncclAllReduce(x.data(), x.data(), 8, ncclFloat32, ncclSum, blocking[0], s0),
              ncclSuccess);
    EXPECT_EQ(ncclGroupEnd(), ncclInvalidArgument);
    EXPECT_NE(std::string(ncclGetLastError(nullptr))
                  .find("blocking and nonblocking communicators are not allowed in the same group"),
              std::string::npos)
        << ncclGetLastError(nullptr);
    for (ncclComm_t c : blocking) EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
    EXPECT_EQ(async_error(c0), ncclSuccess);

    // Rank 0's first send to rank 1, which rank 1 never receives: in progress until aborted.
    EXPECT_EQ(ncclSend(x.data(), 8, ncclFloat32, 1, c0, s0), ncclInProgress);
    std::this_thread::sleep_for(milliseconds(100));
    EXPECT_EQ(async_error(c0), ncclInProgress);
    const auto t0 = std::chrono::steady_clock::now();
    EXPECT_EQ(ncclCommAbort(c0), ncclSuccess);
    EXPECT_LT(std::chrono::steady_clock::now() - t0, Seconds(5));
    EXPECT_EQ(x, std::vector<float>(8, 6.0f));
    // Finalizing is polled too.
    EXPECT_EQ(ncclCommFinalize(c1), ncclInProgress);
    EXPECT_EQ(settle(c1), ncclSuccess) << last_error(c1);
    EXPECT_EQ(ncclCommDestroy(c1), ncclSuccess);
  });
}

TEST_F(NcclEmu, BadArgumentsAreRefused) {
  within(Seconds(60), [] {
    LaunchBlockingOff blocking_off;
    ncclUniqueId id;
    ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
    ncclComm_t comm = nullptr;
    EXPECT_EQ(ncclCommInitRank(&comm, 2, id, 2), ncclInvalidArgument);
    EXPECT_NE(std::string(ncclGetLastError(nullptr)).find("rank 2 is out of range for nranks 2"),
              std::string::npos)
        << ncclGetLastError(nullptr);
    EXPECT_EQ(ncclCommInitRank(&comm, 2, id, -1), ncclInvalidArgument);
    EXPECT_EQ(ncclCommInitRank(&comm, 0, id, 0), ncclInvalidArgument);
    ncclUniqueId garbage{};
    EXPECT_EQ(ncclCommInitRank(&comm, 1, garbage, 0), ncclInvalidArgument);
    EXPECT_EQ(ncclGroupEnd(), ncclInvalidUsage);

    // A single-rank communicator: argument checks of the calls.
    ASSERT_EQ(ncclCommInitRank(&comm, 1, id, 0), ncclSuccess) << ncclGetLastError(nullptr);
    cudaStream_t s = new_stream();
    float x[4] = {1, 2, 3, 4};
    EXPECT_EQ(ncclAllReduce(x, x, 4, ncclNumTypes, ncclSum, comm, s), ncclInvalidArgument);
    EXPECT_EQ(ncclAllReduce(x, x, 4, ncclFloat32, ncclNumOps, comm, s), ncclInvalidArgument);
    EXPECT_EQ(ncclBroadcast(x, x, 4, ncclFloat32, 1, comm, s), ncclInvalidArgument);
    EXPECT_EQ(ncclSend(x, 4, ncclFloat32, 3, comm, s), ncclInvalidArgument);
    EXPECT_EQ(ncclAllReduce(nullptr, x, 4, ncclFloat32, ncclSum, comm, s), ncclInvalidArgument);
    // A send to self needs its receive in the same group.
    EXPECT_EQ(ncclSend(x, 4, ncclFloat32, 0, comm, s), ncclInvalidUsage);
    // A group with a refused call queues nothing.
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    EXPECT_EQ(ncclAllReduce(x, x, 4, ncclFloat32, ncclSum, comm, s), ncclSuccess);
    EXPECT_EQ(ncclReduce(x, x, 4, ncclFloat32, ncclSum, 5, comm, s), ncclInvalidArgument);
    EXPECT_EQ(ncclGroupEnd(), ncclInvalidArgument);
    // A single rank reduces to itself; avg over one rank is the identity.
    float y[4] = {};
    EXPECT_EQ(ncclAllReduce(x, y, 4, ncclFloat32, ncclAvg, comm, s), ncclSuccess);
    ASSERT_TRUE(wait_stream(s, Seconds(10)));
    EXPECT_EQ(async_error(comm), ncclSuccess) << last_error(comm);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(y[i], x[i]);
    EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
    EXPECT_EQ(ncclCommDestroy(comm), ncclInvalidArgument);  // already gone
    EXPECT_EQ(ncclCommCount(comm, nullptr), ncclInvalidArgument);
  });
}

TEST_F(NcclEmu, RanksGivenDifferentSizesBothFail) {
  within(Seconds(60), [] {
    ncclUniqueId id;
    ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
    ncclResult_t results[2];
    std::string messages[2];
    std::thread t0([&] {
      ncclComm_t c = nullptr;
      results[0] = ncclCommInitRank(&c, 2, id, 0);
      messages[0] = ncclGetLastError(nullptr);
    });
    std::thread t1([&] {
      ncclComm_t c = nullptr;
      results[1] = ncclCommInitRank(&c, 3, id, 1);
      messages[1] = ncclGetLastError(nullptr);
    });
    t0.join();
    t1.join();
    for (int r = 0; r < 2; ++r) {
      EXPECT_EQ(results[r], ncclInvalidUsage) << messages[r];
      EXPECT_NE(messages[r].find("created the communicator with nranks"), std::string::npos)
          << messages[r];
    }
  });
}

TEST_F(NcclEmu, InitNamesTheRanksThatNeverJoined) {
  within(Seconds(60), [] {
    ASSERT_EQ(setenv("RG_EMU_NCCL_INIT_TIMEOUT_MS", "300", 1), 0);
    ncclUniqueId id;
    ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
    ncclComm_t comm = nullptr;
    const ncclResult_t r = ncclCommInitRank(&comm, 3, id, 0);
    const std::string msg = ncclGetLastError(nullptr);
    unsetenv("RG_EMU_NCCL_INIT_TIMEOUT_MS");
    EXPECT_EQ(r, ncclSystemError);
    EXPECT_NE(msg.find("rank(s) 1, 2, which never joined"), std::string::npos) << msg;
  });
}

// As nvidia-smi prints it, from the emulated runtime's cudaGetDeviceProperties.
std::string uuid_of(int device) {
  cudaDeviceProp prop{};
  EXPECT_EQ(cudaGetDeviceProperties(&prop, device), cudaSuccess);
  std::string s = "GPU-";
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) s += '-';
    char hex[3];
    std::snprintf(hex, sizeof(hex), "%02x",
                  unsigned(static_cast<unsigned char>(prop.uuid.bytes[i])));
    s += hex;
  }
  return s;
}

// Emulated devices have UUIDs: distinct per device, stable, a function of the emulated machine
// (RG_HOST_ID, else the host name) and the index, so every process of one machine agrees.
TEST(EmulatedDevice, UuidsAreStableAndDistinct) {
  expect_devices(2);
  const std::string u0 = uuid_of(0), u1 = uuid_of(1);
  EXPECT_EQ(u0.size(), 40u) << u0;
  EXPECT_EQ(u0.rfind("GPU-", 0), 0u) << u0;
  EXPECT_NE(u0, u1);
  EXPECT_EQ(uuid_of(0), u0);
  ASSERT_EQ(setenv("RG_HOST_ID", "another-machine", 1), 0);
  const std::string other = uuid_of(0);
  unsetenv("RG_HOST_ID");
  EXPECT_NE(other, u0);
  EXPECT_EQ(uuid_of(0), u0);
  cudaDeviceProp prop{};
  EXPECT_EQ(cudaGetDeviceProperties(&prop, 99), cudaErrorInvalidDevice);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidDevice);
}

// As real NCCL ("Duplicate GPU detected"): two ranks on one device fail ncclCommInitRank with
// ncclInvalidUsage on both, and ncclGetLastError says why; from two threads and from one group.
TEST_F(NcclEmu, TwoRanksOnOneDeviceAreRefused) {
  within(Seconds(60), [] {
    const std::string want =
        "Duplicate GPU detected : rank 0 and rank 1 both on CUDA device 0 (" + uuid_of(0) + ")";
    ncclUniqueId id;
    ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
    ncclResult_t results[2];
    std::string messages[2];
    std::vector<std::thread> threads;
    for (int r = 0; r < 2; ++r) {
      threads.emplace_back([&, r] {
        ncclComm_t c = nullptr;
        results[r] = ncclCommInitRank(&c, 2, id, r);  // both on device 0, the current one
        messages[r] = ncclGetLastError(nullptr);
      });
    }
    for (std::thread& t : threads) t.join();
    for (int r = 0; r < 2; ++r) {
      EXPECT_EQ(results[r], ncclInvalidUsage) << messages[r];
      EXPECT_NE(messages[r].find(want), std::string::npos) << messages[r];
    }

    ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
    ncclComm_t comms[2] = {nullptr, nullptr};
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    for (int r = 0; r < 2; ++r) ASSERT_EQ(ncclCommInitRank(&comms[r], 2, id, r), ncclSuccess);
    const ncclResult_t grouped = ncclGroupEnd();
    const std::string why = ncclGetLastError(nullptr);
    EXPECT_EQ(grouped, ncclInvalidUsage) << why;
    EXPECT_NE(why.find(want), std::string::npos) << why;
    try {  // RG_CUDA_CHECK's message: NCCL's words and the reason, not the NCCL_DEBUG hint
      rg::emu::check_status(grouped, "ncclGroupEnd()", "x.cpp", 9);
      ADD_FAILURE() << "check_status did not throw";
    } catch (const rg::Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("x.cpp:9: ncclGroupEnd() failed: invalid usage: " + want),
                std::string::npos)
          << msg;
      EXPECT_EQ(msg.find("NCCL_DEBUG"), std::string::npos) << msg;
    }
    for (ncclComm_t c : comms) {
      if (c == nullptr) continue;
      EXPECT_EQ(async_error(c), ncclInvalidUsage);
      EXPECT_NE(last_error(c).find(want), std::string::npos) << last_error(c);
      EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
    }
  });
}

TEST_F(NcclEmu, VersionAndErrorStrings) {
  int version = 0;
  ASSERT_EQ(ncclGetVersion(&version), ncclSuccess);
  EXPECT_EQ(version, NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH));
  EXPECT_STREQ(ncclGetErrorString(ncclSuccess), "no error");
  // NCCL's own words, hint included: RG_CUDA_CHECK drops the hint when it has the details.
  EXPECT_STREQ(ncclGetErrorString(ncclInvalidUsage),
               "invalid usage (run with NCCL_DEBUG=WARN for details)");
  EXPECT_STREQ(ncclGetErrorString(ncclRemoteError),
               "remote process exited or there was a network error");
}

}  // namespace
}  // namespace rg::nccl_emu_test
