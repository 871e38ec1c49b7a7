// The block scheduler of the CUDA emulator: fibers that run a block's threads one after another
// until one waits (one fiber per waiting thread), matching of barriers and warp collectives, and
// the diagnosis of a barrier that not every thread can reach.
#include "kernels/emu/block_runner.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <new>
#include <sstream>
#include <string>
#include <utility>

#include "kernels/error.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#endif

#if defined(BOOST_USE_UCONTEXT)
namespace boost::context::detail {
// Boost.Context's library defines this only when it is built for ucontext, and Debian's is built
// for fcontext; the checked build provides it (as Boost's src/fiber.cpp does).
fiber_activation_record*& fiber_activation_record::current() noexcept {
  thread_local fiber_activation_record os_thread_context;
  thread_local fiber_activation_record* current_record = &os_thread_context;
  return current_record;
}
}  // namespace boost::context::detail
#endif

namespace rg::emu::detail {
namespace ctx = boost::context;
using ::rg::detail::cat;

namespace {

thread_local BlockRunner* tls_runner = nullptr;

// Dynamic shared memory starts as 0xff bytes, so that reading it before writing gives NaN or -1
// rather than plausible data left by an earlier block.
constexpr unsigned char kSharedFill = 0xff;
constexpr size_t kSharedAlign = 128;

// The Boost.Context StackAllocator interface over a StackPool.
struct PooledStack {
  StackPool* pool;
  ctx::stack_context allocate() { return pool->allocate(); }
  void deallocate(ctx::stack_context& sc) noexcept { pool->deallocate(sc); }
};

std::string dims(uint3 d) { return cat("(", d.x, ",", d.y, ",", d.z, ")"); }

std::string where(const Site& s) { return cat(s.file_name(), ":", s.line()); }

std::string hex(unsigned int v) {
  std::ostringstream os;
  os << "0x" << std::hex << v;
  return os.str();
}

// Two barriers on one line are different call sites, hence the column.
bool same_site(const Site& a, const Site& b) {
  return a.line() == b.line() && a.column() == b.column() &&
         (a.file_name() == b.file_name() || std::strcmp(a.file_name(), b.file_name()) == 0);
}

// Sorted thread indices as "0-15, 32, 40-47".
std::string ranges(const std::vector<unsigned int>& ids) {
  std::string out;
  for (size_t i = 0; i < ids.size();) {
    size_t j = i;
    while (j + 1 < ids.size() && ids[j + 1] == ids[j] + 1) ++j;
    if (!out.empty()) out += ", ";
    out += j == i ? cat(ids[i]) : cat(ids[i], "-", ids[j]);
    i = j + 1;
  }
  return out;
}

bool is_shuffle(WarpOp op) {
  return op == WarpOp::kShuffleIdx || op == WarpOp::kShuffleUp || op == WarpOp::kShuffleDown ||
         op == WarpOp::kShuffleXor;
}

BlockRunner& runner_for(const char* name, const Site& site) {
  BlockRunner* r = BlockRunner::current();
  RG_CHECK(r != nullptr, name, " called outside an emulated kernel (", where(site), ")");
  return *r;
}

}  // namespace

// ---- StackPool ---------------------------------------------------------------------------------

StackPool::StackPool(size_t bytes) : guard_(static_cast<size_t>(::sysconf(_SC_PAGESIZE))) {
  bytes_ = std::max<size_t>(bytes, 16 * 1024);
  bytes_ = (bytes_ + guard_ - 1) / guard_ * guard_;
}

StackPool::~StackPool() {
  for (ctx::stack_context& sc : free_) {
    ::munmap(static_cast<char*>(sc.sp) - sc.size - guard_, guard_ + bytes_ + kColorSpan);
  }
}

ctx::stack_context StackPool::allocate() {
  if (!free_.empty()) {
    ctx::stack_context sc = free_.back();
    free_.pop_back();
#if defined(__SANITIZE_ADDRESS__)
    // A fiber unwound by an exception may leave poisoned frames behind.
    ASAN_UNPOISON_MEMORY_REGION(static_cast<char*>(sc.sp) - sc.size, sc.size);
#endif
    return sc;
  }
  void* base = ::mmap(nullptr, guard_ + bytes_ + kColorSpan, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (base == MAP_FAILED) throw std::bad_alloc();
  // Stacks grow down: an overflow hits this page and stops with SIGSEGV instead of corrupting.
  ::mprotect(base, guard_, PROT_NONE);
  // Each stack starts at a different offset of its last page ("colouring"): stacks a whole
  // number of pages apart would have their busy tops in the same few cache sets, and a block
  // whose threads all wait at a warp collective switches through hundreds of them.
  const size_t color = (next_color_++ * kColorStep) % kColorSpan;
  ctx::stack_context sc;
  sc.size = bytes_ + kColorSpan - color;
  sc.sp = static_cast<char*>(base) + guard_ + sc.size;
  return sc;
}

void StackPool::deallocate(ctx::stack_context& sc) noexcept { free_.push_back(sc); }

// ---- BlockRunner -------------------------------------------------------------------------------

BlockRunner::~BlockRunner() {
  unwind_all();
  threads_.clear();  // fibers return their stacks to stacks_ before it goes
  if (shared_ != nullptr) ::operator delete (shared_, std::align_val_t{kSharedAlign});
}

BlockRunner* BlockRunner::current() { return tls_runner; }

void BlockRunner::run(const Launch& launch, uint64_t block_linear) {
  launch_ = &launch;
  n_ = launch.threads_per_block;
  const dim3 g = launch.grid;
  const dim3 b = launch.block;
  block_idx_ = uint3{static_cast<unsigned int>(block_linear % g.x),
                     static_cast<unsigned int>(block_linear / g.x % g.y),
                     static_cast<unsigned int>(block_linear / (uint64_t{g.x} * g.y))};
  ::blockIdx = block_idx_;
  ::blockDim = b;
  ::gridDim = g;

  const size_t stack_bytes = fiber_stack_bytes();
  if (!stacks_ || stack_request_ != stack_bytes) {
    stacks_ = std::make_unique<StackPool>(stack_bytes);
    stack_request_ = stack_bytes;
  }
  if (threads_.size() < n_) threads_.resize(n_);
  uint3 idx{0, 0, 0};  // x fastest, counted rather than divided out (this runs for every thread)
  for (unsigned int i = 0; i < n_; ++i) {
    Thread& t = threads_[i];
    t.state = State::kReady;
    t.started = false;
    t.idx = idx;
    if (++idx.x == b.x) {
      idx.x = 0;
      if (++idx.y == b.y) {
        idx.y = 0;
        ++idx.z;
      }
    }
  }
  done_ = 0;
  failure_ = nullptr;
  prepare_shared_memory();

  // Unwinding the other fibers happens outside the catch block: the C++ runtime keeps its list
  // of caught exceptions per OS thread, not per fiber.
  std::exception_ptr error;
  tls_runner = this;
  try {
    schedule();
  } catch (...) {
    error = std::current_exception();
  }
  tls_runner = nullptr;
  if (error) unwind_all();
  release_shared_memory();
  if (!error) return;

  try {
    std::rethrow_exception(error);
  } catch (const rg::Error& e) {
    const std::string thread =
        failure_ ? cat(" thread ", dims(threads_[failed_thread_].idx)) : std::string();
    throw rg::Error(cat("block ", dims(block_idx_), thread, ": ", e.what()));
  }
}

void BlockRunner::schedule() {
  for (;;) {
    // Threads run in index order until each finishes or waits; then waiting groups are released.
    for (unsigned int i = 0; i < n_; ++i) {
      Thread& t = threads_[i];
      if (t.state != State::kReady) continue;
      current_ = i;
      ::threadIdx = t.idx;
      boost::context::fiber resumed;
      if (!t.started) {
        // A fiber starting here runs threads i, i+1, ... one after the other for as long as each
        // finishes without waiting: a block without barriers costs one fiber, not one per thread.
        resumed = ctx::fiber(std::allocator_arg, PooledStack{stacks_.get()},
                             [this, i](ctx::fiber&& s) { return thread_main(i, std::move(s)); });
      } else {
        resumed = std::move(t.fiber);
      }
      resumed = std::move(resumed).resume();
      // The fiber stopped in the thread it ran last (current_): one that waits keeps it; once it
      // has finished its last thread the fiber is gone (Boost's ucontext fibers, in the checked
      // build, keep a finished fiber's stack until the handle goes: let it go now, so the next
      // fiber reuses the stack).
      Thread& last = threads_[current_];
      if (last.state == State::kDone) {
        resumed = ctx::fiber{};
      } else {
        last.fiber = std::move(resumed);
      }
      if (failure_) std::rethrow_exception(failure_);
      i = std::max(i, current_);
    }
    if (done_ == n_) return;
    if (!release_warps() && !release_block_barrier()) report_stuck();
  }
}

ctx::fiber BlockRunner::thread_main(unsigned int first, ctx::fiber&& scheduler) {
  scheduler_ = std::move(scheduler);
  // Runs thread `first`, then each next thread not started yet, until one has to wait (wait()
  // switches away from this fiber; when released, that thread goes on here) or one fails.
  for (unsigned int index = first; index < n_ && !threads_[index].started && !failure_; ++index) {
    Thread& t = threads_[index];
    t.started = true;
    current_ = index;
    ::threadIdx = t.idx;
    try {
      launch_->thunk(launch_->bound);
    } catch (const ctx::detail::forced_unwind&) {
      throw;  // the block is being abandoned: let Boost.Context unwind this fiber
    } catch (...) {
      if (!failure_) {
        failure_ = std::current_exception();
        failed_thread_ = index;
      }
    }
    t.state = State::kDone;
    ++done_;
  }
  return std::move(scheduler_);
}

void BlockRunner::wait() {
  // The scheduler would run the next ready thread of this pass (threads only become ready
  // between passes): switch to it directly when it has a fiber (it waits here too), which halves
  // the switches of a warp collective; else back to the scheduler. Whichever fiber the scheduler
  // resumes keeps the scheduler's continuation in scheduler_; one resumed by another thread is
  // handed nothing.
  const unsigned int me = current_;
  unsigned int next = me + 1;
  while (next < n_ && threads_[next].state != State::kReady) ++next;
  ctx::fiber back;
  if (next < n_ && threads_[next].started) {
    current_ = next;
    ::threadIdx = threads_[next].idx;
    back = std::move(threads_[next].fiber).resume_with([this, me](ctx::fiber&& from) {
      threads_[me].fiber = std::move(from);
      return ctx::fiber{};
    });
  } else {
    back = std::move(scheduler_).resume();
  }
  if (back) scheduler_ = std::move(back);
}

int BlockRunner::sync_block(const char* name, int predicate, const Site& site) {
  Thread& t = threads_[current_];
  t.state = State::kBlockBarrier;
  t.name = name;
  t.site = site;
  t.predicate = predicate;
  wait();
  return static_cast<int>(t.result);
}

unsigned int BlockRunner::warp_collective(const WarpCall& call, const Site& site) {
  Thread& t = threads_[current_];
  const int lane = static_cast<int>(current_ % 32);
  RG_CHECK((call.mask >> lane) & 1u, call.name, "(mask ", hex(call.mask), ") at ", where(site),
           ": the calling lane ", lane, " is not in the mask");
  int src = -1;
  if (is_shuffle(call.op)) {
    const int w = call.width;
    RG_CHECK(w >= 1 && w <= 32 && (w & (w - 1)) == 0, call.name, " at ", where(site), ": width ", w,
             " is not a power of two in [1, 32]");
    // The hardware uses the low 5 bits of the lane argument; a source outside the lane's
    // segment (or, for xor, in a later segment) gives the lane its own value.
    const int seg = lane & ~(w - 1);
    const int arg = call.arg & 31;
    switch (call.op) {
      case WarpOp::kShuffleIdx:
        src = seg + (call.arg & (w - 1));
        break;
      case WarpOp::kShuffleUp:
        src = lane - seg >= arg ? lane - arg : -1;
        break;
      case WarpOp::kShuffleDown:
        src = lane - seg + arg < w ? lane + arg : -1;
        break;
      case WarpOp::kShuffleXor:
        src = (lane ^ arg) < seg + w ? lane ^ arg : -1;
        break;
      default:
        break;
    }
  }
  t.state = State::kWarp;
  t.name = call.name;
  t.site = site;
  t.call = call;
  t.src_lane = src;
  wait();
  return t.result;
}

bool BlockRunner::release_warps() {
  bool released = false;
  for (unsigned int base = 0; base < n_; base += 32) {
    const unsigned int count = std::min(32u, n_ - base);
    // Lanes past the end of a partial last warp do not exist: a full mask does not wait for them.
    const unsigned int exists = count == 32 ? 0xffffffffu : (1u << count) - 1;
    unsigned int examined = 0;  // lanes whose group has been looked at in this pass
    for (unsigned int l = 0; l < count; ++l) {
      const Thread& t = threads_[base + l];
      if (t.state != State::kWarp || ((examined >> l) & 1u)) continue;
      const unsigned int lanes = t.call.mask & exists;
      unsigned int arrived = 0;  // lanes of the group waiting at the same collective
      for (unsigned int j = 0; j < count; ++j) {
        const Thread& u = threads_[base + j];
        if (((lanes >> j) & 1u) && u.state == State::kWarp && u.call.mask == t.call.mask &&
            u.call.op == t.call.op && u.call.size == t.call.size) {
          arrived |= 1u << j;
        }
      }
      examined |= arrived;
      if (arrived != lanes) continue;
      complete_warp_group(base, lanes, t.call.op);
      released = true;
    }
  }
  return released;
}

void BlockRunner::complete_warp_group(unsigned int base, unsigned int lanes, WarpOp op) {
  unsigned int ballot = 0;
  for (unsigned int j = 0; j < 32; ++j) {
    if (((lanes >> j) & 1u) && threads_[base + j].call.predicate != 0) ballot |= 1u << j;
  }
  for (unsigned int j = 0; j < 32; ++j) {
    if (((lanes >> j) & 1u) == 0) continue;
    Thread& u = threads_[base + j];
    if (is_shuffle(op)) {
      // A source lane outside the group (not in the mask, or not existing) is undefined in CUDA;
      // here the lane keeps its own value.
      const int s = u.src_lane;
      const Thread& from = s >= 0 && ((lanes >> s) & 1u) ? threads_[base + s] : u;
      std::memcpy(u.call.out, from.call.in, u.call.size);
      u.result = 0;
    } else if (op == WarpOp::kBallot) {
      u.result = ballot;
    } else if (op == WarpOp::kAny) {
      u.result = ballot != 0;
    } else if (op == WarpOp::kAll) {
      u.result = ballot == lanes;
    } else {
      u.result = 0;
    }
    u.state = State::kReady;
  }
}

bool BlockRunner::release_block_barrier() {
  // Every thread must wait at the same __syncthreads(): none exited, none at a warp collective.
  if (done_ != 0 || threads_[0].state != State::kBlockBarrier) return false;
  const Site& site = threads_[0].site;
  unsigned int count = 0;
  for (unsigned int i = 0; i < n_; ++i) {
    const Thread& t = threads_[i];
    if (t.state != State::kBlockBarrier || !same_site(t.site, site)) return false;
    count += t.predicate != 0;
  }
  for (unsigned int i = 0; i < n_; ++i) {
    threads_[i].result = count;
    threads_[i].state = State::kReady;
  }
  return true;
}

void BlockRunner::report_stuck() const {
  struct Group {
    std::string what;
    std::vector<unsigned int> ids;
  };
  std::vector<Group> groups;
  for (unsigned int i = 0; i < n_; ++i) {
    const Thread& t = threads_[i];
    std::string what;
    switch (t.state) {
      case State::kDone:
        what = "exited";
        break;
      case State::kBlockBarrier:
        what = cat("wait at ", t.name, " (", where(t.site), ")");
        break;
      case State::kWarp:
        what = cat("wait at ", t.name, "(mask ", hex(t.call.mask), ") in warp ", i / 32, " (",
                   where(t.site), ")");
        break;
      case State::kReady:
        what = "are runnable";
        break;
    }
    auto g =
        std::find_if(groups.begin(), groups.end(), [&](const Group& x) { return x.what == what; });
    if (g == groups.end()) {
      groups.push_back(Group{std::move(what), {i}});
    } else {
      g->ids.push_back(i);
    }
  }
  std::string msg =
      cat("deadlock: not every thread reaches the barrier the others wait at (block of ", n_,
          " threads): ");
  for (size_t k = 0; k < groups.size(); ++k) {
    msg += cat(k == 0 ? "" : "; ", "threads ", ranges(groups[k].ids), " ", groups[k].what);
  }
  msg +=
      ". All threads of a block must reach the same __syncthreads(), and all lanes in the mask "
      "the same warp collective";
  RG_FAIL(msg);
}

void BlockRunner::unwind_all() noexcept {
  // Destroying a suspended fiber unwinds its stack (Boost.Context throws forced_unwind in it).
  for (Thread& t : threads_) t.fiber = ctx::fiber{};
}

void BlockRunner::prepare_shared_memory() {
  const size_t bytes = launch_->dynamic_shared_bytes;
#if RG_EMU_CHECKED
  // A separate allocation of exactly the launch's size, so AddressSanitizer reports any access
  // past it (or any access at all when the launch asked for none).
  shared_ = static_cast<unsigned char*>(::operator new (bytes, std::align_val_t{kSharedAlign}));
  tls_dynamic_shared = shared_;
#else
  if (bytes > shared_capacity_) {
    if (shared_ != nullptr) ::operator delete (shared_, std::align_val_t{kSharedAlign});
    shared_ = nullptr;
    shared_ = static_cast<unsigned char*>(::operator new (bytes, std::align_val_t{kSharedAlign}));
    shared_capacity_ = bytes;
  }
  tls_dynamic_shared = bytes != 0 ? shared_ : nullptr;
#endif
  if (bytes != 0) std::memset(shared_, kSharedFill, bytes);
}

void BlockRunner::release_shared_memory() noexcept {
  tls_dynamic_shared = nullptr;
#if RG_EMU_CHECKED
  ::operator delete (shared_, std::align_val_t{kSharedAlign});
  shared_ = nullptr;
#endif
}

// ---- entry points of the intrinsics ------------------------------------------------------------

int sync_block(const char* name, int predicate, const Site& site) {
  return runner_for(name, site).sync_block(name, predicate, site);
}

unsigned int warp_collective(const WarpCall& call, const Site& site) {
  return runner_for(call.name, site).warp_collective(call, site);
}

void trap(const Site& site) { RG_FAIL("__trap() at ", where(site)); }

}  // namespace rg::emu::detail
