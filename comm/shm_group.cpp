// The shared-memory collectives (see shm_group.h). Segment layout: a header (magic, size,
// the first failure), one cache line of control per rank (its stage counter and pid), then two
// sets of one slot per rank, page-aligned. Chunk g (counted from 1, the same on every rank) uses
// set g % 2; rank r's stage reaches 2g-1 when its inputs for chunk g are in its slot and 2g when
// its reduced slice is; a set is reused by chunk g+2 only after every rank has started chunk g+1,
// that is finished chunk g.
#include "comm/shm_group.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <new>
#include <random>
#include <thread>

#include "comm/ring_allreduce.h"
#include "kernels/error.h"

namespace rg::dist {
namespace {

using Clock = std::chrono::steady_clock;

constexpr uint64_t kMagic = 0x52474D4853484D31;  // "RGMHSHM1"
constexpr size_t kLine = 64;
constexpr size_t kMaxSlotsBytes = size_t(32) << 20;  // both slot sets of every rank
constexpr size_t kReducePiece = size_t(16) << 10;

// The first failure any rank saw, for the others to report at once: [kind 8][seen by 24]
// [culprit 32]; 0 = none.
enum class FailureKind : uint64_t { exited = 1, timed_out = 2 };

struct Header {
  uint64_t magic;
  uint64_t size;
  uint64_t slot_bytes;
  std::atomic<uint64_t> failure;
};
static_assert(sizeof(Header) <= kLine);
static_assert(std::atomic<uint64_t>::is_always_lock_free && std::atomic<int32_t>::is_always_lock_free,
              "the shared-memory transport needs lock-free atomics between processes");

size_t round_up(size_t x, size_t m) { return (x + m - 1) / m * m; }
size_t data_offset(int size) { return round_up(kLine * (1 + size_t(size)), 4096); }
size_t segment_bytes(int size, size_t slot_bytes) {
  return data_offset(size) + 2 * size_t(size) * slot_bytes;
}

void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// Sleeps while *word == expected, at most `timeout`; woken by futex_wake (another process may
// wake it: the segment is MAP_SHARED, so no FUTEX_PRIVATE_FLAG).
void futex_wait(std::atomic<uint32_t>& word, uint32_t expected, std::chrono::microseconds timeout) {
  const timespec ts{0, long(timeout.count()) * 1000};
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void futex_wake(std::atomic<uint32_t>& word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAKE, INT32_MAX, nullptr, nullptr,
          0);
}

std::string trimmed(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

// A process that exited is gone (ESRCH) or a zombie until its parent reaps it.
bool process_alive(int pid) {
  if (kill(pid, 0) != 0 && errno == ESRCH) return false;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return true;  // no /proc: trust kill()
  const auto paren = line.rfind(')');
  if (paren == std::string::npos || paren + 2 >= line.size()) return true;
  const char state = line[paren + 2];
  return state != 'Z' && state != 'X';
}

std::string key(const char* what, int r) { return detail::cat("shm/", what, "/", r); }

// Waits for every rank's `what` key and returns their values in rank order.
std::vector<std::string> gather_keys(Store& store, const char* what, int size, Millis timeout) {
  std::vector<std::string> keys;
  for (int q = 0; q < size; ++q) keys.push_back(key(what, q));
  store.wait(keys, timeout);
  std::vector<std::string> values;
  for (const auto& k : keys) values.push_back(to_string(store.get(k, timeout)));
  return values;
}

void* map_segment(int fd, size_t bytes) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  return p == MAP_FAILED ? nullptr : p;
}

// Rank 0: a fresh segment with its header; null (and nothing left behind) on any failure.
void* create_segment(const std::string& name, int size, size_t slot_bytes) {
  const size_t bytes = segment_bytes(size, slot_bytes);
  const int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) return nullptr;
  // posix_fallocate, not ftruncate alone: a full /dev/shm must fail here, not SIGBUS later.
  if (posix_fallocate(fd, 0, off_t(bytes)) != 0) {
    close(fd);
    shm_unlink(name.c_str());
    return nullptr;
  }
  void* base = map_segment(fd, bytes);
  if (base == nullptr) {
    shm_unlink(name.c_str());
    return nullptr;
  }
  auto* h = new (base) Header{kMagic, uint64_t(size), slot_bytes, {}};
  h->failure.store(0, std::memory_order_release);
  return base;
}

void* attach_segment(const std::string& name, int size, size_t slot_bytes) {
  const size_t bytes = segment_bytes(size, slot_bytes);
  const int fd = shm_open(name.c_str(), O_RDWR, 0600);
  if (fd < 0) return nullptr;
  struct stat st {};
  if (fstat(fd, &st) != 0 || size_t(st.st_size) != bytes) {
    close(fd);
    return nullptr;
  }
  void* base = map_segment(fd, bytes);
  if (base == nullptr) return nullptr;
  const auto* h = static_cast<const Header*>(base);
  if (h->magic != kMagic || h->size != uint64_t(size) || h->slot_bytes != slot_bytes) {
    munmap(base, bytes);
    return nullptr;
  }
  return base;
}

}  // namespace

struct alignas(kLine) ShmGroup::Control {
  std::atomic<uint64_t> stage{0};
  std::atomic<uint32_t> word{0};     // stage's low half, what sleeping waiters' futex watches
  std::atomic<uint32_t> waiters{0};  // how many sleep on `word`: publish skips the wake when none
  std::atomic<int32_t> pid{0};
};
static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t));

std::string host_identity() {
  if (const char* id = std::getenv("RG_HOST_ID"); id != nullptr && *id != '\0') return id;
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) != 0) std::strcpy(host, "?");
  std::ifstream boot("/proc/sys/kernel/random/boot_id");
  std::string boot_id;
  std::getline(boot, boot_id);
  return std::string(host) + "/" + trimmed(boot_id);
}

std::unique_ptr<ShmGroup> ShmGroup::create(Store& store, int rank, int size, size_t slot_bytes,
                                           Millis timeout) {
  if (size < 2 || slot_bytes == 0) return nullptr;
  // Many local ranks get smaller chunks: /dev/shm is often small (64 MiB in a default container).
  slot_bytes = std::min(slot_bytes, kMaxSlotsBytes / (2 * size_t(size))) / kLine * kLine;
  if (slot_bytes == 0) return nullptr;
  store.set(key("host", rank), host_identity());
  const auto hosts = gather_keys(store, "host", size, timeout);
  for (const auto& h : hosts)
    if (h != hosts[0]) return nullptr;  // every rank reads the same keys: all decide alike

  std::string name;
  void* base = nullptr;
  if (rank == 0) {
    name = detail::cat("/ringgrad-", getpid(), "-", std::random_device{}());
    base = create_segment(name, size, slot_bytes);
    for (int q = 0; base && q < size; ++q)
      new (static_cast<char*>(base) + kLine * (1 + size_t(q))) Control{};
    store.set("shm/name", base ? name : "");
  } else {
    name = to_string(store.get("shm/name", timeout));
    if (!name.empty()) base = attach_segment(name, size, slot_bytes);
  }
  const size_t bytes = segment_bytes(size, slot_bytes);
  auto group = base ? std::unique_ptr<ShmGroup>(new ShmGroup(rank, size, slot_bytes, base, bytes))
                    : nullptr;
  if (group) group->control(rank).pid.store(int32_t(getpid()), std::memory_order_release);
  store.set(key("attached", rank), group ? "1" : "0");
  std::vector<std::string> attached;
  try {
    attached = gather_keys(store, "attached", size, timeout);
  } catch (...) {
    if (rank == 0 && base) shm_unlink(name.c_str());
    throw;
  }
  // Everyone has mapped it (or given up): the name is no longer needed.
  if (rank == 0 && base) shm_unlink(name.c_str());
  for (const auto& a : attached)
    if (a != "1") return nullptr;
  // A peer whose pid this rank cannot see (another pid namespace sharing /dev/shm) could not be
  // watched for exiting: then nobody uses the segment.
  bool peers_visible = true;
  for (int q = 0; q < size; ++q)
    peers_visible = peers_visible && process_alive(group->control(q).pid.load());
  store.set(key("visible", rank), peers_visible ? "1" : "0");
  for (const auto& v : gather_keys(store, "visible", size, timeout))
    if (v != "1") return nullptr;
  return group;
}

ShmGroup::ShmGroup(int rank, int size, size_t slot_bytes, void* base, size_t bytes)
    : rank_(rank),
      size_(size),
      slot_bytes_(slot_bytes),
      base_(base),
      bytes_(bytes),
      oversubscribed_(unsigned(size) > std::max(1u, std::thread::hardware_concurrency())) {}

ShmGroup::~ShmGroup() { munmap(base_, bytes_); }

ShmGroup::Control& ShmGroup::control(int r) const {
  return *reinterpret_cast<Control*>(static_cast<char*>(base_) + kLine * (1 + size_t(r)));
}

char* ShmGroup::slot(uint64_t chunk, int r) const {
  return static_cast<char*>(base_) + data_offset(size_) +
         (size_t(chunk % 2) * size_t(size_) + size_t(r)) * slot_bytes_;
}

// Sequentially consistent with the waiter's registration (Dekker): either this sees its
// `waiters` increment and wakes it, or the waiter sees the new word and does not sleep.
void ShmGroup::publish(uint64_t stage) {
  Control& c = control(rank_);
  c.stage.store(stage, std::memory_order_release);
  c.word.store(uint32_t(stage));
  if (c.waiters.load() > 0) futex_wake(c.word);
}

// Throws when another rank reported a failure, the deadline passed, or rank q exited before
// reaching `stage` (a rank that published its last stage and then exited did its part).
void ShmGroup::check_peer(int q, uint64_t stage, Clock::time_point deadline) {
  auto& failure = static_cast<Header*>(base_)->failure;
  auto fail = [&](FailureKind kind) {
    uint64_t none = 0;
    failure.compare_exchange_strong(
        none, (uint64_t(kind) << 56) | (uint64_t(rank_) << 32) | uint32_t(q));
  };
  if (const uint64_t f = failure.load(std::memory_order_acquire)) {
    const int culprit = int(uint32_t(f)), seen_by = int((f >> 32) & 0xFFFFFF);
    if (FailureKind(f >> 56) == FailureKind::exited)
      RG_FAIL("shared memory: rank ", culprit, " exited (seen by rank ", seen_by, ")");
    RG_FAIL("shared memory: timed out: rank ", seen_by, " gave up waiting for rank ",
            culprit);
  }
  if (Clock::now() >= deadline) {
    fail(FailureKind::timed_out);
    RG_FAIL("shared memory: timed out waiting for rank ", q, " (stage ", stage, ")");
  }
  const int pid = control(q).pid.load(std::memory_order_acquire);
  if (!process_alive(pid) && control(q).stage.load(std::memory_order_acquire) < stage) {
    fail(FailureKind::exited);
    RG_FAIL("shared memory: rank ", q, " (pid ", pid, ") exited");
  }
}

// Spins briefly (the peer is usually a few microseconds behind), yields a little while, then
// sleeps on the peer's futex until it publishes (at most 2 ms at a time, to check the deadline
// and the peer's pid). With more ranks than cores it skips the yielding: a waiter that keeps its
// core takes it from the peer it waits for.
void ShmGroup::wait_for(int q, uint64_t stage, Clock::time_point deadline) {
  Control& c = control(q);
  for (int i = 0; i < 256; ++i) {
    if (c.stage.load(std::memory_order_acquire) >= stage) return;
    cpu_relax();
  }
  const auto start = Clock::now();
  auto next_check = start;
  const auto yield_for = oversubscribed_ ? Clock::duration(0) : std::chrono::microseconds(100);
  while (c.stage.load(std::memory_order_acquire) < stage) {
    const auto now = Clock::now();
    if (now >= next_check) {
      check_peer(q, stage, deadline);
      next_check = now + std::chrono::milliseconds(2);
    }
    if (now - start < yield_for) {
      sched_yield();
      continue;
    }
    const uint32_t word = c.word.load();
    c.waiters.fetch_add(1);
    if (c.stage.load() < stage) futex_wait(c.word, word, std::chrono::milliseconds(2));
    c.waiters.fetch_sub(1);
  }
}

void ShmGroup::wait_all(uint64_t stage, Clock::time_point deadline) {
  for (int q = 0; q < size_; ++q)
    if (q != rank_) wait_for(q, stage, deadline);
}

uint64_t ShmGroup::next_chunk(Clock::time_point deadline) {
  const uint64_t g = ++chunk_;
  // This chunk's slot set was last used by chunk g-2: free once every rank has started chunk g-1.
  if (g >= 2) wait_all(2 * g - 3, deadline);
  return g;
}

void ShmGroup::reduce_chunk(const ShmReduceArgs& a, char* data, size_t len) {
  const uint64_t g = next_chunk(a.deadline);
  const size_t es = a.element_size;
  auto begin = [&](int q) { return ring_block_begin(len, size_, q) * es; };
  char* mine = slot(g, rank_);
  // 1. The other ranks' slices of my input go to my slot.
  const size_t b0 = begin(rank_), b1 = begin(rank_ + 1), end = len * es;
  std::memcpy(mine, data, b0);
  std::memcpy(mine + b1, data + b1, end - b1);
  publish(2 * g - 1);
  wait_all(2 * g - 1, a.deadline);
  // 2. My slice, reduced over ranks in rank order (the same bits on every rank), into my slot,
  // in pieces of kReducePiece bytes: a piece's partial sums stay in the cache while every
  // rank's contribution is added, so each source is read from memory once.
  if (b1 > b0) {
    auto src = [&](int q) -> const char* { return (q == rank_ ? data : slot(g, q)) + b0; };
    char* out = mine + b0;
    const size_t n = (b1 - b0) / es, piece = std::max<size_t>(1, kReducePiece / es);
    for (size_t i = 0; i < n; i += piece) {
      const size_t k = std::min(piece, n - i), at = i * es;
      a.reduce(out + at, src(0) + at, src(1) + at, k);
      for (int q = 2; q < size_; ++q) a.reduce(out + at, out + at, src(q) + at, k);
    }
    if (a.finalize) a.finalize(out, n);
  }
  publish(2 * g);
  // 3. Every rank's reduced slice back into data, each as soon as it is ready.
  for (int i = 1; i <= size_; ++i) {
    const int q = (rank_ + i) % size_;  // mine last: it is ready
    wait_for(q, 2 * g, a.deadline);
    std::memcpy(data + begin(q), slot(g, q) + begin(q), begin(q + 1) - begin(q));
  }
}

void ShmGroup::all_reduce(const ShmReduceArgs& a) {
  RG_CHECK(a.element_size > 0 && a.element_size <= kLine, "shm all-reduce: bad element size ",
           a.element_size);
  RG_CHECK(a.count == 0 || (a.data != nullptr && a.reduce), "shm all-reduce: no data or reduce");
  const size_t elems = slot_bytes_ / a.element_size;
  auto* data = static_cast<char*>(a.data);
  for (size_t off = 0; off < a.count; off += elems)
    reduce_chunk(a, data + off * a.element_size, std::min(elems, a.count - off));
}

// Root's chunk goes through its slot; the others copy it out.
void ShmGroup::broadcast(void* data, size_t bytes, int root, Clock::time_point deadline) {
  RG_CHECK(root >= 0 && root < size_, "shm broadcast: bad root ", root);
  auto* p = static_cast<char*>(data);
  for (size_t off = 0; off < bytes; off += slot_bytes_) {
    const size_t len = std::min(slot_bytes_, bytes - off);
    const uint64_t g = next_chunk(deadline);
    if (rank_ == root) std::memcpy(slot(g, root), p + off, len);
    publish(2 * g - 1);
    if (rank_ != root) {
      wait_for(root, 2 * g - 1, deadline);
      std::memcpy(p + off, slot(g, root), len);
    }
    publish(2 * g);
  }
}

// Every rank's chunk goes through its slot; each copies every other rank's out.
void ShmGroup::all_gather(const void* input, void* output, size_t bytes,
                          Clock::time_point deadline) {
  const auto* in = static_cast<const char*>(input);
  auto* out = static_cast<char*>(output);
  // The caller may pass its own block of the output as the input.
  std::memmove(out + size_t(rank_) * bytes, in, bytes);
  in = out + size_t(rank_) * bytes;
  for (size_t off = 0; off < bytes; off += slot_bytes_) {
    const size_t len = std::min(slot_bytes_, bytes - off);
    const uint64_t g = next_chunk(deadline);
    std::memcpy(slot(g, rank_), in + off, len);
    publish(2 * g - 1);
    for (int i = 1; i < size_; ++i) {
      const int q = (rank_ + i) % size_;
      wait_for(q, 2 * g - 1, deadline);
      std::memcpy(out + size_t(q) * bytes + off, slot(g, q), len);
    }
    publish(2 * g);
  }
}

// One chunk without data: every rank has started it when all reached its first stage.
void ShmGroup::barrier(Clock::time_point deadline) {
  const uint64_t g = next_chunk(deadline);
  publish(2 * g - 1);
  wait_all(2 * g - 1, deadline);
  publish(2 * g);
}

}  // namespace rg::dist
