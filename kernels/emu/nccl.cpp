// The emulated NCCL of kernels/emu/shim/nccl.h: the ranks of a communicator (processes of this
// machine, or communicators of one process) meet in a POSIX shared-memory object, in stream order.
#include "kernels/emu/shim/nccl.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <random>
#include <string>
#include <thread>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kernels/emu/device_properties.h"
#include "kernels/emu/device_runtime.h"
#include "kernels/error.h"
#include "kernels/half.h"
#include "kernels/link_model.h"
#include "kernels/nccl_error.h"

// How it works. Every collective is a sequence of steps. In step s each rank writes its part into
// the half (s % 2) of its slot, announces s in its `arrived` counter, waits until every rank has
// announced s, then reads the other ranks' halves. A rank can only start writing step s + 1 (into
// the other half) after all ranks arrived at s, that is after they finished reading step s - 1, so
// two halves are enough and one barrier per step suffices. The first step of each collective
// exchanges descriptors, so that differing calls fail with a message before any data moves.
// Sends and receives use one ring buffer per ordered pair of ranks; the two sides first exchange
// and compare descriptors, then stream the bytes. The ops of one communicator run in the order
// they were issued (a turn per op), whatever streams they were queued on. Calls on a stream that
// is capturing a CUDA graph are recorded into it and take their number and turn at each launch of
// the graph (kernels/emu/device_runtime.h, enqueue_prepared).

namespace rg::emu {
namespace {

using ::rg::detail::cat;
using Clock = std::chrono::steady_clock;

static_assert(std::atomic<uint64_t>::is_always_lock_free &&
                  std::atomic<int32_t>::is_always_lock_free,
              "the shared-memory counters must be lock-free to work between processes");

// ---- Data types and reductions ----

struct Fp8E4M3 {
  uint8_t bits;
};
struct Fp8E5M2 {
  uint8_t bits;
};

bool valid_dtype(ncclDataType_t t) { return int(t) >= 0 && int(t) < int(ncclNumTypes); }
bool valid_op(ncclRedOp_t op) { return int(op) >= 0 && int(op) < int(ncclNumOps); }

size_t dtype_size(ncclDataType_t t) {
  switch (t) {
    case ncclInt8:
    case ncclUint8:
    case ncclFloat8e4m3:
    case ncclFloat8e5m2:
      return 1;
    case ncclFloat16:
    case ncclBfloat16:
      return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32:
      return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64:
      return 8;
    default:
      return 0;
  }
}

const char* dtype_name(int t) {
  static const char* const kNames[] = {"i8",  "u8",  "i32", "u32",  "i64",    "u64",
                                       "f16", "f32", "f64", "bf16", "f8e4m3", "f8e5m2"};
  return t >= 0 && t < int(ncclNumTypes) ? kNames[t] : "?";
}

const char* op_name(int op) {
  static const char* const kNames[] = {"sum", "prod", "max", "min", "avg"};
  return op >= 0 && op < int(ncclNumOps) ? kNames[op] : "?";
}

// fp8 as CUDA's __nv_fp8_e4m3 / __nv_fp8_e5m2: e4m3 has no infinities (S.1111.111 is NaN, 448 the
// largest value), e5m2 is IEEE-like. Conversions from float round to nearest even and saturate
// at the largest finite value, as those types' constructors do (__NV_SATFINITE).
struct Fp8Format {
  int exp_bits, man_bits, bias;
  double max_finite;
  bool has_inf;
};
constexpr Fp8Format kE4M3{4, 3, 7, 448.0, false};
constexpr Fp8Format kE5M2{5, 2, 15, 57344.0, true};

float fp8_to_float(uint8_t v, const Fp8Format& f) {
  const int e_all = (1 << f.exp_bits) - 1, m_all = (1 << f.man_bits) - 1;
  const int e = (v >> f.man_bits) & e_all, m = v & m_all;
  float x;
  if (f.has_inf && e == e_all) {
    x = m == 0 ? INFINITY : NAN;
  } else if (!f.has_inf && e == e_all && m == m_all) {
    x = NAN;
  } else if (e == 0) {
    x = std::ldexp(float(m), 1 - f.bias - f.man_bits);
  } else {
    x = std::ldexp(float(m + (1 << f.man_bits)), e - f.bias - f.man_bits);
  }
  return (v & 0x80) != 0 ? -x : x;
}

uint8_t float_to_fp8(float x, const Fp8Format& f) {
  const uint8_t sign = std::signbit(x) ? 0x80 : 0;
  if (std::isnan(x)) return sign | 0x7f;
  const int e_all = (1 << f.exp_bits) - 1, one = 1 << f.man_bits;
  const int max_code =
      f.has_inf ? ((e_all - 1) << f.man_bits) | (one - 1) : (e_all << f.man_bits) | (one - 2);
  const double a = std::fabs(double(x));
  if (a >= f.max_finite) return uint8_t(sign | max_code);
  if (a == 0) return sign;
  int e2 = 0;
  std::frexp(a, &e2);
  const int e = std::max(e2 - 1, 1 - f.bias);  // subnormals share the smallest exponent
  // a in units of the last mantissa bit (exact: a power-of-two scaling), rounded to even.
  const double q = std::nearbyint(std::ldexp(a, f.man_bits - e));
  int code;
  if (q >= 2 * one) {
    code = (e + 1 + f.bias) << f.man_bits;  // rounded up into the next binade
  } else if (q >= one) {
    code = ((e + f.bias) << f.man_bits) | (int(q) - one);
  } else {
    code = int(q);  // subnormal
  }
  return uint8_t(sign | std::min(code, max_code));
}

// How an element is loaded into the type it is reduced in, and stored back: half types and fp8
// are reduced in f32 and rounded once.
template <class T>
struct Elem {
  using Acc = T;
  static Acc load(T v) { return v; }
  static T store(Acc a) { return a; }
};
template <>
struct Elem<Half> {
  using Acc = float;
  static float load(Half v) { return half_to_float(v); }
  static Half store(float a) { return float_to_half(a); }
};
template <>
struct Elem<BFloat16> {
  using Acc = float;
  static float load(BFloat16 v) { return bfloat16_to_float(v); }
  static BFloat16 store(float a) { return float_to_bfloat16(a); }
};
template <>
struct Elem<Fp8E4M3> {
  using Acc = float;
  static float load(Fp8E4M3 v) { return fp8_to_float(v.bits, kE4M3); }
  static Fp8E4M3 store(float a) { return {float_to_fp8(a, kE4M3)}; }
};
template <>
struct Elem<Fp8E5M2> {
  using Acc = float;
  static float load(Fp8E5M2 v) { return fp8_to_float(v.bits, kE5M2); }
  static Fp8E5M2 store(float a) { return {float_to_fp8(a, kE5M2)}; }
};

template <ncclRedOp_t Op, class A>
A combine(A a, A b) {
  if constexpr (std::is_integral_v<A>) {
    // Integer sums and products wrap around, as on the GPU (unsigned arithmetic: no UB).
    using U = std::make_unsigned_t<A>;
    if constexpr (Op == ncclSum || Op == ncclAvg) return A(U(a) + U(b));
    if constexpr (Op == ncclProd) return A(U(a) * U(b));
  } else {
    if constexpr (Op == ncclSum || Op == ncclAvg) return a + b;
    if constexpr (Op == ncclProd) return a * b;
  }
  if constexpr (Op == ncclMax) return b > a ? b : a;
  if constexpr (Op == ncclMin) return b < a ? b : a;
}

// dst[i] = src[0][i] op src[1][i] op ... op src[n-1][i], in rank order so that every rank computes
// bit-identical results; avg divides the sum by n (integer division for integer types).
using ReduceFn = void (*)(void* dst, const void* const* src, int n, size_t count);

template <class T, ncclRedOp_t Op>
void reduce_typed(void* dst, const void* const* src, int n, size_t count) {
  using E = Elem<T>;
  using A = typename E::Acc;
  constexpr size_t kBlock = 512;
  A acc[kBlock];
  T* out = static_cast<T*>(dst);
  for (size_t base = 0; base < count; base += kBlock) {
    const size_t m = std::min(kBlock, count - base);
    const T* s0 = static_cast<const T*>(src[0]) + base;
    for (size_t i = 0; i < m; ++i) acc[i] = E::load(s0[i]);
    for (int r = 1; r < n; ++r) {
      const T* s = static_cast<const T*>(src[r]) + base;
      for (size_t i = 0; i < m; ++i) acc[i] = combine<Op>(acc[i], E::load(s[i]));
    }
    for (size_t i = 0; i < m; ++i) {
      out[base + i] = E::store(Op == ncclAvg ? A(acc[i] / A(n)) : acc[i]);
    }
  }
}

template <class T>
ReduceFn reduce_fn_for(ncclRedOp_t op) {
  switch (op) {
    case ncclSum:
      return reduce_typed<T, ncclSum>;
    case ncclProd:
      return reduce_typed<T, ncclProd>;
    case ncclMax:
      return reduce_typed<T, ncclMax>;
    case ncclMin:
      return reduce_typed<T, ncclMin>;
    case ncclAvg:
      return reduce_typed<T, ncclAvg>;
    default:
      return nullptr;
  }
}

ReduceFn reduce_fn(ncclDataType_t t, ncclRedOp_t op) {
  switch (t) {
    case ncclInt8:
      return reduce_fn_for<int8_t>(op);
    case ncclUint8:
      return reduce_fn_for<uint8_t>(op);
    case ncclInt32:
      return reduce_fn_for<int32_t>(op);
    case ncclUint32:
      return reduce_fn_for<uint32_t>(op);
    case ncclInt64:
      return reduce_fn_for<int64_t>(op);
    case ncclUint64:
      return reduce_fn_for<uint64_t>(op);
    case ncclFloat16:
      return reduce_fn_for<Half>(op);
    case ncclFloat32:
      return reduce_fn_for<float>(op);
    case ncclFloat64:
      return reduce_fn_for<double>(op);
    case ncclBfloat16:
      return reduce_fn_for<BFloat16>(op);
    case ncclFloat8e4m3:
      return reduce_fn_for<Fp8E4M3>(op);
    case ncclFloat8e5m2:
      return reduce_fn_for<Fp8E5M2>(op);
    default:
      return nullptr;
  }
}

// ---- Calls ----

enum Kind : int32_t {
  kAllReduce = 1,
  kBroadcast,
  kReduce,
  kAllGather,
  kReduceScatter,
  kSend,
  kRecv,
};

bool is_collective(int32_t kind) { return kind >= kAllReduce && kind <= kReduceScatter; }

// What a rank called, as published in shared memory and compared between ranks. op is -1 for
// calls without a reduction, root -1 for calls without a root (sends and receives: the peer).
struct CallDesc {
  uint64_t seq = 0;  // collectives: 1, 2, ... per communicator
  uint64_t count = 0;
  int32_t kind = 0;
  int32_t dtype = 0;
  int32_t op = -1;
  int32_t root = -1;
};

bool same_call(const CallDesc& a, const CallDesc& b) {
  return a.seq == b.seq && a.count == b.count && a.kind == b.kind && a.dtype == b.dtype &&
         a.op == b.op && a.root == b.root;
}

std::string describe(const CallDesc& d) {
  const std::string data = cat(dtype_name(d.dtype), "[", d.count, "]");
  switch (d.kind) {
    case kAllReduce:
      return cat("ncclAllReduce(", data, ", ", op_name(d.op), ")");
    case kBroadcast:
      return cat("ncclBroadcast(", data, ", root ", d.root, ")");
    case kReduce:
      return cat("ncclReduce(", data, ", ", op_name(d.op), ", root ", d.root, ")");
    case kAllGather:
      return cat("ncclAllGather(", data, " per rank)");
    case kReduceScatter:
      return cat("ncclReduceScatter(", data, " per rank, ", op_name(d.op), ")");
    case kSend:
      return cat("ncclSend(", data, ", peer ", d.root, ")");
    case kRecv:
      return cat("ncclRecv(", data, ", peer ", d.root, ")");
    default:
      return "an unknown call";
  }
}

struct Status {
  ncclResult_t code = ncclSuccess;
  std::string message;
  bool ok() const { return code == ncclSuccess; }
};

// ---- Shared memory ----

constexpr uint64_t kShmMagic = 0x52474e43434c3031ull;  // "RGNCCL01"
constexpr uint32_t kLayoutVersion = 3;
constexpr int kMaxRanks = 256;
// Per rank: two halves, alternating between steps. With 1 MiB a 64 MiB collective takes 128 steps.
constexpr size_t kSlotBytes = size_t(1) << 20;
constexpr size_t kHalfSlot = kSlotBytes / 2;
constexpr size_t kPageBytes = 4096;

// A ring buffer per ordered pair of ranks: 256 KiB up to 8 ranks, less beyond, so that a
// communicator's object stays within tens of MiB (/dev/shm is often small in containers). Pages
// are only allocated when a pair actually exchanges data.
size_t channel_bytes(int nranks) {
  size_t b = size_t(256) << 10;
  while (b > (size_t(16) << 10) && b * size_t(nranks) * size_t(nranks) > (size_t(16) << 20)) b /= 2;
  return b;
}

struct ShmHeader {
  uint64_t magic = 0;
  uint32_t version = 0;
  int32_t nranks = 0;
  int32_t creator_rank = 0;
  int32_t creator_pid = 0;
  uint64_t total_bytes = 0;
  std::atomic<int32_t> attached{0};    // live mappings; the last one to go unlinks the name
  std::atomic<int32_t> joined{0};      // ranks registered
  std::atomic<int32_t> aborted_by{0};  // rank + 1 of the first rank that aborted, 0: none
  // Set when a rank gives up joining (nranks differs, timeout): the others then stop waiting.
  // -1 while init_error is being written, then the ncclResult_t.
  std::atomic<int32_t> init_failed{0};
  char init_error[512] = {};
};

struct alignas(64) RankArea {
  std::atomic<int32_t> pid{0};                   // 0 until the rank joined
  std::atomic<int32_t> left{0};                  // 1 once it destroyed its communicator
  std::atomic<int32_t> coll_connect{0};          // 1 once it reached its first collective
  int32_t device = 0;                            // written before the rank counts as joined
  cudaUUID_t uuid{};                             // of that device (rg::emu::device_uuid)
  alignas(64) std::atomic<uint64_t> arrived{0};  // the last step whose part this rank wrote
  CallDesc desc[2];     // by step parity: the collective of a descriptor step
  CallDesc skipped[2];  // the count-0 collective issued just before it (seq 0: none)
};

struct P2PDesc {
  uint64_t count = 0;
  int32_t dtype = 0;
};

struct alignas(64) ChannelSide {
  std::atomic<uint64_t> posted{0};   // the last message whose descriptor this side posted
  std::atomic<uint64_t> matched{0};  // the last message this side compared (then desc is free)
  std::atomic<int32_t> connect{0};   // 1 once this side reached its first message of the pair
  P2PDesc desc;
};

struct Channel {
  ChannelSide sender, receiver;
  alignas(64) std::atomic<uint64_t> head{0};  // bytes ever written by the sender
  alignas(64) std::atomic<uint64_t> tail{0};  // bytes ever consumed by the receiver
};

size_t align_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

struct Layout {
  size_t ranks = 0, slots = 0, channels = 0, rings = 0, ring_bytes = 0, total = 0;
  explicit Layout(int n) {
    const auto nn = size_t(n) * size_t(n);
    ranks = align_up(sizeof(ShmHeader), kPageBytes);
    slots = align_up(ranks + size_t(n) * sizeof(RankArea), kPageBytes);
    channels = slots + size_t(n) * kSlotBytes;
    rings = align_up(channels + nn * sizeof(Channel), kPageBytes);
    ring_bytes = channel_bytes(n);
    total = rings + nn * ring_bytes;
  }
};

// The unique id: what ncclGetUniqueId hands out and every rank passes to ncclCommInitRank.
constexpr char kIdMagic[8] = "RGNCCL1";
constexpr char kShmPrefix[] = "/rg-nccl-";
struct IdLayout {
  char magic[8];
  uint64_t token;
  char name[96];
};
static_assert(sizeof(IdLayout) <= NCCL_UNIQUE_ID_BYTES);

long env_positive(const char* name, long fallback, std::string* error) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  if (end == v || *end != '\0' || x <= 0) {
    *error = cat(name, "=", v, " is not a positive integer");
    return fallback;
  }
  return x;
}

std::string rank_list(const std::vector<int>& ranks) {
  std::string s;
  for (size_t i = 0; i < ranks.size(); ++i) s += cat(i == 0 ? "" : ", ", ranks[i]);
  return s;
}

// As nvidia-smi prints a GPU's UUID: GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx.
std::string uuid_text(const cudaUUID_t& u) {
  std::string s = "GPU-";
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) s += '-';
    char hex[3];
    std::snprintf(hex, sizeof(hex), "%02x", unsigned(static_cast<unsigned char>(u.bytes[i])));
    s += hex;
  }
  return s;
}

// RG_EMU_NCCL_LINK=GBPS,LATENCY_US: every all-reduce holds its stream until the flat ring model's
// time (kernels/link_model.h) has passed since all ranks joined it, so that overlap can be studied
// with real multi-rank NCCL on emulated devices. Other collectives are not slowed.
struct LinkModel {
  double gbps = 0;  // 0: no model, collectives take the time they take
  double latency_us = 0;
};

Status link_model(LinkModel* link) {
  *link = {};
  const char* v = std::getenv("RG_EMU_NCCL_LINK");
  if (v == nullptr || *v == '\0') return {};
  char* end = nullptr;
  const double gbps = std::strtod(v, &end);
  double latency = -1;
  if (end != v && *end == ',') {
    const char* rest = end + 1;
    latency = std::strtod(rest, &end);
    if (end == rest || *end != '\0') latency = -1;
  }
  // Bounds keep every modelled time finite and short of hours: at least 1 kB/s, at most 1 s.
  if (!(gbps >= 1e-6 && gbps <= 1e6) || !(latency >= 0 && latency <= 1e6)) {
    return {ncclInvalidArgument,
            cat("RG_EMU_NCCL_LINK=", v,
                " must be GBPS,LATENCY_US: a bandwidth in GB/s from 1e-6 to 1e6 and a latency in "
                "microseconds from 0 to 1e6 (for example 0.05,100)")};
  }
  *link = {gbps, latency};
  return {};
}

// Spin briefly (a peer usually arrives within microseconds), then sleep with a growing backoff.
class Backoff {
 public:
  void pause() {
    if (spins_ < 64) {
      ++spins_;
      std::this_thread::yield();
      return;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(sleep_us_));
    sleep_us_ = std::min(sleep_us_ * 2, 200);
  }
  void reset() {
    spins_ = 0;
    sleep_us_ = 1;
  }

 private:
  int spins_ = 0;
  int sleep_us_ = 1;
};

}  // namespace
}  // namespace rg::emu

using rg::emu::CallDesc;
using rg::emu::Status;

// One rank's communicator: its mapping of the shared object and the state of its ops.
struct ncclComm {
  int rank = 0, nranks = 0, device = 0;
  std::string shm_name;
  void* base = nullptr;
  size_t bytes = 0;
  rg::emu::ShmHeader* header = nullptr;
  rg::emu::RankArea* areas = nullptr;
  char* slots = nullptr;
  rg::emu::Channel* channels = nullptr;
  char* rings = nullptr;
  size_t ring_bytes = 0;
  bool counted = false;     // holds one of header->attached
  bool blocking = true;     // ncclConfig_t::blocking
  rg::emu::LinkModel link;  // RG_EMU_NCCL_LINK at init

  // Touched only by the op that holds the turn (see begin_turn).
  uint64_t step = 0;
  std::vector<uint64_t> sends, recvs;  // messages started per peer
  std::chrono::steady_clock::time_point last_pid_check{};

  // Connected at first use (see shim/nccl.h): written by the thread that issues for this
  // communicator, or by its nonblocking job (while no other call is accepted).
  bool coll_connected = false;
  std::vector<uint8_t> send_connected, recv_connected;  // per peer

  // Issued on the host under g_submit_mu.
  uint64_t coll_seq = 0;     // collectives issued, including the skipped ones
  uint64_t next_ticket = 0;  // ops issued
  CallDesc last_skipped;     // the count-0 collective issued last (seq 0: none yet)

  std::mutex mu;
  std::condition_variable cv;
  uint64_t turn = 0;    // the ticket whose op may run now
  int outstanding = 0;  // ops queued and not finished
  int running = 0;      // ops holding the turn
  int in_progress = 0;  // a nonblocking communicator's jobs not yet done (init, or connect + queue)
  int captures = 0;     // captures of its calls that a CUDA graph still holds
  std::atomic<bool> aborted{false};
  std::atomic<int> error{ncclSuccess};
  std::string error_message;  // written once, under mu, with the first error

  ~ncclComm();

  rg::emu::RankArea& area(int r) { return areas[r]; }
  char* slot(int r, uint64_t s) {
    return slots + size_t(r) * rg::emu::kSlotBytes + (s % 2) * rg::emu::kHalfSlot;
  }
  rg::emu::Channel& channel(int from, int to) { return channels[size_t(from) * nranks + to]; }
  char* ring(int from, int to) { return rings + (size_t(from) * nranks + to) * ring_bytes; }

  bool healthy() const { return !aborted.load() && error.load() == ncclSuccess; }
  // Keeps the first error; later ones are consequences.
  void fail(const Status& st) {
    std::lock_guard lock(mu);
    if (error.load() != ncclSuccess) return;
    error_message = st.message;
    error.store(st.code);
    cv.notify_all();
  }
  std::string message() {
    std::lock_guard lock(mu);
    return error_message;
  }
};

ncclComm::~ncclComm() {
  if (counted && header->attached.fetch_sub(1) == 1) shm_unlink(shm_name.c_str());
  if (base != nullptr) munmap(base, bytes);
}

namespace rg::emu {
namespace {

// One NCCL call as queued.
struct Call {
  std::shared_ptr<ncclComm> comm;
  CallDesc desc;
  CallDesc skipped;  // collectives: the count-0 collective issued just before (seq 0: none)
  const void* send = nullptr;
  void* recv = nullptr;
  cudaStream_t stream = nullptr;
  int device = 0;  // the device of `stream` when it was called (legacy streams depend on it)
};

// ---- Waiting for peers ----

// Whether a process has exited, including a zombie that its parent has not reaped yet.
bool process_gone(pid_t pid) {
  if (kill(pid, 0) != 0) return errno == ESRCH;
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/%d/stat", int(pid));
  FILE* f = std::fopen(path, "r");
  if (f == nullptr) return false;
  char buf[512];
  const size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
  std::fclose(f);
  buf[n] = '\0';
  const char* end_of_name = std::strrchr(buf, ')');  // "pid (name) state ..."
  return end_of_name != nullptr && end_of_name[1] == ' ' &&
         (end_of_name[2] == 'Z' || end_of_name[2] == 'X');
}

// Why waiting for the ranks `waiting_on` cannot end, or ok. A rank that simply has not called yet
// is no error: real NCCL waits for it too, until someone aborts the communicator.
// last_check throttles the check of peer processes (the waiting thread's own).
Status health(ncclComm& c, const std::vector<int>& waiting_on, Clock::time_point* last_check) {
  if (c.aborted.load()) return {ncclRemoteError, "the communicator was aborted on this rank"};
  if (const int a = c.header->aborted_by.load(std::memory_order_acquire); a != 0) {
    return {ncclRemoteError, cat("rank ", a - 1, " aborted the communicator")};
  }
  for (int r : waiting_on) {
    if (c.area(r).left.load(std::memory_order_acquire) != 0) {
      return {ncclRemoteError, cat("rank ", r, " destroyed the communicator")};
    }
  }
  const auto now = Clock::now();
  if (now - *last_check >= std::chrono::milliseconds(50)) {
    *last_check = now;
    for (int r : waiting_on) {
      const pid_t pid = c.area(r).pid.load();
      if (pid > 0 && process_gone(pid)) {
        return {ncclSystemError, cat("rank ", r, " (pid ", pid, ") exited")};
      }
    }
  }
  return {};
}

// Waits until ready(); blockers() names the ranks it waits for. A failed health check counts only
// when ready() is still false after it: a peer may finish its part and then leave.
template <class Ready, class Blockers>
Status wait_until(ncclComm& c, Ready ready, Blockers blockers,
                  Clock::time_point* last_check = nullptr) {
  if (last_check == nullptr) last_check = &c.last_pid_check;
  Backoff backoff;
  while (!ready()) {
    Status st = health(c, blockers(), last_check);
    if (!st.ok()) return ready() ? Status{} : st;
    backoff.pause();
  }
  return {};
}

Status arrive_and_wait(ncclComm& c, uint64_t s) {
  c.area(c.rank).arrived.store(s, std::memory_order_release);
  auto behind = [&] {
    std::vector<int> ranks;
    for (int r = 0; r < c.nranks; ++r) {
      if (c.area(r).arrived.load(std::memory_order_acquire) < s) ranks.push_back(r);
    }
    return ranks;
  };
  auto all_arrived = [&] {
    for (int r = 0; r < c.nranks; ++r) {
      if (c.area(r).arrived.load(std::memory_order_acquire) < s) return false;
    }
    return true;
  };
  return wait_until(c, all_arrived, behind);
}

// ---- Collectives ----

// The descriptor step: every rank publishes its call; all compare before any data moves.
Status agree(ncclComm& c, const Call& call) {
  const uint64_t s = ++c.step;
  const size_t p = s % 2;
  c.area(c.rank).desc[p] = call.desc;
  c.area(c.rank).skipped[p] = call.skipped;
  if (Status st = arrive_and_wait(c, s); !st.ok()) return st;
  const CallDesc& first = c.area(0).desc[p];
  for (int r = 1; r < c.nranks; ++r) {
    const CallDesc& other = c.area(r).desc[p];
    if (same_call(first, other)) continue;
    // Numbers differ only when a rank skipped a count-0 collective that another did not.
    const uint64_t seq = std::min(first.seq, other.seq);
    auto side = [&](int x, const CallDesc& d) {
      if (d.seq == seq) return cat("rank ", x, " called ", describe(d));
      const CallDesc& sk = c.area(x).skipped[p];
      if (sk.seq == seq) {
        return cat("rank ", x, " called ", describe(sk),
                   ", which returned at once (count 0), then #", d.seq, " ", describe(d));
      }
      return cat("rank ", x, " is already at #", d.seq, " ", describe(d),
                 " (collectives with count 0 return at once)");
    };
    return {ncclInvalidUsage, cat("collective #", seq, " differs between ranks: ", side(0, first),
                                  ", ", side(r, other))};
  }
  return {};
}

Status run_collective(ncclComm& c, const Call& call) {
  if (Status st = agree(c, call); !st.ok()) return st;
  const auto joined = Clock::now();  // every rank has joined this collective
  const CallDesc& d = call.desc;
  const auto dtype = ncclDataType_t(d.dtype);
  const size_t esz = dtype_size(dtype);
  const int n = c.nranks, me = c.rank, root = d.root;
  const auto* send = static_cast<const char*>(call.send);
  auto* recv = static_cast<char*>(call.recv);
  const ReduceFn reduce = d.op >= 0 ? reduce_fn(dtype, ncclRedOp_t(d.op)) : nullptr;
  std::vector<const void*> src(static_cast<size_t>(n));
  // A reduce-scatter step carries one chunk of every block.
  const size_t per = d.kind == kReduceScatter ? kHalfSlot / (esz * size_t(n)) : kHalfSlot / esz;
  for (size_t off = 0; off < d.count; off += per) {
    const size_t m = std::min(per, size_t(d.count) - off), chunk = m * esz;
    const uint64_t s = ++c.step;
    char* mine = c.slot(me, s);
    switch (d.kind) {
      case kBroadcast:
        if (me == root) std::memcpy(mine, send + off * esz, chunk);
        break;
      case kReduceScatter:
        for (int b = 0; b < n; ++b) {
          std::memcpy(mine + size_t(b) * chunk, send + (size_t(b) * d.count + off) * esz, chunk);
        }
        break;
      default:
        std::memcpy(mine, send + off * esz, chunk);
    }
    if (Status st = arrive_and_wait(c, s); !st.ok()) return st;
    switch (d.kind) {
      case kAllReduce:
      case kReduce:
        if (d.kind == kReduce && me != root) break;
        for (int r = 0; r < n; ++r) src[size_t(r)] = c.slot(r, s);
        reduce(recv + off * esz, src.data(), n, m);
        break;
      case kBroadcast:
        if (me != root || send != recv) std::memcpy(recv + off * esz, c.slot(root, s), chunk);
        break;
      case kAllGather:
        for (int r = 0; r < n; ++r) {
          std::memcpy(recv + (size_t(r) * d.count + off) * esz, c.slot(r, s), chunk);
        }
        break;
      case kReduceScatter:
        for (int r = 0; r < n; ++r) src[size_t(r)] = c.slot(r, s) + size_t(me) * chunk;
        reduce(recv + off * esz, src.data(), n, m);
        break;
    }
  }
  if (d.kind == kAllReduce && c.link.gbps > 0) {
    // The link model's time, in slices of at most 1 ms so that an abort (here or on a peer) ends
    // the wait as it ends a wait for peers.
    const double us =
        ring_link_allreduce_us(double(d.count) * double(esz), n, c.link.gbps, c.link.latency_us);
    const auto until = joined + std::chrono::duration_cast<Clock::duration>(
                                    std::chrono::duration<double, std::micro>(us));
    for (auto now = Clock::now(); now < until; now = Clock::now()) {
      if (Status st = health(c, {}, &c.last_pid_check); !st.ok()) return st;
      std::this_thread::sleep_until(std::min(until, now + std::chrono::milliseconds(1)));
    }
  }
  return {};
}

// ---- Sends and receives ----

struct P2P {
  const Call* call;
  ncclComm* comm;
  bool send;
  int peer;
  size_t bytes;
  uint64_t msg = 0;  // its number on the channel, from 1
  int stage = 0;     // 0: post the descriptor, 1: compare, 2: move bytes, 3: done (or failed)
  size_t done = 0;
};

// Moves p on as far as it can now; true if anything changed. A mismatch goes to *st.
bool progress(P2P& p, Status* st) {
  ncclComm& c = *p.comm;
  const int from = p.send ? c.rank : p.peer, to = p.send ? p.peer : c.rank;
  Channel& ch = c.channel(from, to);
  ChannelSide& me = p.send ? ch.sender : ch.receiver;
  ChannelSide& other = p.send ? ch.receiver : ch.sender;
  if (p.stage == 0) {
    if (p.msg == 0) p.msg = ++(p.send ? c.sends : c.recvs)[size_t(p.peer)];
    // The other side may still be reading our previous descriptor.
    if (other.matched.load(std::memory_order_acquire) + 1 < p.msg) return false;
    me.desc = P2PDesc{p.call->desc.count, p.call->desc.dtype};
    me.posted.store(p.msg, std::memory_order_release);
    p.stage = 1;
    return true;
  }
  if (p.stage == 1) {
    if (other.posted.load(std::memory_order_acquire) < p.msg) return false;
    const P2PDesc& s = ch.sender.desc;
    const P2PDesc& r = ch.receiver.desc;
    if (s.count != r.count || s.dtype != r.dtype) {
      *st = {
          ncclInvalidUsage,
          cat("send/receive #", p.msg, " from rank ", from, " to rank ", to, " differs: rank ",
              from, " called ", describe(CallDesc{0, s.count, kSend, s.dtype, -1, to}), ", rank ",
              to, " called ", describe(CallDesc{0, r.count, kRecv, r.dtype, -1, from}))};
      p.stage = 3;
      return true;
    }
    me.matched.store(p.msg, std::memory_order_release);
    p.stage = p.bytes == 0 ? 3 : 2;
    return true;
  }
  const size_t cap = c.ring_bytes;
  char* ring = c.ring(from, to);
  size_t n;
  if (p.send) {
    const uint64_t head = ch.head.load(std::memory_order_relaxed);
    const uint64_t tail = ch.tail.load(std::memory_order_acquire);
    n = std::min(cap - size_t(head - tail), p.bytes - p.done);
    if (n == 0) return false;
    const auto* src = static_cast<const char*>(p.call->send) + p.done;
    const size_t at = size_t(head % cap), first = std::min(n, cap - at);
    std::memcpy(ring + at, src, first);
    std::memcpy(ring, src + first, n - first);
    ch.head.store(head + n, std::memory_order_release);
  } else {
    const uint64_t tail = ch.tail.load(std::memory_order_relaxed);
    const uint64_t head = ch.head.load(std::memory_order_acquire);
    n = std::min(size_t(head - tail), p.bytes - p.done);
    if (n == 0) return false;
    auto* dst = static_cast<char*>(p.call->recv) + p.done;
    const size_t at = size_t(tail % cap), first = std::min(n, cap - at);
    std::memcpy(dst, ring + at, first);
    std::memcpy(dst + first, ring, n - first);
    ch.tail.store(tail + n, std::memory_order_release);
  }
  p.done += n;
  if (p.done == p.bytes) p.stage = 3;
  return true;
}

Status with_context(const Call& call, Status st) {
  if (st.code == ncclInvalidUsage) return st;  // mismatch messages name the calls themselves
  const std::string seq = call.desc.seq != 0 ? cat(" (collective #", call.desc.seq, ")") : "";
  st.message = cat(describe(call.desc), seq, " on rank ", call.comm->rank, ": ", st.message);
  return st;
}

// All sends and receives of a group progress together, so that a ring exchange (send right,
// receive left) cannot deadlock on full ring buffers. Messages between the same pair of ranks in
// the same direction are matched in order: only the first unfinished one is active.
void run_p2p(const std::vector<const Call*>& calls) {
  std::vector<P2P> ops;
  for (const Call* call : calls) {
    ops.push_back(P2P{call, call->comm.get(), call->desc.kind == kSend, call->desc.root,
                      size_t(call->desc.count) * dtype_size(ncclDataType_t(call->desc.dtype))});
  }
  auto fail = [](P2P& p, const Status& st) {
    p.comm->fail(with_context(*p.call, st));
    p.stage = 3;
  };
  Backoff backoff;
  for (;;) {
    bool moved = false;
    std::vector<P2P*> waiting;  // the active ops that could not finish
    for (P2P& p : ops) {
      if (p.stage == 3) continue;
      if (!p.comm->healthy()) {
        p.stage = 3;
        continue;
      }
      const bool queued_behind = std::any_of(waiting.begin(), waiting.end(), [&](const P2P* w) {
        return w->comm == p.comm && w->peer == p.peer && w->send == p.send;
      });
      if (queued_behind) continue;
      Status st;
      while (p.stage != 3 && progress(p, &st)) moved = true;
      if (!st.ok()) {
        fail(p, st);
      } else if (p.stage != 3) {
        waiting.push_back(&p);
      }
    }
    if (waiting.empty()) {
      if (std::all_of(ops.begin(), ops.end(), [](const P2P& p) { return p.stage == 3; })) return;
      continue;  // ops queued behind finished ones become active
    }
    if (moved) {
      backoff.reset();
      continue;
    }
    for (P2P* p : waiting) {
      Status st = health(*p->comm, {p->peer}, &p->comm->last_pid_check);
      if (st.ok()) continue;
      Status mismatch;
      if (progress(*p, &mismatch) || !mismatch.ok()) {
        if (!mismatch.ok()) fail(*p, mismatch);
        continue;  // the peer did its part before it went
      }
      fail(*p, st);
    }
    backoff.pause();
  }
}

// ---- Running queued work ----

// The calls of one enqueue: one call, or the calls of a group on one stream (or on streams that
// share a communicator, which the group joins).
struct Work {
  std::vector<Call> calls;
  std::vector<std::pair<std::shared_ptr<ncclComm>, uint64_t>> tickets;  // a turn per communicator
};

// Waits until every earlier op of c has run (ops of one communicator run in the order they were
// issued, whatever their streams). False when c is broken or aborted: the op then does nothing.
bool begin_turn(ncclComm& c, uint64_t ticket) {
  std::unique_lock lock(c.mu);
  c.cv.wait(lock, [&] { return c.turn == ticket || !c.healthy(); });
  if (!c.healthy()) return false;
  ++c.running;
  return true;
}

void end_turn(ncclComm& c, uint64_t ticket, bool held) {
  std::lock_guard lock(c.mu);
  if (held) {
    c.turn = ticket + 1;
    --c.running;
  }
  --c.outstanding;
  c.cv.notify_all();
}

// Collectives first, in call order, then all sends and receives together.
void run_work(const Work& w) {
  std::vector<bool> held;
  for (const auto& [comm, ticket] : w.tickets) held.push_back(begin_turn(*comm, ticket));
  std::vector<const Call*> p2p;
  for (const Call& call : w.calls) {
    if (!is_collective(call.desc.kind)) {
      p2p.push_back(&call);
    } else if (call.comm->healthy()) {
      if (Status st = run_collective(*call.comm, call); !st.ok()) {
        call.comm->fail(with_context(call, st));
      }
    }
  }
  if (!p2p.empty()) run_p2p(p2p);
  for (size_t i = 0; i < w.tickets.size(); ++i) {
    end_turn(*w.tickets[i].first, w.tickets[i].second, held[i]);
  }
}

// ---- Host-side state ----

// Never destroyed: stream workers may still hold communicators while the process exits.
std::mutex& registry_mu() {
  static auto* mu = new std::mutex;
  return *mu;
}
std::unordered_map<ncclComm*, std::shared_ptr<ncclComm>>& registry() {
  static auto* m = new std::unordered_map<ncclComm*, std::shared_ptr<ncclComm>>;
  return *m;
}

std::shared_ptr<ncclComm> lookup(ncclComm_t handle) {
  std::lock_guard lock(registry_mu());
  auto it = registry().find(handle);
  return it == registry().end() ? nullptr : it->second;
}

std::shared_ptr<ncclComm> take(ncclComm_t handle) {
  std::lock_guard lock(registry_mu());
  auto it = registry().find(handle);
  if (it == registry().end()) return nullptr;
  std::shared_ptr<ncclComm> c = std::move(it->second);
  registry().erase(it);
  return c;
}

void publish(const std::shared_ptr<ncclComm>& c) {
  std::lock_guard lock(registry_mu());
  registry()[c.get()] = c;
}

// Numbers collectives and hands out turns, atomically across communicators (so that a group's
// turns on several communicators cannot interleave with another group's).
std::mutex g_submit_mu;

// Why this thread's last failed call failed: check_status and ncclGetLastError report it.
thread_local std::string t_message;

struct PendingInit {
  std::shared_ptr<ncclComm> comm;
  long timeout_ms;
};

// A nonblocking communicator's wait for the other ranks, on a background thread.
void wait_joined_in_background(std::vector<PendingInit> inits);
struct GroupState {
  int depth = 0;
  std::vector<Call> calls;
  std::vector<PendingInit> inits;
  Status error;  // the first call of the group that failed: nothing of the group is queued
};
thread_local GroupState t_group;

ncclResult_t failed(ncclResult_t code, std::string message) {
  t_message = std::move(message);
  return code;
}
ncclResult_t failed(const Status& st) { return failed(st.code, st.message); }

// A collective, send or receive refused: inside a group the whole group is then refused.
ncclResult_t call_failed(ncclResult_t code, std::string message) {
  if (t_group.depth > 0 && t_group.error.ok()) t_group.error = Status{code, message};
  return failed(code, std::move(message));
}

// ---- Init ----

bool parse_id(const ncclUniqueId& id, IdLayout* out) {
  std::memcpy(out, id.internal, sizeof(*out));
  if (std::memcmp(out->magic, kIdMagic, sizeof(kIdMagic)) != 0 || out->token == 0) return false;
  if (std::memchr(out->name, 0, sizeof(out->name)) == nullptr) return false;
  const size_t prefix = sizeof(kShmPrefix) - 1;
  return std::strncmp(out->name, kShmPrefix, prefix) == 0 &&
         std::strchr(out->name + prefix, '/') == nullptr;
}

// Tells the ranks still waiting in init to give up (first message wins).
void poison(ShmHeader* h, ncclResult_t code, const std::string& message) {
  int32_t expected = 0;
  if (!h->init_failed.compare_exchange_strong(expected, -1)) return;
  std::snprintf(h->init_error, sizeof(h->init_error), "%s", message.c_str());
  h->init_failed.store(code, std::memory_order_release);
}

// Maps the communicator's object, creating and sizing it if this rank comes first. flock makes
// creation atomic: the first rank sizes and initializes the object before any other looks at it.
Status open_shared(ncclComm& c, const char* name) {
  const Layout layout(c.nranks);
  const int fd = shm_open(name, O_CREAT | O_RDWR, 0600);
  if (fd < 0) return {ncclSystemError, cat("shm_open(", name, ") failed: ", std::strerror(errno))};
  // The mapping keeps the open file (and so the flock) alive after close: unlock explicitly.
  struct Closer {
    int fd;
    ~Closer() {
      flock(fd, LOCK_UN);
      close(fd);
    }
  } closer{fd};
  if (flock(fd, LOCK_EX) != 0) {
    return {ncclSystemError, cat("flock(", name, ") failed: ", std::strerror(errno))};
  }
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    return {ncclSystemError, cat("fstat(", name, ") failed: ", std::strerror(errno))};
  }
  const bool create = st.st_size == 0;
  if (create) {
    // The part every rank touches is reserved now, so that a full /dev/shm is an error here
    // rather than a SIGBUS later; ring buffers get pages only when a pair of ranks uses them.
    int e = posix_fallocate(fd, 0, off_t(layout.rings));
    if (e == 0 && ftruncate(fd, off_t(layout.total)) != 0) e = errno;
    if (e != 0) {
      shm_unlink(name);
      return {ncclSystemError, cat("sizing ", name, " (", layout.total, " bytes, ", layout.rings,
                                   " reserved) in /dev/shm failed: ", std::strerror(e))};
    }
  }
  const size_t bytes = create ? layout.total : size_t(st.st_size);
  if (bytes < sizeof(ShmHeader)) {
    return {ncclInvalidArgument, cat(name, " is not an emulated NCCL communicator")};
  }
  void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) {
    if (create) shm_unlink(name);
    return {ncclSystemError, cat("mmap(", name, ", ", bytes, ") failed: ", std::strerror(errno))};
  }
  c.base = base;
  c.bytes = bytes;
  auto* h = static_cast<ShmHeader*>(base);
  c.header = h;
  if (create) {
    new (h) ShmHeader();
    h->magic = kShmMagic;
    h->version = kLayoutVersion;
    h->nranks = c.nranks;
    h->creator_rank = c.rank;
    h->creator_pid = getpid();
    h->total_bytes = layout.total;
  } else if (h->magic != kShmMagic || h->version != kLayoutVersion) {
    return {ncclInvalidArgument,
            cat(name, " is not an emulated NCCL communicator of this version")};
  } else if (h->nranks != c.nranks) {
    Status st{ncclInvalidUsage,
              cat("ncclCommInitRank: rank ", c.rank, " was given nranks ", c.nranks, ", but rank ",
                  h->creator_rank, " created the communicator with nranks ", h->nranks)};
    poison(h, st.code, st.message);
    return st;
  } else if (h->total_bytes != bytes || bytes != layout.total) {
    return {ncclInternalError, cat(name, " has ", bytes, " bytes, expected ", layout.total)};
  }
  auto* raw = static_cast<char*>(base);
  c.areas = reinterpret_cast<RankArea*>(raw + layout.ranks);
  c.slots = raw + layout.slots;
  c.channels = reinterpret_cast<Channel*>(raw + layout.channels);
  c.rings = raw + layout.rings;
  c.ring_bytes = layout.ring_bytes;
  if (create) {
    for (int r = 0; r < c.nranks; ++r) new (&c.areas[r]) RankArea();
    for (size_t i = 0; i < size_t(c.nranks) * size_t(c.nranks); ++i) new (&c.channels[i]) Channel();
  }
  h->attached.fetch_add(1);
  c.counted = true;
  return {};
}

// Maps the object and registers this rank; the wait for the others is wait_joined.
Status join(std::shared_ptr<ncclComm>* out, int nranks, const ncclUniqueId& id, int rank,
            int device) {
  IdLayout parsed{};
  if (!parse_id(id, &parsed)) {
    return {ncclInvalidArgument, "ncclCommInitRank: the unique id was not made by ncclGetUniqueId"};
  }
  if (nranks < 1 || nranks > kMaxRanks) {
    return {ncclInvalidArgument, cat("ncclCommInitRank: nranks ", nranks, " is not in [1, ",
                                     kMaxRanks, "] (the emulator's limit)")};
  }
  if (rank < 0 || rank >= nranks) {
    return {ncclInvalidArgument,
            cat("ncclCommInitRank: rank ", rank, " is out of range for nranks ", nranks)};
  }
  auto c = std::make_shared<ncclComm>();
  c->rank = rank;
  c->nranks = nranks;
  c->device = device;
  c->shm_name = parsed.name;
  c->sends.assign(size_t(nranks), 0);
  c->recvs.assign(size_t(nranks), 0);
  c->send_connected.assign(size_t(nranks), 0);
  c->recv_connected.assign(size_t(nranks), 0);
  if (Status st = open_shared(*c, parsed.name); !st.ok()) return st;
  int32_t other = 0;
  if (!c->area(rank).pid.compare_exchange_strong(other, int32_t(getpid()))) {
    Status st{ncclInvalidUsage, cat("ncclCommInitRank: rank ", rank, " joined twice (pid ", other,
                                    " and pid ", getpid(), ")")};
    poison(c->header, st.code, st.message);
    return st;
  }
  c->area(rank).device = device;
  c->area(rank).uuid = device_uuid(device);
  c->header->joined.fetch_add(1, std::memory_order_acq_rel);
  *out = std::move(c);
  return {};
}

// Real NCCL refuses two ranks on one GPU once all have joined ("Duplicate GPU detected"); every
// rank reads the same table, so all of them fail alike. Emulated devices are told apart by UUID.
Status check_distinct_devices(ncclComm& c) {
  for (int r = 0; r < c.nranks; ++r) {
    for (int q = 0; q < r; ++q) {
      const RankArea &a = c.area(q), &b = c.area(r);
      if (std::memcmp(a.uuid.bytes, b.uuid.bytes, sizeof(a.uuid.bytes)) != 0) continue;
      return {ncclInvalidUsage,
              cat("Duplicate GPU detected : rank ", q, " and rank ", r, " both on CUDA device ",
                  a.device, " (", uuid_text(a.uuid), ")")};
    }
  }
  return {};
}

// Blocks until all ranks have joined (a real NCCL init does too), at most timeout_ms.
Status wait_joined(ncclComm& c, long timeout_ms) {
  ShmHeader* h = c.header;
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  Backoff backoff;
  while (h->joined.load(std::memory_order_acquire) < c.nranks) {
    if (c.aborted.load()) {
      return {ncclInvalidUsage, cat("ncclCommInitRank: rank ", c.rank,
                                    " was aborted while it waited for the others")};
    }
    if (const int f = h->init_failed.load(std::memory_order_acquire); f > 0) {
      return {ncclResult_t(f), cat("ncclCommInitRank: rank ", c.rank,
                                   " stopped waiting for the other ranks: ", h->init_error)};
    }
    if (Clock::now() >= deadline) {
      std::vector<int> missing;
      for (int r = 0; r < c.nranks; ++r) {
        if (c.area(r).pid.load() == 0) missing.push_back(r);
      }
      Status st{ncclSystemError,
                cat("ncclCommInitRank: rank ", c.rank, " of ", c.nranks, " waited ", timeout_ms,
                    " ms (RG_EMU_NCCL_INIT_TIMEOUT_MS) for rank(s) ", rank_list(missing),
                    ", which never joined")};
      poison(h, st.code, st.message);
      return st;
    }
    backoff.pause();
  }
  // Every rank has mapped the object: from now on a crashed job leaves nothing in /dev/shm.
  shm_unlink(c.shm_name.c_str());
  return check_distinct_devices(c);
}

Status init_timeout(long* ms) {
  std::string error;
  *ms = env_positive("RG_EMU_NCCL_INIT_TIMEOUT_MS", 300000, &error);
  if (!error.empty()) return {ncclInvalidArgument, error};
  return {};
}

// ---- Issuing calls ----

bool is_legacy(cudaStream_t s) {
  return s == nullptr || s == cudaStreamLegacy || s == cudaStreamPerThread;
}

// A stream as the runtime resolves it: legacy handles mean the default stream of a device.
struct StreamKey {
  cudaStream_t stream;
  int device;
  bool operator==(const StreamKey&) const = default;
};
StreamKey key_of(const Call& call) {
  return is_legacy(call.stream) ? StreamKey{nullptr, call.device} : StreamKey{call.stream, -1};
}
int device_of(const StreamKey& k) { return k.device >= 0 ? k.device : stream_device(k.stream); }

// Makes the current device `device` for its lifetime (legacy streams resolve through it).
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    cudaGetDevice(&saved_);
    if (device != saved_) cudaSetDevice(device);
  }
  ~DeviceScope() { cudaSetDevice(saved_); }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int saved_ = 0;
};

// Makes `to` wait for everything queued on `from` so far.
Status order_after(const StreamKey& from, const StreamKey& to) {
  cudaEvent_t event = nullptr;
  cudaError_t e;
  try {
    {
      DeviceScope scope(device_of(from));
      e = cudaEventCreateWithFlags(&event, cudaEventDisableTiming);
      if (e == cudaSuccess) e = cudaEventRecord(event, from.stream);
    }
    if (e == cudaSuccess) {
      DeviceScope scope(device_of(to));
      e = cudaStreamWaitEvent(to.stream, event, 0);
    }
  } catch (const std::exception& x) {
    if (event != nullptr) cudaEventDestroy(event);
    return {ncclUnhandledCudaError, cat("joining the streams of a group failed: ", x.what())};
  }
  if (event != nullptr) cudaEventDestroy(event);
  if (e != cudaSuccess) {
    return {ncclUnhandledCudaError,
            cat("joining the streams of a group failed: ", cudaGetErrorString(e))};
  }
  return {};
}

std::string name_with_rank(const Call& call) {
  std::string s = describe(call.desc);
  s.insert(s.size() - 1, cat(", comm rank ", call.comm->rank, "/", call.comm->nranks));
  return s;
}

std::string work_name(const Work& w) {
  if (w.calls.size() == 1) return name_with_rank(w.calls.front());
  std::string s = "ncclGroupEnd(";
  for (size_t i = 0; i < w.calls.size() && i < 4; ++i) {
    s += cat(i == 0 ? "" : "; ", name_with_rank(w.calls[i]));
  }
  if (w.calls.size() > 4) s += cat("; ... ", w.calls.size(), " calls");
  return s + ")";
}

void add_accesses(const Call& call, std::vector<MemAccess>* out) {
  const CallDesc& d = call.desc;
  const size_t bytes = size_t(d.count) * dtype_size(ncclDataType_t(d.dtype));
  const size_t n = size_t(call.comm->nranks);
  const bool root = call.comm->rank == d.root;
  auto add = [&](const void* p, size_t b, bool write) {
    if (p != nullptr && b > 0) out->push_back(MemAccess{p, b, write});
  };
  switch (d.kind) {
    case kAllReduce:
      add(call.send, bytes, false);
      add(call.recv, bytes, true);
      break;
    case kBroadcast:
      if (root) add(call.send, bytes, false);
      add(call.recv, bytes, true);
      break;
    case kReduce:
      add(call.send, bytes, false);
      if (root) add(call.recv, bytes, true);
      break;
    case kAllGather:
      add(call.send, bytes, false);
      add(call.recv, bytes * n, true);
      break;
    case kReduceScatter:
      add(call.send, bytes * n, false);
      add(call.recv, bytes, true);
      break;
    case kSend:
      add(call.send, bytes, false);
      break;
    case kRecv:
      add(call.recv, bytes, true);
      break;
  }
}

// A send to self completes only against a receive from self of the same group.
Status check_self_p2p(const std::vector<Call>& calls) {
  std::vector<ncclComm*> comms;
  for (const Call& call : calls) {
    if (std::find(comms.begin(), comms.end(), call.comm.get()) == comms.end()) {
      comms.push_back(call.comm.get());
    }
  }
  for (ncclComm* c : comms) {
    std::vector<const CallDesc*> sends, recvs;
    for (const Call& call : calls) {
      if (call.comm.get() != c || call.desc.root != c->rank) continue;
      if (call.desc.kind == kSend) sends.push_back(&call.desc);
      if (call.desc.kind == kRecv) recvs.push_back(&call.desc);
    }
    for (size_t i = 0; i < std::max(sends.size(), recvs.size()); ++i) {
      const CallDesc* s = i < sends.size() ? sends[i] : nullptr;
      const CallDesc* r = i < recvs.size() ? recvs[i] : nullptr;
      if (s != nullptr && r != nullptr && s->count == r->count && s->dtype == r->dtype) continue;
      return {ncclInvalidUsage, cat("rank ", c->rank,
                                    ": a send to self needs a receive from self of the same count "
                                    "and type in the same group, but there is ",
                                    s != nullptr ? describe(*s) : "no ncclSend", " and ",
                                    r != nullptr ? describe(*r) : "no ncclRecv")};
    }
  }
  return {};
}

// Under g_submit_mu: gives a collective its number; false for a count-0 collective, which NCCL
// returns from at once (the number stays taken so later calls still match).
bool number_call(Call& call) {
  ncclComm& c = *call.comm;
  if (!is_collective(call.desc.kind)) return true;
  call.desc.seq = ++c.coll_seq;
  call.skipped = c.last_skipped;
  if (call.desc.count != 0) return true;
  c.last_skipped = call.desc;
  return false;
}

// Under g_submit_mu: the next turn of call's communicator for `work`, unless it has one.
void take_turn(Work& work, const Call& call) {
  const bool has_turn = std::any_of(work.tickets.begin(), work.tickets.end(),
                                    [&](const auto& t) { return t.first == call.comm; });
  if (has_turn) return;
  std::lock_guard comm_lock(call.comm->mu);
  work.tickets.emplace_back(call.comm, call.comm->next_ticket++);
  ++call.comm->outstanding;
}

// The work of captured calls at one launch of their CUDA graph: numbered and given their
// communicators' turns now, as calls made at this point would be.
PreparedWork prepare_captured(const std::vector<Call>& captured) {
  auto work = std::make_shared<Work>();
  {
    std::lock_guard lock(g_submit_mu);
    for (Call call : captured) {
      if (!number_call(call)) continue;
      take_turn(*work, call);
      work->calls.push_back(std::move(call));
    }
  }
  PreparedWork out;
  out.run = [work] { run_work(*work); };
  out.abandon = [work] {  // the turns handed out must not block later ops
    for (const auto& [comm, ticket] : work->tickets) {
      comm->fail({ncclUnhandledCudaError,
                  cat(work_name(*work), " was not queued: its CUDA graph's launch failed")});
      end_turn(*comm, ticket, false);
    }
  };
  return out;
}

// Calls on a capturing stream (one call, or a group on that one stream): recorded into the CUDA
// graph; each launch of the graph numbers them and takes their turns (prepare_captured), so a
// replay runs them as fresh calls, in the order it was queued among the communicator's others.
ncclResult_t submit_captured(std::vector<Call> calls) {
  const StreamKey key = key_of(calls.front());
  for (const Call& call : calls) {
    if (!(key_of(call) == key)) {
      return failed(ncclInvalidUsage,
                    cat(describe(call.desc),
                        ": a group of calls on several streams cannot be captured into a CUDA "
                        "graph by the emulated NCCL (put the group's calls on one stream)"));
    }
  }
  Work named;
  named.calls = calls;
  const std::string what = work_name(named);
  std::vector<MemAccess> accesses;
  for (const Call& call : calls) add_accesses(call, &accesses);
  // NCCL 2.26 and later keep the communicator's abort and destroy waiting until the CUDA graphs
  // that captured its calls are destroyed: counted while the graph holds this capture.
  std::vector<std::shared_ptr<ncclComm>> comms;
  for (const Call& call : calls) {
    if (std::find(comms.begin(), comms.end(), call.comm) == comms.end()) comms.push_back(call.comm);
  }
  auto release = [comms](const std::vector<Call>* p) {
    delete p;
    for (const auto& c : comms) {
      std::lock_guard lock(c->mu);
      --c->captures;
      c->cv.notify_all();
    }
  };
  // Counted before the shared_ptr exists: if making it throws, it runs the deleter.
  auto* held = new std::vector<Call>(std::move(calls));
  for (const auto& c : comms) {
    std::lock_guard lock(c->mu);
    ++c->captures;
  }
  auto captured = std::shared_ptr<const std::vector<Call>>(held, std::move(release));
  try {
    DeviceScope scope(device_of(key));
    enqueue_prepared(key.stream, what, std::move(accesses),
                     [captured] { return prepare_captured(*captured); });
  } catch (const std::exception& e) {
    return failed(ncclUnhandledCudaError, cat(what, " could not be captured: ", e.what()));
  }
  return ncclSuccess;
}

// Queues calls (one call, or a whole group): one enqueue per stream, with the streams that share
// a communicator joined into one, so that its grouped sends and receives progress together.
ncclResult_t submit(std::vector<Call> calls) {
  if (std::any_of(calls.begin(), calls.end(),
                  [](const Call& c) { return stream_capturing(c.stream); })) {
    return submit_captured(std::move(calls));
  }
  if (serialize_mode()) {
    for (const Call& call : calls) {
      const ncclComm& c = *call.comm;
      for (int r = 0; r < c.nranks; ++r) {
        if (r != c.rank && c.areas[r].pid.load() == getpid()) {
          return failed(ncclInvalidUsage,
                        "RG_EMU_SERIALIZE=1 runs all streams on one worker, so communicators of "
                        "one process cannot meet");
        }
      }
    }
  }
  std::lock_guard lock(g_submit_mu);
  std::vector<Call> queued;
  for (Call& call : calls)
    if (number_call(call)) queued.push_back(std::move(call));
  // Streams, and which of them share a communicator (union-find).
  std::vector<StreamKey> keys;
  std::vector<size_t> key_of_call, parent;
  auto find = [&](size_t i) {
    while (parent[i] != i) i = parent[i] = parent[parent[i]];
    return i;
  };
  std::vector<std::pair<ncclComm*, size_t>> first_key;  // per communicator
  for (const Call& call : queued) {
    const StreamKey k = key_of(call);
    size_t i = size_t(std::find(keys.begin(), keys.end(), k) - keys.begin());
    if (i == keys.size()) {
      keys.push_back(k);
      parent.push_back(i);
    }
    key_of_call.push_back(i);
    auto it = std::find_if(first_key.begin(), first_key.end(),
                           [&](const auto& e) { return e.first == call.comm.get(); });
    if (it == first_key.end()) {
      first_key.emplace_back(call.comm.get(), i);
    } else {
      parent[find(i)] = find(it->second);
    }
  }
  ncclResult_t result = ncclSuccess;
  std::vector<bool> done(keys.size());
  for (size_t root_call = 0; root_call < queued.size(); ++root_call) {
    const size_t component = find(key_of_call[root_call]);
    if (done[component]) continue;
    done[component] = true;
    auto work = std::make_shared<Work>();
    std::vector<MemAccess> accesses;
    std::vector<StreamKey> joined;  // the component's streams, the carrier first
    for (size_t i = root_call; i < queued.size(); ++i) {
      if (find(key_of_call[i]) != component) continue;
      const Call& call = queued[i];
      work->calls.push_back(call);
      add_accesses(call, &accesses);
      if (std::find(joined.begin(), joined.end(), keys[key_of_call[i]]) == joined.end()) {
        joined.push_back(keys[key_of_call[i]]);
      }
      take_turn(*work, call);
    }
    const std::string what = work_name(*work);
    Status st;
    for (size_t j = 1; j < joined.size() && st.ok(); ++j) st = order_after(joined[j], joined[0]);
    bool queued_ok = false;
    if (st.ok()) {
      try {
        DeviceScope scope(device_of(joined[0]));
        enqueue(joined[0].stream, what, std::move(accesses), [work] { run_work(*work); });
        queued_ok = true;
      } catch (const std::exception& e) {
        st = {ncclUnhandledCudaError, cat(what, " could not be queued: ", e.what())};
      }
    }
    for (size_t j = 1; j < joined.size() && st.ok(); ++j) st = order_after(joined[0], joined[j]);
    if (st.ok()) continue;
    // The turns handed out must not block later ops: the communicators are broken now.
    for (const auto& [comm, ticket] : work->tickets) {
      comm->fail(st);
      if (!queued_ok) end_turn(*comm, ticket, false);
    }
    if (result == ncclSuccess) result = failed(st);
  }
  return result;
}

// ---- Connecting at first use ----

// One side of a connection a call needs: kAllReduce stands for every collective (one rendezvous
// of all ranks), kSend and kRecv for one direction of one pair.
struct Connect {
  std::shared_ptr<ncclComm> comm;
  int32_t kind = 0;
  int peer = -1;
  CallDesc call;  // the first call that needs it
  bool operator==(const Connect& o) const {
    return comm == o.comm && kind == o.kind && peer == o.peer;
  }
};

// The connections `calls` need that their communicators do not have yet. A count-0 collective
// needs none (NCCL returns from it at once); sends and receives to self need none either.
std::vector<Connect> connects_needed(const std::vector<Call>& calls) {
  std::vector<Connect> out;
  for (const Call& call : calls) {
    const ncclComm& c = *call.comm;
    Connect k{call.comm, kAllReduce, -1, call.desc};
    if (is_collective(call.desc.kind)) {
      if (c.coll_connected || call.desc.count == 0) continue;
    } else {
      k = Connect{call.comm, call.desc.kind, call.desc.root, call.desc};
      const auto& done = call.desc.kind == kSend ? c.send_connected : c.recv_connected;
      if (k.peer == c.rank || done[size_t(k.peer)] != 0) continue;
    }
    if (std::find(out.begin(), out.end(), k) == out.end()) out.push_back(std::move(k));
  }
  return out;
}

std::string describe(const Connect& k) {
  const std::string what =
      k.kind == kAllReduce
          ? "its connection to every rank"
          : cat("its connection ", k.kind == kSend ? "to" : "from", " rank ", k.peer);
  return cat(describe(k.call), " on rank ", k.comm->rank, " waited for ", what,
             " (made at first use)");
}

// Every side is announced before any is waited for, so that one thread can connect a group's
// sends and receives, and several communicators of one process, together.
Status connect_all(const std::vector<Connect>& connects) {
  for (const Connect& k : connects) {
    ncclComm& c = *k.comm;
    if (k.kind == kAllReduce) {
      c.area(c.rank).coll_connect.store(1, std::memory_order_release);
    } else if (k.kind == kSend) {
      c.channel(c.rank, k.peer).sender.connect.store(1, std::memory_order_release);
    } else {
      c.channel(k.peer, c.rank).receiver.connect.store(1, std::memory_order_release);
    }
  }
  for (const Connect& k : connects) {
    ncclComm& c = *k.comm;
    auto missing = [&] {
      std::vector<int> ranks;
      if (k.kind == kAllReduce) {
        for (int r = 0; r < c.nranks; ++r) {
          if (c.area(r).coll_connect.load(std::memory_order_acquire) == 0) ranks.push_back(r);
        }
      } else if ((k.kind == kSend ? c.channel(c.rank, k.peer).receiver.connect
                                  : c.channel(k.peer, c.rank).sender.connect)
                     .load(std::memory_order_acquire) == 0) {
        ranks.push_back(k.peer);
      }
      return ranks;
    };
    Clock::time_point last_check{};
    Status st = wait_until(
        c, [&] { return missing().empty(); }, missing, &last_check);
    if (!st.ok()) return {st.code, cat(describe(k), ", which cannot be made: ", st.message)};
  }
  for (const Connect& k : connects) {
    ncclComm& c = *k.comm;
    if (k.kind == kAllReduce) {
      c.coll_connected = true;
    } else {
      (k.kind == kSend ? c.send_connected : c.recv_connected)[size_t(k.peer)] = 1;
    }
  }
  return {};
}

// Queues calls (one call, or a whole group) once their connections are made: on this thread for
// blocking communicators, and for nonblocking ones on a background thread, as NCCL does for every
// call of such a communicator (ncclInProgress; ncclCommGetAsyncError says when it is done, or why
// it failed).
ncclResult_t start(std::vector<Call> calls) {
  if (Status st = check_self_p2p(calls); !st.ok()) return failed(st);
  const bool blocking = calls.front().comm->blocking;
  if (std::any_of(calls.begin(), calls.end(),
                  [&](const Call& c) { return c.comm->blocking != blocking; })) {
    return failed(ncclInvalidArgument,
                  "ncclGroupEnd: blocking and nonblocking communicators are not allowed in the "
                  "same group");
  }
  std::vector<Connect> connects = connects_needed(calls);
  if (blocking && connects.empty()) return submit(std::move(calls));
  std::vector<std::shared_ptr<ncclComm>> comms;
  for (const Call& call : calls) {
    if (std::find(comms.begin(), comms.end(), call.comm) == comms.end()) comms.push_back(call.comm);
  }
  if (blocking) {
    if (Status st = connect_all(connects); !st.ok()) {
      for (const auto& c : comms) c->fail(st);
      return failed(st);
    }
    return submit(std::move(calls));
  }
  for (const auto& c : comms) {
    std::lock_guard lock(c->mu);
    ++c->in_progress;
  }
  std::thread([calls = std::move(calls), connects = std::move(connects), comms]() mutable {
    Status st = connect_all(connects);
    if (st.ok()) {
      if (const ncclResult_t r = submit(std::move(calls)); r != ncclSuccess) st = {r, t_message};
    }
    for (const auto& c : comms) {
      if (!st.ok()) c->fail(st);
      std::lock_guard lock(c->mu);
      --c->in_progress;
      c->cv.notify_all();
    }
  }).detach();
  return ncclInProgress;
}

// The communicator behind a handle, for a new call; or why the call fails.
ncclResult_t usable(ncclComm_t handle, const char* api, std::shared_ptr<ncclComm>* out) {
  *out = lookup(handle);
  if (*out == nullptr) {
    return call_failed(ncclInvalidArgument,
                       cat(api, ": invalid communicator (NULL, destroyed or aborted)"));
  }
  {
    std::lock_guard lock((*out)->mu);
    if ((*out)->in_progress > 0) {
      return call_failed(ncclInvalidArgument,
                         cat(api,
                             ": attempt to use a nonblocking communicator before its "
                             "previous operation returned ncclSuccess (poll "
                             "ncclCommGetAsyncError until it is no longer ncclInProgress)"));
    }
  }
  if (const int e = (*out)->error.load(); e != ncclSuccess) {
    return call_failed(ncclResult_t(e),
                       cat(api, ": the communicator failed earlier: ", (*out)->message()));
  }
  return ncclSuccess;
}

ncclResult_t issue(Call call) {
  if (t_group.depth > 0) {
    t_group.calls.push_back(std::move(call));
    return ncclSuccess;
  }
  std::vector<Call> calls;
  calls.push_back(std::move(call));
  return start(std::move(calls));
}

ncclResult_t collective(const char* api, Kind kind, const void* send, void* recv, size_t count,
                        ncclDataType_t dtype, ncclRedOp_t op, int root, ncclComm_t handle,
                        cudaStream_t stream) {
  t_message.clear();
  std::shared_ptr<ncclComm> c;
  if (ncclResult_t r = usable(handle, api, &c); r != ncclSuccess) return r;
  const bool reduces = kind == kAllReduce || kind == kReduce || kind == kReduceScatter;
  const bool rooted = kind == kBroadcast || kind == kReduce;
  if (!valid_dtype(dtype)) {
    return call_failed(ncclInvalidArgument, cat(api, ": invalid datatype ", int(dtype)));
  }
  if (reduces && !valid_op(op)) {
    return call_failed(ncclInvalidArgument, cat(api, ": invalid reduction op ", int(op)));
  }
  if (rooted && (root < 0 || root >= c->nranks)) {
    return call_failed(ncclInvalidArgument,
                       cat(api, ": root ", root, " is out of range for nranks ", c->nranks));
  }
  const size_t n = size_t(c->nranks), esz = dtype_size(dtype);
  if (count > (~size_t(0) >> 1) / esz / n) {
    return call_failed(ncclInvalidArgument, cat(api, ": count ", count, " is too large"));
  }
  const bool is_root = c->rank == root;
  const bool needs_send = kind != kBroadcast || is_root;
  const bool needs_recv = kind != kReduce || is_root;
  if (count > 0 && ((needs_send && send == nullptr) || (needs_recv && recv == nullptr))) {
    return call_failed(
        ncclInvalidArgument,
        cat(api, ": NULL ", needs_send && send == nullptr ? "sendbuff" : "recvbuff"));
  }
  Call call;
  call.comm = std::move(c);
  call.desc = CallDesc{0, count, kind, dtype, reduces ? int32_t(op) : -1, rooted ? root : -1};
  call.send = send;
  call.recv = recv;
  call.stream = stream;
  call.device = stream_device(stream);
  return issue(std::move(call));
}

ncclResult_t point_to_point(const char* api, Kind kind, const void* send, void* recv, size_t count,
                            ncclDataType_t dtype, int peer, ncclComm_t handle,
                            cudaStream_t stream) {
  t_message.clear();
  std::shared_ptr<ncclComm> c;
  if (ncclResult_t r = usable(handle, api, &c); r != ncclSuccess) return r;
  if (!valid_dtype(dtype)) {
    return call_failed(ncclInvalidArgument, cat(api, ": invalid datatype ", int(dtype)));
  }
  if (peer < 0 || peer >= c->nranks) {
    return call_failed(ncclInvalidArgument,
                       cat(api, ": peer ", peer, " is out of range for nranks ", c->nranks));
  }
  if (count > (~size_t(0) >> 1) / dtype_size(dtype)) {
    return call_failed(ncclInvalidArgument, cat(api, ": count ", count, " is too large"));
  }
  if (count > 0 && (kind == kSend ? send == nullptr : recv == nullptr)) {
    return call_failed(ncclInvalidArgument, cat(api, ": NULL buffer"));
  }
  Call call;
  call.comm = std::move(c);
  call.desc = CallDesc{0, count, kind, dtype, -1, peer};
  call.send = send;
  call.recv = recv;
  call.stream = stream;
  call.device = stream_device(stream);
  return issue(std::move(call));
}

// Waits until no CUDA graph holds a capture of the communicator's calls, as NCCL 2.26 and later do
// in an abort or destroy: without end (a graph destroyed later never ends it), saying so on stderr
// after 5 s.
void wait_for_captures(ncclComm& c, const char* api) {
  std::unique_lock lock(c.mu);
  if (c.cv.wait_for(lock, std::chrono::seconds(5), [&] { return c.captures == 0; })) return;
  std::fprintf(stderr,
               "emulated NCCL: %s of rank %d waits until the %d CUDA graph capture(s) of its calls "
               "are destroyed (as NCCL 2.26 and later do)\n",
               api, c.rank, c.captures);
  c.cv.wait(lock, [&] { return c.captures == 0; });
}

// Waits until the communicator's background jobs and queued ops have finished.
void drain(ncclComm& c) {
  std::unique_lock lock(c.mu);
  c.cv.wait(lock, [&] { return c.in_progress == 0 && c.outstanding == 0; });
}

}  // namespace

void check_status(ncclResult_t status, const char* call, const char* file, int line) {
  if (status == ncclSuccess) return;
  RG_FAIL(file, ":", line, ": ", call,
          " failed: ", kernels::nccl_error_text(ncclGetErrorString(status), t_message.c_str()));
}

}  // namespace rg::emu

// ---- The C API ----

using rg::emu::t_message;

ncclResult_t ncclGetVersion(int* version) {
  t_message.clear();
  if (version == nullptr) return rg::emu::failed(ncclInvalidArgument, "ncclGetVersion: NULL");
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* unique_id) {
  t_message.clear();
  if (unique_id == nullptr) return rg::emu::failed(ncclInvalidArgument, "ncclGetUniqueId: NULL");
  rg::emu::IdLayout id{};
  std::memcpy(id.magic, rg::emu::kIdMagic, sizeof(id.magic));
  uint64_t token = 0;
  try {
    std::random_device rd;
    token = (uint64_t(rd()) << 32) ^ rd();
  } catch (const std::exception&) {
  }
  // Different ids of one process must differ even if random_device is weak.
  static std::atomic<uint64_t> counter{0};
  token ^= uint64_t(std::chrono::steady_clock::now().time_since_epoch().count()) ^
           (++counter * 0x9e3779b97f4a7c15ull);
  id.token = token == 0 ? 1 : token;
  std::snprintf(id.name, sizeof(id.name), "%s%d-%016llx", rg::emu::kShmPrefix, int(getpid()),
                static_cast<unsigned long long>(id.token));
  std::memset(unique_id, 0, sizeof(*unique_id));
  std::memcpy(unique_id->internal, &id, sizeof(id));
  return ncclSuccess;
}

namespace rg::emu {
namespace {

void wait_joined_in_background(std::vector<PendingInit> inits) {
  for (const PendingInit& init : inits) {
    std::lock_guard lock(init.comm->mu);
    ++init.comm->in_progress;
  }
  std::thread([inits = std::move(inits)] {
    for (const PendingInit& init : inits) {
      if (Status st = wait_joined(*init.comm, init.timeout_ms); !st.ok()) init.comm->fail(st);
      std::lock_guard lock(init.comm->mu);
      --init.comm->in_progress;
      init.comm->cv.notify_all();
    }
  }).detach();
}

ncclResult_t init_rank(ncclComm_t* comm, int nranks, const ncclUniqueId& commId, int rank,
                       bool blocking) {
  t_message.clear();
  if (comm == nullptr) return failed(ncclInvalidArgument, "ncclCommInitRank: comm is NULL");
  long timeout_ms = 0;
  if (Status st = init_timeout(&timeout_ms); !st.ok()) return failed(st);
  LinkModel link;
  if (Status st = link_model(&link); !st.ok()) return failed(st);
  int device = 0;
  cudaGetDevice(&device);
  std::shared_ptr<ncclComm> c;
  if (Status st = join(&c, nranks, commId, rank, device); !st.ok()) return failed(st);
  c->link = link;
  c->blocking = blocking;
  if (t_group.depth > 0) {  // several ranks initialized from one thread: wait in ncclGroupEnd
    t_group.inits.push_back(PendingInit{c, timeout_ms});
  } else if (!blocking) {
    wait_joined_in_background({PendingInit{c, timeout_ms}});
  } else if (Status st = wait_joined(*c, timeout_ms); !st.ok()) {
    return failed(st);
  }
  publish(c);
  *comm = c.get();
  return blocking || t_group.depth > 0 ? ncclSuccess : ncclInProgress;
}

}  // namespace
}  // namespace rg::emu

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank) {
  return rg::emu::init_rank(comm, nranks, commId, rank, /*blocking=*/true);
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank,
                                    ncclConfig_t* config) {
  using namespace rg::emu;
  bool blocking = true;
  if (config != nullptr) {
    if (config->size != sizeof(ncclConfig_t) || config->magic != 0xcafebeef) {
      t_message.clear();
      return failed(ncclInvalidArgument,
                    "ncclCommInitRankConfig: the config was not made with NCCL_CONFIG_INITIALIZER");
    }
    if (config->blocking != NCCL_CONFIG_UNDEF_INT && config->blocking != 0 &&
        config->blocking != 1) {
      t_message.clear();
      return failed(ncclInvalidArgument,
                    cat("ncclCommInitRankConfig: blocking must be 0 or 1, got ", config->blocking));
    }
    blocking = config->blocking != 0;
  }
  return init_rank(comm, nranks, commId, rank, blocking);
}

ncclResult_t ncclCommInitAll(ncclComm_t* comms, int ndev, const int* devlist) {
  using namespace rg::emu;
  t_message.clear();
  if (comms == nullptr || ndev < 1) {
    return failed(
        ncclInvalidArgument,
        cat("ncclCommInitAll: ", comms == nullptr ? "comm is NULL" : cat("ndev ", ndev, " < 1")));
  }
  long timeout_ms = 0;
  if (Status st = init_timeout(&timeout_ms); !st.ok()) return failed(st);
  LinkModel link;
  if (Status st = link_model(&link); !st.ok()) return failed(st);
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess) devices = 0;
  for (int i = 0; i < ndev; ++i) {
    const int d = devlist != nullptr ? devlist[i] : i;
    if (d < 0 || d >= devices) {
      return failed(ncclInvalidArgument, cat("ncclCommInitAll: device ", d, " does not exist (",
                                             devices, " emulated devices: RG_EMU_DEVICES)"));
    }
  }
  ncclUniqueId id;
  ncclGetUniqueId(&id);
  // Every rank joins before any waits, so that one thread can create them all.
  std::vector<std::shared_ptr<ncclComm>> made(static_cast<size_t>(ndev));
  for (int i = 0; i < ndev; ++i) {
    const int d = devlist != nullptr ? devlist[i] : i;
    if (Status st = join(&made[size_t(i)], ndev, id, i, d); !st.ok()) return failed(st);
    made[size_t(i)]->link = link;
  }
  for (auto& c : made) {
    if (Status st = wait_joined(*c, timeout_ms); !st.ok()) return failed(st);
  }
  for (int i = 0; i < ndev; ++i) {
    publish(made[size_t(i)]);
    comms[i] = made[size_t(i)].get();
  }
  return ncclSuccess;
}

ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  using namespace rg::emu;
  t_message.clear();
  std::shared_ptr<ncclComm> c = lookup(comm);
  if (c == nullptr) return failed(ncclInvalidArgument, "ncclCommFinalize: invalid communicator");
  if (!c->blocking) {  // flushed on a thread, as NCCL does: ncclInProgress until then
    {
      std::lock_guard lock(c->mu);
      if (c->in_progress > 0) {
        return failed(ncclInvalidArgument,
                      "ncclCommFinalize: attempt to use a nonblocking communicator before its "
                      "previous operation returned ncclSuccess");
      }
      ++c->in_progress;
    }
    std::thread([c] {
      std::unique_lock lock(c->mu);
      c->cv.wait(lock, [&] { return c->outstanding == 0 || c->aborted.load(); });
      --c->in_progress;
      c->cv.notify_all();
    }).detach();
    return ncclInProgress;
  }
  drain(*c);
  if (const int e = c->error.load(); e != ncclSuccess) return failed(ncclResult_t(e), c->message());
  return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  using namespace rg::emu;
  t_message.clear();
  if (comm == nullptr) return ncclSuccess;
  std::shared_ptr<ncclComm> c = take(comm);
  if (c == nullptr) return failed(ncclInvalidArgument, "ncclCommDestroy: invalid communicator");
  drain(*c);
  wait_for_captures(*c, "ncclCommDestroy");
  // Peers still waiting for this rank stop with an error instead of waiting forever.
  c->area(c->rank).left.store(1, std::memory_order_release);
  return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
  using namespace rg::emu;
  t_message.clear();
  if (comm == nullptr) return ncclSuccess;
  std::shared_ptr<ncclComm> c = take(comm);
  if (c == nullptr) return failed(ncclInvalidArgument, "ncclCommAbort: invalid communicator");
  {
    std::lock_guard lock(c->mu);
    c->aborted.store(true);
  }
  c->cv.notify_all();
  int32_t none = 0;
  c->header->aborted_by.compare_exchange_strong(none, c->rank + 1);
  // Running ops notice within a backoff period; queued ones will do nothing when they start.
  {
    std::unique_lock lock(c->mu);
    c->cv.wait_for(lock, std::chrono::seconds(10),
                   [&] { return c->running == 0 && c->in_progress == 0; });
  }
  wait_for_captures(*c, "ncclCommAbort");
  return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError) {
  using namespace rg::emu;
  t_message.clear();
  std::shared_ptr<ncclComm> c = lookup(comm);
  if (c == nullptr || asyncError == nullptr) {
    return failed(ncclInvalidArgument, "ncclCommGetAsyncError: invalid communicator or NULL");
  }
  std::lock_guard lock(c->mu);
  const int e = c->error.load();
  *asyncError = e != ncclSuccess     ? ncclResult_t(e)
                : c->in_progress > 0 ? ncclInProgress
                                     : ncclSuccess;
  return ncclSuccess;
}

namespace {
template <class F>
ncclResult_t query(ncclComm_t comm, int* out, const char* api, F f) {
  using namespace rg::emu;
  t_message.clear();
  std::shared_ptr<ncclComm> c = lookup(comm);
  if (c == nullptr || out == nullptr) {
    return failed(ncclInvalidArgument, cat(api, ": invalid communicator or NULL"));
  }
  *out = f(*c);
  return ncclSuccess;
}
}  // namespace

ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  return query(comm, count, "ncclCommCount", [](const ncclComm& c) { return c.nranks; });
}
ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device) {
  return query(comm, device, "ncclCommCuDevice", [](const ncclComm& c) { return c.device; });
}
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  return query(comm, rank, "ncclCommUserRank", [](const ncclComm& c) { return c.rank; });
}

const char* ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess:
      return "no error";
    case ncclUnhandledCudaError:
      return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError:
      return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError:
      return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument:
      return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage:
      return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError:
      return "remote process exited or there was a network error";
    case ncclInProgress:
      return "NCCL operation in progress";
    default:
      return "unknown result code";
  }
}

const char* ncclGetLastError(ncclComm_t comm) {
  thread_local std::string text;
  std::shared_ptr<ncclComm> c = rg::emu::lookup(comm);
  text = c != nullptr && c->error.load() != ncclSuccess ? c->message() : t_message;
  return text.c_str();
}

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream) {
  return rg::emu::collective("ncclAllReduce", rg::emu::kAllReduce, sendbuff, recvbuff, count,
                             datatype, op, -1, comm, stream);
}

ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, int root, ncclComm_t comm,
                           cudaStream_t stream) {
  return rg::emu::collective("ncclBroadcast", rg::emu::kBroadcast, sendbuff, recvbuff, count,
                             datatype, ncclSum, root, comm, stream);
}

ncclResult_t ncclBcast(void* buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
                       cudaStream_t stream) {
  return rg::emu::collective("ncclBcast", rg::emu::kBroadcast, buff, buff, count, datatype, ncclSum,
                             root, comm, stream);
}

ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                        ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream) {
  return rg::emu::collective("ncclReduce", rg::emu::kReduce, sendbuff, recvbuff, count, datatype,
                             op, root, comm, stream);
}

ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
  return rg::emu::collective("ncclAllGather", rg::emu::kAllGather, sendbuff, recvbuff, sendcount,
                             datatype, ncclSum, -1, comm, stream);
}

ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                               ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t stream) {
  return rg::emu::collective("ncclReduceScatter", rg::emu::kReduceScatter, sendbuff, recvbuff,
                             recvcount, datatype, op, -1, comm, stream);
}

ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
  return rg::emu::point_to_point("ncclSend", rg::emu::kSend, sendbuff, nullptr, count, datatype,
                                 peer, comm, stream);
}

ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
  return rg::emu::point_to_point("ncclRecv", rg::emu::kRecv, nullptr, recvbuff, count, datatype,
                                 peer, comm, stream);
}

ncclResult_t ncclGroupStart() {
  t_message.clear();
  ++rg::emu::t_group.depth;
  return ncclSuccess;
}

ncclResult_t ncclGroupEnd() {
  using namespace rg::emu;
  t_message.clear();
  if (t_group.depth == 0) return failed(ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
  if (--t_group.depth > 0) return ncclSuccess;
  GroupState group = std::move(t_group);
  t_group = GroupState{};
  ncclResult_t result = ncclSuccess;
  std::vector<PendingInit> nonblocking;
  for (PendingInit& init : group.inits) {
    if (!init.comm->blocking) {
      nonblocking.push_back(std::move(init));
    } else if (Status st = wait_joined(*init.comm, init.timeout_ms); !st.ok()) {
      init.comm->fail(st);
      if (result == ncclSuccess) result = failed(st);
    }
  }
  if (!nonblocking.empty()) {
    wait_joined_in_background(std::move(nonblocking));
    if (result == ncclSuccess) result = ncclInProgress;
  }
  if (!group.error.ok()) {
    return failed(group.error.code, cat("ncclGroupEnd: nothing of the group was queued, since a "
                                        "call in it failed: ",
                                        group.error.message));
  }
  if (!group.calls.empty()) {
    const ncclResult_t r = start(std::move(group.calls));
    if (result == ncclSuccess || (result == ncclInProgress && r != ncclSuccess)) result = r;
  }
  return result;
}
