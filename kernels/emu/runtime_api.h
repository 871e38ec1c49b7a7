// The subset of the CUDA runtime API (cudart) that ringgrad uses, emulated on the CPU by
// kernels/emu/device_runtime.cpp: the same names, types and error codes, so that kernel launchers
// and engine/cuda/backend_cudart.cpp compile unchanged against it.
#pragma once

// Device memory is host memory. Streams run their work asynchronously on worker threads; events,
// stream waits, the legacy default stream and pageable-vs-pinned copies behave as in CUDA.

#include <cstddef>

// CUDA's own type names (struct CUstream_st*, enum cudaError), so declarations that mention
// them mangle the same way as with the real headers.
typedef struct CUstream_st* cudaStream_t;
typedef struct CUevent_st* cudaEvent_t;
typedef struct CUgraph_st* cudaGraph_t;
typedef struct CUgraphExec_st* cudaGraphExec_t;

// CUDA's own enumerator values.
enum cudaError {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorCudartUnloading = 4,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorNoDevice = 100,
  cudaErrorInvalidDevice = 101,
  cudaErrorInvalidResourceHandle = 400,
  cudaErrorIllegalState = 401,
  cudaErrorNotReady = 600,
  cudaErrorLaunchFailure = 719,
  cudaErrorStreamCaptureUnsupported = 900,
  cudaErrorStreamCaptureInvalidated = 901,
  cudaErrorStreamCaptureUnmatched = 903,
  cudaErrorStreamCaptureUnjoined = 904,
  cudaErrorStreamCaptureIsolation = 905,
  cudaErrorStreamCaptureImplicit = 906,
  cudaErrorCapturedEvent = 907,
  cudaErrorStreamCaptureWrongThread = 908,
};
typedef enum cudaError cudaError_t;

enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4,
};

enum cudaDeviceAttr {
  cudaDevAttrComputeCapabilityMajor = 75,
  cudaDevAttrComputeCapabilityMinor = 76,
};

#define cudaStreamDefault 0x00
#define cudaStreamNonBlocking 0x01
#define cudaEventDefault 0x00
#define cudaEventBlockingSync 0x01
#define cudaEventDisableTiming 0x02
#define cudaHostAllocDefault 0x00
#define cudaHostAllocPortable 0x01
#define cudaStreamLegacy ((cudaStream_t)0x1)
#define cudaStreamPerThread ((cudaStream_t)0x2)

typedef void (*cudaHostFn_t)(void* user_data);

enum cudaStreamCaptureMode {
  cudaStreamCaptureModeGlobal = 0,
  cudaStreamCaptureModeThreadLocal = 1,
  cudaStreamCaptureModeRelaxed = 2,
};
enum cudaStreamCaptureStatus {
  cudaStreamCaptureStatusNone = 0,
  cudaStreamCaptureStatusActive = 1,
  cudaStreamCaptureStatusInvalidated = 2,
};

// Errors: a failed call returns its status and remembers it (cudaGetLastError). An exception
// thrown by queued work (a kernel's rg::Error, a failed emulated library call) is a sticky error
// of its device, returned by every later call on that device as cudaErrorLaunchFailure;
// rg::emu::check_status adds its message.
cudaError_t cudaGetLastError();
cudaError_t cudaPeekAtLastError();
const char* cudaGetErrorString(cudaError_t error);

// Devices: RG_EMU_DEVICES (default 1, at most 16) emulated devices of compute capability 8.0. The
// current device is per host thread, 0 at first.
cudaError_t cudaGetDeviceCount(int* count);
cudaError_t cudaGetDevice(int* device);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device);
cudaError_t cudaDeviceSynchronize();
// Clears the current device's sticky error (and only that: memory and streams stay).
cudaError_t cudaDeviceReset();

// Memory. cudaFree and cudaFreeHost wait for the work of every stream first, as in CUDA.
cudaError_t cudaMalloc(void** ptr, size_t bytes);
cudaError_t cudaFree(void* ptr);
cudaError_t cudaHostAlloc(void** ptr, size_t bytes, unsigned int flags);
cudaError_t cudaMallocHost(void** ptr, size_t bytes);
cudaError_t cudaFreeHost(void* ptr);
// A copy that involves pageable host memory (any host memory not from cudaHostAlloc) returns
// when it is done; between device and pinned memory it is asynchronous.
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t stream = nullptr);
cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind);
cudaError_t cudaMemsetAsync(void* dst, int value, size_t bytes, cudaStream_t stream = nullptr);
cudaError_t cudaMemset(void* dst, int value, size_t bytes);

// Streams: nullptr (and cudaStreamLegacy, cudaStreamPerThread) is the current device's legacy
// default stream, which waits for and is waited on by the device's blocking streams.
cudaError_t cudaStreamCreate(cudaStream_t* stream);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int flags);
cudaError_t cudaStreamDestroy(cudaStream_t stream);
cudaError_t cudaStreamQuery(cudaStream_t stream);  // cudaSuccess when idle, else NotReady
cudaError_t cudaStreamSynchronize(cudaStream_t stream);
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags = 0);
cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void* user_data);

// Events record a position in a stream; timing events also the time the stream reached it.
cudaError_t cudaEventCreate(cudaEvent_t* event);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags);
cudaError_t cudaEventDestroy(cudaEvent_t event);
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream = nullptr);
cudaError_t cudaEventQuery(cudaEvent_t event);
cudaError_t cudaEventSynchronize(cudaEvent_t event);
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end);

// Stream capture and graphs (CUDA graphs): between BeginCapture and EndCapture the stream's work
// (launches, async copies and sets, host functions, events it records) is recorded, not run; a
// graph launch queues the recorded work on a stream, as often as launched, with the same
// arguments. Another stream joins the capture by waiting on an event recorded in it (a fork, as
// ProcessGroupNCCL's communication stream does); its work is recorded into the same graph, and
// the capturing stream must wait on an event recorded on it after its last captured work before
// EndCapture (a join), or EndCapture fails with cudaErrorStreamCaptureUnjoined; EndCapture on a
// joined stream is cudaErrorStreamCaptureUnmatched. The emulated graph is the captured work in
// the order the host queued it, which every fork and join respects; a launch runs it in that
// order on one stream. As in CUDA, synchronizing or querying a capturing stream, a pageable copy
// on it, or waiting on an event recorded outside the capture invalidates the capture (EndCapture
// then fails with cudaErrorStreamCaptureInvalidated); so does, in global mode (and in
// thread-local mode on the capturing thread), cudaMalloc, cudaFree and device synchronization;
// querying or synchronizing an event recorded in a capture is cudaErrorCapturedEvent.
cudaError_t cudaStreamBeginCapture(cudaStream_t stream, enum cudaStreamCaptureMode mode);
cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph);
cudaError_t cudaStreamIsCapturing(cudaStream_t stream, enum cudaStreamCaptureStatus* status);
// Swaps the calling thread's capture interaction mode with *mode (global by default). A thread in
// relaxed mode may call cudaMalloc during a capture (the caching allocator's private pools grow so,
// as PyTorch's); cudaFree and device synchronization still invalidate its captures.
cudaError_t cudaThreadExchangeStreamCaptureMode(enum cudaStreamCaptureMode* mode);
cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph,
                                 unsigned long long flags = 0);
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream);
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec);
cudaError_t cudaGraphDestroy(cudaGraph_t graph);
