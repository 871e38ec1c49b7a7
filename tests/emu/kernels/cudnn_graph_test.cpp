// The emulated cuDNN graph (backend) API (kernels/emu/cudnn_backend.cpp), called directly: each
// convolution pass against the legacy API's (bit for bit, with and without TF32, in every data
// type, NHWC as NCHW), the heuristics' engines for each offer (emu::cudnn_set_graph_engines) and
// mode, the plans that cannot be built, workspaces, the checks of descriptors and executions, the
// descriptor counts, capture, and what the race detector sees. conv2d.cu's use of the API is
// tested through the engine (tests/device/cudnn_graph_device_test.cpp).
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <map>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "emu/kernels/kernel_test_util.h"
#include "kernels/conv2d.h"
#include "kernels/emu/device_runtime.h"
#include "kernels/emu/shim/cudnn.h"
#include "kernels/error.h"
#include "kernels/half.h"

namespace rg::emu_kernel_test {
namespace {

using Dims = std::array<int64_t, 4>;
constexpr cudnnStatus_t kOk = CUDNN_STATUS_SUCCESS, kBadParam = CUDNN_STATUS_BAD_PARAM,
                        kNotSupported = CUDNN_STATUS_NOT_SUPPORTED;
// The operands' unique ids: x (or dx), w (or dw), y (or dy).
constexpr int64_t kUidX = 1, kUidW = 2, kUidY = 3;

// Owns one backend descriptor.
class Desc {
 public:
  explicit Desc(cudnnBackendDescriptorType_t type) {
    EXPECT_EQ(cudnnBackendCreateDescriptor(type, &d_), kOk);
  }
  ~Desc() { reset(); }
  Desc(Desc&& other) noexcept : d_(std::exchange(other.d_, nullptr)) {}
  Desc& operator=(Desc&& other) noexcept {
    std::swap(d_, other.d_);
    return *this;
  }
  Desc(const Desc&) = delete;
  Desc& operator=(const Desc&) = delete;

  cudnnBackendDescriptor_t get() const { return d_; }
  template <class V>
  cudnnStatus_t set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type,
                    const V* values, int64_t count = 1) {
    return cudnnBackendSetAttribute(d_, name, type, count, values);
  }
  cudnnStatus_t set_desc(cudnnBackendAttributeName_t name, const Desc& value) {
    const cudnnBackendDescriptor_t v = value.get();
    return set(name, CUDNN_TYPE_BACKEND_DESCRIPTOR, &v);
  }
  cudnnStatus_t finalize() { return cudnnBackendFinalize(d_); }
  // Destroys it now.
  void reset() {
    if (d_ != nullptr) {
      EXPECT_EQ(cudnnBackendDestroyDescriptor(std::exchange(d_, nullptr)), kOk);
    }
  }

 private:
  cudnnBackendDescriptor_t d_ = nullptr;
};

// N=2, C=3, 5x5 images, K=4 3x3 filters, padding 1 by default.
struct Shape {
  int64_t n = 2, c = 3, h = 5, w = 5, k = 4, kh = 3, kw = 3, stride = 1, pad = 1, dilation = 1;
  int64_t ho() const { return (h + 2 * pad - dilation * (kh - 1) - 1) / stride + 1; }
  int64_t wo() const { return (w + 2 * pad - dilation * (kw - 1) - 1) / stride + 1; }
  Dims x_dims() const { return {n, c, h, w}; }
  Dims w_dims() const { return {k, c, kh, kw}; }
  Dims y_dims() const { return {n, k, ho(), wo()}; }
};

Shape shape(int64_t stride, int64_t dilation) {
  Shape s;
  s.stride = stride;
  s.dilation = dilation;
  return s;
}

int64_t count(const Dims& d) { return d[0] * d[1] * d[2] * d[3]; }

enum class Op { forward, data, filter };
const Op kOps[] = {Op::forward, Op::data, Op::filter};

const char* op_name(Op op) {
  return op == Op::forward ? "forward" : op == Op::data ? "backward data" : "backward filter";
}

cudnnBackendDescriptorType_t op_type(Op op) {
  return op == Op::forward ? CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR
         : op == Op::data  ? CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR
                           : CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR;
}

struct OpAttrs {
  cudnnBackendAttributeName_t alpha, beta, conv, x, w, y;
};
OpAttrs op_attrs(Op op) {
  switch (op) {
    case Op::forward:
      return {CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA,
              CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA,
              CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC,
              CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X,
              CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W,
              CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y};
    case Op::data:
      return {CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA,
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA,
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC,
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX,
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W,
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY};
    case Op::filter:
      break;
  }
  return {CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA,
          CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA,
          CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC,
          CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X,
          CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW,
          CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY};
}

// The strides of a packed tensor of dims (in NCHW order) laid out NCHW or NHWC.
Dims strides(const Dims& d, bool nhwc) {
  return nhwc ? Dims{d[1] * d[2] * d[3], 1, d[3] * d[1], d[1]}
              : Dims{d[1] * d[2] * d[3], d[2] * d[3], d[3], 1};
}

// A tensor descriptor with every attribute set, not finalized.
Desc unfinalized_tensor(int64_t uid, cudnnDataType_t type, const Dims& dims, bool nhwc = false,
                        int64_t alignment = 16) {
  Desc t(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
  const Dims s = strides(dims, nhwc);
  EXPECT_EQ(t.set(CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, &type), kOk);
  EXPECT_EQ(t.set(CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, dims.data(), 4), kOk);
  EXPECT_EQ(t.set(CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, s.data(), 4), kOk);
  EXPECT_EQ(t.set(CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, &uid), kOk);
  EXPECT_EQ(t.set(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, &alignment), kOk);
  return t;
}

Desc tensor(int64_t uid, cudnnDataType_t type, const Dims& dims, bool nhwc = false) {
  Desc t = unfinalized_tensor(uid, type, dims, nhwc);
  EXPECT_EQ(t.finalize(), kOk);
  return t;
}

// A convolution descriptor of s with every attribute set (post paddings `post`), not finalized.
Desc unfinalized_convolution(const Shape& s, cudnnDataType_t compute, int64_t post = -1) {
  Desc c(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR);
  const cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
  const int64_t spatial = 2;
  const std::array<int64_t, 2> pad{s.pad, s.pad}, stride{s.stride, s.stride},
      dilation{s.dilation, s.dilation}, post_pad{post < 0 ? s.pad : post, s.pad};
  EXPECT_EQ(c.set(CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, &compute), kOk);
  EXPECT_EQ(c.set(CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, &mode), kOk);
  EXPECT_EQ(c.set(CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, CUDNN_TYPE_INT64, &spatial), kOk);
  EXPECT_EQ(c.set(CUDNN_ATTR_CONVOLUTION_DILATIONS, CUDNN_TYPE_INT64, dilation.data(), 2), kOk);
  EXPECT_EQ(c.set(CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, CUDNN_TYPE_INT64, stride.data(), 2), kOk);
  EXPECT_EQ(c.set(CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, CUDNN_TYPE_INT64, pad.data(), 2), kOk);
  EXPECT_EQ(c.set(CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, CUDNN_TYPE_INT64, post_pad.data(), 2), kOk);
  return c;
}

cudnnDataType_t compute_type(cudnnDataType_t type) {
  return type == CUDNN_DATA_DOUBLE ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT;
}

// One operation graph's description.
struct Spec {
  Op op = Op::forward;
  Shape shape;
  cudnnDataType_t type = CUDNN_DATA_FLOAT;
  bool nhwc = false;
  double alpha = 1, beta = 0;
};

// Sets alpha and beta, as double for f64 compute and float otherwise, as cuDNN wants them.
void set_scales(Desc& op, const Spec& sp) {
  const OpAttrs a = op_attrs(sp.op);
  if (sp.type == CUDNN_DATA_DOUBLE) {
    EXPECT_EQ(op.set(a.alpha, CUDNN_TYPE_DOUBLE, &sp.alpha), kOk);
    EXPECT_EQ(op.set(a.beta, CUDNN_TYPE_DOUBLE, &sp.beta), kOk);
  } else {
    const float alpha = float(sp.alpha), beta = float(sp.beta);
    EXPECT_EQ(op.set(a.alpha, CUDNN_TYPE_FLOAT, &alpha), kOk);
    EXPECT_EQ(op.set(a.beta, CUDNN_TYPE_FLOAT, &beta), kOk);
  }
}

// The finalized convolution operation of sp. The tensor and convolution descriptors it was made
// of are destroyed on return: the operation keeps their values.
Desc operation(const Spec& sp) {
  const Shape& s = sp.shape;
  const Desc x = tensor(kUidX, sp.type, s.x_dims(), sp.nhwc);
  const Desc w = tensor(kUidW, sp.type, s.w_dims(), sp.nhwc);
  const Desc y = tensor(kUidY, sp.type, s.y_dims(), sp.nhwc);
  Desc conv = unfinalized_convolution(s, compute_type(sp.type));
  EXPECT_EQ(conv.finalize(), kOk);
  Desc op(op_type(sp.op));
  const OpAttrs a = op_attrs(sp.op);
  EXPECT_EQ(op.set_desc(a.x, x), kOk);
  EXPECT_EQ(op.set_desc(a.w, w), kOk);
  EXPECT_EQ(op.set_desc(a.y, y), kOk);
  EXPECT_EQ(op.set_desc(a.conv, conv), kOk);
  set_scales(op, sp);
  EXPECT_EQ(op.finalize(), kOk);
  return op;
}

Desc graph(cudnnHandle_t h, const Desc& op) {
  Desc g(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
  EXPECT_EQ(g.set_desc(CUDNN_ATTR_OPERATIONGRAPH_OPS, op), kOk);
  EXPECT_EQ(g.set(CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, &h), kOk);
  EXPECT_EQ(g.finalize(), kOk);
  return g;
}

// The engine configurations the heuristics give for `graph` in `mode`, best first (their
// heuristics descriptor destroyed on return).
std::vector<Desc> engine_configs(const Desc& graph, cudnnBackendHeurMode_t mode) {
  Desc heur(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
  EXPECT_EQ(heur.set_desc(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph), kOk);
  EXPECT_EQ(heur.set(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, &mode), kOk);
  EXPECT_EQ(heur.finalize(), kOk);
  int64_t available = -1;
  EXPECT_EQ(cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                     CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &available, nullptr),
            kOk);
  std::vector<Desc> configs;
  std::vector<cudnnBackendDescriptor_t> raw;
  for (int64_t i = 0; i < available; ++i) {
    configs.emplace_back(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
    raw.push_back(configs.back().get());
  }
  if (available == 0) return configs;
  int64_t got = -1;
  EXPECT_EQ(cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                     CUDNN_TYPE_BACKEND_DESCRIPTOR, available, &got, raw.data()),
            kOk);
  EXPECT_EQ(got, available);
  return configs;
}

// The engine of a configuration.
Desc engine_of(const Desc& config) {
  Desc engine(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
  cudnnBackendDescriptor_t raw = engine.get();
  int64_t n = -1;
  EXPECT_EQ(cudnnBackendGetAttribute(config.get(), CUDNN_ATTR_ENGINECFG_ENGINE,
                                     CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n, &raw),
            kOk);
  EXPECT_EQ(n, 1);
  return engine;
}

int64_t global_index(const Desc& engine) {
  int64_t index = -1, n = -1;
  EXPECT_EQ(cudnnBackendGetAttribute(engine.get(), CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64,
                                     1, &n, &index),
            kOk);
  EXPECT_EQ(n, 1);
  return index;
}

int64_t engine_index(const Desc& config) { return global_index(engine_of(config)); }

std::vector<int64_t> engine_indices(const std::vector<Desc>& configs) {
  std::vector<int64_t> out;
  for (const Desc& c : configs) out.push_back(engine_index(c));
  return out;
}

// A configuration of engine `index` for `graph`, built by hand.
Desc config_of_engine(const Desc& graph, int64_t index) {
  Desc engine(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
  EXPECT_EQ(engine.set_desc(CUDNN_ATTR_ENGINE_OPERATION_GRAPH, graph), kOk);
  EXPECT_EQ(engine.set(CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, &index), kOk);
  EXPECT_EQ(engine.finalize(), kOk);
  Desc config(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
  EXPECT_EQ(config.set_desc(CUDNN_ATTR_ENGINECFG_ENGINE, engine), kOk);
  EXPECT_EQ(config.finalize(), kOk);
  return config;
}

// An execution plan of `config`, not finalized.
Desc plan_of(cudnnHandle_t h, const Desc& config) {
  Desc plan(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
  EXPECT_EQ(plan.set(CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, &h), kOk);
  EXPECT_EQ(plan.set_desc(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, config), kOk);
  return plan;
}

Desc finalized_plan(cudnnHandle_t h, const Desc& config) {
  Desc plan = plan_of(h, config);
  EXPECT_EQ(plan.finalize(), kOk);
  return plan;
}

int64_t workspace_of(const Desc& plan) {
  int64_t bytes = -1, n = -1;
  EXPECT_EQ(cudnnBackendGetAttribute(plan.get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                     CUDNN_TYPE_INT64, 1, &n, &bytes),
            kOk);
  EXPECT_EQ(n, 1);
  return bytes;
}

Desc variant_pack(const std::vector<int64_t>& uids, const std::vector<void*>& pointers,
                  void* workspace) {
  Desc pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  EXPECT_EQ(pack.set(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, uids.data(),
                     int64_t(uids.size())),
            kOk);
  EXPECT_EQ(pack.set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, pointers.data(),
                     int64_t(pointers.size())),
            kOk);
  EXPECT_EQ(pack.set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, &workspace), kOk);
  EXPECT_EQ(pack.finalize(), kOk);
  return pack;
}

cudnnStatus_t execute(cudnnHandle_t h, const Desc& plan, const std::vector<int64_t>& uids,
                      const std::vector<void*>& pointers, void* workspace) {
  const Desc pack = variant_pack(uids, pointers, workspace);
  return cudnnBackendExecute(h, plan.get(), pack.get());
}

// A pass's three operands in storage type T (NCHW unless the test transposes them).
template <class T>
struct Operands {
  std::vector<T> x, w, y;
  std::vector<T>& out(Op op) { return op == Op::forward ? y : op == Op::data ? x : w; }
};

// Random operands of sp's shapes; the output of sp's pass filled with `fill`, so that a pass that
// writes nothing shows.
template <class T>
Operands<T> operands(const Spec& sp, uint64_t seed, float fill) {
  const Shape& s = sp.shape;
  Operands<T> o{random_values<T>(count(s.x_dims()), seed),
                random_values<T>(count(s.w_dims()), seed + 1),
                random_values<T>(count(s.y_dims()), seed + 2)};
  std::vector<T>& out = o.out(sp.op);
  std::fill(out.begin(), out.end(), kernels::cpu::convert<T>(fill));
  return o;
}

// Runs `plan` on o (uids 1, 2, 3: x, w, y) with a workspace of the plan's size.
template <class T>
cudnnStatus_t run(cudnnHandle_t h, const Desc& plan, Operands<T>& o) {
  std::vector<unsigned char> workspace(size_t(std::max<int64_t>(workspace_of(plan), 1)));
  return execute(h, plan, {kUidX, kUidW, kUidY}, {o.x.data(), o.w.data(), o.y.data()},
                 workspace.data());
}

// The same pass through the legacy API with math type `math`.
template <class T>
void run_legacy(cudnnHandle_t h, const Spec& sp, cudnnMathType_t math, Operands<T>& o) {
  const Shape& s = sp.shape;
  cudnnTensorDescriptor_t xd = nullptr, yd = nullptr;
  cudnnFilterDescriptor_t wd = nullptr;
  cudnnConvolutionDescriptor_t cd = nullptr;
  ASSERT_EQ(cudnnCreateTensorDescriptor(&xd), kOk);
  ASSERT_EQ(cudnnCreateTensorDescriptor(&yd), kOk);
  ASSERT_EQ(cudnnCreateFilterDescriptor(&wd), kOk);
  ASSERT_EQ(cudnnCreateConvolutionDescriptor(&cd), kOk);
  EXPECT_EQ(cudnnSetTensor4dDescriptor(xd, CUDNN_TENSOR_NCHW, sp.type, int(s.n), int(s.c), int(s.h),
                                       int(s.w)),
            kOk);
  EXPECT_EQ(cudnnSetTensor4dDescriptor(yd, CUDNN_TENSOR_NCHW, sp.type, int(s.n), int(s.k),
                                       int(s.ho()), int(s.wo())),
            kOk);
  EXPECT_EQ(cudnnSetFilter4dDescriptor(wd, sp.type, CUDNN_TENSOR_NCHW, int(s.k), int(s.c),
                                       int(s.kh), int(s.kw)),
            kOk);
  EXPECT_EQ(cudnnSetConvolution2dDescriptor(cd, int(s.pad), int(s.pad), int(s.stride),
                                            int(s.stride), int(s.dilation), int(s.dilation),
                                            CUDNN_CROSS_CORRELATION, compute_type(sp.type)),
            kOk);
  EXPECT_EQ(cudnnSetConvolutionMathType(cd, math), kOk);
  const double alpha64 = 1, beta64 = 0;
  const float alpha32 = 1, beta32 = 0;
  const bool f64 = sp.type == CUDNN_DATA_DOUBLE;
  const void* alpha = f64 ? static_cast<const void*>(&alpha64) : &alpha32;
  const void* beta = f64 ? static_cast<const void*>(&beta64) : &beta32;
  switch (sp.op) {
    case Op::forward:
      EXPECT_EQ(cudnnConvolutionForward(h, alpha, xd, o.x.data(), wd, o.w.data(), cd,
                                        CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, nullptr, 0, beta,
                                        yd, o.y.data()),
                kOk);
      break;
    case Op::data:
      EXPECT_EQ(cudnnConvolutionBackwardData(h, alpha, wd, o.w.data(), yd, o.y.data(), cd,
                                             CUDNN_CONVOLUTION_BWD_DATA_ALGO_1, nullptr, 0, beta,
                                             xd, o.x.data()),
                kOk);
      break;
    case Op::filter:
      EXPECT_EQ(cudnnConvolutionBackwardFilter(h, alpha, xd, o.x.data(), yd, o.y.data(), cd,
                                               CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1, nullptr, 0,
                                               beta, wd, o.w.data()),
                kOk);
      break;
  }
  EXPECT_EQ(cudnnDestroyTensorDescriptor(xd), kOk);
  EXPECT_EQ(cudnnDestroyTensorDescriptor(yd), kOk);
  EXPECT_EQ(cudnnDestroyFilterDescriptor(wd), kOk);
  EXPECT_EQ(cudnnDestroyConvolutionDescriptor(cd), kOk);
}

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// v (dims in NCHW order) laid out NHWC, and back.
template <class T>
std::vector<T> relayout(const std::vector<T>& v, const Dims& d, bool to_nhwc) {
  std::vector<T> out(v.size());
  size_t nchw = 0;
  for (int64_t n = 0; n < d[0]; ++n) {
    for (int64_t c = 0; c < d[1]; ++c) {
      for (int64_t h = 0; h < d[2]; ++h) {
        for (int64_t w = 0; w < d[3]; ++w, ++nchw) {
          const size_t nhwc = size_t(((n * d[2] + h) * d[3] + w) * d[1] + c);
          if (to_nhwc) {
            out[nhwc] = v[nchw];
          } else {
            out[nchw] = v[nhwc];
          }
        }
      }
    }
  }
  return out;
}

// The pass in f64 on the CPU, from o's inputs (NCHW).
template <class T>
std::vector<double> cpu_reference(const Spec& sp, const Operands<T>& o) {
  const Shape& s = sp.shape;
  const kernels::Conv2dGeometry g{s.n,   s.c,        s.h,        s.w,      s.k,
                                  s.kh,  s.kw,       s.stride,   s.stride, s.pad,
                                  s.pad, s.dilation, s.dilation, s.ho(),   s.wo()};
  const auto wide = [](const std::vector<T>& v) {
    std::vector<double> d(v.size());
    for (size_t i = 0; i < v.size(); ++i) d[i] = as_double(v[i]);
    return d;
  };
  std::vector<double> x = wide(o.x), w = wide(o.w), y = wide(o.y);
  using Cpu = kernels::Conv2d<kernels::Cpu>;
  switch (sp.op) {
    case Op::forward:
      Cpu::forward<double>(g, x.data(), w.data(), nullptr, y.data(), false, {}, {});
      return y;
    case Op::data:
      Cpu::backward<double>(g, nullptr, w.data(), y.data(), x.data(), nullptr, nullptr, false, {},
                            {});
      return x;
    case Op::filter:
      break;
  }
  Cpu::backward<double>(g, x.data(), nullptr, y.data(), nullptr, w.data(), nullptr, false, {}, {});
  return w;
}

// The graph API's pass on engine `engine` (chosen through the heuristics' mode A list) and the
// legacy API's with `math`, from the same operands: their outputs. The graph's is also checked
// against the CPU's in f64, within `tolerance` (absolute and relative).
template <class T>
std::pair<std::vector<T>, std::vector<T>> graph_and_legacy(cudnnHandle_t h, const Spec& sp,
                                                           int64_t engine, cudnnMathType_t math,
                                                           uint64_t seed, double tolerance) {
  const Desc op = operation(sp);
  const Desc g = graph(h, op);
  const std::vector<Desc> configs = engine_configs(g, CUDNN_HEUR_MODE_A);
  const std::vector<int64_t> engines = engine_indices(configs);
  const auto at = std::find(engines.begin(), engines.end(), engine);
  EXPECT_NE(at, engines.end()) << "engine " << engine << " is not offered";
  if (at == engines.end()) return {};
  const Desc plan = finalized_plan(h, configs[size_t(at - engines.begin())]);
  Operands<T> by_graph = operands<T>(sp, seed, 7.f), by_legacy = operands<T>(sp, seed, -3.f);
  EXPECT_EQ(run(h, plan, by_graph), kOk);
  run_legacy(h, sp, math, by_legacy);
  expect_close(by_graph.out(sp.op), cpu_reference(sp, by_graph), tolerance, tolerance,
               "engine " + std::to_string(engine) + " vs the CPU");
  return {by_graph.out(sp.op), by_legacy.out(sp.op)};
}

class CudnnGraphApi : public ::testing::Test {
 protected:
  void SetUp() override {
    live_before_ = emu::cudnn_live_descriptors();
    ASSERT_EQ(cudnnCreate(&handle_), kOk);
  }
  void TearDown() override {
    EXPECT_EQ(cudnnDestroy(handle_), kOk);
    emu::cudnn_set_graph_engines(emu::CudnnGraphEngines::standard);
    EXPECT_EQ(emu::cudnn_live_descriptors(), live_before_) << "a descriptor was not destroyed";
  }
  cudnnHandle_t handle_ = nullptr;
  int live_before_ = 0;
};

// Engine 0 (tensor cores) computes f32 in TF32 as the legacy default math does; engine 2 (FMA) in
// full f32 as CUDNN_FMA_MATH does; each execution counts for its engine and as
// "cudnnBackendExecute", not as a legacy call.
TEST_F(CudnnGraphApi, EachPassMatchesTheLegacyApiBitForBitWithAndWithoutTf32) {
  uint64_t seed = 10;
  for (const Op op : kOps) {
    for (const int64_t stride : {1, 2}) {
      for (const int64_t dilation : {1, 2}) {
        SCOPED_TRACE(std::string(op_name(op)) + ", stride " + std::to_string(stride) +
                     ", dilation " + std::to_string(dilation));
        const Spec sp{op, shape(stride, dilation)};
        const int64_t engine0 = emu::cudnn_engine_executions(0),
                      engine2 = emu::cudnn_engine_executions(2),
                      calls = emu::cudnn_calls("cudnnBackendExecute"),
                      forward = emu::cudnn_calls("cudnnConvolutionForward");
        const auto [tf32, tf32_legacy] =
            graph_and_legacy<float>(handle_, sp, 0, CUDNN_DEFAULT_MATH, seed, 2e-2);
        EXPECT_EQ(emu::cudnn_engine_executions(0), engine0 + 1);
        EXPECT_EQ(emu::cudnn_engine_executions(2), engine2);
        const auto [fma, fma_legacy] =
            graph_and_legacy<float>(handle_, sp, 2, CUDNN_FMA_MATH, seed, 1e-5);
        EXPECT_EQ(emu::cudnn_engine_executions(2), engine2 + 1);
        EXPECT_EQ(emu::cudnn_calls("cudnnBackendExecute"), calls + 2);
        EXPECT_EQ(emu::cudnn_calls("cudnnConvolutionForward"),
                  forward + (op == Op::forward ? 2 : 0))
            << "only the legacy references count as legacy calls";
        EXPECT_TRUE(same_bits(tf32, tf32_legacy)) << "engine 0 vs CUDNN_DEFAULT_MATH";
        EXPECT_TRUE(same_bits(fma, fma_legacy)) << "engine 2 vs CUDNN_FMA_MATH";
        EXPECT_FALSE(same_bits(tf32, fma)) << "TF32 rounds engine 0's inputs";
        ++seed;
      }
    }
  }
}

template <class T>
void expect_like_legacy(cudnnHandle_t h, cudnnDataType_t type, uint64_t seed) {
  const double tolerance = std::is_same_v<T, double> ? 1e-12 : default_rtol<T>();
  for (const Op op : kOps) {
    for (const int64_t stride : {1, 2}) {
      SCOPED_TRACE(std::string(op_name(op)) + ", stride " + std::to_string(stride));
      Spec sp{op, shape(stride, 1)};
      sp.type = type;
      for (const int64_t engine : {0, 2}) {
        const auto [by_graph, by_legacy] =
            graph_and_legacy<T>(h, sp, engine, CUDNN_DEFAULT_MATH, seed, tolerance);
        EXPECT_TRUE(same_bits(by_graph, by_legacy)) << "engine " << engine;
      }
    }
  }
}

// f64 (with double alpha and beta) computes in f64, f16 and bf16 in f32 rounded once, on every
// engine (TF32 is for f32 data only), as the legacy API does.
TEST_F(CudnnGraphApi, F64F16AndBf16MatchTheLegacyApiOnEveryEngine) {
  {
    SCOPED_TRACE("f64");
    expect_like_legacy<double>(handle_, CUDNN_DATA_DOUBLE, 40);
  }
  {
    SCOPED_TRACE("f16");
    expect_like_legacy<Half>(handle_, CUDNN_DATA_HALF, 50);
  }
  {
    SCOPED_TRACE("bf16");
    expect_like_legacy<BFloat16>(handle_, CUDNN_DATA_BFLOAT16, 60);
  }
}

// NHWC strides on all three tensors (dimensions still in NCHW order): the NCHW pass's values,
// transposed; tensors of both layouts in one operation are refused.
TEST_F(CudnnGraphApi, NhwcOperandsGiveTheNchwResultTransposed) {
  uint64_t seed = 70;
  for (const Op op : kOps) {
    for (const int64_t stride : {1, 2}) {
      for (const int64_t engine : {0, 2}) {
        SCOPED_TRACE(std::string(op_name(op)) + ", stride " + std::to_string(stride) + ", engine " +
                     std::to_string(engine));
        Spec sp{op, shape(stride, 1)};
        const Shape& s = sp.shape;
        const Desc nchw_op = operation(sp);
        const Desc nchw_graph = graph(handle_, nchw_op);
        sp.nhwc = true;
        const Desc nhwc_op = operation(sp);
        const Desc nhwc_graph = graph(handle_, nhwc_op);
        EXPECT_EQ(engine_indices(engine_configs(nhwc_graph, CUDNN_HEUR_MODE_A)),
                  (std::vector<int64_t>{0, 2}));
        Operands<float> nchw = operands<float>(sp, seed++, 7.f);
        Operands<float> nhwc{relayout(nchw.x, s.x_dims(), true), relayout(nchw.w, s.w_dims(), true),
                             relayout(nchw.y, s.y_dims(), true)};
        ASSERT_EQ(run(handle_, finalized_plan(handle_, config_of_engine(nchw_graph, engine)), nchw),
                  kOk);
        ASSERT_EQ(run(handle_, finalized_plan(handle_, config_of_engine(nhwc_graph, engine)), nhwc),
                  kOk);
        const Dims out_dims = op == Op::forward ? s.y_dims()
                              : op == Op::data  ? s.x_dims()
                                                : s.w_dims();
        EXPECT_FALSE(same_bits(nhwc.out(op), nchw.out(op))) << "the layouts differ";
        EXPECT_TRUE(same_bits(relayout(nhwc.out(op), out_dims, false), nchw.out(op)));
      }
    }
  }
  // x NHWC, w and y NCHW.
  const Shape s;
  const Desc x = tensor(kUidX, CUDNN_DATA_FLOAT, s.x_dims(), /*nhwc=*/true);
  const Desc w = tensor(kUidW, CUDNN_DATA_FLOAT, s.w_dims());
  const Desc y = tensor(kUidY, CUDNN_DATA_FLOAT, s.y_dims());
  Desc conv = unfinalized_convolution(s, CUDNN_DATA_FLOAT);
  ASSERT_EQ(conv.finalize(), kOk);
  Desc mixed(op_type(Op::forward));
  const OpAttrs a = op_attrs(Op::forward);
  EXPECT_EQ(mixed.set_desc(a.x, x), kOk);
  EXPECT_EQ(mixed.set_desc(a.w, w), kOk);
  EXPECT_EQ(mixed.set_desc(a.y, y), kOk);
  EXPECT_EQ(mixed.set_desc(a.conv, conv), kOk);
  set_scales(mixed, Spec{});
  EXPECT_EQ(mixed.finalize(), kBadParam);
}

// Each offer's lists in each mode (INSTANT is mode A's list), each query counted by mode, and the
// engines' notes.
TEST_F(CudnnGraphApi, TheHeuristicsListTheOfferedEnginesInEachMode) {
  using E = emu::CudnnGraphEngines;
  using List = std::vector<int64_t>;
  struct Case {
    E offer;
    const char* name;
    List a, fallback;  // mode B offers what A does
  };
  const Case cases[] = {{E::standard, "standard", {0, 2}, {2}},
                        {E::nondeterministic_first, "nondeterministic_first", {1, 0, 2}, {2}},
                        {E::unsupported_first, "unsupported_first", {3, 0, 2}, {2}},
                        {E::unrunnable_first, "unrunnable_first", {4, 0, 2}, {2}},
                        {E::nondeterministic_only, "nondeterministic_only", {1}, {2}},
                        {E::fallback_only, "fallback_only", {}, {2}},
                        {E::none, "none", {}, {}}};
  for (const Op op : kOps) {
    const Desc o = operation(Spec{op, Shape{}});
    const Desc g = graph(handle_, o);
    for (const Case& c : cases) {
      SCOPED_TRACE(std::string(op_name(op)) + ", offer " + c.name);
      emu::cudnn_set_graph_engines(c.offer);
      const std::pair<cudnnBackendHeurMode_t, const char*> modes[] = {
          {CUDNN_HEUR_MODE_A, "A"},
          {CUDNN_HEUR_MODE_B, "B"},
          {CUDNN_HEUR_MODE_FALLBACK, "fallback"},
          {CUDNN_HEUR_MODE_INSTANT, "A"}};
      for (const auto& [mode, counted_as] : modes) {
        SCOPED_TRACE(std::string("mode ") + std::to_string(int(mode)));
        const std::string call = std::string("heuristics mode ") + counted_as;
        const int64_t before = emu::cudnn_calls(call);
        EXPECT_EQ(engine_indices(engine_configs(g, mode)),
                  mode == CUDNN_HEUR_MODE_FALLBACK ? c.fallback : c.a);
        EXPECT_EQ(emu::cudnn_calls(call), before + 1);
      }
    }
  }
  // The notes: engine 0 tensor cores, 1 non-deterministic, 2, 3 and 4 none; no behavior notes.
  emu::cudnn_set_graph_engines(E::unsupported_first);
  const Desc o = operation(Spec{});
  const Desc g = graph(handle_, o);
  const std::map<int64_t, std::vector<cudnnBackendNumericalNote_t>> want{
      {0, {CUDNN_NUMERICAL_NOTE_TENSOR_CORE}},
      {1, {CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC}},
      {2, {}},
      {3, {}},
      {4, {}}};
  for (const auto& [index, notes] : want) {
    SCOPED_TRACE("engine " + std::to_string(index));
    const Desc engine = engine_of(config_of_engine(g, index));
    EXPECT_EQ(global_index(engine), index);
    std::array<cudnnBackendNumericalNote_t, CUDNN_NUMERICAL_NOTE_TYPE_COUNT> got{};
    int64_t n = -1;
    EXPECT_EQ(
        cudnnBackendGetAttribute(engine.get(), CUDNN_ATTR_ENGINE_NUMERICAL_NOTE,
                                 CUDNN_TYPE_NUMERICAL_NOTE, int64_t(got.size()), &n, got.data()),
        kOk);
    ASSERT_EQ(n, int64_t(notes.size()));
    EXPECT_TRUE(std::equal(notes.begin(), notes.end(), got.begin()));
    std::array<cudnnBackendBehaviorNote_t, CUDNN_BEHAVIOR_NOTE_TYPE_COUNT> behavior{};
    EXPECT_EQ(cudnnBackendGetAttribute(engine.get(), CUDNN_ATTR_ENGINE_BEHAVIOR_NOTE,
                                       CUDNN_TYPE_BEHAVIOR_NOTE, int64_t(behavior.size()), &n,
                                       behavior.data()),
              kOk);
    EXPECT_EQ(n, 0);
  }
}

// Asked for fewer results than there are, the heuristics fill that many configurations; asked for
// none, they say how many there are; only engine configurations can be filled.
TEST_F(CudnnGraphApi, TheHeuristicsFillAsManyConfigurationsAsAskedFor) {
  emu::cudnn_set_graph_engines(emu::CudnnGraphEngines::nondeterministic_first);
  const Desc o = operation(Spec{});
  const Desc g = graph(handle_, o);
  Desc heur(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
  ASSERT_EQ(heur.set_desc(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, g), kOk);
  const cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_B;
  ASSERT_EQ(heur.set(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, &mode), kOk);
  int64_t n = -1;
  cudnnBackendDescriptor_t raw[3] = {};
  EXPECT_EQ(cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                     CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &n, nullptr),
            kBadParam)
      << "not finalized yet";
  ASSERT_EQ(heur.finalize(), kOk);
  EXPECT_EQ(cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                     CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &n, nullptr),
            kOk);
  EXPECT_EQ(n, 3);
  std::vector<Desc> configs;
  for (int i = 0; i < 3; ++i) {
    configs.emplace_back(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
    raw[i] = configs.back().get();
  }
  EXPECT_EQ(cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                     CUDNN_TYPE_BACKEND_DESCRIPTOR, 2, &n, raw),
            kOk);
  EXPECT_EQ(n, 2);
  EXPECT_EQ(engine_index(configs[0]), 1);
  EXPECT_EQ(engine_index(configs[1]), 0);
  Desc engine(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
  cudnnBackendDescriptor_t raw_engine = engine.get();
  EXPECT_EQ(cudnnBackendGetAttribute(configs[2].get(), CUDNN_ATTR_ENGINECFG_ENGINE,
                                     CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n, &raw_engine),
            kBadParam)
      << "the third configuration was not filled";
  // A tensor descriptor where an engine configuration belongs.
  const Desc t = tensor(kUidX, CUDNN_DATA_FLOAT, Shape{}.x_dims());
  raw[0] = t.get();
  EXPECT_EQ(cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                     CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n, raw),
            kBadParam);
}

// Engine 3's plan cannot be finalized, nor any plan of an operation with alpha != 1 or
// beta != 0 (the operation itself finalizes, and the heuristics offer engines for it).
TEST_F(CudnnGraphApi, PlansOfEngine3OrOfScaledOperationsCannotBeFinalized) {
  emu::cudnn_set_graph_engines(emu::CudnnGraphEngines::unsupported_first);
  {
    const Desc o = operation(Spec{});
    const Desc g = graph(handle_, o);
    const std::vector<Desc> configs = engine_configs(g, CUDNN_HEUR_MODE_A);
    ASSERT_EQ(engine_indices(configs), (std::vector<int64_t>{3, 0, 2}));
    Desc plan = plan_of(handle_, configs[0]);
    EXPECT_EQ(plan.finalize(), kNotSupported);
    EXPECT_EQ(workspace_of(finalized_plan(handle_, configs[1])), 0);
    int64_t n = -1, bytes = -1;
    EXPECT_EQ(cudnnBackendGetAttribute(plan.get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                       CUDNN_TYPE_INT64, 1, &n, &bytes),
              kBadParam)
        << "the unbuilt plan has no workspace size";
  }
  for (const auto& [alpha, beta] : {std::pair{2.0, 0.0}, std::pair{1.0, 1.0}}) {
    for (const cudnnDataType_t type : {CUDNN_DATA_FLOAT, CUDNN_DATA_DOUBLE}) {
      SCOPED_TRACE("alpha " + std::to_string(alpha) + ", beta " + std::to_string(beta));
      Spec sp;
      sp.type = type;
      sp.alpha = alpha;
      sp.beta = beta;
      const Desc o = operation(sp);
      const Desc g = graph(handle_, o);
      const std::vector<Desc> configs = engine_configs(g, CUDNN_HEUR_MODE_A);
      ASSERT_EQ(configs.size(), 3u);
      for (const Desc& config : configs) {
        EXPECT_EQ(plan_of(handle_, config).finalize(), kNotSupported);
      }
    }
  }
}

// Engine 4's plan finalizes (no workspace), but every run of it fails and queues nothing.
TEST_F(CudnnGraphApi, Engine4sPlanFinalizesButFailsToRun) {
  emu::cudnn_set_graph_engines(emu::CudnnGraphEngines::unrunnable_first);
  const Spec sp{};
  const Desc o = operation(sp);
  const Desc g = graph(handle_, o);
  const std::vector<Desc> configs = engine_configs(g, CUDNN_HEUR_MODE_A);
  ASSERT_EQ(engine_indices(configs), (std::vector<int64_t>{4, 0, 2}));
  const Desc plan = finalized_plan(handle_, configs[0]);
  EXPECT_EQ(workspace_of(plan), 0);
  Operands<float> ops = operands<float>(sp, 81, 7.f);
  const auto y_before = ops.y;
  const int64_t calls = emu::cudnn_calls("cudnnBackendExecute");
  const int64_t runs = emu::cudnn_engine_executions(4);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(execute(handle_, plan, {kUidX, kUidW, kUidY},
                      {ops.x.data(), ops.w.data(), ops.y.data()}, nullptr),
              CUDNN_STATUS_EXECUTION_FAILED);
  }
  EXPECT_EQ(emu::cudnn_calls("cudnnBackendExecute"), calls);
  EXPECT_EQ(emu::cudnn_engine_executions(4), runs);
  EXPECT_EQ(ops.y, y_before) << "nothing was written";
}

// Engines 0, 1 and 2 need 0, 1024 and 256 bytes; a plan that needs a workspace is not executed
// without one.
TEST_F(CudnnGraphApi, EachPlanNeedsItsEnginesWorkspace) {
  emu::cudnn_set_graph_engines(emu::CudnnGraphEngines::nondeterministic_first);
  const Spec sp{};
  const Desc o = operation(sp);
  const Desc g = graph(handle_, o);
  const std::vector<Desc> configs = engine_configs(g, CUDNN_HEUR_MODE_A);
  ASSERT_EQ(engine_indices(configs), (std::vector<int64_t>{1, 0, 2}));
  const int64_t want[] = {1024, 0, 256};
  for (size_t i = 0; i < configs.size(); ++i) {
    SCOPED_TRACE("engine " + std::to_string(engine_index(configs[i])));
    const Desc plan = finalized_plan(handle_, configs[i]);
    EXPECT_EQ(workspace_of(plan), want[i]);
    Operands<float> ops = operands<float>(sp, 80, 7.f);
    const int64_t calls = emu::cudnn_calls("cudnnBackendExecute");
    EXPECT_EQ(execute(handle_, plan, {kUidX, kUidW, kUidY},
                      {ops.x.data(), ops.w.data(), ops.y.data()}, nullptr),
              want[i] == 0 ? kOk : kBadParam);
    EXPECT_EQ(emu::cudnn_calls("cudnnBackendExecute"), calls + (want[i] == 0 ? 1 : 0));
    std::vector<unsigned char> workspace(size_t(want[i]) + 1);
    EXPECT_EQ(execute(handle_, plan, {kUidX, kUidW, kUidY},
                      {ops.x.data(), ops.w.data(), ops.y.data()}, workspace.data()),
              kOk);
  }
}

// An execution needs every operand of the operation, non-null and as aligned as its tensor
// says, a finalized plan and variant pack, and a handle; a refused one queues nothing.
TEST_F(CudnnGraphApi, ExecuteRefusesAnIncompleteVariantPack) {
  const Spec sp{};
  const Desc o = operation(sp);
  const Desc g = graph(handle_, o);
  const Desc plan = finalized_plan(handle_, config_of_engine(g, 2));
  Operands<float> ops = operands<float>(sp, 90, 7.f);
  std::vector<unsigned char> ws(256);
  void *x = ops.x.data(), *w = ops.w.data(), *y = ops.y.data();
  const int64_t calls = emu::cudnn_calls("cudnnBackendExecute");
  EXPECT_EQ(execute(handle_, plan, {kUidX, kUidW}, {x, w}, ws.data()), kBadParam);
  EXPECT_EQ(execute(handle_, plan, {kUidX, kUidW, 4}, {x, w, y}, ws.data()), kBadParam);
  EXPECT_EQ(execute(handle_, plan, {kUidX, kUidW, kUidY}, {x, nullptr, y}, ws.data()), kBadParam);
  // x 4 bytes past a 16-byte boundary; its tensor says 16.
  std::vector<float> shifted(ops.x.size() + 4);
  void* misaligned = shifted.data() + 1;
  ASSERT_EQ(reinterpret_cast<uintptr_t>(shifted.data()) % 16, 0u);
  EXPECT_EQ(execute(handle_, plan, {kUidX, kUidW, kUidY}, {misaligned, w, y}, ws.data()),
            kBadParam);
  EXPECT_EQ(emu::cudnn_calls("cudnnBackendExecute"), calls);
  EXPECT_TRUE(std::all_of(ops.y.begin(), ops.y.end(), [](float v) { return v == 7.f; }));
  // A null handle; a plan not finalized; a variant pack not finalized, or a plan in its place.
  const Desc pack = variant_pack({kUidX, kUidW, kUidY}, {x, w, y}, ws.data());
  EXPECT_EQ(cudnnBackendExecute(nullptr, plan.get(), pack.get()), kBadParam);
  const Desc unfinished = plan_of(handle_, config_of_engine(g, 2));
  EXPECT_EQ(cudnnBackendExecute(handle_, unfinished.get(), pack.get()), kBadParam);
  Desc open_pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  EXPECT_EQ(cudnnBackendExecute(handle_, plan.get(), open_pack.get()), kBadParam);
  EXPECT_EQ(cudnnBackendExecute(handle_, plan.get(), plan.get()), kBadParam);
  EXPECT_EQ(emu::cudnn_calls("cudnnBackendExecute"), calls);
  // Extra unique ids are fine.
  EXPECT_EQ(execute(handle_, plan, {9, kUidY, kUidW, kUidX}, {ws.data(), y, w, x}, ws.data()), kOk);
  EXPECT_EQ(emu::cudnn_calls("cudnnBackendExecute"), calls + 1);
  EXPECT_FALSE(std::all_of(ops.y.begin(), ops.y.end(), [](float v) { return v == 7.f; }));
  // A variant pack's ids and pointers: as many of each, each id once.
  const int64_t uids[] = {kUidX, kUidW, kUidX};
  void* const pointers[] = {x, w, y};
  Desc uneven(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  EXPECT_EQ(uneven.set(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, uids, 2), kOk);
  EXPECT_EQ(uneven.set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, pointers, 3),
            kOk);
  EXPECT_EQ(uneven.finalize(), kBadParam);
  Desc repeated(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  EXPECT_EQ(repeated.set(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, uids, 3), kOk);
  EXPECT_EQ(repeated.set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, pointers, 3),
            kOk);
  EXPECT_EQ(repeated.finalize(), kBadParam);
}

// Tensor and convolution descriptors: attribute types, counts and names, the attributes Finalize
// requires, and what the emulator does not compute.
TEST_F(CudnnGraphApi, TensorAndConvolutionDescriptorsCheckTheirAttributes) {
  cudnnBackendDescriptor_t raw = nullptr;
  // CUDNN_BACKEND_POINTWISE_DESCRIPTOR (14 in cuDNN's enum) is not emulated.
  EXPECT_EQ(cudnnBackendCreateDescriptor(static_cast<cudnnBackendDescriptorType_t>(14), &raw),
            kNotSupported);
  EXPECT_EQ(cudnnBackendCreateDescriptor(CUDNN_BACKEND_TENSOR_DESCRIPTOR, nullptr), kBadParam);

  const Dims dims{2, 3, 5, 5}, nchw = strides(dims, false);
  const int64_t uid = 1, alignment = 16, three = 3;
  const cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
  Desc t(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
  EXPECT_EQ(t.set(CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, dims.data(), 3), kBadParam);
  EXPECT_EQ(t.set(CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_INT64, &uid), kBadParam);
  EXPECT_EQ(t.set(CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, &f32), kBadParam);
  EXPECT_EQ(t.set(CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, static_cast<int64_t*>(nullptr)),
            kBadParam);
  EXPECT_EQ(t.set(CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, &f32), kOk);
  EXPECT_EQ(t.set(CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, dims.data(), 4), kOk);
  EXPECT_EQ(t.set(CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, nchw.data(), 4), kOk);
  EXPECT_EQ(t.set(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, &alignment), kOk);
  EXPECT_EQ(t.finalize(), kBadParam) << "no unique id";
  EXPECT_EQ(t.set(CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, &uid), kOk);
  EXPECT_EQ(t.set(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, &three), kOk);
  EXPECT_EQ(t.finalize(), kBadParam) << "an alignment of 3";
  EXPECT_EQ(t.set(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, &alignment), kOk);
  const Dims padded{3 * 5 * 6, 5 * 6, 6, 1};  // rows of 6 for 5 values
  EXPECT_EQ(t.set(CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, padded.data(), 4), kOk);
  EXPECT_EQ(t.finalize(), kNotSupported) << "not packed";
  EXPECT_EQ(t.set(CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, nchw.data(), 4), kOk);
  EXPECT_EQ(t.finalize(), kOk);
  EXPECT_EQ(t.set(CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, &three), kBadParam) << "finalized";
  EXPECT_EQ(t.finalize(), kBadParam) << "finalized twice";
  const Dims empty{2, 0, 5, 5};
  Desc bad_dims = unfinalized_tensor(1, f32, empty);
  EXPECT_EQ(bad_dims.finalize(), kBadParam);
  const Dims huge{int64_t(1) << 40, 3, 5, 5};  // beyond the legacy API's int
  EXPECT_EQ(unfinalized_tensor(1, f32, huge).finalize(), kNotSupported);
  const auto int8 = static_cast<cudnnDataType_t>(3);  // CUDNN_DATA_INT8: not emulated
  Desc bad_type = unfinalized_tensor(1, int8, dims);
  EXPECT_EQ(bad_type.finalize(), kNotSupported);

  const Shape s;
  Desc post = unfinalized_convolution(s, f32, /*post=*/0);
  EXPECT_EQ(post.finalize(), kNotSupported) << "post paddings unlike the pre paddings";
  Desc convolution = unfinalized_convolution(s, f32);
  const cudnnConvolutionMode_t flipped = CUDNN_CONVOLUTION;
  EXPECT_EQ(
      convolution.set(CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, &flipped),
      kOk);
  EXPECT_EQ(convolution.finalize(), kNotSupported);
  Desc volume = unfinalized_convolution(s, f32);
  EXPECT_EQ(volume.set(CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, CUDNN_TYPE_INT64, &three), kOk);
  EXPECT_EQ(volume.finalize(), kNotSupported);
  const std::array<int64_t, 3> three_pads{1, 1, 1};
  EXPECT_EQ(volume.set(CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, CUDNN_TYPE_INT64, three_pads.data(), 3),
            kBadParam);
  Desc incomplete(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR);
  EXPECT_EQ(incomplete.set(CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, &f32), kOk);
  EXPECT_EQ(incomplete.finalize(), kBadParam);
}

// An operation needs finalized tensors (their values taken when set) of one data type, in the
// convolution's shapes, with distinct ids, alpha and beta, and the compute type of its data.
TEST_F(CudnnGraphApi, OperationsCheckTheirTensorsAndGraphsTheirOperations) {
  const Shape s;
  const cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
  const OpAttrs a = op_attrs(Op::forward);
  Desc conv = unfinalized_convolution(s, f32);
  ASSERT_EQ(conv.finalize(), kOk);
  // x, w, y: replaced one at a time by a faulty tensor.
  const auto finalize_with = [&](Desc x, Desc w, Desc y, const Desc& c) {
    Desc op(op_type(Op::forward));
    EXPECT_EQ(op.set_desc(a.x, x), kOk);
    EXPECT_EQ(op.set_desc(a.w, w), kOk);
    EXPECT_EQ(op.set_desc(a.y, y), kOk);
    EXPECT_EQ(op.set_desc(a.conv, c), kOk);
    set_scales(op, Spec{});
    return op.finalize();
  };
  const auto x = [&] { return tensor(kUidX, f32, s.x_dims()); };
  const auto w = [&] { return tensor(kUidW, f32, s.w_dims()); };
  const auto y = [&] { return tensor(kUidY, f32, s.y_dims()); };
  EXPECT_EQ(finalize_with(x(), w(), y(), conv), kOk);
  EXPECT_EQ(finalize_with(unfinalized_tensor(kUidX, f32, s.x_dims()), w(), y(), conv), kBadParam)
      << "x not finalized";
  EXPECT_EQ(finalize_with(x(), w(), tensor(kUidY, f32, {2, 4, 4, 5}), conv), kBadParam)
      << "y of the wrong size";
  EXPECT_EQ(finalize_with(x(), tensor(kUidW, f32, {4, 2, 3, 3}), y(), conv), kBadParam)
      << "w of other channels";
  EXPECT_EQ(finalize_with(x(), w(), tensor(kUidX, f32, s.y_dims()), conv), kBadParam)
      << "a repeated unique id";
  EXPECT_EQ(finalize_with(x(), tensor(kUidW, CUDNN_DATA_HALF, s.w_dims()), y(), conv), kBadParam)
      << "two data types";
  Desc f32_compute = unfinalized_convolution(s, f32);
  ASSERT_EQ(f32_compute.finalize(), kOk);
  const cudnnDataType_t f64 = CUDNN_DATA_DOUBLE;
  EXPECT_EQ(finalize_with(tensor(kUidX, f64, s.x_dims()), tensor(kUidW, f64, s.w_dims()),
                          tensor(kUidY, f64, s.y_dims()), f32_compute),
            kNotSupported)
      << "f64 data in f32";

  Desc op(op_type(Op::forward));
  EXPECT_EQ(op.set_desc(a.x, conv), kBadParam) << "a convolution where a tensor belongs";
  EXPECT_EQ(op.set_desc(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX, x()), kBadParam)
      << "the backward data pass's attribute";
  const int64_t one = 1;
  EXPECT_EQ(op.set(a.alpha, CUDNN_TYPE_INT64, &one), kBadParam);
  EXPECT_EQ(op.set_desc(a.x, x()), kOk);
  EXPECT_EQ(op.set_desc(a.w, w()), kOk);
  EXPECT_EQ(op.set_desc(a.y, y()), kOk);
  EXPECT_EQ(op.set_desc(a.conv, conv), kOk);
  EXPECT_EQ(op.finalize(), kBadParam) << "no alpha and beta";
  set_scales(op, Spec{});
  EXPECT_EQ(op.finalize(), kOk);

  // A graph: a handle and one finalized operation.
  Desc no_handle(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
  EXPECT_EQ(no_handle.set_desc(CUDNN_ATTR_OPERATIONGRAPH_OPS, op), kOk);
  EXPECT_EQ(no_handle.finalize(), kBadParam);
  Desc two_ops(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
  const Desc other = operation(Spec{Op::data, s});
  const cudnnBackendDescriptor_t ops[] = {op.get(), other.get()};
  EXPECT_EQ(two_ops.set(CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, ops, 2), kOk);
  EXPECT_EQ(two_ops.set(CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, &handle_), kOk);
  EXPECT_EQ(two_ops.finalize(), kNotSupported);
  Desc open_op(op_type(Op::forward));
  Desc unfinished(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
  EXPECT_EQ(unfinished.set_desc(CUDNN_ATTR_OPERATIONGRAPH_OPS, open_op), kOk);
  EXPECT_EQ(unfinished.set(CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, &handle_), kOk);
  EXPECT_EQ(unfinished.finalize(), kBadParam) << "its operation is not finalized";

  // Heuristics: a finalized graph and a mode.
  Desc heur(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
  EXPECT_EQ(heur.set_desc(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, unfinished), kOk);
  const cudnnBackendHeurMode_t a_mode = CUDNN_HEUR_MODE_A;
  const auto bad_mode = static_cast<cudnnBackendHeurMode_t>(7);
  EXPECT_EQ(heur.set(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, &bad_mode), kBadParam);
  EXPECT_EQ(heur.set(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, &a_mode), kOk);
  const int64_t heuristics = emu::cudnn_calls("heuristics mode A");
  EXPECT_EQ(heur.finalize(), kBadParam);
  EXPECT_EQ(emu::cudnn_calls("heuristics mode A"), heuristics) << "a failed query is not counted";
  // An engine's index: one of the 5.
  const Desc g = graph(handle_, op);
  Desc engine(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
  const int64_t sixth = 5;
  EXPECT_EQ(engine.set_desc(CUDNN_ATTR_ENGINE_OPERATION_GRAPH, g), kOk);
  EXPECT_EQ(engine.set(CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, &sixth), kOk);
  EXPECT_EQ(engine.finalize(), kBadParam);
}

// The values an attribute names are copied when it is set: tensors after their operation,
// operations and graphs after their heuristics' results, configurations after their plans, and
// the heuristics descriptor itself may all be destroyed first. A destroyed descriptor is refused.
TEST_F(CudnnGraphApi, ResultsAndPlansOutliveTheDescriptorsTheyCameFrom) {
  const Spec sp{Op::filter, shape(2, 2)};
  Desc op = operation(sp);  // its tensors and convolution are gone already
  Desc g = graph(handle_, op);
  std::vector<Desc> configs = engine_configs(g, CUDNN_HEUR_MODE_A);  // the heuristics are gone
  ASSERT_EQ(configs.size(), 2u);
  const cudnnBackendDescriptor_t dead_graph = g.get();
  op.reset();
  g.reset();
  EXPECT_EQ(cudnnBackendFinalize(dead_graph), kBadParam);
  EXPECT_EQ(cudnnBackendDestroyDescriptor(dead_graph), kBadParam);
  Desc heur(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
  const cudnnBackendDescriptor_t raw = dead_graph;
  EXPECT_EQ(heur.set(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, &raw),
            kBadParam);
  const Desc plan = finalized_plan(handle_, configs[1]);
  configs.clear();
  EXPECT_EQ(workspace_of(plan), 256);
  Operands<float> by_graph = operands<float>(sp, 100, 7.f), by_legacy = operands<float>(sp, 100, 0);
  ASSERT_EQ(run(handle_, plan, by_graph), kOk);
  run_legacy(handle_, sp, CUDNN_FMA_MATH, by_legacy);
  EXPECT_TRUE(same_bits(by_graph.w, by_legacy.w));
}

// An engine (graph and global index) and its configuration built by hand run like the
// heuristics' ones; a configuration's engine can be read back.
TEST_F(CudnnGraphApi, AHandBuiltEngineConfigurationRuns) {
  const Spec sp{Op::data, shape(2, 1)};
  const Desc op = operation(sp);
  const Desc g = graph(handle_, op);
  const Desc config = config_of_engine(g, 2);
  EXPECT_EQ(engine_index(config), 2);
  const Desc plan = finalized_plan(handle_, config);
  EXPECT_EQ(workspace_of(plan), 256);
  const int64_t runs = emu::cudnn_engine_executions(2);
  Operands<float> by_graph = operands<float>(sp, 110, 7.f), by_legacy = operands<float>(sp, 110, 0);
  ASSERT_EQ(run(handle_, plan, by_graph), kOk);
  EXPECT_EQ(emu::cudnn_engine_executions(2), runs + 1);
  run_legacy(handle_, sp, CUDNN_FMA_MATH, by_legacy);
  EXPECT_TRUE(same_bits(by_graph.x, by_legacy.x));
  // Engine 3 by hand: its configuration is built, its plan is not.
  EXPECT_EQ(plan_of(handle_, config_of_engine(g, 3)).finalize(), kNotSupported);
}

// Creations count by type, and every descriptor of either API counts as live until destroyed.
TEST_F(CudnnGraphApi, DescriptorsAreCountedByTypeAndAllDestroyed) {
  const cudnnBackendDescriptorType_t types[] = {
      CUDNN_BACKEND_TENSOR_DESCRIPTOR,
      CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR,
      CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR,
      CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR,
      CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR,
      CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR,
      CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR,
      CUDNN_BACKEND_ENGINECFG_DESCRIPTOR,
      CUDNN_BACKEND_ENGINE_DESCRIPTOR,
      CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR,
      CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR};
  std::map<cudnnBackendDescriptorType_t, int64_t> before;
  for (const auto t : types) before[t] = emu::cudnn_backend_created(t);
  const int live = emu::cudnn_live_descriptors();
  {
    const Spec sp{Op::data, Shape{}};
    const Desc op = operation(sp);  // 3 tensors, 1 convolution, the operation
    EXPECT_EQ(emu::cudnn_live_descriptors(), live + 1);
    const Desc g = graph(handle_, op);
    const std::vector<Desc> configs = engine_configs(g, CUDNN_HEUR_MODE_A);  // heuristics, 2
    EXPECT_EQ(emu::cudnn_live_descriptors(), live + 4);
    const Desc plan = finalized_plan(handle_, configs[0]);
    EXPECT_EQ(engine_index(configs[0]), 0);  // an engine
    Operands<float> ops = operands<float>(sp, 120, 0);
    EXPECT_EQ(run(handle_, plan, ops), kOk);  // a variant pack
    EXPECT_EQ(emu::cudnn_live_descriptors(), live + 5);
    cudnnTensorDescriptor_t legacy = nullptr;
    ASSERT_EQ(cudnnCreateTensorDescriptor(&legacy), kOk);
    EXPECT_EQ(emu::cudnn_live_descriptors(), live + 6) << "both APIs' descriptors count";
    EXPECT_EQ(cudnnDestroyTensorDescriptor(legacy), kOk);
  }
  EXPECT_EQ(emu::cudnn_live_descriptors(), live);
  const std::map<cudnnBackendDescriptorType_t, int64_t> want{
      {CUDNN_BACKEND_TENSOR_DESCRIPTOR, 3},
      {CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR, 1},
      {CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR, 0},
      {CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR, 1},
      {CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR, 0},
      {CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, 1},
      {CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, 1},
      {CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, 2},
      {CUDNN_BACKEND_ENGINE_DESCRIPTOR, 1},
      {CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, 1},
      {CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, 1}};
  for (const auto t : types) {
    EXPECT_EQ(emu::cudnn_backend_created(t) - before[t], want.at(t)) << "type " << int(t);
  }
  // A refused creation counts nowhere.
  cudnnBackendDescriptor_t raw = nullptr;
  const auto pointwise = static_cast<cudnnBackendDescriptorType_t>(14);
  const int64_t pointwise_before = emu::cudnn_backend_created(pointwise);
  EXPECT_EQ(cudnnBackendCreateDescriptor(pointwise, &raw), kNotSupported);
  EXPECT_EQ(emu::cudnn_backend_created(pointwise), pointwise_before);
  EXPECT_EQ(emu::cudnn_live_descriptors(), live);
}

// As the legacy calls: an execution on a capturing stream is recorded, counted once, and run by
// each launch of the graph.
TEST_F(CudnnGraphApi, AnExecutionIsCapturedAndRunByEachGraphLaunch) {
  const Spec sp{};
  const Desc op = operation(sp);
  const Desc g = graph(handle_, op);
  const Desc plan = finalized_plan(handle_, config_of_engine(g, 0));
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudnnSetStream(handle_, stream), kOk);
  Operands<float> ops = operands<float>(sp, 130, 7.f), want = operands<float>(sp, 130, 0);
  ASSERT_EQ(run(handle_, finalized_plan(handle_, config_of_engine(g, 0)), want), kOk);
  std::fill(ops.y.begin(), ops.y.end(), 7.f);
  const int64_t calls = emu::cudnn_calls("cudnnBackendExecute"),
                runs = emu::cudnn_engine_executions(0);
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
  EXPECT_EQ(execute(handle_, plan, {kUidX, kUidW, kUidY},
                    {ops.x.data(), ops.w.data(), ops.y.data()}, nullptr),
            kOk);
  cudaGraph_t captured = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(stream, &captured), cudaSuccess);
  EXPECT_TRUE(std::all_of(ops.y.begin(), ops.y.end(), [](float v) { return v == 7.f; }))
      << "recorded, not run";
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, captured), cudaSuccess);
  for (int launch = 0; launch < 2; ++launch) {
    std::fill(ops.y.begin(), ops.y.end(), 7.f);
    ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    EXPECT_TRUE(same_bits(ops.y, want.y)) << "launch " << launch;
  }
  EXPECT_EQ(emu::cudnn_calls("cudnnBackendExecute"), calls + 1);
  EXPECT_EQ(emu::cudnn_engine_executions(0), runs + 1);
  EXPECT_EQ(cudaGraphExecDestroy(exec), cudaSuccess);
  EXPECT_EQ(cudaGraphDestroy(captured), cudaSuccess);
  EXPECT_EQ(cudnnSetStream(handle_, nullptr), kOk);
  EXPECT_EQ(cudaStreamDestroy(stream), cudaSuccess);
}

// An execution declares its reads of the inputs and its writes of the output and the workspace:
// unordered work on another stream that touches them is reported (and thrown, in the detector's
// default error mode).
TEST_F(CudnnGraphApi, TheRaceDetectorSeesTheOperandsAndTheWorkspace) {
  if (!emu::racecheck_enabled()) GTEST_SKIP() << "RG_EMU_RACECHECK=off";
  // The host must not wait for each call: that would order the two streams.
  emu::set_launch_blocking(false);
  struct Restore {
    ~Restore() { emu::set_launch_blocking(true); }
  } restore;
  const Spec sp{};
  const Shape& s = sp.shape;
  const Desc op = operation(sp);
  const Desc g = graph(handle_, op);
  const Desc plan = finalized_plan(handle_, config_of_engine(g, 2));  // 256 bytes of workspace
  const size_t nx = size_t(count(s.x_dims())) * 4, nw = size_t(count(s.w_dims())) * 4,
               ny = size_t(count(s.y_dims())) * 4;
  // Two sets of operands and one workspace, in emulated device memory.
  std::vector<void*> memory;
  for (const size_t bytes : {nx, nw, ny, nx, nw, ny, size_t(256)}) {
    void* p = nullptr;
    ASSERT_EQ(cudaMalloc(&p, bytes), cudaSuccess);
    ASSERT_EQ(cudaMemset(p, 0, bytes), cudaSuccess);
    memory.push_back(p);
  }
  void* workspace = memory[6];
  cudaStream_t a = nullptr, b = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking), cudaSuccess);
  const std::string on_a = "on " + emu::stream_name(a), on_b = "on " + emu::stream_name(b);
  const auto run_on = [&](cudaStream_t stream, size_t set) {
    EXPECT_EQ(cudnnSetStream(handle_, stream), kOk);
    return execute(handle_, plan, {kUidX, kUidW, kUidY},
                   {memory[3 * set], memory[3 * set + 1], memory[3 * set + 2]}, workspace);
  };
  // Whatever `racing` throws: a race report naming both operations.
  const auto race = [&](auto racing) {
    std::string msg;
    try {
      racing();
    } catch (const Error& e) {
      msg = e.what();
    }
    EXPECT_TRUE(cudaDeviceSynchronize() == cudaSuccess);
    emu::clear_race_reports();
    return msg;
  };
  const auto expect_report = [](const std::string& msg, std::initializer_list<std::string> parts) {
    ASSERT_NE(msg.find("stream race"), std::string::npos) << "no race reported: " << msg;
    for (const std::string& part : parts) {
      EXPECT_NE(msg.find(part), std::string::npos) << "'" << part << "' is missing from " << msg;
    }
  };
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  emu::clear_race_reports();

  // Ordered (the host waits between them): no report.
  EXPECT_EQ(run_on(b, 0), kOk);
  ASSERT_EQ(cudaStreamSynchronize(b), cudaSuccess);
  EXPECT_EQ(cudaMemsetAsync(memory[0], 0, nx, a), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(a), cudaSuccess);
  EXPECT_TRUE(emu::race_reports().empty());

  // x overwritten on a while b's execution may still read it.
  expect_report(race([&] {
                  EXPECT_EQ(run_on(b, 0), kOk);
                  (void)cudaMemsetAsync(memory[0], 0, nx, a);
                }),
                {"cudaMemsetAsync", on_a + " writes", "cudnnBackendExecute " + on_b + " reads"});
  // y read on a while b's execution may still write it.
  expect_report(race([&] {
                  EXPECT_EQ(run_on(b, 0), kOk);
                  (void)cudaMemcpyAsync(memory[5], memory[2], ny, cudaMemcpyDeviceToDevice, a);
                }),
                {on_a + " reads", "cudnnBackendExecute " + on_b + " writes"});
  // Two executions on other operands, sharing only the workspace.
  expect_report(
      race([&] {
        EXPECT_EQ(run_on(b, 0), kOk);
        (void)run_on(a, 1);
      }),
      {"cudnnBackendExecute " + on_a + " writes", "cudnnBackendExecute " + on_b + " writes"});

  EXPECT_EQ(cudnnSetStream(handle_, nullptr), kOk);
  EXPECT_EQ(cudaStreamDestroy(a), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(b), cudaSuccess);
  for (void* p : memory) EXPECT_EQ(cudaFree(p), cudaSuccess);
}

}  // namespace
}  // namespace rg::emu_kernel_test
