// Conv2d<Cuda>'s convolutions through cuDNN's graph (backend) API, libcudnn's own cudnnBackend*
// C functions (no cudnn-frontend): one operation graph per pass, the engine configurations from
// cuDNN's heuristics (mode A, then mode B, then the fallback list), filtered as PyTorch filters
// them (no engine that down-converts its inputs; no tensor-core engine for f32 without TF32; only
// deterministic engines under set_deterministic_algorithms), then, as the legacy API's choice in
// conv2d.cu, the first deterministic one whose execution plan finalizes within
// kMaxConvWorkspaceBytes, else the first non-deterministic one, in the first list that has one; or
// with benchmark the fastest of mode A's usable ones, timed once. The choice is made once per
// configuration (kernels/conv_algo_cache.h, shared by every thread); the choosing thread keeps the
// plan it built, and each other (thread, handle) builds the descriptors and the plan of a
// configuration once and keeps them, and the variant packs of the pointer sets it has run, so
// that a steady training step creates no descriptor. Where no engine is usable, or a plan fails
// its first run, conv2d.cu runs the legacy API.
#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <initializer_list>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kernels/algorithm_policy.h"
#include "kernels/conv_algo_cache.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/conv2d_graph.h"
#include "kernels/cuda/cudnn_common.h"
#include "kernels/error.h"

namespace rg::kernels::cuda {

const char* pass_name(CudnnPass pass) {
  return pass == CudnnPass::forward         ? "conv2d forward"
         : pass == CudnnPass::backward_data ? "conv2d backward (input gradient)"
                                            : "conv2d backward (weight gradient)";
}

std::string describe(const Conv2dGeometry& g, CudnnPass pass) {
  return ::rg::detail::cat("the ", pass_name(pass), " of ", g.n, "x", g.c, "x", g.h, "x", g.w,
                           g.channels_last ? " (NHWC), " : " (NCHW), ", g.o, " filters of ", g.kh,
                           "x", g.kw, ", stride ", g.sh, "x", g.sw, ", padding ", g.ph, "x", g.pw,
                           ", dilation ", g.dh, "x", g.dw);
}

void log_choice(const char* api, const Conv2dGeometry& g, CudnnPass pass, cudnnDataType_t type,
                const std::string& what) {
  const char* on = std::getenv("RG_CUDNN_LOG");
  if (on == nullptr || *on == '\0' || std::string_view(on) == "0") return;
  const char* dtype = type == CUDNN_DATA_DOUBLE  ? "f64"
                      : type == CUDNN_DATA_FLOAT ? "f32"
                      : type == CUDNN_DATA_HALF  ? "f16"
                                                 : "bf16";
  std::fprintf(stderr, "ringgrad: cuDNN %s: %s, %s: %s\n", api, describe(g, pass).c_str(), dtype,
               what.c_str());
}

namespace conv_graph {
namespace {

// The operands' unique ids in every operation graph: x (or dx), w (or dw), y (or dy).
constexpr int64_t kUidX = 1, kUidW = 2, kUidY = 3;
// The alignment the plans assume when the operands are not known yet (workspace_bytes).
constexpr int64_t kAssumedAlignment = 16;
// How many of mode A's usable engines benchmark times.
constexpr size_t kBenchmarkCandidates = 8;
// Variant packs kept per plan (one per pointer set run); beyond it the plan's are dropped.
constexpr size_t kMaxVariantPacks = 64;

// cuDNN 9 deprecates the handle attributes of the operation graph and the execution plan (from
// 9.8.0 the graph needs none, and the plan only to be deserialized); older cuDNN 9 releases
// require them. So they are set where accepted (a release that refuses them is not an error), by
// value, to keep the deprecation warnings out of a -Werror build.
constexpr auto kGraphHandle = static_cast<cudnnBackendAttributeName_t>(800);
constexpr auto kPlanHandle = static_cast<cudnnBackendAttributeName_t>(400);

// Owns one backend descriptor.
class Desc {
 public:
  explicit Desc(cudnnBackendDescriptorType_t type) {
    RG_CUDA_CHECK(cudnnBackendCreateDescriptor(type, &d_));
  }
  ~Desc() {
    if (d_ != nullptr) (void)cudnnBackendDestroyDescriptor(d_);
  }
  Desc(Desc&& other) noexcept : d_(std::exchange(other.d_, nullptr)) {}
  Desc& operator=(Desc&& other) noexcept {
    std::swap(d_, other.d_);
    return *this;
  }
  Desc(const Desc&) = delete;
  Desc& operator=(const Desc&) = delete;

  cudnnBackendDescriptor_t get() const { return d_; }
  template <class V>
  void set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, const V* values,
           int64_t count = 1) {
    RG_CUDA_CHECK(cudnnBackendSetAttribute(d_, name, type, count, values));
  }
  void set_desc(cudnnBackendAttributeName_t name, const Desc& value) {
    const cudnnBackendDescriptor_t v = value.get();
    set(name, CUDNN_TYPE_BACKEND_DESCRIPTOR, &v);
  }
  void finalize() { RG_CUDA_CHECK(cudnnBackendFinalize(d_)); }

 private:
  cudnnBackendDescriptor_t d_ = nullptr;
};

// What one configuration is: the pass, the geometry, the data type and the math.
struct Config {
  Conv2dGeometry g;
  CudnnPass pass;
  cudnnDataType_t type;
  bool allow_tf32;
  int64_t alignment;
  int64_t limit;  // the most workspace a plan may take
};

Desc tensor(int64_t uid, cudnnDataType_t type, std::array<int64_t, 4> dims, int64_t alignment,
            bool channels_last) {
  Desc t(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
  // Packed NCHW, or NHWC (channels last); the dimensions are in NCHW order either way.
  const std::array<int64_t, 4> strides =
      channels_last
          ? std::array<int64_t, 4>{dims[1] * dims[2] * dims[3], 1, dims[3] * dims[1], dims[1]}
          : std::array<int64_t, 4>{dims[1] * dims[2] * dims[3], dims[2] * dims[3], dims[3], 1};
  t.set(CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, &type);
  t.set(CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, dims.data(), 4);
  t.set(CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, strides.data(), 4);
  t.set(CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, &uid);
  t.set(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, &alignment);
  t.finalize();
  return t;
}

// The operation graph of one configuration, and the descriptors it was made of.
struct OpGraph {
  Desc x, w, y, conv, op, graph;
};

OpGraph op_graph(cudnnHandle_t h, const Config& c) {
  const Conv2dGeometry& g = c.g;
  const bool f64 = c.type == CUDNN_DATA_DOUBLE;
  OpGraph o{
      tensor(kUidX, c.type, {g.n, g.c, g.h, g.w}, c.alignment, g.channels_last),
      tensor(kUidW, c.type, {g.o, g.c, g.kh, g.kw}, c.alignment, g.channels_last),
      tensor(kUidY, c.type, {g.n, g.o, g.ho, g.wo}, c.alignment, g.channels_last),
      Desc(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR),
      Desc(c.pass == CudnnPass::forward ? CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR
           : c.pass == CudnnPass::backward_data
               ? CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR
               : CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR),
      Desc(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR)};
  // f16 and bf16 accumulate in f32, as the legacy path's convolution descriptor says.
  const cudnnDataType_t compute = f64 ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT;
  const cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
  const int64_t spatial = 2;
  const std::array<int64_t, 2> pad{g.ph, g.pw}, stride{g.sh, g.sw}, dilation{g.dh, g.dw};
  o.conv.set(CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, &compute);
  o.conv.set(CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, &mode);
  o.conv.set(CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, CUDNN_TYPE_INT64, &spatial);
  o.conv.set(CUDNN_ATTR_CONVOLUTION_DILATIONS, CUDNN_TYPE_INT64, dilation.data(), 2);
  o.conv.set(CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, CUDNN_TYPE_INT64, stride.data(), 2);
  o.conv.set(CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, CUDNN_TYPE_INT64, pad.data(), 2);
  o.conv.set(CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, CUDNN_TYPE_INT64, pad.data(), 2);
  o.conv.finalize();

  // alpha and beta are double for f64 compute, float otherwise.
  const double alpha64 = 1, beta64 = 0;
  const float alpha32 = 1, beta32 = 0;
  const auto scales = [&](cudnnBackendAttributeName_t alpha, cudnnBackendAttributeName_t beta) {
    if (f64) {
      o.op.set(alpha, CUDNN_TYPE_DOUBLE, &alpha64);
      o.op.set(beta, CUDNN_TYPE_DOUBLE, &beta64);
    } else {
      o.op.set(alpha, CUDNN_TYPE_FLOAT, &alpha32);
      o.op.set(beta, CUDNN_TYPE_FLOAT, &beta32);
    }
  };
  switch (c.pass) {
    case CudnnPass::forward:
      o.op.set_desc(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X, o.x);
      o.op.set_desc(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W, o.w);
      o.op.set_desc(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y, o.y);
      o.op.set_desc(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC, o.conv);
      scales(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA,
             CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA);
      break;
    case CudnnPass::backward_data:
      o.op.set_desc(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX, o.x);
      o.op.set_desc(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W, o.w);
      o.op.set_desc(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY, o.y);
      o.op.set_desc(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC, o.conv);
      scales(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA,
             CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA);
      break;
    case CudnnPass::backward_weight:
      o.op.set_desc(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X, o.x);
      o.op.set_desc(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW, o.w);
      o.op.set_desc(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY, o.y);
      o.op.set_desc(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC, o.conv);
      scales(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA,
             CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA);
      break;
  }
  o.op.finalize();
  o.graph.set_desc(CUDNN_ATTR_OPERATIONGRAPH_OPS, o.op);
  (void)cudnnBackendSetAttribute(o.graph.get(), kGraphHandle, CUDNN_TYPE_HANDLE, 1, &h);
  o.graph.finalize();
  return o;
}

// The engine configurations cuDNN's heuristics rank for `graph` in `mode`, best first (none when
// the mode has no answer for it).
std::vector<Desc> engine_configs(const OpGraph& o, cudnnBackendHeurMode_t mode) {
  Desc heur(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
  heur.set_desc(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, o.graph);
  heur.set(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, &mode);
  // Mode B's heuristics are not safe to finalize on several threads at once (cudnn-frontend
  // serializes them with a process-wide mutex); the choice runs outside ConvAlgoCache's lock.
  static std::mutex mode_b;
  std::unique_lock<std::mutex> serial(mode_b, std::defer_lock);
  if (mode == CUDNN_HEUR_MODE_B) serial.lock();
  if (cudnnBackendFinalize(heur.get()) != CUDNN_STATUS_SUCCESS) return {};
  if (serial.owns_lock()) serial.unlock();
  int64_t count = 0;
  RG_CUDA_CHECK(cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                         CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, nullptr));
  std::vector<Desc> configs;
  std::vector<cudnnBackendDescriptor_t> raw;
  for (int64_t i = 0; i < count; ++i) {
    configs.emplace_back(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
    raw.push_back(configs.back().get());
  }
  int64_t got = 0;
  RG_CUDA_CHECK(cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                         CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &got, raw.data()));
  // Only the first `got` were filled.
  configs.erase(configs.begin() + std::clamp<int64_t>(got, 0, count), configs.end());
  return configs;
}

struct Engine {
  int64_t index = -1;  // cuDNN's global engine index
  bool usable = false;
  bool deterministic = true;
};

// The engine of `config` and whether the policy allows it (see the file comment). An engine whose
// index or notes cannot be read is not usable (the next configuration may be).
Engine engine_of(const Desc& config, const Config& c, bool deterministic) {
  Desc engine(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
  cudnnBackendDescriptor_t raw = engine.get();
  int64_t count = 0;
  Engine e;
  std::array<cudnnBackendNumericalNote_t, CUDNN_NUMERICAL_NOTE_TYPE_COUNT> notes;
  notes.fill(CUDNN_NUMERICAL_NOTE_TYPE_COUNT);
  int64_t noted = 0;
  if (cudnnBackendGetAttribute(config.get(), CUDNN_ATTR_ENGINECFG_ENGINE,
                               CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &count,
                               &raw) != CUDNN_STATUS_SUCCESS ||
      cudnnBackendGetAttribute(engine.get(), CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1,
                               &count, &e.index) != CUDNN_STATUS_SUCCESS ||
      cudnnBackendGetAttribute(engine.get(), CUDNN_ATTR_ENGINE_NUMERICAL_NOTE,
                               CUDNN_TYPE_NUMERICAL_NOTE, int64_t(notes.size()), &noted,
                               notes.data()) != CUDNN_STATUS_SUCCESS) {
    return e;
  }
  e.usable = true;
  for (int64_t i = 0; i < std::min<int64_t>(noted, int64_t(notes.size())); ++i) {
    const cudnnBackendNumericalNote_t note = notes[size_t(i)];
    if (note == CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS) e.usable = false;
    if (note == CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC) {
      e.deterministic = false;
      if (deterministic) e.usable = false;
    }
    if (note == CUDNN_NUMERICAL_NOTE_TENSOR_CORE && c.type == CUDNN_DATA_FLOAT && !c.allow_tf32) {
      e.usable = false;
    }
  }
  return e;
}

struct Plan {
  Desc plan;
  int64_t workspace = 0;
};

// The execution plan of `config`, or none when cuDNN cannot build it (or it needs more than
// `limit` bytes of workspace).
std::unique_ptr<Plan> make_plan(cudnnHandle_t h, const Desc& config, int64_t limit) {
  auto p = std::make_unique<Plan>(Plan{Desc(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR), 0});
  (void)cudnnBackendSetAttribute(p->plan.get(), kPlanHandle, CUDNN_TYPE_HANDLE, 1, &h);
  p->plan.set_desc(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, config);
  if (cudnnBackendFinalize(p->plan.get()) != CUDNN_STATUS_SUCCESS) return nullptr;
  int64_t count = 0;
  RG_CUDA_CHECK(cudnnBackendGetAttribute(p->plan.get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                         CUDNN_TYPE_INT64, 1, &count, &p->workspace));
  if (p->workspace < 0 || p->workspace > limit) return nullptr;
  return p;
}

// The engine chosen for one configuration: heuristics mode and position in its list.
struct Choice {
  bool available = false;  // false: the legacy API serves this configuration
  cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
  int64_t position = 0;
  int64_t engine = -1;
  int64_t workspace = 0;
  bool deterministic = true;
  bool timed = false;  // the fastest of benchmark's candidates
};

size_t element_bytes(cudnnDataType_t type) {
  return type == CUDNN_DATA_DOUBLE ? 8 : type == CUDNN_DATA_FLOAT ? 4 : 2;
}

struct Operands {
  const void* a;
  const void* b;
  void* out;
};

// The pointers of the x, w and y uids, in that order.
std::array<void*, 3> by_uid(CudnnPass pass, Operands o) {
  void* a = const_cast<void*>(o.a);
  void* b = const_cast<void*>(o.b);
  switch (pass) {
    case CudnnPass::forward:
      return {a, b, o.out};
    case CudnnPass::backward_data:
      return {o.out, a, b};
    case CudnnPass::backward_weight:
      break;
  }
  return {a, o.out, b};
}

Desc variant_pack(CudnnPass pass, Operands o, void* workspace) {
  Desc pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  const std::array<int64_t, 3> uids{kUidX, kUidW, kUidY};
  std::array<void*, 3> ptrs = by_uid(pass, o);
  pack.set(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, uids.data(), 3);
  pack.set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, ptrs.data(), 3);
  pack.set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, &workspace);
  pack.finalize();
  return pack;
}

// Device scratch for timing: freed (after the device finishes with it) on scope exit.
class Scratch {
 public:
  Scratch(size_t bytes, cudaStream_t stream) {
    if (bytes == 0) return;
    if (cudaMalloc(&p_, bytes) != cudaSuccess) {
      // Out of memory (the caching allocator holds the device's memory): no timing. The error
      // is cleared so that it is not blamed on the next launch.
      (void)cudaGetLastError();
      p_ = nullptr;
      throw std::bad_alloc();
    }
    // Zeros, so that no engine times NaN or denormal inputs.
    RG_CUDA_CHECK(cudaMemsetAsync(p_, 0, bytes, stream));
  }
  ~Scratch() {
    if (p_ != nullptr) (void)cudaFree(p_);
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  void* get() const { return p_; }

 private:
  void* p_ = nullptr;
};

// The milliseconds of one run of `plan` on the handle's stream (the best of two, after a warm-up
// run), on scratch operands.
float time_plan(cudnnHandle_t h, cudaStream_t stream, const Plan& plan, const Config& c, Operands o,
                void* workspace) {
  Desc pack = variant_pack(c.pass, o, workspace);
  cudaEvent_t start = nullptr, stop = nullptr;
  RG_CUDA_CHECK(cudaEventCreate(&start));
  RG_CUDA_CHECK(cudaEventCreate(&stop));
  float best = -1;
  try {
    RG_CUDA_CHECK(cudnnBackendExecute(h, plan.plan.get(), pack.get()));
    for (int i = 0; i < 2; ++i) {
      RG_CUDA_CHECK(cudaEventRecord(start, stream));
      RG_CUDA_CHECK(cudnnBackendExecute(h, plan.plan.get(), pack.get()));
      RG_CUDA_CHECK(cudaEventRecord(stop, stream));
      RG_CUDA_CHECK(cudaEventSynchronize(stop));
      float ms = 0;
      RG_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
      best = best < 0 ? ms : std::min(best, ms);
    }
  } catch (...) {
    (void)cudaEventDestroy(start);
    (void)cudaEventDestroy(stop);
    throw;
  }
  (void)cudaEventDestroy(start);
  (void)cudaEventDestroy(stop);
  return best;
}

// The configuration and plan of a choice, as the thread that made the choice built them.
struct Built {
  std::optional<Desc> config;
  std::unique_ptr<Plan> plan;
};

// Benchmark: runs each of mode A's usable engines (at most kBenchmarkCandidates) and keeps the
// fastest. None usable in mode A: no choice here (the caller takes the heuristics path).
Choice benchmark(cudnnHandle_t h, cudaStream_t stream, const OpGraph& o, const Config& c,
                 bool deterministic, int64_t limit, Built& built) {
  std::vector<Desc> configs = engine_configs(o, CUDNN_HEUR_MODE_A);
  std::vector<std::pair<Choice, std::unique_ptr<Plan>>> candidates;
  for (size_t i = 0; i < configs.size() && candidates.size() < kBenchmarkCandidates; ++i) {
    const Engine e = engine_of(configs[i], c, deterministic);
    if (!e.usable) continue;
    std::unique_ptr<Plan> plan = make_plan(h, configs[i], limit);
    if (plan == nullptr) continue;
    const Choice choice{
        true, CUDNN_HEUR_MODE_A, int64_t(i), e.index, plan->workspace, e.deterministic, true};
    candidates.emplace_back(choice, std::move(plan));
  }
  if (candidates.empty()) return {};
  const Conv2dGeometry& g = c.g;
  const size_t elem = element_bytes(c.type);
  int64_t most = 0;
  for (const auto& cand : candidates) most = std::max(most, cand.first.workspace);
  std::unique_ptr<Scratch> x, w, y, workspace;
  try {
    x = std::make_unique<Scratch>(size_t(g.n * g.c * g.h * g.w) * elem, stream);
    w = std::make_unique<Scratch>(size_t(g.o * g.c * g.kh * g.kw) * elem, stream);
    y = std::make_unique<Scratch>(size_t(g.n * g.o * g.ho * g.wo) * elem, stream);
    workspace = std::make_unique<Scratch>(size_t(most), stream);
  } catch (const std::bad_alloc&) {
    return {};  // no memory to time in: the heuristics choose
  }
  const std::array<void*, 3> ptrs{x->get(), w->get(), y->get()};
  // The operands in the pass's order (by_uid's inverse).
  const Operands ops = c.pass == CudnnPass::forward         ? Operands{ptrs[0], ptrs[1], ptrs[2]}
                       : c.pass == CudnnPass::backward_data ? Operands{ptrs[1], ptrs[2], ptrs[0]}
                                                            : Operands{ptrs[0], ptrs[2], ptrs[1]};
  size_t fastest = candidates.size();
  float fastest_ms = -1;
  for (size_t i = 0; i < candidates.size(); ++i) {
    float ms = -1;
    try {
      ms = time_plan(h, stream, *candidates[i].second, c, ops, workspace->get());
    } catch (const std::exception&) {
      continue;  // an engine that fails to run is not a candidate
    }
    if (fastest_ms < 0 || ms < fastest_ms) {
      fastest = i;
      fastest_ms = ms;
    }
  }
  if (fastest == candidates.size()) return {};
  auto& [choice, plan] = candidates[fastest];
  built = {std::move(configs[size_t(choice.position)]), std::move(plan)};
  return choice;
}

// From the first list (mode A, then B, then the fallback list) with a usable engine whose plan
// builds: its first deterministic such engine, else its first such engine (as the legacy API's
// choice, so that runs repeat their bits unless no deterministic engine is at hand).
Choice heuristic(cudnnHandle_t h, const OpGraph& o, const Config& c, bool deterministic,
                 int64_t limit, Built& built) {
  for (cudnnBackendHeurMode_t mode :
       {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_B, CUDNN_HEUR_MODE_FALLBACK}) {
    std::vector<Desc> configs = engine_configs(o, mode);
    Choice first;
    Built first_built;
    for (size_t i = 0; i < configs.size(); ++i) {
      const Engine e = engine_of(configs[i], c, deterministic);
      if (!e.usable || (!e.deterministic && first.available)) continue;
      std::unique_ptr<Plan> plan = make_plan(h, configs[i], limit);
      if (plan == nullptr) continue;
      const Choice choice{true, mode, int64_t(i), e.index, plan->workspace, e.deterministic};
      if (e.deterministic) {
        built = {std::move(configs[i]), std::move(plan)};
        return choice;
      }
      first = choice;
      first_built = {std::move(configs[i]), std::move(plan)};
    }
    if (first.available) {
      built = std::move(first_built);
      return first;
    }
  }
  return {};
}

// Tells the user that a configuration fell back to the legacy API, and why: once per distinct
// (pass, reason) in the process, so that every kind of refusal shows without repeating.
void warn_fallback(const Config& c, const char* why) {
  static std::mutex mu;
  static std::set<std::pair<int, std::string>> told;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (!told.emplace(int(c.pass), why).second) return;
  }
  std::fprintf(stderr,
               "ringgrad: cuDNN's graph API could not serve a %s (%s); it runs through cuDNN's "
               "legacy API (shown once per pass and reason)\n",
               pass_name(c.pass), why);
}

ConvAlgoKey key_of(const Config& c, bool deterministic, bool benchmark) {
  int device = 0;
  RG_CUDA_CHECK(cudaGetDevice(&device));
  ConvAlgoKey key = conv_algo_key(device, int(c.pass), c.g, int(c.type), int(tensor_format(c.g)),
                                  c.allow_tf32, deterministic, benchmark);
  key.alignment = c.alignment;
  key.workspace_limit = c.limit == kMaxConvWorkspaceBytes ? 0 : c.limit;
  return key;
}

// One configuration's descriptors and plan on one (thread, handle), and the variant packs of the
// pointer sets it has run.
struct Prepared {
  OpGraph graph;
  Desc config;  // kept while the plan lives, as cudnn-frontend keeps it
  std::unique_ptr<Plan> plan;
  std::map<std::array<const void*, 4>, Desc> packs;
  bool ran = false;     // a run has succeeded
  bool failed = false;  // the first run failed: the legacy API serves the configuration
};

// The choice of `key`, made once per process (the first caller's handle and stream time it). The
// thread that makes it gets the plan it built for h in *mine (untouched otherwise), so that a
// plan is not finalized twice (runtime-compiled engines compile in their finalization).
Choice choose(cudnnHandle_t h, cudaStream_t stream, const Config& c, const ConvAlgoKey& key,
              std::unique_ptr<Prepared>* mine) {
  const int64_t limit = c.limit;
  static ConvAlgoCache<Choice> cache;
  return cache.get_or_choose(key, [&] {
    Choice choice;
    try {
      OpGraph o = op_graph(h, c);
      Built built;
      if (key.benchmark) choice = benchmark(h, stream, o, c, key.deterministic, limit, built);
      if (!choice.available) choice = heuristic(h, o, c, key.deterministic, limit, built);
      if (!choice.available) warn_fallback(c, "no usable engine");
      log_choice(
          "graph API", c.g, c.pass, c.type,
          choice.available
              ? ::rg::detail::cat("engine ", choice.engine, " (heuristics mode ",
                                  choice.mode == CUDNN_HEUR_MODE_A   ? "A"
                                  : choice.mode == CUDNN_HEUR_MODE_B ? "B"
                                                                     : "fallback",
                                  ", position ", choice.position,
                                  choice.deterministic ? ", deterministic" : ", non-deterministic",
                                  choice.timed ? ", the fastest timed" : "", ", workspace ",
                                  choice.workspace, " bytes)")
              : std::string("no usable engine: the legacy API serves it"));
      if (choice.available && built.plan != nullptr) {
        *mine = std::make_unique<Prepared>(
            Prepared{std::move(o), std::move(*built.config), std::move(built.plan), {}});
      }
    } catch (const std::exception& e) {
      warn_fallback(c, e.what());
      choice = {};
    }
    return choice;
  });
}

// The prepared plan of `c` on handle h (null: the legacy API serves it), built on the thread's
// first use of (h, c) from the process-wide choice.
Prepared* prepared(cudnnHandle_t h, cudaStream_t stream, const Config& c) {
  const bool deterministic = deterministic_algorithms(), bench = cudnn_benchmark();
  const ConvAlgoKey key = key_of(c, deterministic, bench);
  thread_local std::map<std::pair<cudnnHandle_t, ConvAlgoKey>, std::unique_ptr<Prepared>> cache;
  const auto it = cache.find({h, key});
  if (it != cache.end()) return it->second.get();
  // Choosing and building a plan (heuristics, plan finalization, benchmark's allocations and
  // synchronizations) cannot happen inside a CUDA graph capture.
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  RG_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
  RG_CHECK(capture == cudaStreamCaptureStatusNone, "cuda::conv2d: the ", pass_name(c.pass),
           " of a configuration first seen inside a CUDA graph capture (", c.g.n, "x", c.g.c, "x",
           c.g.h, "x", c.g.w, ", ", c.g.o, " filters of ", c.g.kh, "x", c.g.kw,
           "); run it once before capturing, as train::GraphStep's warm-up steps do");
  std::unique_ptr<Prepared> p;
  const Choice choice = choose(h, stream, c, key, &p);
  if (!choice.available) p.reset();
  if (choice.available && p == nullptr) {
    try {
      OpGraph o = op_graph(h, c);
      std::vector<Desc> configs = engine_configs(o, choice.mode);
      // The heuristics answer the same way every time: the chosen engine is at its position.
      const size_t at = size_t(choice.position);
      if (at < configs.size() && engine_of(configs[at], c, deterministic).index == choice.engine) {
        std::unique_ptr<Plan> plan = make_plan(h, configs[at], c.limit);
        if (plan != nullptr) {
          p = std::make_unique<Prepared>(
              Prepared{std::move(o), std::move(configs[at]), std::move(plan), {}});
        }
      }
      if (p == nullptr) warn_fallback(c, "the chosen engine's plan could not be rebuilt");
    } catch (const std::exception& e) {
      warn_fallback(c, e.what());
      p.reset();
    }
  }
  return cache.emplace(std::pair{h, key}, std::move(p)).first->second.get();
}

// The largest power of two (at most 16) that divides every pointer.
int64_t alignment_of(std::initializer_list<const void*> ptrs) {
  int64_t a = kAssumedAlignment;
  for (const void* p : ptrs) {
    while (a > 1 && reinterpret_cast<uintptr_t>(p) % uintptr_t(a) != 0) a /= 2;
  }
  return a;
}

bool graph_api() { return !cudnn_legacy_conv(); }

}  // namespace

int64_t workspace_bytes(const Conv2dGeometry& g, CudnnPass pass, cudnnDataType_t type,
                        bool allow_tf32, void* stream) {
  if (!graph_api()) return -1;
  const cudnn::LockedHandle handle(stream);
  const Config c{g, pass, type, allow_tf32, kAssumedAlignment, kMaxConvWorkspaceBytes};
  const Prepared* p = prepared(handle.get(), static_cast<cudaStream_t>(stream), c);
  return p == nullptr || p->failed ? -1 : p->plan->workspace;
}

bool run(const Conv2dGeometry& g, CudnnPass pass, cudnnDataType_t type, bool allow_tf32,
         const void* a, const void* b, void* out, void* workspace, int64_t workspace_bytes,
         void* stream) {
  if (!graph_api()) return false;
  const cudnn::LockedHandle handle(stream);
  const int64_t alignment = alignment_of({a, b, out});
  // Operands less aligned than assumed get a plan of their own, within the workspace given (the
  // limit is part of the configuration's key).
  const int64_t limit = alignment == kAssumedAlignment
                            ? kMaxConvWorkspaceBytes
                            : std::min(kMaxConvWorkspaceBytes, workspace_bytes);
  const Config c{g, pass, type, allow_tf32, alignment, limit};
  Prepared* p = prepared(handle.get(), static_cast<cudaStream_t>(stream), c);
  // A plan this workspace cannot hold (another thread's or handle's choice, the switch turned
  // between the query and the run): the legacy API runs it, within the workspace given.
  if (p == nullptr || p->failed || p->plan->workspace > workspace_bytes ||
      (workspace == nullptr && p->plan->workspace > 0)) {
    return false;
  }
  const std::array<const void*, 4> ptrs{a, b, out, workspace};
  auto it = p->packs.find(ptrs);
  if (it == p->packs.end()) {
    if (p->packs.size() >= kMaxVariantPacks) p->packs.clear();
    it = p->packs.emplace(ptrs, variant_pack(pass, Operands{a, b, out}, workspace)).first;
  }
  const cudnnStatus_t status =
      cudnnBackendExecute(handle.get(), p->plan->plan.get(), it->second.get());
  if (status != CUDNN_STATUS_SUCCESS && !p->ran) {
    // A plan can finalize and still refuse to run (on a GPU: a misaligned pointer, too little
    // shared memory, a failed launch): before it has ever run, the legacy API takes the
    // configuration, as PyTorch moves on to its next plan.
    (void)cudaGetLastError();  // a failed launch's error is not the next launch's
    p->failed = true;
    p->packs.clear();
    warn_fallback(
        c, ::rg::detail::cat("its plan failed to run: ", cudnnGetErrorString(status)).c_str());
    return false;
  }
  RG_CUDA_CHECK(status);
  p->ran = true;
  return true;
}

}  // namespace conv_graph
}  // namespace rg::kernels::cuda
