// oneDNN convolutions (see conv2d_onednn.h). Primitives are built once per geometry and pass and
// kept (with their reorders and scratch memory) in a process-wide cache; a call then binds our
// pointers, reorders what needs reordering and executes, all on the calling thread's stream.
#include "kernels/cpu/conv2d_onednn.h"

#include <omp.h>

#include <atomic>
#include <cstdlib>
#include <dnnl.hpp>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <unordered_map>

#include "kernels/cpu/parallel.h"

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

dnnl::engine& cpu_engine() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

// The geometries oneDNN gets: non-empty, f32. (Everything else: im2col + GEMM.)
bool usable(const Conv2dGeometry& g) {
  return onednn_enabled() && g.n > 0 && g.c > 0 && g.o > 0 && g.ho > 0 && g.wo > 0;
}

using Key = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                       int64_t, int64_t, int64_t, int64_t, int64_t, bool, int>;
Key key_of(const Conv2dGeometry& g, bool bias, int pass) {
  return {g.n, g.c, g.h, g.w, g.o, g.kh, g.kw, g.sh, g.sw, g.ph, g.pw, g.dh, g.dw, bias, pass};
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

// A primitive argument in oneDNN's chosen layout: `plain` is our array (its handle set per call),
// `inner` the primitive's memory, the same object when the layouts agree.
struct Operand {
  memory plain, inner;
  bool reordered() const { return plain != inner; }
};
Operand operand(const memory::desc& ours, const memory::desc& chosen) {
  memory p(ours, cpu_engine(), DNNL_MEMORY_NONE);
  return {p, chosen == ours ? p : memory(chosen, cpu_engine())};
}
// Copies our array into the primitive's layout (an input).
void bring_in(dnnl::stream& s, Operand& op, const float* data) {
  op.plain.set_data_handle(const_cast<float*>(data));
  if (op.reordered()) dnnl::reorder(op.plain, op.inner).execute(s, op.plain, op.inner);
}
// Points the operand at our array (an output); send_out copies the result back after execution.
void bind_out(Operand& op, float* data) { op.plain.set_data_handle(data); }
void send_out(dnnl::stream& s, Operand& op) {
  if (op.reordered()) dnnl::reorder(op.inner, op.plain).execute(s, op.inner, op.plain);
}

struct Forward {
  dnnl::convolution_forward::primitive_desc pd;
  dnnl::convolution_forward prim;
  Operand src, wei, dst;
  std::optional<memory> bias;
  memory scratch;
  std::mutex mu;
};

struct Backward {
  std::optional<dnnl::convolution_backward_data> data;
  std::optional<dnnl::convolution_backward_weights> weights;
  Operand data_wei, data_dy, data_dx, w_src, w_dy, w_dw;
  memory data_scratch, w_scratch;
  std::mutex mu;
};

dnnl::convolution_forward::primitive_desc forward_pd(const Conv2dGeometry& g, bool bias) {
  const Dims d = dims_of(g);
  const auto desc =
      bias ? dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training,
                                             dnnl::algorithm::convolution_direct, any(d.src),
                                             any(d.wei), plain(d.bias, tag::x), any(d.dst),
                                             d.strides, d.dilates, d.pad_l, d.pad_r)
           : dnnl::convolution_forward::desc(
                 dnnl::prop_kind::forward_training, dnnl::algorithm::convolution_direct, any(d.src),
                 any(d.wei), any(d.dst), d.strides, d.dilates, d.pad_l, d.pad_r);
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

Forward& forward_for(const Conv2dGeometry& g, bool bias) {
  static std::mutex mu;
  static std::map<Key, std::unique_ptr<Forward>> cache;
  return cached<Forward>(cache, mu, key_of(g, bias, 0), [&] {
    const Dims d = dims_of(g);
    auto pd = forward_pd(g, bias);
    auto f =
        std::unique_ptr<Forward>(new Forward{pd,
                                             dnnl::convolution_forward(pd),
                                             operand(plain(d.src, tag::nchw), pd.src_desc()),
                                             operand(plain(d.wei, tag::oihw), pd.weights_desc()),
                                             operand(plain(d.dst, tag::nchw), pd.dst_desc()),
                                             std::nullopt,
                                             memory(pd.scratchpad_desc(), cpu_engine()),
                                             {}});
    if (bias) f->bias = memory(plain(d.bias, tag::x), cpu_engine(), DNNL_MEMORY_NONE);
    return f;
  });
}

Backward& backward_for(const Conv2dGeometry& g, bool want_gx, bool want_gw) {
  static std::mutex mu;
  static std::map<Key, std::unique_ptr<Backward>> cache;
  const int pass = 1 + (want_gx ? 1 : 0) + (want_gw ? 2 : 0);
  return cached<Backward>(cache, mu, key_of(g, false, pass), [&] {
    const Dims d = dims_of(g);
    auto b = std::make_unique<Backward>();
    const auto hint = forward_pd(g, false);
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    if (want_gx) {
      const dnnl::convolution_backward_data::primitive_desc pd(
          dnnl::convolution_backward_data::desc(dnnl::algorithm::convolution_direct, any(d.src),
                                                any(d.wei), any(d.dst), d.strides, d.dilates,
                                                d.pad_l, d.pad_r),
          attr, cpu_engine(), hint);
      b->data.emplace(pd);
      b->data_wei = operand(plain(d.wei, tag::oihw), pd.weights_desc());
      b->data_dy = operand(plain(d.dst, tag::nchw), pd.diff_dst_desc());
      b->data_dx = operand(plain(d.src, tag::nchw), pd.diff_src_desc());
      b->data_scratch = memory(pd.scratchpad_desc(), cpu_engine());
    }
    if (want_gw) {
      const dnnl::convolution_backward_weights::primitive_desc pd(
          dnnl::convolution_backward_weights::desc(dnnl::algorithm::convolution_direct, any(d.src),
                                                   any(d.wei), any(d.dst), d.strides, d.dilates,
                                                   d.pad_l, d.pad_r),
          attr, cpu_engine(), hint);
      b->weights.emplace(pd);
      b->w_src = operand(plain(d.src, tag::nchw), pd.src_desc());
      b->w_dy = operand(plain(d.dst, tag::nchw), pd.diff_dst_desc());
      b->w_dw = operand(plain(d.wei, tag::oihw), pd.diff_weights_desc());
      b->w_scratch = memory(pd.scratchpad_desc(), cpu_engine());
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

bool onednn_conv2d_forward(const Conv2dGeometry& g, const float* x, const float* w,
                           const float* bias, float* y) {
  if (!usable(g)) return false;
  follow_thread_count();
  Forward& f = forward_for(g, bias != nullptr);
  std::lock_guard lock(f.mu);
  dnnl::stream s(cpu_engine());
  bring_in(s, f.src, x);
  bring_in(s, f.wei, w);
  bind_out(f.dst, y);
  std::unordered_map<int, memory> args{{DNNL_ARG_SRC, f.src.inner},
                                       {DNNL_ARG_WEIGHTS, f.wei.inner},
                                       {DNNL_ARG_DST, f.dst.inner},
                                       {DNNL_ARG_SCRATCHPAD, f.scratch}};
  if (bias) {
    f.bias->set_data_handle(const_cast<float*>(bias));
    args.emplace(DNNL_ARG_BIAS, *f.bias);
  }
  f.prim.execute(s, args);
  send_out(s, f.dst);
  s.wait();
  return true;
}

bool onednn_conv2d_backward(const Conv2dGeometry& g, const float* x, const float* w,
                            const float* gy, float* gx, float* gw) {
  if (!usable(g)) return false;
  if (!gx && !gw) return true;
  follow_thread_count();
  Backward& b = backward_for(g, gx != nullptr, gw != nullptr);
  std::lock_guard lock(b.mu);
  dnnl::stream s(cpu_engine());
  if (gx) {
    bring_in(s, b.data_wei, w);
    bring_in(s, b.data_dy, gy);
    bind_out(b.data_dx, gx);
    b.data->execute(s, {{DNNL_ARG_WEIGHTS, b.data_wei.inner},
                        {DNNL_ARG_DIFF_DST, b.data_dy.inner},
                        {DNNL_ARG_DIFF_SRC, b.data_dx.inner},
                        {DNNL_ARG_SCRATCHPAD, b.data_scratch}});
    send_out(s, b.data_dx);
  }
  if (gw) {
    bring_in(s, b.w_src, x);
    bring_in(s, b.w_dy, gy);
    bind_out(b.w_dw, gw);
    b.weights->execute(s, {{DNNL_ARG_SRC, b.w_src.inner},
                           {DNNL_ARG_DIFF_DST, b.w_dy.inner},
                           {DNNL_ARG_DIFF_WEIGHTS, b.w_dw.inner},
                           {DNNL_ARG_SCRATCHPAD, b.w_scratch}});
    send_out(s, b.w_dw);
  }
  s.wait();
  return true;
}

}  // namespace rg::kernels::cpu
