// The emulated CUDA runtime behind kernels/emu/runtime_api.h: devices whose memory is host
// memory, streams that run their work in order on their own worker threads (concurrently with the
// host and with each other), events, and the stream-race detector (kernels/emu/racecheck.h).
// Emulated libraries (cuBLAS, cuDNN, NCCL) queue their calls here with the memory they touch.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "kernels/emu/runtime_api.h"

namespace rg::emu {

// A range of emulated memory that an operation reads or writes. bytes == kToBlockEnd: from ptr to
// the end of the allocation (or caching-allocator block) that holds ptr, for kernel pointer
// arguments whose extent the launch does not say. Pointers outside emulated device and pinned
// memory (plain host memory, as the kernel tests use) are not tracked.
inline constexpr size_t kToBlockEnd = ~size_t(0);
struct MemAccess {
  const void* ptr;
  size_t bytes;
  bool write;
};

// Queues `work` on `stream` (nullptr: the legacy default stream of the current device), after
// everything queued there before and after the events it was told to wait for. `what` names the
// operation in race reports and errors ("kernel reduce_sum_kernel", "ncclAllReduce(...)").
// An exception thrown by `work` becomes the device's sticky error: the next runtime call on that
// device reports it (as a CUDA kernel fault would). With launch blocking (CUDA_LAUNCH_BLOCKING=1
// or set_launch_blocking) the host waits here until `work` has run and rethrows its exception.
void enqueue(cudaStream_t stream, std::string what, std::vector<MemAccess> accesses,
             std::function<void()> work);

// Work whose arguments are fixed only when it is queued, each time it is queued: `run` is the
// work; `abandon` undoes the preparation when `run` will never be queued (the launch failed).
// The emulated NCCL takes a communicator's turn so, in the order calls are queued.
struct PreparedWork {
  std::function<void()> run;
  std::function<void()> abandon;
};
using Prepare = std::function<PreparedWork()>;
// As enqueue, with the work made by `prepare`: at once outside a capture; in a stream capture, at
// each launch of the graph (the captured prepares of a graph run in their order, on the launching
// thread without the runtime's lock, before its work is queued).
void enqueue_prepared(cudaStream_t stream, std::string what, std::vector<MemAccess> accesses,
                      const Prepare& prepare);

// The device a stream belongs to (the current device for nullptr).
int stream_device(cudaStream_t stream);
// A readable name: "cuda:0/default", "cuda:1/stream 3".
std::string stream_name(cudaStream_t stream);

// Launch blocking: every enqueue waits for its work (CUDA_LAUNCH_BLOCKING=1 in the environment
// turns it on at start). For tests that hand kernels plain host memory and read it right after.
void set_launch_blocking(bool on);
bool launch_blocking();
// Whether `stream` is capturing (cudaStreamBeginCapture, or joined to a capture through an
// event): its work is recorded, not run.
bool stream_capturing(cudaStream_t stream);
// Serialize mode (RG_EMU_SERIALIZE=1): one worker runs the work of every stream in the order it was
// queued, for debugging. Collectives between devices of one process cannot run in this mode.
bool serialize_mode();

// Emulated device memory and pinned host memory, as cudaMalloc/cudaHostAlloc hand them out;
// the registry tells which device (or pinned host, -1) a pointer belongs to.
// Returns -2 for memory the emulator did not allocate.
int memory_owner(const void* ptr);

// The stream-race detector (kernels/emu/racecheck.h), RG_EMU_RACECHECK=off|warn|error (default
// error: a race found when work is queued throws rg::Error from that call; one found when memory
// is freed is thrown by the next call that queues work). Every report is printed to stderr and
// kept for race_reports().
bool racecheck_enabled();
std::vector<std::string> race_reports();
void clear_race_reports();
// What the caching allocators tell the detector (through cuda::Backend in the engine): a block of
// `device` handed out for work on `stream`, and given back with the other streams that
// record_stream named; the same for pinned host blocks, which the host hands out.
void annotate_block_allocated(int device, void* ptr, size_t bytes, cudaStream_t stream);
void annotate_block_freed(int device, void* ptr, size_t bytes, cudaStream_t stream,
                          const std::vector<cudaStream_t>& also_used_on);
void annotate_host_block_allocated(void* ptr, size_t bytes);
// A pending free (device or pinned block) whose events the allocator found reached: the block's
// earlier uses are over, and its reuse needs no ordering with them.
void annotate_block_released(void* ptr, size_t bytes);
// cudaEventQuery for bookkeeping polls (the allocators' pending frees, the NCCL watchdog): the
// same answer, but a reached event does not order the polling host thread after it for the race
// detector. All host threads share one clock, so an ordering poll would order the program's own
// later work after that stream and hide a missing wait.
cudaError_t poll_event(cudaEvent_t event);
// cudaEventQuery's body: a reached event orders the host after it when `orders_host`.
cudaError_t query_event(cudaEvent_t event, bool orders_host);
void annotate_host_block_freed(void* ptr, size_t bytes,
                               const std::vector<std::pair<int, cudaStream_t>>& also_used_on);

// Host-blocking calls: the emulated calls that make the calling host thread wait for device work
// (device, stream and event synchronization; a copy to or from pageable host memory, cudaMemcpy
// and cudaMemset included; cudaFree and cudaFreeHost, which wait for all work), counted per
// thread. A training step that runs ahead of the device has none; one that reads a value back
// stalls. A call inside another (cudaMemcpy's synchronization) counts once, as the outer call.
// The count of this thread since it started:
uint64_t host_blocking_calls();
// The work this thread queued on streams since it started (kernel launches, asynchronous copies
// and sets, host functions, each captured one included; a graph launch counts once): what the
// host spends launching, which a CUDA graph's replay saves.
uint64_t host_submissions();
// For the emulated libraries' calls that are unsafe during a stream capture (cublasCreate and
// cudnnCreate allocate device memory): true, and the captures it would disturb are invalidated
// (as cudaMalloc's; `allowed_in_relaxed`: a relaxed-mode thread may), when the call must fail.
bool refuse_during_capture(bool allowed_in_relaxed);
// Called (on the blocking thread, after the call, without the runtime's lock) with the call's name,
// for every host-blocking call of every thread; nullptr: none. The engine's tracer installs one.
using HostBlockingObserver = void (*)(const char* call);
void set_host_blocking_observer(HostBlockingObserver observer);
// Objects the emulated libraries create on the host per call site (cuDNN descriptors, of either
// API): each creation is shown to the observer with the creating function's name, on the creating
// thread; nullptr: none. The engine's tracer installs one, so that ringgrad-bench profile can
// count them per step (a steady training step creates none).
using LibraryObjectObserver = void (*)(const char* function);
void set_library_object_observer(LibraryObjectObserver observer);
void library_object_created(const char* function);

}  // namespace rg::emu
