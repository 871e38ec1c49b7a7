// oneDNN convolutions (see conv2d_onednn.h). Primitives are built once per geometry and pass and
// kept (with their reorders and scratch memory) in a process-wide cache; a call then binds our
// pointers, reorders what needs reordering and executes, all on the calling thread's stream.
#include "kernels/cpu/conv2d_onednn.h"

#include <omp.h>

#include <atomic>
#include <cstdlib>
#include <dnnl.hpp>
#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <unordered_map>

#include "kernels/cpu/conv2d_winograd.h"
#include "kernels/cpu/parallel.h"
#include "kernels/error.h"

namespace rg::kernels::cpu {
namespace {

using dnnl::memory;
using tag = dnnl::memory::format_tag;
using dt = dnnl::memory::data_type;

std::atomic<bool>& enabled_flag() {
  static std::atomic<bool> on{[] {
    const char* v = std::getenv("RG_ONEDNN");
    return v == nullptr || std::string(v) != "0";
  }()};
  return on;
}

// The engine and the primitive caches below are never destroyed: threads that outlive main (an
// emulated CUDA stream still running a convolution at exit, a user's detached thread) must not
// meet them half torn down by the static destructors.
dnnl::engine& cpu_engine() {
  static auto* e = new dnnl::engine(dnnl::engine::kind::cpu, 0);
  return *e;
}

// The geometries oneDNN gets: non-empty, f32. (Everything else: im2col + GEMM.)
bool usable(const Conv2dGeometry& g) {
  return onednn_enabled() && g.n > 0 && g.c > 0 && g.o > 0 && g.ho > 0 && g.wo > 0;
}

using Key = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                       int64_t, int64_t, int64_t, int64_t, int64_t, bool, int, bool, bool>;
Key key_of(const Conv2dGeometry& g, bool bias, int pass, bool winograd) {
  return {g.n,  g.c,  g.h,  g.w,  g.o,  g.kh, g.kw,     g.sh,           g.sw,
          g.ph, g.pw, g.dh, g.dw, bias, pass, winograd, g.channels_last};
}

// convolution_auto lets oneDNN use Winograd (F(4x4, 3x3) on AVX-512 machines) where it has it,
// direct convolution elsewhere; convolution_direct is PyTorch's choice.
dnnl::algorithm conv_algorithm(bool winograd) {
  return winograd ? dnnl::algorithm::convolution_auto : dnnl::algorithm::convolution_direct;
}

struct Dims {
  memory::dims src, wei, bias, dst, strides, dilates, pad_l, pad_r;
};
Dims dims_of(const Conv2dGeometry& g) {
  // oneDNN's right padding makes its output size exactly ours (PyTorch floors the last window).
  const int64_t pr_h = (g.ho - 1) * g.sh + (g.kh - 1) * g.dh + 1 - g.h - g.ph;
  const int64_t pr_w = (g.wo - 1) * g.sw + (g.kw - 1) * g.dw + 1 - g.w - g.pw;
  return {{g.n, g.c, g.h, g.w}, {g.o, g.c, g.kh, g.kw}, {g.o},        {g.n, g.o, g.ho, g.wo},
          {g.sh, g.sw},         {g.dh - 1, g.dw - 1},   {g.ph, g.pw}, {pr_h, pr_w}};
}

memory::desc any(const memory::dims& d) { return memory::desc(d, dt::f32, tag::any); }
memory::desc plain(const memory::dims& d, tag t) { return memory::desc(d, dt::f32, t); }

// Our arrays' layouts: NCHW/OIHW, or with channels_last NHWC/OHWI (kernels/conv2d.h).
tag activation_tag(const Conv2dGeometry& g) { return g.channels_last ? tag::nhwc : tag::nchw; }
tag weight_tag(const Conv2dGeometry& g) { return g.channels_last ? tag::ohwi : tag::oihw; }
// What the primitive is asked to take for an activation: oneDNN chooses its blocked layout, with a
// reorder in and out of our NCHW or NHWC arrays. For NHWC that is not what PyTorch does (it runs
// oneDNN's NHWC kernels on the arrays as they are), but it measured faster here: ResNet-18 b32
// channels_last 111 img/s with the NHWC kernels against 117-131 with the reorders (NCHW 135-137),
// on a 2-core AMD EPYC with AVX-512; capped at AVX2 (ONEDNN_MAX_CPU_ISA) 62.0 against 61.7. The
// reorders' buffers cost peak RSS: 440 MB against 348 MB, as NCHW's.
memory::desc activation(const Conv2dGeometry&, const memory::dims& d) { return any(d); }

// Per-thread, grow-only buffers for what oneDNN's layouts need besides our arrays: the reordered
// copies of inputs and outputs and the scratchpad. Shared by every geometry, so memory stays at
// the largest layer's needs instead of one copy per cached geometry (which made ResNet-18's
// peak RSS 1.17x PyTorch's). Each thread has its own, so primitives run concurrently.
enum Slot { kSrc, kWeights, kDst, kScratchpad, kSlots };
void* scratch(Slot slot, size_t bytes) {
  struct Buffer {
    std::unique_ptr<void, decltype(&std::free)> data{nullptr, &std::free};
    size_t bytes = 0;
  };
  thread_local Buffer buffers[kSlots];
  Buffer& b = buffers[slot];
  if (b.bytes < bytes) {
    const size_t rounded = (bytes + 63) / 64 * 64;
    b.data.reset(std::aligned_alloc(64, rounded));
    RG_CHECK(b.data != nullptr, "oneDNN convolution: cannot allocate ", rounded, " bytes");
    b.bytes = rounded;
  }
  return b.data.get();
}

// A primitive argument: our array's layout and the one oneDNN chose (equal when no reorder is
// needed), and the scratch slot that holds the reordered copy.
struct Operand {
  memory::desc ours, chosen;
  Slot slot;
};
// The memories of one call: `plain` over our array, `inner` what the primitive reads or writes.
struct Bound {
  memory plain, inner;
  bool reordered() const { return plain != inner; }
};
Bound bind(const Operand& op, const float* data) {
  memory plain(op.ours, cpu_engine(), const_cast<float*>(data));
  if (op.chosen == op.ours) return {plain, plain};
  return {plain, memory(op.chosen, cpu_engine(), scratch(op.slot, op.chosen.get_size()))};
}
// An input: our array reordered into the primitive's layout where they differ.
memory bring_in(dnnl::stream& s, const Operand& op, const float* data) {
  Bound b = bind(op, data);
  if (b.reordered()) dnnl::reorder(b.plain, b.inner).execute(s, b.plain, b.inner);
  return b.inner;
}
// After execution, an output in the primitive's layout copied back into our array.
void send_out(dnnl::stream& s, Bound b) {
  if (b.reordered()) dnnl::reorder(b.inner, b.plain).execute(s, b.inner, b.plain);
}
memory scratchpad(const memory::desc& d) {
  return memory(d, cpu_engine(), scratch(kScratchpad, d.get_size()));
}

// Runs one convolution primitive on our arrays: reorders the inputs in, executes with the
// scratchpad of `pd` (and any `args` that need no reorder, such as the bias), then reorders the
// output back.
struct In {
  int arg;
  const Operand& op;
  const float* data;
};
struct Out {
  int arg;
  const Operand& op;
  float* data;
};
void run(dnnl::stream& s, const dnnl::primitive& prim, const dnnl::primitive_desc_base& pd,
         std::initializer_list<In> inputs, const Out& output,
         std::unordered_map<int, memory> args = {}) {
  for (const In& in : inputs) args.emplace(in.arg, bring_in(s, in.op, in.data));
  const Bound out = bind(output.op, output.data);
  args.emplace(output.arg, out.inner);
  args.emplace(DNNL_ARG_SCRATCHPAD, scratchpad(pd.scratchpad_desc()));
  prim.execute(s, args);
  send_out(s, out);
}

struct Forward {
  dnnl::convolution_forward::primitive_desc pd;
  dnnl::convolution_forward prim;
  Operand src, wei, dst;
  memory::desc bias;
};

struct Backward {
  std::optional<dnnl::convolution_backward_data::primitive_desc> data_pd;
  std::optional<dnnl::convolution_backward_data> data;
  std::optional<dnnl::convolution_backward_weights::primitive_desc> weights_pd;
  std::optional<dnnl::convolution_backward_weights> weights;
  Operand data_wei, data_dy, data_dx, w_src, w_dy, w_dw;
};

dnnl::convolution_forward::primitive_desc forward_pd(const Conv2dGeometry& g, bool bias,
                                                     bool winograd) {
  const Dims d = dims_of(g);
  const auto desc =
      bias ? dnnl::convolution_forward::desc(
                 dnnl::prop_kind::forward_training, conv_algorithm(winograd), activation(g, d.src),
                 any(d.wei), plain(d.bias, tag::x), activation(g, d.dst), d.strides, d.dilates,
                 d.pad_l, d.pad_r)
           : dnnl::convolution_forward::desc(
                 dnnl::prop_kind::forward_training, conv_algorithm(winograd), activation(g, d.src),
                 any(d.wei), activation(g, d.dst), d.strides, d.dilates, d.pad_l, d.pad_r);
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return dnnl::convolution_forward::primitive_desc(desc, attr, cpu_engine());
}

template <class V>
V& cached(std::map<Key, std::unique_ptr<V>>& cache, std::mutex& mu, const Key& k,
          const std::function<std::unique_ptr<V>()>& make) {
  std::lock_guard lock(mu);
  auto& slot = cache[k];
  if (!slot) slot = make();
  return *slot;
}

Forward& forward_for(const Conv2dGeometry& g, bool bias, bool winograd) {
  static auto& mu = *new std::mutex;
  static auto& cache = *new std::map<Key, std::unique_ptr<Forward>>;
  return cached<Forward>(cache, mu, key_of(g, bias, 0, winograd), [&] {
    const Dims d = dims_of(g);
    auto pd = forward_pd(g, bias, winograd);
    return std::unique_ptr<Forward>(
        new Forward{pd,
                    dnnl::convolution_forward(pd),
                    {plain(d.src, activation_tag(g)), pd.src_desc(), kSrc},
                    {plain(d.wei, weight_tag(g)), pd.weights_desc(), kWeights},
                    {plain(d.dst, activation_tag(g)), pd.dst_desc(), kDst},
                    plain(d.bias, tag::x)});
  });
}

Backward& backward_for(const Conv2dGeometry& g, bool want_gx, bool want_gw, bool winograd) {
  static auto& mu = *new std::mutex;
  static auto& cache = *new std::map<Key, std::unique_ptr<Backward>>;
  const int pass = 1 + (want_gx ? 1 : 0) + (want_gw ? 2 : 0);
  return cached<Backward>(cache, mu, key_of(g, false, pass, winograd), [&] {
    const Dims d = dims_of(g);
    auto b = std::make_unique<Backward>();
    const auto hint = forward_pd(g, false, winograd);
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    if (want_gx) {
      b->data_pd.emplace(dnnl::convolution_backward_data::desc(
                             conv_algorithm(winograd), activation(g, d.src), any(d.wei),
                             activation(g, d.dst), d.strides, d.dilates, d.pad_l, d.pad_r),
                         attr, cpu_engine(), hint);
      const auto& pd = *b->data_pd;
      b->data.emplace(pd);
      b->data_wei = {plain(d.wei, weight_tag(g)), pd.weights_desc(), kWeights};
      b->data_dy = {plain(d.dst, activation_tag(g)), pd.diff_dst_desc(), kDst};
      b->data_dx = {plain(d.src, activation_tag(g)), pd.diff_src_desc(), kSrc};
    }
    if (want_gw) {
      b->weights_pd.emplace(dnnl::convolution_backward_weights::desc(
                                conv_algorithm(winograd), activation(g, d.src), any(d.wei),
                                activation(g, d.dst), d.strides, d.dilates, d.pad_l, d.pad_r),
                            attr, cpu_engine(), hint);
      const auto& pd = *b->weights_pd;
      b->weights.emplace(pd);
      b->w_src = {plain(d.src, activation_tag(g)), pd.src_desc(), kSrc};
      b->w_dy = {plain(d.dst, activation_tag(g)), pd.diff_dst_desc(), kDst};
      b->w_dw = {plain(d.wei, weight_tag(g)), pd.diff_weights_desc(), kWeights};
    }
    return b;
  });
}

// oneDNN's OpenMP threads follow ringgrad's count (RG_NUM_THREADS, set_num_threads).
void follow_thread_count() {
  if (omp_get_max_threads() != num_threads()) omp_set_num_threads(num_threads());
}

}  // namespace

bool onednn_enabled() { return enabled_flag().load(std::memory_order_relaxed); }
void set_onednn_enabled(bool enabled) { enabled_flag().store(enabled); }

std::string onednn_forward_impl(const Conv2dGeometry& g) {
  return forward_for(g, false, winograd_enabled()).pd.impl_info_str();
}

bool onednn_runs_winograd(const Conv2dGeometry& g) {
  return usable(g) && winograd_enabled() &&
         onednn_forward_impl(g).find("wino") != std::string::npos;
}

bool onednn_conv2d_forward(const Conv2dGeometry& g, const float* x, const float* w,
                           const float* bias, float* y) {
  if (!usable(g)) return false;
  follow_thread_count();
  const Forward& f = forward_for(g, bias != nullptr, winograd_enabled());
  dnnl::stream s(cpu_engine());
  std::unordered_map<int, memory> args;
  if (bias) args.emplace(DNNL_ARG_BIAS, memory(f.bias, cpu_engine(), const_cast<float*>(bias)));
  run(s, f.prim, f.pd, {{DNNL_ARG_SRC, f.src, x}, {DNNL_ARG_WEIGHTS, f.wei, w}},
      {DNNL_ARG_DST, f.dst, y}, std::move(args));
  s.wait();
  return true;
}

bool onednn_conv2d_backward(const Conv2dGeometry& g, const float* x, const float* w,
                            const float* gy, float* gx, float* gw) {
  if (!usable(g)) return false;
  if (!gx && !gw) return true;
  follow_thread_count();
  const Backward& b = backward_for(g, gx != nullptr, gw != nullptr, winograd_enabled());
  dnnl::stream s(cpu_engine());
  if (gx) {
    run(s, *b.data, *b.data_pd,
        {{DNNL_ARG_WEIGHTS, b.data_wei, w}, {DNNL_ARG_DIFF_DST, b.data_dy, gy}},
        {DNNL_ARG_DIFF_SRC, b.data_dx, gx});
  }
  if (gw) {
    run(s, *b.weights, *b.weights_pd, {{DNNL_ARG_SRC, b.w_src, x}, {DNNL_ARG_DIFF_DST, b.w_dy, gy}},
        {DNNL_ARG_DIFF_WEIGHTS, b.w_dw, gw});
  }
  s.wait();
  return true;
}

}  // namespace rg::kernels::cpu
