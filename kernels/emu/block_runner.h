// Internal to kernels/emu: runs the threads of one emulated block as fibers on the calling OS
// thread, switching at barriers and warp collectives (launch.cpp has one per worker thread).
#pragma once

// AddressSanitizer must be told about every stack switch, which Boost.Context does only in its
// ucontext implementation; the checked build (-fsanitize=address) uses that one.
#if defined(__SANITIZE_ADDRESS__)
#define BOOST_USE_ASAN 1
#define BOOST_USE_UCONTEXT 1
#endif
#include <boost/context/fiber.hpp>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "kernels/emu/intrinsics.h"
#include "kernels/emu/launch.h"

namespace rg::emu::detail {

// One launch as the workers see it.
struct Launch {
  LaunchSite site;
  dim3 grid;
  dim3 block;
  size_t dynamic_shared_bytes = 0;
  KernelThunk thunk = nullptr;
  const void* bound = nullptr;
  unsigned int threads_per_block = 0;
};

// Fiber stacks of one size, kept for the next block instead of being unmapped.
class StackPool {
 public:
  explicit StackPool(size_t bytes);
  ~StackPool();
  StackPool(const StackPool&) = delete;
  StackPool& operator=(const StackPool&) = delete;

  boost::context::stack_context allocate();
  void deallocate(boost::context::stack_context& sc) noexcept;
  size_t bytes() const { return bytes_; }

 private:
  // Stack tops 11 * 256 bytes apart modulo 16 KiB: 64 different offsets (Boost.Context puts its
  // control record, above the first frame, at a multiple of 256 bytes).
  static constexpr size_t kColorStep = 2816;
  static constexpr size_t kColorSpan = 16384;
  size_t bytes_;
  size_t guard_;
  size_t next_color_ = 0;
  std::vector<boost::context::stack_context> free_;
};

class BlockRunner {
 public:
  BlockRunner() = default;
  ~BlockRunner();
  BlockRunner(const BlockRunner&) = delete;
  BlockRunner& operator=(const BlockRunner&) = delete;

  // Runs block `block_linear` (x fastest) of `launch` to completion. Throws the first failure:
  // an rg::Error (prefixed with the block, and the thread where one threw) or the exception a
  // kernel thread threw, after unwinding every other fiber of the block.
  void run(const Launch& launch, uint64_t block_linear);

  // The runner whose block is running on this OS thread, or nullptr outside kernels.
  static BlockRunner* current();

  // Called from kernel threads through the intrinsics (kernels/emu/intrinsics.h).
  int sync_block(const char* name, int predicate, const Site& site);
  unsigned int warp_collective(const WarpCall& call, const Site& site);

 private:
  enum class State : unsigned char { kReady, kBlockBarrier, kWarp, kDone };

  struct Thread {
    boost::context::fiber fiber;
    uint3 idx{};
    State state = State::kReady;
    bool started = false;
    // What the thread waits at (valid unless kReady/kDone); in/out point into its stack.
    Site site;
    const char* name = nullptr;
    int predicate = 0;
    unsigned int result = 0;  // barrier count, vote or 0, set when the thread is released
    WarpCall call{};
    int src_lane = -1;  // resolved shuffle source lane in the warp, -1: the thread's own value
  };

  void schedule();
  boost::context::fiber thread_main(unsigned int first, boost::context::fiber&& scheduler);
  void wait();
  bool release_warps();
  void complete_warp_group(unsigned int base, unsigned int lanes, WarpOp op);
  bool release_block_barrier();
  [[noreturn]] void report_stuck() const;
  void unwind_all() noexcept;
  void prepare_shared_memory();
  void release_shared_memory() noexcept;

  const Launch* launch_ = nullptr;
  uint3 block_idx_{};
  unsigned int n_ = 0;
  unsigned int done_ = 0;
  unsigned int current_ = 0;
  std::vector<Thread> threads_;
  boost::context::fiber scheduler_;  // where a waiting or finishing thread switches to
  std::exception_ptr failure_;       // first exception thrown by a kernel thread
  unsigned int failed_thread_ = 0;
  std::unique_ptr<StackPool> stacks_;
  size_t stack_request_ = 0;
  unsigned char* shared_ = nullptr;  // dynamic shared memory of the running block
  size_t shared_capacity_ = 0;
};

}  // namespace rg::emu::detail
