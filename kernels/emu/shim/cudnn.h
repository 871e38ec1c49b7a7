// Stands in for <cudnn.h> in emulated builds: the subset of cuDNN that kernels/cuda uses, computed
// on the CPU (kernels/emu/cudnn.cpp): convolution (conv2d.cu: handles, 4-D tensor/filter/
// convolution descriptors, heuristic algorithm queries, forward and both gradients; by
// kernels/cpu/conv2d), spatial batch normalization (batch_norm_cudnn.cu: forward training and
// inference, backward; by kernels/cpu/batch_norm) and average pooling (pool_cudnn.cu: forward and
// backward; by kernels/cpu/pool). The algorithm queries offer one deterministic algorithm without
// workspace; only alpha = 1, beta = 0 is supported; f16/bf16 compute in f32 and round once. Not
// emulated (CUDNN_STATUS_NOT_SUPPORTED): per-activation batch norm, max pooling, and batch norm
// on bf16 data (which kernels/cuda does not ask cuDNN for).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "kernels/emu/runtime_api.h"

// cuDNN's own enumerator values.
typedef enum {
  CUDNN_STATUS_SUCCESS = 0,
  CUDNN_STATUS_NOT_INITIALIZED = 1001,
  CUDNN_STATUS_BAD_PARAM = 2000,
  CUDNN_STATUS_NOT_SUPPORTED = 3000,
  CUDNN_STATUS_EXECUTION_FAILED = 5000,
} cudnnStatus_t;

typedef enum {
  CUDNN_DATA_FLOAT = 0,
  CUDNN_DATA_DOUBLE = 1,
  CUDNN_DATA_HALF = 2,
  CUDNN_DATA_BFLOAT16 = 9,
} cudnnDataType_t;

// NHWC: the legacy convolution's tensors and filters (batch norm and pooling refuse it).
typedef enum { CUDNN_TENSOR_NCHW = 0, CUDNN_TENSOR_NHWC = 1 } cudnnTensorFormat_t;
typedef enum { CUDNN_NOT_PROPAGATE_NAN = 0, CUDNN_PROPAGATE_NAN = 1 } cudnnNanPropagation_t;
typedef enum {
  CUDNN_DEFAULT_MATH = 0,
  CUDNN_TENSOR_OP_MATH = 1,
  CUDNN_FMA_MATH = 3,
} cudnnMathType_t;
typedef enum { CUDNN_CONVOLUTION = 0, CUDNN_CROSS_CORRELATION = 1 } cudnnConvolutionMode_t;
typedef enum { CUDNN_NON_DETERMINISTIC = 0, CUDNN_DETERMINISTIC = 1 } cudnnDeterminism_t;
typedef enum {
  CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM = 0,
  CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM = 1
} cudnnConvolutionFwdAlgo_t;
typedef enum {
  CUDNN_CONVOLUTION_BWD_DATA_ALGO_0 = 0,
  CUDNN_CONVOLUTION_BWD_DATA_ALGO_1 = 1
} cudnnConvolutionBwdDataAlgo_t;
typedef enum {
  CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0 = 0,
  CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1 = 1
} cudnnConvolutionBwdFilterAlgo_t;

typedef struct cudnnContext* cudnnHandle_t;
typedef struct cudnnTensorStruct* cudnnTensorDescriptor_t;
typedef struct cudnnFilterStruct* cudnnFilterDescriptor_t;
typedef struct cudnnConvolutionStruct* cudnnConvolutionDescriptor_t;
typedef struct cudnnPoolingStruct* cudnnPoolingDescriptor_t;

#define RG_EMU_CUDNN_PERF(Name, Algo) \
  typedef struct {                    \
    Algo algo;                        \
    cudnnStatus_t status;             \
    float time;                       \
    size_t memory;                    \
    cudnnDeterminism_t determinism;   \
    cudnnMathType_t mathType;         \
    int reserved[3];                  \
  } Name
RG_EMU_CUDNN_PERF(cudnnConvolutionFwdAlgoPerf_t, cudnnConvolutionFwdAlgo_t);
RG_EMU_CUDNN_PERF(cudnnConvolutionBwdDataAlgoPerf_t, cudnnConvolutionBwdDataAlgo_t);
RG_EMU_CUDNN_PERF(cudnnConvolutionBwdFilterAlgoPerf_t, cudnnConvolutionBwdFilterAlgo_t);
#undef RG_EMU_CUDNN_PERF

cudnnStatus_t cudnnCreate(cudnnHandle_t* handle);
cudnnStatus_t cudnnDestroy(cudnnHandle_t handle);
cudnnStatus_t cudnnSetStream(cudnnHandle_t handle, cudaStream_t stream);
const char* cudnnGetErrorString(cudnnStatus_t status);

cudnnStatus_t cudnnCreateTensorDescriptor(cudnnTensorDescriptor_t* desc);
cudnnStatus_t cudnnDestroyTensorDescriptor(cudnnTensorDescriptor_t desc);
cudnnStatus_t cudnnSetTensor4dDescriptor(cudnnTensorDescriptor_t desc, cudnnTensorFormat_t format,
                                         cudnnDataType_t type, int n, int c, int h, int w);
cudnnStatus_t cudnnCreateFilterDescriptor(cudnnFilterDescriptor_t* desc);
cudnnStatus_t cudnnDestroyFilterDescriptor(cudnnFilterDescriptor_t desc);
cudnnStatus_t cudnnSetFilter4dDescriptor(cudnnFilterDescriptor_t desc, cudnnDataType_t type,
                                         cudnnTensorFormat_t format, int k, int c, int h, int w);
cudnnStatus_t cudnnCreateConvolutionDescriptor(cudnnConvolutionDescriptor_t* desc);
cudnnStatus_t cudnnDestroyConvolutionDescriptor(cudnnConvolutionDescriptor_t desc);
cudnnStatus_t cudnnSetConvolution2dDescriptor(cudnnConvolutionDescriptor_t desc, int pad_h,
                                              int pad_w, int u, int v, int dilation_h,
                                              int dilation_w, cudnnConvolutionMode_t mode,
                                              cudnnDataType_t compute_type);
cudnnStatus_t cudnnSetConvolutionMathType(cudnnConvolutionDescriptor_t desc, cudnnMathType_t math);

cudnnStatus_t cudnnGetConvolutionForwardAlgorithm_v7(
    cudnnHandle_t handle, cudnnTensorDescriptor_t x, cudnnFilterDescriptor_t w,
    cudnnConvolutionDescriptor_t conv, cudnnTensorDescriptor_t y, int requested, int* returned,
    cudnnConvolutionFwdAlgoPerf_t* perf);
cudnnStatus_t cudnnGetConvolutionBackwardDataAlgorithm_v7(
    cudnnHandle_t handle, cudnnFilterDescriptor_t w, cudnnTensorDescriptor_t dy,
    cudnnConvolutionDescriptor_t conv, cudnnTensorDescriptor_t dx, int requested, int* returned,
    cudnnConvolutionBwdDataAlgoPerf_t* perf);
cudnnStatus_t cudnnGetConvolutionBackwardFilterAlgorithm_v7(
    cudnnHandle_t handle, cudnnTensorDescriptor_t x, cudnnTensorDescriptor_t dy,
    cudnnConvolutionDescriptor_t conv, cudnnFilterDescriptor_t dw, int requested, int* returned,
    cudnnConvolutionBwdFilterAlgoPerf_t* perf);

// cudnnFind*: the candidates "timed", fastest first (the emulator runs nothing here).
cudnnStatus_t cudnnFindConvolutionForwardAlgorithm(cudnnHandle_t handle, cudnnTensorDescriptor_t x,
                                                   cudnnFilterDescriptor_t w,
                                                   cudnnConvolutionDescriptor_t conv,
                                                   cudnnTensorDescriptor_t y, int requested,
                                                   int* returned,
                                                   cudnnConvolutionFwdAlgoPerf_t* perf);
cudnnStatus_t cudnnFindConvolutionBackwardDataAlgorithm(
    cudnnHandle_t handle, cudnnFilterDescriptor_t w, cudnnTensorDescriptor_t dy,
    cudnnConvolutionDescriptor_t conv, cudnnTensorDescriptor_t dx, int requested, int* returned,
    cudnnConvolutionBwdDataAlgoPerf_t* perf);
cudnnStatus_t cudnnFindConvolutionBackwardFilterAlgorithm(
    cudnnHandle_t handle, cudnnTensorDescriptor_t x, cudnnTensorDescriptor_t dy,
    cudnnConvolutionDescriptor_t conv, cudnnFilterDescriptor_t dw, int requested, int* returned,
    cudnnConvolutionBwdFilterAlgoPerf_t* perf);

cudnnStatus_t cudnnConvolutionForward(cudnnHandle_t handle, const void* alpha,
                                      cudnnTensorDescriptor_t x_desc, const void* x,
                                      cudnnFilterDescriptor_t w_desc, const void* w,
                                      cudnnConvolutionDescriptor_t conv,
                                      cudnnConvolutionFwdAlgo_t algo, void* workspace,
                                      size_t workspace_bytes, const void* beta,
                                      cudnnTensorDescriptor_t y_desc, void* y);
cudnnStatus_t cudnnConvolutionBackwardData(cudnnHandle_t handle, const void* alpha,
                                           cudnnFilterDescriptor_t w_desc, const void* w,
                                           cudnnTensorDescriptor_t dy_desc, const void* dy,
                                           cudnnConvolutionDescriptor_t conv,
                                           cudnnConvolutionBwdDataAlgo_t algo, void* workspace,
                                           size_t workspace_bytes, const void* beta,
                                           cudnnTensorDescriptor_t dx_desc, void* dx);
cudnnStatus_t cudnnConvolutionBackwardFilter(cudnnHandle_t handle, const void* alpha,
                                             cudnnTensorDescriptor_t x_desc, const void* x,
                                             cudnnTensorDescriptor_t dy_desc, const void* dy,
                                             cudnnConvolutionDescriptor_t conv,
                                             cudnnConvolutionBwdFilterAlgo_t algo, void* workspace,
                                             size_t workspace_bytes, const void* beta,
                                             cudnnFilterDescriptor_t dw_desc, void* dw);

// Batch normalization (cudnn_ops.h).
typedef enum {
  CUDNN_BATCHNORM_PER_ACTIVATION = 0,
  CUDNN_BATCHNORM_SPATIAL = 1,
  CUDNN_BATCHNORM_SPATIAL_PERSISTENT = 2,
} cudnnBatchNormMode_t;
#define CUDNN_BN_MIN_EPSILON 0.0

cudnnStatus_t cudnnDeriveBNTensorDescriptor(cudnnTensorDescriptor_t derived_desc,
                                            const cudnnTensorDescriptor_t x_desc,
                                            cudnnBatchNormMode_t mode);
cudnnStatus_t cudnnBatchNormalizationForwardTraining(
    cudnnHandle_t handle, cudnnBatchNormMode_t mode, const void* alpha, const void* beta,
    const cudnnTensorDescriptor_t x_desc, const void* x, const cudnnTensorDescriptor_t y_desc,
    void* y, const cudnnTensorDescriptor_t scale_bias_mean_var_desc, const void* scale,
    const void* bias, double exponential_average_factor, void* result_running_mean,
    void* result_running_variance, double epsilon, void* result_save_mean,
    void* result_save_inv_variance);
cudnnStatus_t cudnnBatchNormalizationForwardInference(
    cudnnHandle_t handle, cudnnBatchNormMode_t mode, const void* alpha, const void* beta,
    const cudnnTensorDescriptor_t x_desc, const void* x, const cudnnTensorDescriptor_t y_desc,
    void* y, const cudnnTensorDescriptor_t scale_bias_mean_var_desc, const void* scale,
    const void* bias, const void* estimated_mean, const void* estimated_variance, double epsilon);
cudnnStatus_t cudnnBatchNormalizationBackward(
    cudnnHandle_t handle, cudnnBatchNormMode_t mode, const void* alpha_data_diff,
    const void* beta_data_diff, const void* alpha_param_diff, const void* beta_param_diff,
    const cudnnTensorDescriptor_t x_desc, const void* x, const cudnnTensorDescriptor_t dy_desc,
    const void* dy, const cudnnTensorDescriptor_t dx_desc, void* dx,
    const cudnnTensorDescriptor_t scale_bias_diff_desc, const void* scale, void* scale_diff,
    void* bias_diff, double epsilon, const void* saved_mean, const void* saved_inv_variance);

// Pooling (cudnn_ops.h).
typedef enum {
  CUDNN_POOLING_MAX = 0,
  CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING = 1,
  CUDNN_POOLING_AVERAGE_COUNT_EXCLUDE_PADDING = 2,
  CUDNN_POOLING_MAX_DETERMINISTIC = 3,
} cudnnPoolingMode_t;

cudnnStatus_t cudnnCreatePoolingDescriptor(cudnnPoolingDescriptor_t* desc);
cudnnStatus_t cudnnDestroyPoolingDescriptor(cudnnPoolingDescriptor_t desc);
cudnnStatus_t cudnnSetPooling2dDescriptor(cudnnPoolingDescriptor_t desc, cudnnPoolingMode_t mode,
                                          cudnnNanPropagation_t max_pooling_nan_opt,
                                          int window_height, int window_width, int vertical_padding,
                                          int horizontal_padding, int vertical_stride,
                                          int horizontal_stride);
cudnnStatus_t cudnnPoolingForward(cudnnHandle_t handle, const cudnnPoolingDescriptor_t desc,
                                  const void* alpha, const cudnnTensorDescriptor_t x_desc,
                                  const void* x, const void* beta,
                                  const cudnnTensorDescriptor_t y_desc, void* y);
cudnnStatus_t cudnnPoolingBackward(cudnnHandle_t handle, const cudnnPoolingDescriptor_t desc,
                                   const void* alpha, const cudnnTensorDescriptor_t y_desc,
                                   const void* y, const cudnnTensorDescriptor_t dy_desc,
                                   const void* dy, const cudnnTensorDescriptor_t x_desc,
                                   const void* x, const void* beta,
                                   const cudnnTensorDescriptor_t dx_desc, void* dx);

// The graph (backend) API (cudnn_graph.h), the subset conv2d.cu uses: one convolution per
// operation graph (forward, backward data, backward filter) on packed 4-D tensors (NCHW or NHWC
// strides), engine heuristics, engine configurations, execution plans, variant packs and
// execution. cuDNN's own enumerator values; other descriptor types are CUDNN_STATUS_NOT_SUPPORTED.
// Emulated as cuDNN 9 behaves (kernels/emu/cudnn_backend.cpp), with the base statuses only:
// - CUDNN_STATUS_BAD_PARAM: a null, destroyed or foreign descriptor; setting an attribute of a
//   finalized descriptor, or one its kind lacks, or with the wrong type or element count; getting
//   one of a descriptor not finalized; a Finalize missing a required attribute or given
//   inconsistent ones (tensor shapes, data types, layouts, repeated unique ids); a
//   descriptor-valued attribute naming a descriptor that was not finalized when it was set (its
//   value is copied then: it may be destroyed right after); execution with an operand missing
//   from the variant pack, null or less aligned than its tensor's BYTE_ALIGNMENT, or without the
//   plan's workspace.
// - CUDNN_STATUS_NOT_SUPPORTED: what the emulator does not compute: a data type other than f32,
//   f64, f16 and bf16, a dimension or convolution parameter above INT32_MAX or more than 2^59
//   elements, strides that are neither packed NCHW nor packed NHWC, CUDNN_CONVOLUTION mode, other
//   than 2 spatial dimensions, post paddings unlike the pre paddings, a compute type other than
//   f64 for f64 data and f32 for the rest, more than one operation in a graph; and an execution
//   plan of engine 3, or of an operation with alpha != 1 or beta != 0 (refused at the plan's
//   Finalize).
// GetAttribute with requested = 0 sets *count to the attribute's number of elements and writes
// nothing; otherwise it writes the first min(requested, number) and sets *count to how many.
// ENGINEHEUR_RESULTS fills (and finalizes) ENGINECFG descriptors the caller created, and
// ENGINECFG_ENGINE an ENGINE descriptor; an ENGINE (OPERATION_GRAPH, GLOBAL_INDEX) or ENGINECFG
// (ENGINE) descriptor may also be built by hand. Execution is queued on the handle's stream like
// the legacy calls (a stream capture records it), declaring the operands and the workspace to the
// race detector.
typedef void* cudnnBackendDescriptor_t;

typedef enum {
  CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR = 1,
  CUDNN_BACKEND_ENGINE_DESCRIPTOR = 2,
  CUDNN_BACKEND_ENGINECFG_DESCRIPTOR = 3,
  CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR = 4,
  CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR = 5,
  CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR = 10,
  CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR = 11,
  CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR = 12,
  CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR = 15,
  CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR = 16,
  CUDNN_BACKEND_TENSOR_DESCRIPTOR = 17,
} cudnnBackendDescriptorType_t;

typedef enum {
  CUDNN_TYPE_HANDLE = 0,
  CUDNN_TYPE_DATA_TYPE = 1,
  CUDNN_TYPE_BOOLEAN = 2,
  CUDNN_TYPE_INT64 = 3,
  CUDNN_TYPE_FLOAT = 4,
  CUDNN_TYPE_DOUBLE = 5,
  CUDNN_TYPE_VOID_PTR = 6,
  CUDNN_TYPE_CONVOLUTION_MODE = 7,
  CUDNN_TYPE_HEUR_MODE = 8,
  CUDNN_TYPE_NUMERICAL_NOTE = 11,
  CUDNN_TYPE_BACKEND_DESCRIPTOR = 15,
  CUDNN_TYPE_BEHAVIOR_NOTE = 19,
} cudnnBackendAttributeType_t;

typedef enum {
  CUDNN_ATTR_CONVOLUTION_COMP_TYPE = 100,
  CUDNN_ATTR_CONVOLUTION_CONV_MODE = 101,
  CUDNN_ATTR_CONVOLUTION_DILATIONS = 102,
  CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES = 103,
  CUDNN_ATTR_CONVOLUTION_POST_PADDINGS = 104,
  CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS = 105,
  CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS = 106,
  CUDNN_ATTR_ENGINEHEUR_MODE = 200,
  CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH = 201,
  CUDNN_ATTR_ENGINEHEUR_RESULTS = 202,
  CUDNN_ATTR_ENGINECFG_ENGINE = 300,
  CUDNN_ATTR_EXECUTION_PLAN_HANDLE = 400,
  CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG = 401,
  CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE = 402,
  CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA = 700,
  CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA = 701,
  CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC = 702,
  CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W = 703,
  CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X = 704,
  CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y = 705,
  CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA = 706,
  CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA = 707,
  CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC = 708,
  CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W = 709,
  CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX = 710,
  CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY = 711,
  CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA = 712,
  CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA = 713,
  CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC = 714,
  CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW = 715,
  CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X = 716,
  CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY = 717,
  CUDNN_ATTR_OPERATIONGRAPH_HANDLE = 800,
  CUDNN_ATTR_OPERATIONGRAPH_OPS = 801,
  CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT = 900,
  CUDNN_ATTR_TENSOR_DATA_TYPE = 901,
  CUDNN_ATTR_TENSOR_DIMENSIONS = 902,
  CUDNN_ATTR_TENSOR_STRIDES = 903,
  CUDNN_ATTR_TENSOR_UNIQUE_ID = 906,
  CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS = 1000,
  CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS = 1001,
  CUDNN_ATTR_VARIANT_PACK_WORKSPACE = 1003,
  CUDNN_ATTR_ENGINE_OPERATION_GRAPH = 1300,
  CUDNN_ATTR_ENGINE_GLOBAL_INDEX = 1301,
  CUDNN_ATTR_ENGINE_NUMERICAL_NOTE = 1303,
  CUDNN_ATTR_ENGINE_BEHAVIOR_NOTE = 1305,
} cudnnBackendAttributeName_t;

typedef enum {
  CUDNN_NUMERICAL_NOTE_TENSOR_CORE = 0,
  CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS = 1,
  CUDNN_NUMERICAL_NOTE_REDUCED_PRECISION_REDUCTION = 2,
  CUDNN_NUMERICAL_NOTE_FFT = 3,
  CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC = 4,
  CUDNN_NUMERICAL_NOTE_WINOGRAD = 5,
  CUDNN_NUMERICAL_NOTE_TYPE_COUNT = 10,
} cudnnBackendNumericalNote_t;

typedef enum {
  CUDNN_BEHAVIOR_NOTE_RUNTIME_COMPILATION = 0,
  CUDNN_BEHAVIOR_NOTE_TYPE_COUNT = 5,
} cudnnBackendBehaviorNote_t;

typedef enum {
  CUDNN_HEUR_MODE_INSTANT = 0,
  CUDNN_HEUR_MODE_B = 1,
  CUDNN_HEUR_MODE_FALLBACK = 2,
  CUDNN_HEUR_MODE_A = 3,
} cudnnBackendHeurMode_t;

cudnnStatus_t cudnnBackendCreateDescriptor(cudnnBackendDescriptorType_t type,
                                           cudnnBackendDescriptor_t* desc);
cudnnStatus_t cudnnBackendDestroyDescriptor(cudnnBackendDescriptor_t desc);
cudnnStatus_t cudnnBackendFinalize(cudnnBackendDescriptor_t desc);
cudnnStatus_t cudnnBackendSetAttribute(cudnnBackendDescriptor_t desc,
                                       cudnnBackendAttributeName_t name,
                                       cudnnBackendAttributeType_t type, int64_t count,
                                       const void* elements);
cudnnStatus_t cudnnBackendGetAttribute(cudnnBackendDescriptor_t const desc,
                                       cudnnBackendAttributeName_t name,
                                       cudnnBackendAttributeType_t type, int64_t requested,
                                       int64_t* count, void* elements);
cudnnStatus_t cudnnBackendExecute(cudnnHandle_t handle, cudnnBackendDescriptor_t plan,
                                  cudnnBackendDescriptor_t variant_pack);

namespace rg::emu {
// For tests: the cuDNN descriptors created and not yet destroyed, of every kind, and how many
// times a computing function ("cudnnPoolingForward") has been queued so far.
int cudnn_live_descriptors();
int64_t cudnn_calls(std::string_view function);
// Which convolution algorithms the emulated cuDNN offers, from its heuristic (cudnnGet*_v7) and
// its benchmark (cudnnFind*, also counted by cudnn_calls); every algorithm computes the same (the
// CPU convolution). `deterministic` (the default): one deterministic algorithm per pass (forward
// IMPLICIT_GEMM, backward ALGO_1, as real cuDNN flags them). `nondeterministic_first`: algorithm
// 0 marked non-deterministic, ranked and timed before the deterministic algorithm 1.
// `nondeterministic_only`: only algorithm 0, non-deterministic; `..._weight_gradient`: so for the
// weight gradient, the default for the other passes.
enum class CudnnConvAlgorithms {
  deterministic,
  nondeterministic_first,
  nondeterministic_only,
  nondeterministic_only_weight_gradient
};
void cudnn_set_conv_algorithms(CudnnConvAlgorithms offer);
// How many times a convolution pass ("cudnnConvolutionBackwardFilter") was queued with `algo`.
int64_t cudnn_conv_algo_calls(std::string_view function, int algo);
// The engines the emulated graph API's heuristics offer. Every engine computes with the CPU
// convolution; they differ in their numerical notes and workspace, as real engines do:
//   engine 0: CUDNN_NUMERICAL_NOTE_TENSOR_CORE (f32 data runs in TF32), deterministic, no workspace
//   engine 1: CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC, 1024 bytes of workspace
//   engine 2: no note (FMA: f32 without TF32), deterministic, 256 bytes of workspace
//   engine 3: an engine whose execution plan cannot be finalized (CUDNN_STATUS_NOT_SUPPORTED)
//   engine 4: deterministic, no workspace, its plan finalizes but every cudnnBackendExecute of it
//             returns CUDNN_STATUS_EXECUTION_FAILED (queues nothing, counts in no count)
// `standard` (the default): modes A and B offer 0, 2; the fallback mode 2.
// `nondeterministic_first`: A and B offer 1, 0, 2. `unsupported_first`: A and B offer 3, 0, 2.
// `unrunnable_first`: A and B offer 4, 0, 2. `nondeterministic_only`: A and B offer 1.
// `fallback_only`: A and B offer nothing, the fallback mode 2. `none`: no mode offers anything.
// The fallback mode offers 2 in every offer but `none`; CUDNN_HEUR_MODE_INSTANT offers what mode A
// does. Every engine runs f16, bf16, f32 and f64, NCHW and NHWC. An offer holds for the heuristics
// finalized after it is set.
enum class CudnnGraphEngines {
  standard,
  nondeterministic_first,
  unsupported_first,
  unrunnable_first,
  nondeterministic_only,
  fallback_only,
  none
};
void cudnn_set_graph_engines(CudnnGraphEngines offer);
// How many passes engine `global_index` has been given (counted when cudnnBackendExecute queues
// one, as cudnn_calls counts: a replayed CUDA graph does not add to it; each also counts in
// cudnn_calls("cudnnBackendExecute"), and in no legacy call's count); heuristics queries by mode
// (each successful cudnnBackendFinalize of an ENGINEHEUR descriptor counts as
// cudnn_calls("heuristics mode A") / "... mode B" / "... mode fallback"; INSTANT counts as A).
int64_t cudnn_engine_executions(int64_t global_index);
// How many backend descriptors of `type` have been created so far (cudnnBackendCreateDescriptor);
// they also count in cudnn_live_descriptors until destroyed.
int64_t cudnn_backend_created(cudnnBackendDescriptorType_t type);
// RG_CUDA_CHECK for cuDNN statuses under emulation (kernels/cuda/check.h).
void check_status(cudnnStatus_t status, const char* call, const char* file, int line);
}  // namespace rg::emu
