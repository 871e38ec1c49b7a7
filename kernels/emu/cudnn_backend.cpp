// The emulated cuDNN graph (backend) API of kernels/emu/shim/cudnn.h: tensor, convolution,
// convolution operation (forward, backward data, backward filter), operation graph, heuristics,
// engine, engine configuration, execution plan and variant pack descriptors, and execution, which
// queues the legacy API's convolution pass (kernels/emu/cudnn_internal.h) on the handle's stream.
//
// Every descriptor a descriptor-valued attribute names is copied by value when the attribute is set
// (as real cuDNN keeps what it needs): the named descriptor may be destroyed right after, and must
// be finalized by then, or the Finalize that needs it fails. Descriptor handles are checked
// against the live ones: a destroyed or foreign handle is CUDNN_STATUS_BAD_PARAM, not a crash.
#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <mutex>
#include <optional>
#include <unordered_set>
#include <utility>
#include <vector>

#include "kernels/conv2d.h"
#include "kernels/emu/cudnn_internal.h"
#include "kernels/emu/shim/cudnn.h"
#include "kernels/emu/tf32.h"

namespace {

namespace detail = rg::emu::cudnn_detail;
using detail::Layout;
using detail::Pass;
using rg::emu::CudnnGraphEngines;
using rg::kernels::Conv2dGeometry;
using Dims = std::array<int64_t, 4>;
using Pair = std::array<int64_t, 2>;

// ---- The emulated engines (rg::emu::cudnn_set_graph_engines) ----

struct EngineSpec {
  std::vector<cudnnBackendNumericalNote_t> notes;
  int64_t workspace;  // bytes
  bool buildable;     // false: its execution plan cannot be finalized
  bool runs = true;   // false: cudnnBackendExecute of its plan fails
};
constexpr int64_t kEngines = 5;

const EngineSpec& engine_spec(int64_t index) {
  static const std::array<EngineSpec, kEngines> engines{{
      {{CUDNN_NUMERICAL_NOTE_TENSOR_CORE}, 0, true},
      {{CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC}, 1024, true},
      {{}, 256, true},
      {{}, 0, false},
      {{}, 0, true, false},
  }};
  return engines[size_t(index)];
}

bool has_note(int64_t engine, cudnnBackendNumericalNote_t note) {
  const std::vector<cudnnBackendNumericalNote_t>& notes = engine_spec(engine).notes;
  return std::find(notes.begin(), notes.end(), note) != notes.end();
}

std::atomic<CudnnGraphEngines> graph_engines{CudnnGraphEngines::standard};

// The engines the heuristics offer in `mode`, best first.
std::vector<int64_t> offered(cudnnBackendHeurMode_t mode) {
  const CudnnGraphEngines offer = graph_engines.load();
  if (offer == CudnnGraphEngines::none) return {};
  if (mode == CUDNN_HEUR_MODE_FALLBACK) return {2};
  switch (offer) {
    case CudnnGraphEngines::standard:
      return {0, 2};
    case CudnnGraphEngines::nondeterministic_first:
      return {1, 0, 2};
    case CudnnGraphEngines::unsupported_first:
      return {3, 0, 2};
    case CudnnGraphEngines::unrunnable_first:
      return {4, 0, 2};
    case CudnnGraphEngines::nondeterministic_only:
      return {1};
    default:  // fallback_only
      return {};
  }
}

const char* heuristics_call(cudnnBackendHeurMode_t mode) {
  switch (mode) {
    case CUDNN_HEUR_MODE_B:
      return "heuristics mode B";
    case CUDNN_HEUR_MODE_FALLBACK:
      return "heuristics mode fallback";
    default:  // A, and INSTANT, which is A's list
      return "heuristics mode A";
  }
}

// ---- Counters ----

std::array<std::atomic<int64_t>, kEngines> engine_runs{};
// Creations by descriptor type (cuDNN's types are all below this).
constexpr int64_t kTypeSlots = 64;
std::array<std::atomic<int64_t>, kTypeSlots> created{};

// ---- Descriptors ----

struct Descriptor {
  explicit Descriptor(cudnnBackendDescriptorType_t t) : type(t) {}
  virtual ~Descriptor() = default;
  Descriptor(const Descriptor&) = delete;
  Descriptor& operator=(const Descriptor&) = delete;
  const cudnnBackendDescriptorType_t type;
  bool finalized = false;
};

// What a finalized descriptor is, by value.
struct TensorInfo {
  cudnnDataType_t type = CUDNN_DATA_FLOAT;
  Dims dims{};
  int64_t uid = 0, alignment = 1;
  // Whether the strides are those of a packed NCHW, a packed NHWC tensor (those of dimensions of
  // size 1 do not matter: both when only one dimension is larger than 1).
  bool nchw = false, nhwc = false;
};
struct ConvInfo {
  cudnnDataType_t compute = CUDNN_DATA_FLOAT;
  Pair pad{}, stride{}, dilation{};
};
// A convolution operation: what its graph, heuristics, engines, configurations and plans keep.
struct OpInfo {
  Pass pass = Pass::forward;
  TensorInfo x, w, y;  // x or dx, w or dw, y or dy
  Conv2dGeometry g{};
  Layout layout = Layout::nchw;
  double alpha = 1, beta = 0;
};
struct EngineInfo {
  OpInfo op;
  int64_t index = 0;  // the global index
};

// A descriptor-valued attribute: the named descriptor's value when the attribute was set.
template <class Info>
struct Ref {
  bool set = false, finalized = false;
  Info info{};
  bool usable() const { return set && finalized; }
};

struct TensorDesc : Descriptor {
  using Descriptor::Descriptor;
  std::optional<cudnnDataType_t> data_type;
  std::optional<Dims> dims, strides;
  std::optional<int64_t> uid, alignment;
  TensorInfo info;
};
struct ConvDesc : Descriptor {
  using Descriptor::Descriptor;
  std::optional<cudnnDataType_t> compute;
  std::optional<cudnnConvolutionMode_t> mode;
  std::optional<int64_t> spatial_dims;
  std::optional<Pair> dilations, strides, pre, post;
  ConvInfo info;
};
struct OpDesc : Descriptor {
  using Descriptor::Descriptor;
  Ref<TensorInfo> x, w, y;
  Ref<ConvInfo> conv;
  std::optional<double> alpha, beta;
  OpInfo info;
};
struct GraphDesc : Descriptor {
  using Descriptor::Descriptor;
  bool handle = false;
  int64_t ops = 0;  // how many operations OPS names; the first is `op`
  Ref<OpInfo> op;
  OpInfo info;
};
struct HeurDesc : Descriptor {
  using Descriptor::Descriptor;
  Ref<OpInfo> graph;
  std::optional<cudnnBackendHeurMode_t> mode;
  std::vector<int64_t> engines;  // the results, best first
};
struct EngineDesc : Descriptor {
  using Descriptor::Descriptor;
  Ref<OpInfo> graph;
  std::optional<int64_t> index;
  EngineInfo info;
};
struct EngineCfgDesc : Descriptor {
  using Descriptor::Descriptor;
  Ref<EngineInfo> engine;
  EngineInfo info;
};
struct PlanDesc : Descriptor {
  using Descriptor::Descriptor;
  bool handle = false;
  Ref<EngineInfo> config;
  EngineInfo info;
  int64_t workspace = 0;
};
struct PackDesc : Descriptor {
  using Descriptor::Descriptor;
  std::optional<std::vector<int64_t>> uids;
  std::optional<std::vector<void*>> pointers;
  void* workspace = nullptr;
};

bool is_operation(cudnnBackendDescriptorType_t type) {
  return type == CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR ||
         type == CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR ||
         type == CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR;
}

Pass pass_of(cudnnBackendDescriptorType_t type) {
  return type == CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR         ? Pass::forward
         : type == CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR ? Pass::data
                                                                                : Pass::weight;
}

// The name the tracer shows for a creation: the function and the descriptor type.
const char* creation_name(cudnnBackendDescriptorType_t type) {
  switch (type) {
    case CUDNN_BACKEND_TENSOR_DESCRIPTOR:
      return "cudnnBackendCreateDescriptor (tensor)";
    case CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR:
      return "cudnnBackendCreateDescriptor (convolution)";
    case CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR:
      return "cudnnBackendCreateDescriptor (operation graph)";
    case CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR:
      return "cudnnBackendCreateDescriptor (heuristics)";
    case CUDNN_BACKEND_ENGINE_DESCRIPTOR:
      return "cudnnBackendCreateDescriptor (engine)";
    case CUDNN_BACKEND_ENGINECFG_DESCRIPTOR:
      return "cudnnBackendCreateDescriptor (engine config)";
    case CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR:
      return "cudnnBackendCreateDescriptor (execution plan)";
    case CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR:
      return "cudnnBackendCreateDescriptor (variant pack)";
    default:
      return "cudnnBackendCreateDescriptor (operation)";
  }
}

Descriptor* make(cudnnBackendDescriptorType_t type) {
  switch (type) {
    case CUDNN_BACKEND_TENSOR_DESCRIPTOR:
      return new TensorDesc(type);
    case CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR:
      return new ConvDesc(type);
    case CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR:
    case CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR:
    case CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR:
      return new OpDesc(type);
    case CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR:
      return new GraphDesc(type);
    case CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR:
      return new HeurDesc(type);
    case CUDNN_BACKEND_ENGINE_DESCRIPTOR:
      return new EngineDesc(type);
    case CUDNN_BACKEND_ENGINECFG_DESCRIPTOR:
      return new EngineCfgDesc(type);
    case CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR:
      return new PlanDesc(type);
    case CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR:
      return new PackDesc(type);
    default:
      return nullptr;
  }
}

// The live descriptors (created, not yet destroyed).
std::mutex registry_mu;
std::unordered_set<const void*> registry;

// The live descriptor `d` is, or nullptr.
Descriptor* lookup(const void* d) {
  if (d == nullptr) return nullptr;
  std::lock_guard<std::mutex> lock(registry_mu);
  return registry.count(d) != 0 ? static_cast<Descriptor*>(const_cast<void*>(d)) : nullptr;
}

// The live descriptor `d` is when of `type`, or nullptr.
template <class D>
D* lookup_as(const void* d, cudnnBackendDescriptorType_t type) {
  Descriptor* desc = lookup(d);
  return desc != nullptr && desc->type == type ? static_cast<D*>(desc) : nullptr;
}

// ---- SetAttribute ----

// The elements of one cudnnBackendSetAttribute call.
struct Elements {
  cudnnBackendAttributeType_t type;
  int64_t count;
  const void* p;

  // Whether they are n elements of type t.
  bool are(cudnnBackendAttributeType_t t, int64_t n) const { return type == t && count == n; }
  template <class T>
  T at(int64_t i) const {
    T v;
    std::memcpy(&v, static_cast<const char*>(p) + size_t(i) * sizeof(T), sizeof(T));
    return v;
  }
};

template <class T>
cudnnStatus_t set_one(const Elements& e, cudnnBackendAttributeType_t type, std::optional<T>& to) {
  if (!e.are(type, 1)) return CUDNN_STATUS_BAD_PARAM;
  to = e.at<T>(0);
  return CUDNN_STATUS_SUCCESS;
}

template <size_t N>
cudnnStatus_t set_int64s(const Elements& e, std::optional<std::array<int64_t, N>>& to) {
  if (!e.are(CUDNN_TYPE_INT64, int64_t(N))) return CUDNN_STATUS_BAD_PARAM;
  std::array<int64_t, N> v{};
  for (size_t i = 0; i < N; ++i) v[i] = e.at<int64_t>(int64_t(i));
  to = v;
  return CUDNN_STATUS_SUCCESS;
}

// alpha or beta: one float or one double (cuDNN wants the double for f64 compute), kept as double.
cudnnStatus_t set_scale(const Elements& e, std::optional<double>& to) {
  if (e.are(CUDNN_TYPE_FLOAT, 1)) {
    to = double(e.at<float>(0));
  } else if (e.are(CUDNN_TYPE_DOUBLE, 1)) {
    to = e.at<double>(0);
  } else {
    return CUDNN_STATUS_BAD_PARAM;
  }
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t set_handle(const Elements& e, bool& to) {
  if (!e.are(CUDNN_TYPE_HANDLE, 1) || e.at<cudnnHandle_t>(0) == nullptr) {
    return CUDNN_STATUS_BAD_PARAM;
  }
  to = true;
  return CUDNN_STATUS_SUCCESS;
}

void copy_info(const Descriptor& d, TensorInfo& to) { to = static_cast<const TensorDesc&>(d).info; }
void copy_info(const Descriptor& d, ConvInfo& to) { to = static_cast<const ConvDesc&>(d).info; }
void copy_info(const Descriptor& d, OpInfo& to) {
  to = d.type == CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR ? static_cast<const GraphDesc&>(d).info
                                                         : static_cast<const OpDesc&>(d).info;
}
void copy_info(const Descriptor& d, EngineInfo& to) {
  to = d.type == CUDNN_BACKEND_ENGINE_DESCRIPTOR ? static_cast<const EngineDesc&>(d).info
                                                 : static_cast<const EngineCfgDesc&>(d).info;
}

// A descriptor-valued attribute: the value of a live descriptor of one of `types`.
template <class Info>
cudnnStatus_t set_ref(const Elements& e, std::initializer_list<cudnnBackendDescriptorType_t> types,
                      Ref<Info>& to) {
  if (!e.are(CUDNN_TYPE_BACKEND_DESCRIPTOR, 1)) return CUDNN_STATUS_BAD_PARAM;
  const Descriptor* d = lookup(e.at<cudnnBackendDescriptor_t>(0));
  if (d == nullptr || std::find(types.begin(), types.end(), d->type) == types.end()) {
    return CUDNN_STATUS_BAD_PARAM;
  }
  to.set = true;
  to.finalized = d->finalized;
  if (d->finalized) copy_info(*d, to.info);
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t set_tensor(TensorDesc& t, cudnnBackendAttributeName_t name, const Elements& e) {
  switch (name) {
    case CUDNN_ATTR_TENSOR_DATA_TYPE:
      return set_one(e, CUDNN_TYPE_DATA_TYPE, t.data_type);
    case CUDNN_ATTR_TENSOR_DIMENSIONS:
      return set_int64s(e, t.dims);
    case CUDNN_ATTR_TENSOR_STRIDES:
      return set_int64s(e, t.strides);
    case CUDNN_ATTR_TENSOR_UNIQUE_ID:
      return set_one(e, CUDNN_TYPE_INT64, t.uid);
    case CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT:
      return set_one(e, CUDNN_TYPE_INT64, t.alignment);
    default:
      return CUDNN_STATUS_BAD_PARAM;
  }
}

cudnnStatus_t set_conv(ConvDesc& c, cudnnBackendAttributeName_t name, const Elements& e) {
  switch (name) {
    case CUDNN_ATTR_CONVOLUTION_COMP_TYPE:
      return set_one(e, CUDNN_TYPE_DATA_TYPE, c.compute);
    case CUDNN_ATTR_CONVOLUTION_CONV_MODE:
      if (e.are(CUDNN_TYPE_CONVOLUTION_MODE, 1) &&
          e.at<cudnnConvolutionMode_t>(0) != CUDNN_CONVOLUTION &&
          e.at<cudnnConvolutionMode_t>(0) != CUDNN_CROSS_CORRELATION) {
        return CUDNN_STATUS_BAD_PARAM;
      }
      return set_one(e, CUDNN_TYPE_CONVOLUTION_MODE, c.mode);
    case CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS:
      return set_one(e, CUDNN_TYPE_INT64, c.spatial_dims);
    case CUDNN_ATTR_CONVOLUTION_DILATIONS:
      return set_int64s(e, c.dilations);
    case CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES:
      return set_int64s(e, c.strides);
    case CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS:
      return set_int64s(e, c.pre);
    case CUDNN_ATTR_CONVOLUTION_POST_PADDINGS:
      return set_int64s(e, c.post);
    default:
      return CUDNN_STATUS_BAD_PARAM;
  }
}

// An operation's attribute names, by pass.
struct OpAttrs {
  cudnnBackendAttributeName_t alpha, beta, conv, x, w, y;
};
OpAttrs op_attrs(Pass pass) {
  switch (pass) {
    case Pass::forward:
      return {CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA,
              CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA,
              CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC,
              CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X,
              CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W,
              CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y};
    case Pass::data:
      return {CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA,
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA,
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC,
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX,
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W,
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY};
    case Pass::weight:
      break;
  }
  return {CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA,
          CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA,
          CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC,
          CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X,
          CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW,
          CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY};
}

cudnnStatus_t set_op(OpDesc& o, cudnnBackendAttributeName_t name, const Elements& e) {
  const OpAttrs a = op_attrs(pass_of(o.type));
  if (name == a.alpha) return set_scale(e, o.alpha);
  if (name == a.beta) return set_scale(e, o.beta);
  if (name == a.conv) return set_ref(e, {CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR}, o.conv);
  if (name == a.x) return set_ref(e, {CUDNN_BACKEND_TENSOR_DESCRIPTOR}, o.x);
  if (name == a.w) return set_ref(e, {CUDNN_BACKEND_TENSOR_DESCRIPTOR}, o.w);
  if (name == a.y) return set_ref(e, {CUDNN_BACKEND_TENSOR_DESCRIPTOR}, o.y);
  return CUDNN_STATUS_BAD_PARAM;
}

cudnnStatus_t set_graph(GraphDesc& g, cudnnBackendAttributeName_t name, const Elements& e) {
  switch (name) {
    case CUDNN_ATTR_OPERATIONGRAPH_HANDLE:
      return set_handle(e, g.handle);
    case CUDNN_ATTR_OPERATIONGRAPH_OPS: {
      if (e.type != CUDNN_TYPE_BACKEND_DESCRIPTOR || e.count < 1) return CUDNN_STATUS_BAD_PARAM;
      for (int64_t i = 0; i < e.count; ++i) {
        const Descriptor* d = lookup(e.at<cudnnBackendDescriptor_t>(i));
        if (d == nullptr || !is_operation(d->type)) return CUDNN_STATUS_BAD_PARAM;
      }
      g.ops = e.count;
      const Elements first{e.type, 1, e.p};
      return set_ref(first,
                     {CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR,
                      CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR,
                      CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR},
                     g.op);
    }
    default:
      return CUDNN_STATUS_BAD_PARAM;
  }
}

cudnnStatus_t set_heur(HeurDesc& h, cudnnBackendAttributeName_t name, const Elements& e) {
  switch (name) {
    case CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH:
      return set_ref(e, {CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR}, h.graph);
    case CUDNN_ATTR_ENGINEHEUR_MODE: {
      if (!e.are(CUDNN_TYPE_HEUR_MODE, 1)) return CUDNN_STATUS_BAD_PARAM;
      const auto mode = e.at<cudnnBackendHeurMode_t>(0);
      if (mode != CUDNN_HEUR_MODE_INSTANT && mode != CUDNN_HEUR_MODE_B &&
          mode != CUDNN_HEUR_MODE_FALLBACK && mode != CUDNN_HEUR_MODE_A) {
        return CUDNN_STATUS_BAD_PARAM;
      }
      h.mode = mode;
      return CUDNN_STATUS_SUCCESS;
    }
    default:
      return CUDNN_STATUS_BAD_PARAM;
  }
}

cudnnStatus_t set_engine(EngineDesc& en, cudnnBackendAttributeName_t name, const Elements& e) {
  switch (name) {
    case CUDNN_ATTR_ENGINE_OPERATION_GRAPH:
      return set_ref(e, {CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR}, en.graph);
    case CUDNN_ATTR_ENGINE_GLOBAL_INDEX:
      return set_one(e, CUDNN_TYPE_INT64, en.index);
    default:
      return CUDNN_STATUS_BAD_PARAM;
  }
}

cudnnStatus_t set_plan(PlanDesc& p, cudnnBackendAttributeName_t name, const Elements& e) {
  switch (name) {
    case CUDNN_ATTR_EXECUTION_PLAN_HANDLE:
      return set_handle(e, p.handle);
    case CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG:
      return set_ref(e, {CUDNN_BACKEND_ENGINECFG_DESCRIPTOR}, p.config);
    default:
      return CUDNN_STATUS_BAD_PARAM;
  }
}

cudnnStatus_t set_pack(PackDesc& p, cudnnBackendAttributeName_t name, const Elements& e) {
  switch (name) {
    case CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS: {
      if (e.type != CUDNN_TYPE_INT64) return CUDNN_STATUS_BAD_PARAM;
      std::vector<int64_t> uids(size_t(e.count));
      for (int64_t i = 0; i < e.count; ++i) uids[size_t(i)] = e.at<int64_t>(i);
      p.uids = std::move(uids);
      return CUDNN_STATUS_SUCCESS;
    }
    case CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS: {
      if (e.type != CUDNN_TYPE_VOID_PTR) return CUDNN_STATUS_BAD_PARAM;
      std::vector<void*> pointers(size_t(e.count));
      for (int64_t i = 0; i < e.count; ++i) pointers[size_t(i)] = e.at<void*>(i);
      p.pointers = std::move(pointers);
      return CUDNN_STATUS_SUCCESS;
    }
    case CUDNN_ATTR_VARIANT_PACK_WORKSPACE:
      if (!e.are(CUDNN_TYPE_VOID_PTR, 1)) return CUDNN_STATUS_BAD_PARAM;
      p.workspace = e.at<void*>(0);
      return CUDNN_STATUS_SUCCESS;
    default:
      return CUDNN_STATUS_BAD_PARAM;
  }
}

// ---- Finalize ----

// The largest dimension (and convolution parameter), and element count, of a tensor the emulator
// takes (cuDNN's legacy API takes int dimensions; the count's bytes fit in int64_t); larger ones
// are CUDNN_STATUS_NOT_SUPPORTED.
constexpr int64_t kMaxDim = INT32_MAX, kMaxElements = int64_t(1) << 59;

cudnnStatus_t finalize_tensor(TensorDesc& t) {
  if (!t.data_type || !t.dims || !t.strides || !t.uid || !t.alignment) {
    return CUDNN_STATUS_BAD_PARAM;
  }
  if (detail::element_bytes(*t.data_type) == 0) return CUDNN_STATUS_NOT_SUPPORTED;
  const Dims& d = *t.dims;
  const Dims& s = *t.strides;
  if (std::any_of(d.begin(), d.end(), [](int64_t n) { return n <= 0; })) {
    return CUDNN_STATUS_BAD_PARAM;
  }
  int64_t elements = 1;
  for (const int64_t n : d) {
    if (n > kMaxDim || __builtin_mul_overflow(elements, n, &elements) || elements > kMaxElements) {
      return CUDNN_STATUS_NOT_SUPPORTED;
    }
  }
  if (*t.alignment < 1 || !std::has_single_bit(uint64_t(*t.alignment))) {
    return CUDNN_STATUS_BAD_PARAM;
  }
  const auto packed = [&](const Dims& want) {
    for (size_t i = 0; i < 4; ++i) {
      if (d[i] > 1 && s[i] != want[i]) return false;
    }
    return true;
  };
  const bool nchw = packed({d[1] * d[2] * d[3], d[2] * d[3], d[3], 1});
  const bool nhwc = packed({d[1] * d[2] * d[3], 1, d[3] * d[1], d[1]});
  if (!nchw && !nhwc) return CUDNN_STATUS_NOT_SUPPORTED;
  t.info = TensorInfo{*t.data_type, d, *t.uid, *t.alignment, nchw, nhwc};
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t finalize_conv(ConvDesc& c) {
  if (!c.compute || !c.mode || !c.spatial_dims || !c.dilations || !c.strides || !c.pre || !c.post) {
    return CUDNN_STATUS_BAD_PARAM;
  }
  for (size_t i = 0; i < 2; ++i) {
    if ((*c.dilations)[i] < 1 || (*c.strides)[i] < 1 || (*c.pre)[i] < 0 || (*c.post)[i] < 0) {
      return CUDNN_STATUS_BAD_PARAM;
    }
  }
  const auto too_large = [](const Pair& p) { return p[0] > kMaxDim || p[1] > kMaxDim; };
  // Only what the emulator computes: 2-D cross-correlation, symmetric padding.
  if (*c.mode != CUDNN_CROSS_CORRELATION || *c.spatial_dims != 2 || *c.post != *c.pre ||
      detail::element_bytes(*c.compute) == 0 || too_large(*c.dilations) || too_large(*c.strides) ||
      too_large(*c.pre)) {
    return CUDNN_STATUS_NOT_SUPPORTED;
  }
  c.info = ConvInfo{*c.compute, *c.pre, *c.strides, *c.dilations};
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t finalize_op(OpDesc& o) {
  if (!o.x.usable() || !o.w.usable() || !o.y.usable() || !o.conv.usable() || !o.alpha || !o.beta) {
    return CUDNN_STATUS_BAD_PARAM;
  }
  const TensorInfo &x = o.x.info, &w = o.w.info, &y = o.y.info;
  const ConvInfo& conv = o.conv.info;
  if (x.type != w.type || x.type != y.type) return CUDNN_STATUS_BAD_PARAM;
  if (x.uid == w.uid || x.uid == y.uid || w.uid == y.uid) return CUDNN_STATUS_BAD_PARAM;
  const bool nchw = x.nchw && w.nchw && y.nchw, nhwc = x.nhwc && w.nhwc && y.nhwc;
  if (!nchw && !nhwc) return CUDNN_STATUS_BAD_PARAM;
  Conv2dGeometry g{x.dims[0],
                   x.dims[1],
                   x.dims[2],
                   x.dims[3],
                   w.dims[0],
                   w.dims[2],
                   w.dims[3],
                   conv.stride[0],
                   conv.stride[1],
                   conv.pad[0],
                   conv.pad[1],
                   conv.dilation[0],
                   conv.dilation[1],
                   0,
                   0};
  if (!detail::complete_geometry(g) || w.dims[1] != x.dims[1] ||
      y.dims != Dims{g.n, g.o, g.ho, g.wo}) {
    return CUDNN_STATUS_BAD_PARAM;
  }
  // f64 computes in f64; f32, f16 and bf16 in f32 (the emulator has no f16 arithmetic).
  if (conv.compute != (x.type == CUDNN_DATA_DOUBLE ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT)) {
    return CUDNN_STATUS_NOT_SUPPORTED;
  }
  o.info =
      OpInfo{pass_of(o.type), x, w, y, g, nchw ? Layout::nchw : Layout::nhwc, *o.alpha, *o.beta};
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t finalize_graph(GraphDesc& g) {
  if (!g.handle || !g.op.usable()) return CUDNN_STATUS_BAD_PARAM;
  if (g.ops != 1) return CUDNN_STATUS_NOT_SUPPORTED;  // one convolution per graph
  g.info = g.op.info;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t finalize_heur(HeurDesc& h) {
  if (!h.graph.usable() || !h.mode) return CUDNN_STATUS_BAD_PARAM;
  h.engines = offered(*h.mode);
  detail::count_call(heuristics_call(*h.mode));
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t finalize_engine(EngineDesc& e) {
  if (!e.graph.usable() || !e.index || *e.index < 0 || *e.index >= kEngines) {
    return CUDNN_STATUS_BAD_PARAM;
  }
  e.info = EngineInfo{e.graph.info, *e.index};
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t finalize_cfg(EngineCfgDesc& c) {
  if (!c.engine.usable()) return CUDNN_STATUS_BAD_PARAM;
  c.info = c.engine.info;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t finalize_plan(PlanDesc& p) {
  if (!p.handle || !p.config.usable()) return CUDNN_STATUS_BAD_PARAM;
  const EngineInfo& e = p.config.info;
  const EngineSpec& spec = engine_spec(e.index);
  // Engine 3 cannot be built; and no engine here scales its result (alpha = 1, beta = 0 only).
  if (!spec.buildable || e.op.alpha != 1 || e.op.beta != 0) return CUDNN_STATUS_NOT_SUPPORTED;
  p.info = e;
  p.workspace = spec.workspace;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t finalize_pack(PackDesc& p) {
  if (!p.uids || !p.pointers || p.uids->size() != p.pointers->size()) {
    return CUDNN_STATUS_BAD_PARAM;
  }
  std::vector<int64_t> sorted = *p.uids;
  std::sort(sorted.begin(), sorted.end());
  if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end()) {
    return CUDNN_STATUS_BAD_PARAM;
  }
  return CUDNN_STATUS_SUCCESS;
}

// ---- GetAttribute ----

// Hands out an attribute of n values: with requested = 0 only their number, in *count; otherwise
// the first min(requested, n), and their number in *count.
template <class T>
cudnnStatus_t put(const T* values, int64_t n, int64_t requested, int64_t* count, void* elements) {
  if (requested == 0) {
    *count = n;
    return CUDNN_STATUS_SUCCESS;
  }
  const int64_t m = std::min(requested, n);
  if (m > 0) std::memcpy(elements, values, size_t(m) * sizeof(T));
  *count = m;
  return CUDNN_STATUS_SUCCESS;
}

// Fills the caller's ENGINECFG descriptors with the heuristics' results, best first.
cudnnStatus_t get_results(const HeurDesc& h, cudnnBackendAttributeType_t type, int64_t requested,
                          int64_t* count, void* elements) {
  if (type != CUDNN_TYPE_BACKEND_DESCRIPTOR) return CUDNN_STATUS_BAD_PARAM;
  const int64_t n = int64_t(h.engines.size());
  if (requested == 0) {
    *count = n;
    return CUDNN_STATUS_SUCCESS;
  }
  const int64_t m = std::min(requested, n);
  std::vector<EngineCfgDesc*> configs;
  for (int64_t i = 0; i < m; ++i) {
    cudnnBackendDescriptor_t d;
    std::memcpy(&d, static_cast<const char*>(elements) + size_t(i) * sizeof(d), sizeof(d));
    EngineCfgDesc* c = lookup_as<EngineCfgDesc>(d, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
    if (c == nullptr) return CUDNN_STATUS_BAD_PARAM;
    configs.push_back(c);
  }
  for (int64_t i = 0; i < m; ++i) {
    EngineCfgDesc& c = *configs[size_t(i)];
    c.engine = {};
    c.info = EngineInfo{h.graph.info, h.engines[size_t(i)]};
    c.finalized = true;
  }
  *count = m;
  return CUDNN_STATUS_SUCCESS;
}

// Fills the caller's ENGINE descriptor with a configuration's engine.
cudnnStatus_t get_engine(const EngineCfgDesc& c, cudnnBackendAttributeType_t type,
                         int64_t requested, int64_t* count, void* elements) {
  if (type != CUDNN_TYPE_BACKEND_DESCRIPTOR) return CUDNN_STATUS_BAD_PARAM;
  if (requested > 0) {
    cudnnBackendDescriptor_t d;
    std::memcpy(&d, elements, sizeof(d));
    EngineDesc* e = lookup_as<EngineDesc>(d, CUDNN_BACKEND_ENGINE_DESCRIPTOR);
    if (e == nullptr) return CUDNN_STATUS_BAD_PARAM;
    e->graph = {};
    e->index.reset();
    e->info = c.info;
    e->finalized = true;
  }
  *count = 1;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t get_engine_attr(const EngineDesc& e, cudnnBackendAttributeName_t name,
                              cudnnBackendAttributeType_t type, int64_t requested, int64_t* count,
                              void* elements) {
  switch (name) {
    case CUDNN_ATTR_ENGINE_GLOBAL_INDEX:
      if (type != CUDNN_TYPE_INT64) return CUDNN_STATUS_BAD_PARAM;
      return put(&e.info.index, 1, requested, count, elements);
    case CUDNN_ATTR_ENGINE_NUMERICAL_NOTE: {
      if (type != CUDNN_TYPE_NUMERICAL_NOTE) return CUDNN_STATUS_BAD_PARAM;
      const std::vector<cudnnBackendNumericalNote_t>& notes = engine_spec(e.info.index).notes;
      return put(notes.data(), int64_t(notes.size()), requested, count, elements);
    }
    case CUDNN_ATTR_ENGINE_BEHAVIOR_NOTE: {
      if (type != CUDNN_TYPE_BEHAVIOR_NOTE) return CUDNN_STATUS_BAD_PARAM;
      const cudnnBackendBehaviorNote_t none[1] = {};  // the emulated engines have no such note
      return put(none, 0, requested, count, elements);
    }
    default:
      return CUDNN_STATUS_BAD_PARAM;
  }
}

// ---- Execute ----

// The pointer of `uid` in the pack (nullptr when it has none).
void* pointer_of(const PackDesc& pack, int64_t uid) {
  for (size_t i = 0; i < pack.uids->size(); ++i) {
    if ((*pack.uids)[i] == uid) return (*pack.pointers)[i];
  }
  return nullptr;
}

}  // namespace

cudnnStatus_t cudnnBackendCreateDescriptor(cudnnBackendDescriptorType_t type,
                                           cudnnBackendDescriptor_t* desc) {
  if (desc == nullptr) return CUDNN_STATUS_BAD_PARAM;
  Descriptor* d = make(type);
  if (d == nullptr) return CUDNN_STATUS_NOT_SUPPORTED;
  {
    std::lock_guard<std::mutex> lock(registry_mu);
    registry.insert(static_cast<void*>(d));
  }
  ++detail::live_descriptors;
  ++created[size_t(type)];
  rg::emu::library_object_created(creation_name(type));
  *desc = static_cast<void*>(d);
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBackendDestroyDescriptor(cudnnBackendDescriptor_t desc) {
  {
    std::lock_guard<std::mutex> lock(registry_mu);
    if (desc == nullptr || registry.erase(desc) == 0) return CUDNN_STATUS_BAD_PARAM;
  }
  --detail::live_descriptors;
  delete static_cast<Descriptor*>(desc);
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBackendSetAttribute(cudnnBackendDescriptor_t desc,
                                       cudnnBackendAttributeName_t name,
                                       cudnnBackendAttributeType_t type, int64_t count,
                                       const void* elements) {
  Descriptor* d = lookup(desc);
  if (d == nullptr || d->finalized || count < 0 || (count > 0 && elements == nullptr)) {
    return CUDNN_STATUS_BAD_PARAM;
  }
  const Elements e{type, count, elements};
  switch (d->type) {
    case CUDNN_BACKEND_TENSOR_DESCRIPTOR:
      return set_tensor(*static_cast<TensorDesc*>(d), name, e);
    case CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR:
      return set_conv(*static_cast<ConvDesc*>(d), name, e);
    case CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR:
    case CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR:
    case CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR:
      return set_op(*static_cast<OpDesc*>(d), name, e);
    case CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR:
      return set_graph(*static_cast<GraphDesc*>(d), name, e);
    case CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR:
      return set_heur(*static_cast<HeurDesc*>(d), name, e);
    case CUDNN_BACKEND_ENGINE_DESCRIPTOR:
      return set_engine(*static_cast<EngineDesc*>(d), name, e);
    case CUDNN_BACKEND_ENGINECFG_DESCRIPTOR:
      if (name != CUDNN_ATTR_ENGINECFG_ENGINE) return CUDNN_STATUS_BAD_PARAM;
      return set_ref(e, {CUDNN_BACKEND_ENGINE_DESCRIPTOR}, static_cast<EngineCfgDesc*>(d)->engine);
    case CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR:
      return set_plan(*static_cast<PlanDesc*>(d), name, e);
    case CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR:
      return set_pack(*static_cast<PackDesc*>(d), name, e);
    default:
      return CUDNN_STATUS_BAD_PARAM;
  }
}

cudnnStatus_t cudnnBackendFinalize(cudnnBackendDescriptor_t desc) {
  Descriptor* d = lookup(desc);
  if (d == nullptr || d->finalized) return CUDNN_STATUS_BAD_PARAM;
  cudnnStatus_t status = CUDNN_STATUS_BAD_PARAM;
  switch (d->type) {
    case CUDNN_BACKEND_TENSOR_DESCRIPTOR:
      status = finalize_tensor(*static_cast<TensorDesc*>(d));
      break;
    case CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR:
      status = finalize_conv(*static_cast<ConvDesc*>(d));
      break;
    case CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR:
    case CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR:
    case CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR:
      status = finalize_op(*static_cast<OpDesc*>(d));
      break;
    case CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR:
      status = finalize_graph(*static_cast<GraphDesc*>(d));
      break;
    case CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR:
      status = finalize_heur(*static_cast<HeurDesc*>(d));
      break;
    case CUDNN_BACKEND_ENGINE_DESCRIPTOR:
      status = finalize_engine(*static_cast<EngineDesc*>(d));
      break;
    case CUDNN_BACKEND_ENGINECFG_DESCRIPTOR:
      status = finalize_cfg(*static_cast<EngineCfgDesc*>(d));
      break;
    case CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR:
      status = finalize_plan(*static_cast<PlanDesc*>(d));
      break;
    case CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR:
      status = finalize_pack(*static_cast<PackDesc*>(d));
      break;
    default:
      break;
  }
  d->finalized = status == CUDNN_STATUS_SUCCESS;
  return status;
}

cudnnStatus_t cudnnBackendGetAttribute(cudnnBackendDescriptor_t const desc,
                                       cudnnBackendAttributeName_t name,
                                       cudnnBackendAttributeType_t type, int64_t requested,
                                       int64_t* count, void* elements) {
  const Descriptor* d = lookup(desc);
  if (d == nullptr || !d->finalized || count == nullptr || requested < 0 ||
      (requested > 0 && elements == nullptr)) {
    return CUDNN_STATUS_BAD_PARAM;
  }
  switch (d->type) {
    case CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR:
      if (name != CUDNN_ATTR_ENGINEHEUR_RESULTS) break;
      return get_results(*static_cast<const HeurDesc*>(d), type, requested, count, elements);
    case CUDNN_BACKEND_ENGINECFG_DESCRIPTOR:
      if (name != CUDNN_ATTR_ENGINECFG_ENGINE) break;
      return get_engine(*static_cast<const EngineCfgDesc*>(d), type, requested, count, elements);
    case CUDNN_BACKEND_ENGINE_DESCRIPTOR:
      return get_engine_attr(*static_cast<const EngineDesc*>(d), name, type, requested, count,
                             elements);
    case CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR:
      if (name != CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE || type != CUDNN_TYPE_INT64) break;
      return put(&static_cast<const PlanDesc*>(d)->workspace, 1, requested, count, elements);
    default:
      break;
  }
  return CUDNN_STATUS_BAD_PARAM;
}

cudnnStatus_t cudnnBackendExecute(cudnnHandle_t handle, cudnnBackendDescriptor_t plan_desc,
                                  cudnnBackendDescriptor_t variant_pack) {
  const auto* plan = lookup_as<PlanDesc>(plan_desc, CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
  const auto* pack = lookup_as<PackDesc>(variant_pack, CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  if (handle == nullptr || plan == nullptr || !plan->finalized || pack == nullptr ||
      !pack->finalized) {
    return CUDNN_STATUS_BAD_PARAM;
  }
  const OpInfo& op = plan->info.op;
  // Every operand, at least as aligned as its tensor says; the workspace when the plan needs one.
  void* ptrs[3] = {};
  const TensorInfo* tensors[3] = {&op.x, &op.w, &op.y};
  for (size_t i = 0; i < 3; ++i) {
    ptrs[i] = pointer_of(*pack, tensors[i]->uid);
    if (ptrs[i] == nullptr ||
        reinterpret_cast<uintptr_t>(ptrs[i]) % uint64_t(tensors[i]->alignment) != 0) {
      return CUDNN_STATUS_BAD_PARAM;
    }
  }
  if (plan->workspace > 0 && pack->workspace == nullptr) return CUDNN_STATUS_BAD_PARAM;
  void *x = ptrs[0], *w = ptrs[1], *y = ptrs[2];
  const int64_t engine = plan->info.index;
  if (!engine_spec(engine).runs) return CUDNN_STATUS_EXECUTION_FAILED;
  const bool tf32 = op.x.type == CUDNN_DATA_FLOAT &&
                    has_note(engine, CUDNN_NUMERICAL_NOTE_TENSOR_CORE) &&
                    !rg::emu::tf32_overridden_off();
  // (a, b) -> out as dispatch takes them: (x, w) -> y, (w, dy) -> dx, (x, dy) -> dw.
  const void* a = op.pass == Pass::data ? w : x;
  const void* b = op.pass == Pass::forward ? w : y;
  void* out = op.pass == Pass::forward ? y : op.pass == Pass::data ? x : w;
  void* workspace = plan->workspace > 0 ? pack->workspace : nullptr;
  const detail::ConvCall call{
      "cudnnBackendExecute",  op.x.type, tf32, op.pass, op.g, op.layout, a, b, out, workspace,
      size_t(plan->workspace)};
  ++engine_runs[size_t(engine)];
  return detail::dispatch(handle, call);
}

namespace rg::emu {
void cudnn_set_graph_engines(CudnnGraphEngines offer) { graph_engines.store(offer); }
int64_t cudnn_engine_executions(int64_t global_index) {
  return global_index >= 0 && global_index < kEngines ? engine_runs[size_t(global_index)].load()
                                                      : 0;
}
int64_t cudnn_backend_created(cudnnBackendDescriptorType_t type) {
  const int64_t t = type;
  return t >= 0 && t < kTypeSlots ? created[size_t(t)].load() : 0;
}
}  // namespace rg::emu
