// Emulated kernel launches: the configuration checks of the CUDA runtime, and the pool of worker
// threads that runs the blocks of each launch in parallel (one BlockRunner per worker).
#include "kernels/emu/launch.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "kernels/emu/block_runner.h"
#include "kernels/error.h"

namespace rg::emu {
namespace {

using ::rg::detail::cat;

#if RG_EMU_CHECKED
constexpr bool kChecked = true;
constexpr size_t kDefaultStackBytes = 256 * 1024;
#else
constexpr bool kChecked = false;
constexpr size_t kDefaultStackBytes = 64 * 1024;
#endif

long env_long(const char* name, long fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  RG_CHECK(end != v && *end == '\0' && x > 0, name, "=", v, " is not a positive integer");
  return x;
}

std::atomic<size_t> g_stack_bytes{0};  // 0: not configured yet

std::string dims(dim3 d) { return cat("(", d.x, ",", d.y, ",", d.z, ")"); }

// Why CUDA would refuse this configuration, or "" when it is valid.
std::string invalid_configuration(dim3 grid, dim3 block, size_t shmem) {
  const unsigned int g[3] = {grid.x, grid.y, grid.z};
  const unsigned int b[3] = {block.x, block.y, block.z};
  for (int i = 0; i < 3; ++i) {
    if (g[i] == 0) return cat("grid ", dims(grid), " has a zero dimension");
    if (b[i] == 0) return cat("block ", dims(block), " has a zero dimension");
  }
  const uint64_t threads = uint64_t{block.x} * block.y * block.z;
  if (threads > kMaxThreadsPerBlock) {
    return cat("block ", dims(block), " has ", threads, " threads, more than ",
               kMaxThreadsPerBlock);
  }
  for (int i = 0; i < 3; ++i) {
    if (b[i] > kMaxBlockDim[i]) {
      return cat("block ", dims(block), " exceeds the per-dimension limits (", kMaxBlockDim[0], ",",
                 kMaxBlockDim[1], ",", kMaxBlockDim[2], ")");
    }
    if (g[i] > kMaxGridDim[i]) {
      return cat("grid ", dims(grid), " exceeds the per-dimension limits (", kMaxGridDim[0], ",",
                 kMaxGridDim[1], ",", kMaxGridDim[2], ")");
    }
  }
  if (shmem > kMaxDynamicSharedBytes) {
    return cat(shmem, " bytes of dynamic shared memory, more than ", kMaxDynamicSharedBytes);
  }
  return {};
}

// One launch in the queue: workers claim its blocks one at a time.
struct Job {
  detail::Launch launch;
  uint64_t num_blocks = 0;
  uint64_t next = 0;         // next block to hand out
  unsigned int running = 0;  // blocks being run by workers
  bool cancelled = false;    // a block failed: hand out no more
  std::exception_ptr error;
  std::condition_variable finished_cv;

  bool finished() const { return running == 0 && (cancelled || next == num_blocks); }
};

class WorkerPool {
 public:
  // Never destroyed: workers may still wait on the queue while the process exits.
  static WorkerPool& instance() {
    static WorkerPool* pool = new WorkerPool(worker_count());
    return *pool;
  }

  void run(Job& job) {
    std::unique_lock lock(mutex_);
    queue_.push_back(&job);
    work_cv_.notify_all();
    job.finished_cv.wait(lock, [&] { return job.finished(); });
    // A cancelled job may still be queued.
    const auto it = std::find(queue_.begin(), queue_.end(), &job);
    if (it != queue_.end()) queue_.erase(it);
  }

 private:
  explicit WorkerPool(int n) {
    for (int i = 0; i < n; ++i) std::thread([this] { work(); }).detach();
  }

  void work() {
    detail::BlockRunner runner;
    std::unique_lock lock(mutex_);
    for (;;) {
      work_cv_.wait(lock, [&] { return !queue_.empty(); });
      Job* job = queue_.front();
      if (job->cancelled || job->next == job->num_blocks) {
        queue_.pop_front();
        continue;
      }
      const uint64_t block = job->next++;
      if (job->next == job->num_blocks) queue_.pop_front();
      ++job->running;
      lock.unlock();
      std::exception_ptr error;
      try {
        runner.run(job->launch, block);
      } catch (...) {
        error = std::current_exception();
      }
      lock.lock();
      --job->running;
      if (error && !job->error) {
        job->error = error;
        job->cancelled = true;
      }
      // Notified under the lock: the launching thread cannot destroy the job before we let go.
      if (job->finished()) job->finished_cv.notify_all();
    }
  }

  std::mutex mutex_;
  std::condition_variable work_cv_;
  std::deque<Job*> queue_;
};

}  // namespace

int worker_count() {
  if (kChecked) return 1;
  static const int n = static_cast<int>(
      env_long("RG_EMU_THREADS", std::clamp<long>(std::thread::hardware_concurrency(), 1, 4)));
  return n;
}

size_t fiber_stack_bytes() {
  size_t bytes = g_stack_bytes.load(std::memory_order_relaxed);
  if (bytes == 0) {
    bytes = static_cast<size_t>(
        env_long("RG_EMU_STACK_KB", static_cast<long>(kDefaultStackBytes / 1024)) * 1024);
    g_stack_bytes.store(bytes, std::memory_order_relaxed);
  }
  return bytes;
}

void set_fiber_stack_bytes(size_t bytes) {
  RG_CHECK(bytes >= 16 * 1024, "fiber stacks of ", bytes, " bytes are too small (16 KiB at least)");
  g_stack_bytes.store(bytes, std::memory_order_relaxed);
}

bool checked_build() { return kChecked; }

static std::string launch_name(const LaunchSite& site, dim3 grid, dim3 block, size_t shmem) {
  return cat(site.file, ":", site.line, ": kernel ", site.kernel, "<<<", dims(grid), ", ",
             dims(block), ", ", shmem, ">>>");
}

void check_launch(const LaunchSite& site, dim3 grid, dim3 block, size_t dynamic_shared_bytes) {
  const std::string invalid = invalid_configuration(grid, block, dynamic_shared_bytes);
  RG_CHECK(invalid.empty(), launch_name(site, grid, block, dynamic_shared_bytes),
           ": invalid configuration argument: ", invalid);
  RG_CHECK(detail::BlockRunner::current() == nullptr,
           launch_name(site, grid, block, dynamic_shared_bytes),
           ": launched from inside an emulated kernel (dynamic parallelism is not emulated)");
}

void launch_kernel(const LaunchSite& site, dim3 grid, dim3 block, size_t dynamic_shared_bytes,
                   KernelThunk thunk, const void* bound) {
  Job job;
  job.launch = detail::Launch{
      site, grid, block, dynamic_shared_bytes, thunk, bound, block.x * block.y * block.z};
  job.num_blocks = uint64_t{grid.x} * grid.y * grid.z;
  WorkerPool::instance().run(job);
  if (!job.error) return;
  try {
    std::rethrow_exception(job.error);
  } catch (const rg::Error& e) {
    throw rg::Error(cat(launch_name(site, grid, block, dynamic_shared_bytes), ": ", e.what()));
  }
}

}  // namespace rg::emu
