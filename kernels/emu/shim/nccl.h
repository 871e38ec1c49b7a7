// Stands in for <nccl.h> in emulated builds: the subset of NCCL's C API that ringgrad uses, with
// NCCL 2.28's names and enumerator values, run by kernels/emu/nccl.cpp through POSIX shared memory.
#pragma once

#include <cstddef>

#include "kernels/emu/runtime_api.h"

// Collectives, sends and receives are queued on their stream and run there in stream order,
// blocking the stream (not the host) until the peers arrive. Ranks may be processes of one machine
// or communicators of one process (ncclCommInitAll). Differing calls at the same sequence number
// fail on every rank with ncclInvalidUsage, naming both calls, instead of hanging.

#define NCCL_MAJOR 2
#define NCCL_MINOR 28
#define NCCL_PATCH 9
#define NCCL_SUFFIX ""
#define NCCL_VERSION_CODE 22809
#define NCCL_VERSION(X, Y, Z) \
  (((X) <= 2 && (Y) <= 8) ? (X)*1000 + (Y)*100 + (Z) : (X)*10000 + (Y)*100 + (Z))

typedef struct ncclComm* ncclComm_t;
#define NCCL_COMM_NULL NULL

#define NCCL_UNIQUE_ID_BYTES 128
typedef struct {
  char internal[NCCL_UNIQUE_ID_BYTES];
} ncclUniqueId;

typedef enum {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7,
  ncclNumResults = 8
} ncclResult_t;

typedef enum {
  ncclSum = 0,
  ncclProd = 1,
  ncclMax = 2,
  ncclMin = 3,
  ncclAvg = 4,
  ncclNumOps = 5,
  ncclMaxRedOp = 0x7fffffff
} ncclRedOp_t;

typedef enum {
  ncclInt8 = 0,
  ncclChar = 0,
  ncclUint8 = 1,
  ncclInt32 = 2,
  ncclInt = 2,
  ncclUint32 = 3,
  ncclInt64 = 4,
  ncclUint64 = 5,
  ncclFloat16 = 6,
  ncclHalf = 6,
  ncclFloat32 = 7,
  ncclFloat = 7,
  ncclFloat64 = 8,
  ncclDouble = 8,
  ncclBfloat16 = 9,
  ncclFloat8e4m3 = 10,
  ncclFloat8e5m2 = 11,
  ncclNumTypes = 12
} ncclDataType_t;

// The communicator options of ncclCommInitRankConfig. The emulator reads `blocking` only (and
// checks size and magic); the other fields are NCCL's and are accepted and ignored.
#define NCCL_CONFIG_UNDEF_INT (-2147483647 - 1)
#define NCCL_CONFIG_UNDEF_PTR NULL
typedef struct ncclConfig_v22800 {
  size_t size;
  unsigned int magic;
  unsigned int version;
  int blocking;  // 0: every call returns at once, ncclInProgress while it still waits (see below)
  int cgaClusterSize;
  int minCTAs;
  int maxCTAs;
  const char* netName;
  int splitShare;
} ncclConfig_t;
#define NCCL_CONFIG_INITIALIZER                                                         \
  {                                                                                     \
    sizeof(ncclConfig_t), 0xcafebeef, NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH), \
        NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT,            \
        NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_PTR, NCCL_CONFIG_UNDEF_INT             \
  }

// Connections are made at first use, as NCCL 2.22 and later do (NCCL_RUNTIME_CONNECT=1): a
// communicator's first collective waits on the host until every rank has reached its first
// collective, and the first send to (receive from) a peer until that peer's first receive from
// (send to) this rank. A blocking communicator waits inside the call (inside ncclGroupEnd for a
// group); a nonblocking one returns ncclInProgress and connects and queues the work on a
// background thread, and ncclCommGetAsyncError says ncclInProgress until that is done. Calls on
// a communicator whose earlier call is still in progress are refused (ncclInvalidArgument), as
// NCCL does. ncclCommAbort ends such a wait.

extern "C" {

ncclResult_t ncclGetVersion(int* version);
ncclResult_t ncclGetUniqueId(ncclUniqueId* uniqueId);
// Blocks until all nranks ranks have joined, at most RG_EMU_NCCL_INIT_TIMEOUT_MS (default 300000).
ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank);
// config->blocking == 0: returns ncclInProgress after registering this rank, and waits for the
// others on a background thread (ncclCommGetAsyncError: ncclInProgress until all have joined).
ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank,
                                    ncclConfig_t* config);
ncclResult_t ncclCommInitAll(ncclComm_t* comm, int ndev, const int* devlist);
ncclResult_t ncclCommFinalize(ncclComm_t comm);
ncclResult_t ncclCommDestroy(ncclComm_t comm);
ncclResult_t ncclCommAbort(ncclComm_t comm);
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError);
ncclResult_t ncclCommCount(const ncclComm_t comm, int* count);
ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device);
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank);
const char* ncclGetErrorString(ncclResult_t result);
// The communicator's first error, or else why this thread's last failed call failed; the text
// stays valid until this thread's next ncclGetLastError.
const char* ncclGetLastError(ncclComm_t comm);

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream);
ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclBcast(void* buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
                       cudaStream_t stream);
ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                        ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                               ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t stream);
ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclGroupStart();
ncclResult_t ncclGroupEnd();

}  // extern "C"

namespace rg::emu {
// RG_CUDA_CHECK for NCCL statuses under emulation (kernels/cuda/check.h): throws rg::Error naming
// file:line, the call, ncclGetErrorString and the failed call's message (the communicator's last
// error).
void check_status(ncclResult_t status, const char* call, const char* file, int line);
}  // namespace rg::emu
