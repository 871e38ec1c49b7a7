// The entries of the op table (op_table.h), one per engine op, in the order of engine/ops/*.h.
// Sample shapes: awkward sizes (33, 4097: partial blocks and vector tails), broadcast forms, an
// empty batch, and the models' own shapes (ToyNet, MLP, ResNet-18; device comparisons only).
#include "ops/op_table.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <set>
#include <string>

#include "engine/autograd/grad_mode.h"
#include "engine/ops/activation.h"
#include "engine/ops/attention.h"
#include "engine/ops/batch_norm.h"
#include "engine/ops/binary.h"
#include "engine/ops/conv2d.h"
#include "engine/ops/dropout.h"
#include "engine/ops/embedding.h"
#include "engine/ops/factory.h"
#include "engine/ops/flatten.h"
#include "engine/ops/grad_clip.h"
#include "engine/ops/layer_norm.h"
#include "engine/ops/loss.h"
#include "engine/ops/matmul.h"
#include "engine/ops/metrics.h"
#include "engine/ops/orthonormalize.h"
#include "engine/ops/pool.h"
#include "engine/ops/reduce.h"
#include "engine/ops/shape.h"
#include "engine/ops/sync_batch_norm.h"
#include "engine/ops/unary.h"
#include "kernels/error.h"

namespace rg::testing {
namespace {

using V = std::vector<Tensor>;
using Pair = std::array<int64_t, 2>;
const DType f32 = DType::f32, f64 = DType::f64, f16 = DType::f16, bf16 = DType::bf16;

// f64 values uniform in [low, high) on the CPU (the harness makes leaves of them).
Tensor uniform(const Shape& shape, Generator& gen, double low = -1.0, double high = 1.0) {
  Tensor t = Tensor::empty(shape, f64);
  return uniform_(t, low, high, gen);
}

// Values in [low, high) (default [0.1, 1.5)) with a random sign: kinks at 0 (relu) stay far from
// every +-eps probe.
Tensor away_from_zero(const Shape& shape, Generator& gen, double low = 0.1, double high = 1.5) {
  Tensor t = uniform(shape, gen, low, high);
  const std::vector<double> sign = rand(shape, gen, f64).to_vector<double>();
  double* p = t.data<double>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = sign[size_t(i)] < 0.5 ? -p[i] : p[i];
  return t;
}

// A shuffled 0.1-spaced ramp: every value distinct and far apart compared with the
// finite-difference step, so no max-pool window has a near-tie.
Tensor distinct(const Shape& shape, uint64_t seed) {
  std::vector<double> values(size_t(shape_numel(shape)));
  std::iota(values.begin(), values.end(), 0.0);
  std::shuffle(values.begin(), values.end(), std::mt19937_64(seed));
  for (double& v : values) v = 0.1 * v - 1.0;
  return from_vector<double>(values, shape);
}

// Class indices in [0, c) for n rows.
Tensor targets(int64_t n, int64_t c, Generator& gen) {
  std::vector<int64_t> t;
  for (double v : rand({n}, gen, f64).to_vector<double>()) t.push_back(int64_t(v * double(c)));
  return from_vector<int64_t>(t, {n});
}

Tensor constant(const std::vector<double>& values) {
  return from_vector<double>(values, {int64_t(values.size())});
}

// Batch-norm inputs with running mean and variance appended (constants of the call).
V with_stats(V in, const std::vector<double>& mean, const std::vector<double>& var) {
  in.push_back(constant(mean));
  in.push_back(constant(var));
  return in;
}

OpSample sample(std::string name, V inputs, OpFn forward = {}) {
  return {std::move(name), std::move(inputs), std::move(forward)};
}
OpSample model_shape(std::string name, V inputs, OpFn forward = {}) {
  OpSample s = sample(std::move(name), std::move(inputs), std::move(forward));
  s.gradcheck = false;
  return s;
}
OpSample empty_batch(std::string name, V inputs, OpFn forward = {}) {
  OpSample s = sample(std::move(name), std::move(inputs), std::move(forward));
  s.empty_batch = true;
  return s;
}

// The bad inputs every op with floating inputs shares: an integer tensor and an undefined one.
std::vector<OpBadInput> common_bad_inputs(const std::string& op, V good) {
  std::vector<OpBadInput> bad;
  V ints = good;
  for (Tensor& t : ints)
    if (is_floating(t.dtype())) t = t.to(DType::i64);
  bad.push_back({"i64 input", ints, "i64"});  // CUDA batch_norm words it differently
  V undefined = good;
  undefined[0] = Tensor();
  bad.push_back({"undefined input", undefined, op + ": input 0 is an undefined tensor"});
  return bad;
}

// ---- binary.h: add, sub, mul, div with every broadcast form, and the tensor-scalar forms ----

OpEntry binary_entry(const std::string& name, Tensor (*op)(const Tensor&, const Tensor&),
                     Tensor (*scalar_op)(const Tensor&, double), double b_low) {
  OpEntry e;
  e.name = name;
  e.forward = [op](const V& x) { return op(x[0], x[1]); };
  e.half_tolerance_scale = 4;  // a broadcast operand's gradient is a sum in the half type
  e.samples = [op, scalar_op, b_low] {
    Generator gen(11);
    std::vector<OpSample> s;
    const std::vector<std::pair<Shape, Shape>> shapes = {
        {{33, 31}, {33, 31}},       // same shape
        {{1000}, {1}},              // one-element tensor
        {{2, 3}, {1}},              // one-element tensor, 2-d
        {{1}, {2, 3}},              // one-element tensor first
        {{}, {7, 5}},               // 0-d first operand
        {{17, 33}, {33}},           // bias
        {{4, 5}, {5}},              // bias, small
        {{5}, {4, 5}},              // bias first (rsub/rdiv order)
        {{2, 6, 4}, {6, 4}},        // GPT's token + position embeddings
        {{4, 3, 5, 7}, {3, 1, 1}},  // per channel
        {{3, 1, 1}, {4, 3, 5, 7}},  // per channel, broadcast operand first
        {{6, 1, 5}, {1, 4, 1}},     // both broadcast: the general kernel
        {{3, 1}, {1, 4}},           // both broadcast, 2-d
        {{2, 3, 4}, {2, 1, 4}},     // a gap of ones: the general kernel
    };
    for (const auto& [sa, sb] : shapes) {
      s.push_back(sample(shape_str(sa) + " op " + shape_str(sb),
                         {uniform(sa, gen), uniform(sb, gen, b_low, b_low + 1.0)}));
    }
    s.push_back(empty_batch("[0, 3] op [3]", {uniform({0, 3}, gen), uniform({3}, gen, 0.5, 1.5)}));
    for (double c : {1.5, -3.0, 7.0}) {
      s.push_back(sample("[4097] op scalar " + std::to_string(c), {uniform({4097}, gen, 0.5, 2.0)},
                         [scalar_op, c](const V& x) { return scalar_op(x[0], c); }));
    }
    return s;
  };
  e.bad_inputs = [name] {
    std::vector<OpBadInput> bad = common_bad_inputs(name, {zeros({2, 3}, f32), zeros({3}, f32)});
    bad.push_back({"shapes that do not broadcast",
                   {zeros({2, 3}), zeros({4})},
                   name + ": shapes [2, 3] and [4] cannot be broadcast together"});
    bad.push_back({"dtype mismatch", {zeros({3}), zeros({3}, f64)}, "dtype mismatch"});
    return bad;
  };
  return e;
}

// rsub and rdiv: a scalar on the left. Their errors name the op they run as (sub, div).
OpEntry reversed_scalar_entry(const std::string& name, const std::string& error_name,
                              Tensor (*op)(const Tensor&, double)) {
  OpEntry e;
  e.name = name;
  e.forward = [op](const V& x) { return op(x[0], 3.0); };
  e.samples = [] {
    Generator gen(12);
    return std::vector<OpSample>{sample("[3, 4]", {uniform({3, 4}, gen, 0.5, 2.0)}),
                                 sample("[4097]", {uniform({4097}, gen, 0.5, 2.0)}),
                                 empty_batch("[0, 4]", {uniform({0, 4}, gen, 0.5, 2.0)})};
  };
  e.bad_inputs = [error_name] { return common_bad_inputs(error_name, {zeros({2, 3})}); };
  return e;
}

// ---- unary.h and activation.h: elementwise, one input ----

OpEntry elementwise_entry(const std::string& name, OpFn forward, double low, double high,
                          std::vector<std::pair<std::string, OpFn>> variants = {},
                          bool kinks_at_zero = false) {
  OpEntry e;
  e.name = name;
  e.forward = forward;
  e.samples = [variants, low, high, kinks_at_zero] {
    Generator gen(13);
    auto in = [&](const Shape& s) {
      return kinks_at_zero ? away_from_zero(s, gen) : uniform(s, gen, low, high);
    };
    std::vector<OpSample> s = {sample("[4, 5]", {in({4, 5})}), sample("[31, 33]", {in({31, 33})}),
                               sample("[1000]", {in({1000})}), empty_batch("[0, 5]", {in({0, 5})})};
    const Tensor x = in({5, 3});
    for (const auto& [what, f] : variants) s.push_back(sample("[5, 3] " + what, {x}, f));
    return s;
  };
  e.bad_inputs = [name] { return common_bad_inputs(name, {zeros({2, 3})}); };
  return e;
}

OpFn unary(Tensor (*op)(const Tensor&)) {
  return [op](const V& x) { return op(x[0]); };
}

// ---- reduce.h ----

OpEntry reduction_entry(const std::string& name, Tensor (*all)(const Tensor&),
                        Tensor (*dims)(const Tensor&, const std::vector<int64_t>&, bool)) {
  OpEntry e;
  e.name = name;
  e.forward = [all](const V& x) { return all(x[0]); };
  e.half_tolerance_scale = 4;  // a 4097-element sum rounds once more in the half type
  e.samples = [dims, name] {
    Generator gen(14);
    auto along = [dims](std::vector<int64_t> d, bool keep) {
      return [dims, d, keep](const V& x) { return dims(x[0], d, keep); };
    };
    const Tensor a = uniform({2, 3, 4}, gen), b = uniform({5, 33, 7}, gen);
    std::vector<OpSample> s = {
        sample("[2, 3, 4] all", {a}),
        sample("[2, 3, 4] dim 1", {a}, along({1}, false)),
        sample("[2, 3, 4] dims 0, 2 keepdim", {a}, along({0, 2}, true)),
        sample("[2, 3, 4] dim 1 keepdim", {a}, along({1}, true)),
        sample("[2, 3, 4] dim -1", {a}, along({-1}, false)),
        model_shape("[5, 33, 7] all", {b}),
        model_shape("[5, 33, 7] dims 0, 2 keepdim", {b}, along({0, 2}, true)),
        model_shape("[4097] all", {uniform({4097}, gen)}),
        empty_batch("[0, 3] dim 1", {uniform({0, 3}, gen)}, along({1}, false)),
    };
    if (name == "sum") {
      s.push_back(empty_batch("[0, 3] all", {uniform({0, 3}, gen)}));
      s.push_back(empty_batch("[0, 3] dim 0", {uniform({0, 3}, gen)}, along({0}, false)));
    }
    return s;
  };
  e.bad_inputs = [name, dims] {
    std::vector<OpBadInput> bad = common_bad_inputs(name, {zeros({2, 3})});
    bad.push_back(
        {"dim out of range", {zeros({2, 3})}, name + ": dim 2 is out of range", [dims](const V& x) {
           return dims(x[0], {2}, false);
         }});
    bad.push_back(
        {"dim listed twice", {zeros({2, 3})}, "a dimension is listed twice", [dims](const V& x) {
           return dims(x[0], {1, -1}, false);
         }});
    if (name == "mean") {
      bad.push_back(
          {"mean of an empty batch", {zeros({0, 3})}, "mean: reducing over an empty dimension"});
    }
    return bad;
  };
  return e;
}

Tensor sum_all(const Tensor& x) { return sum(x); }
Tensor sum_dims(const Tensor& x, const std::vector<int64_t>& d, bool k) { return sum(x, d, k); }
Tensor mean_all(const Tensor& x) { return mean(x); }
Tensor mean_dims(const Tensor& x, const std::vector<int64_t>& d, bool k) { return mean(x, d, k); }

// ---- conv2d.h ----

struct ConvCase {
  Shape x, w;
  Pair stride, padding, dilation;
  bool bias;
  std::string why;
};

OpSample conv_sample(const ConvCase& c, Generator& gen, bool gradcheck = true) {
  V in{uniform(c.x, gen), uniform(c.w, gen)};
  if (c.bias) in.push_back(uniform({c.w[0]}, gen));
  OpSample s = sample(shape_str(c.x) + " * " + shape_str(c.w) + " " + c.why, in, [c](const V& v) {
    return conv2d(v[0], v[1], c.bias ? v[2] : Tensor(), c.stride, c.padding, c.dilation);
  });
  s.gradcheck = gradcheck;
  s.empty_batch = c.x[0] == 0;
  return s;
}

OpEntry conv2d_entry() {
  OpEntry e;
  e.name = "conv2d";
  e.tf32 = OpEntry::Tf32::conv;
  e.forward = [](const V& x) { return conv2d(x[0], x[1], x.size() > 2 ? x[2] : Tensor()); };
  e.half_tolerance_scale = 4;  // cuDNN's half convolutions accumulate 27..144 products
  e.samples = [] {
    Generator gen(15);
    const std::vector<ConvCase> cases = {
        // Stride 1 takes the input gradient as a flipped-weight convolution, strided or
        // over-padded convolutions take GEMM + col2im.
        {{2, 3, 5, 6}, {4, 3, 3, 3}, {1, 1}, {1, 1}, {1, 1}, true, "padded"},
        {{2, 3, 5, 6}, {4, 3, 3, 3}, {1, 1}, {0, 0}, {1, 1}, false, "valid"},
        {{2, 2, 7, 6}, {3, 2, 3, 3}, {2, 2}, {1, 1}, {1, 1}, false, "stride 2"},
        {{2, 2, 7, 6}, {3, 2, 3, 3}, {2, 3}, {1, 0}, {1, 1}, true, "stride (2, 3)"},
        {{2, 2, 7, 7}, {2, 2, 3, 3}, {1, 1}, {2, 2}, {2, 2}, true, "dilation 2"},
        {{1, 2, 8, 7}, {3, 2, 3, 2}, {1, 2}, {0, 1}, {2, 1}, false, "dilation (2, 1)"},
        // Non-square kernels.
        {{2, 2, 6, 7}, {3, 2, 2, 3}, {1, 1}, {0, 1}, {1, 1}, true, "2x3 kernel"},
        {{2, 2, 6, 7}, {3, 2, 1, 4}, {2, 1}, {0, 2}, {1, 1}, false, "1x4 kernel"},
        {{1, 3, 5, 5}, {2, 3, 5, 1}, {1, 1}, {2, 0}, {1, 1}, true, "5x1 kernel"},
        // 1x1: the direct path (>= 512 pixels a sample), batched columns for small maps, and
        // the strided / padded 1x1 forms of ResNet shortcuts.
        {{2, 2, 16, 32}, {3, 2, 1, 1}, {1, 1}, {0, 0}, {1, 1}, true, "1x1 direct"},
        {{3, 3, 4, 5}, {2, 3, 1, 1}, {1, 1}, {0, 0}, {1, 1}, false, "1x1 batched"},
        {{2, 3, 6, 6}, {4, 3, 1, 1}, {2, 2}, {0, 0}, {1, 1}, false, "1x1 stride 2"},
        {{2, 2, 4, 4}, {2, 2, 1, 1}, {1, 1}, {1, 1}, {1, 1}, true, "1x1 padded"},
        // Stride 1 on wide maps: one GEMM per kernel tap, without im2col.
        {{2, 2, 4, 34}, {3, 2, 3, 3}, {1, 1}, {1, 1}, {1, 1}, true, "wide map"},
        {{1, 2, 5, 36}, {2, 2, 2, 3}, {1, 1}, {0, 1}, {1, 1}, false, "wide map 2x3"},
        {{1, 2, 5, 64}, {2, 2, 3, 3}, {1, 1}, {2, 2}, {2, 2}, true, "wide map dilated"},
        // One sample is split into row blocks; five samples give uneven chunks.
        {{1, 2, 9, 5}, {3, 2, 3, 3}, {1, 1}, {1, 1}, {1, 1}, true, "one sample"},
        {{1, 2, 9, 5}, {3, 2, 3, 3}, {2, 1}, {1, 1}, {1, 1}, true, "one sample strided"},
        {{5, 2, 4, 4}, {3, 2, 3, 3}, {1, 1}, {1, 1}, {1, 1}, false, "odd batch"},
        // An empty batch: no output, zero weight and bias gradients (cuDNN refuses zero-sized
        // descriptors, so the CUDA path answers itself).
        {{0, 3, 9, 11}, {5, 3, 3, 3}, {1, 1}, {1, 1}, {1, 1}, true, "empty batch"},
    };
    std::vector<OpSample> s;
    for (const ConvCase& c : cases) s.push_back(conv_sample(c, gen));
    // Awkward sizes for the device comparisons (the cases above cover the CPU paths).
    const std::vector<ConvCase> awkward = {
        {{2, 3, 9, 11}, {5, 3, 3, 3}, {1, 1}, {1, 1}, {1, 1}, true, "9x11"},
        {{2, 3, 9, 11}, {4, 3, 3, 2}, {2, 1}, {0, 1}, {1, 1}, false, "9x11 strided"},
        {{1, 2, 10, 10}, {3, 2, 3, 3}, {1, 2}, {2, 2}, {2, 2}, true, "10x10 dilated"},
    };
    for (const ConvCase& c : awkward) s.push_back(conv_sample(c, gen, false));
    // The models' convolutions (channels cut down where the shape of the call stays the same).
    const std::vector<ConvCase> models = {
        {{2, 1, 28, 28}, {32, 1, 3, 3}, {1, 1}, {0, 0}, {1, 1}, true, "ToyNet conv1"},
        {{1, 3, 32, 32}, {8, 3, 7, 7}, {2, 2}, {3, 3}, {1, 1}, false, "ResNet-18 stem"},
        {{2, 16, 8, 8}, {32, 16, 3, 3}, {2, 2}, {1, 1}, {1, 1}, false, "ResNet-18 block"},
        {{2, 16, 8, 8}, {32, 16, 1, 1}, {2, 2}, {0, 0}, {1, 1}, false, "ResNet-18 shortcut"},
    };
    for (const ConvCase& c : models) s.push_back(conv_sample(c, gen, false));
    return s;
  };
  e.bad_inputs = [] {
    const Tensor x = zeros({1, 2, 5, 5}), w = zeros({3, 2, 3, 3});
    std::vector<OpBadInput> bad = common_bad_inputs("conv2d", {x, w});
    bad.push_back({"channel mismatch", {x, zeros({3, 4, 3, 3})}, "channels but weight"});
    bad.push_back({"3-d input", {zeros({2, 5, 5}), w}, "expected a 4-d tensor"});
    bad.push_back({"bias of the wrong size", {x, w, zeros({2})}, "conv2d: bias [2]"});
    bad.push_back({"stride 0", {x, w}, "must be positive", [](const V& v) {
                     return conv2d(v[0], v[1], Tensor(), {0, 1});
                   }});
    bad.push_back({"kernel larger than the input", {zeros({1, 2, 2, 2}), w}, "kernel extent"});
    return bad;
  };
  return e;
}

// ---- pool.h ----

OpFn max_pool(Pair k, Pair s = {0, 0}, Pair p = {0, 0}) {
  return [=](const V& x) { return max_pool2d(x[0], k, s, p); };
}
OpFn avg_pool(Pair k, Pair s = {0, 0}, Pair p = {0, 0}, bool include_pad = true) {
  return [=](const V& x) { return avg_pool2d(x[0], k, s, p, include_pad); };
}

std::vector<OpBadInput> pool_bad_inputs(const std::string& op, const OpFn& kernel3_pad2) {
  std::vector<OpBadInput> bad = common_bad_inputs(op, {zeros({1, 2, 5, 5})});
  bad.push_back({"3-d input", {zeros({2, 5, 5})}, "expected a 4-d tensor"});
  bad.push_back(
      {"padding over half the kernel", {zeros({1, 2, 5, 5})}, "half the kernel", kernel3_pad2});
  bad.push_back({"kernel larger than the input", {zeros({1, 2, 1, 1})}, "kernel"});
  return bad;
}

OpEntry max_pool2d_entry() {
  OpEntry e;
  e.name = "max_pool2d";
  e.forward = max_pool({2, 2});
  // Distinct values everywhere: no window has a near-tie, so the max is differentiable.
  e.samples = [] {
    const Tensor x = distinct({2, 3, 7, 6}, 140), y = distinct({2, 3, 5, 6}, 21);
    const Tensor z = distinct({2, 3, 9, 11}, 22);
    return std::vector<OpSample>{
        sample("[2, 3, 7, 6] k2", {x}),
        sample("[2, 3, 7, 6] k3 s2 p1", {x}, max_pool({3, 3}, {2, 2}, {1, 1})),
        // Overlapping windows: one input may be the maximum of several windows.
        sample("[2, 3, 7, 6] k(3, 2) s1 p(1, 0)", {x}, max_pool({3, 2}, {1, 1}, {1, 0})),
        sample("[2, 3, 5, 6] k(2, 3) s(1, 2)", {y}, max_pool({2, 3}, {1, 2})),
        sample("[2, 3, 9, 11] k3 s2 p1", {z}, max_pool({3, 3}, {2, 2}, {1, 1})),
        model_shape("ResNet-18 [2, 8, 16, 16] k3 s2 p1", {distinct({2, 8, 16, 16}, 23)},
                    max_pool({3, 3}, {2, 2}, {1, 1})),
        model_shape("ToyNet [4, 64, 24, 24] k2", {distinct({4, 64, 24, 24}, 24)}),
        empty_batch("[0, 3, 7, 6] k2", {distinct({0, 3, 7, 6}, 25)}),
    };
  };
  e.bad_inputs = [] { return pool_bad_inputs("max_pool2d", max_pool({3, 3}, {1, 1}, {2, 2})); };
  return e;
}

OpEntry avg_pool2d_entry() {
  OpEntry e;
  e.name = "avg_pool2d";
  e.forward = avg_pool({2, 2});
  e.samples = [] {
    Generator gen(16);
    const Tensor x = uniform({2, 3, 7, 6}, gen), y = uniform({2, 2, 5, 5}, gen);
    const Tensor z = uniform({2, 3, 9, 11}, gen);
    return std::vector<OpSample>{
        sample("[2, 3, 7, 6] k2", {x}),
        sample("[2, 3, 7, 6] k3 s2 p1", {x}, avg_pool({3, 3}, {2, 2}, {1, 1})),
        sample("[2, 3, 7, 6] k(3, 2) s(1, 2) p1 exclude pad", {x},
               avg_pool({3, 2}, {1, 2}, {1, 1}, false)),
        sample("[2, 2, 5, 5] k2", {y}),
        sample("[2, 2, 5, 5] k3 s2 p1", {y}, avg_pool({3, 3}, {2, 2}, {1, 1})),
        sample("[2, 2, 5, 5] k3 s2 p1 exclude pad", {y}, avg_pool({3, 3}, {2, 2}, {1, 1}, false)),
        sample("[2, 3, 9, 11] k(3, 2) s(2, 1) p1", {z}, avg_pool({3, 2}, {2, 1}, {1, 1})),
        sample("[2, 3, 9, 11] k(3, 2) s(2, 1) p1 exclude pad", {z},
               avg_pool({3, 2}, {2, 1}, {1, 1}, false)),
        empty_batch("[0, 3, 7, 6] k2", {uniform({0, 3, 7, 6}, gen)}),
    };
  };
  e.bad_inputs = [] { return pool_bad_inputs("avg_pool2d", avg_pool({3, 3}, {1, 1}, {2, 2})); };
  return e;
}

OpEntry adaptive_avg_pool2d_entry() {
  OpEntry e;
  e.name = "adaptive_avg_pool2d";
  e.forward = [](const V& x) { return adaptive_avg_pool2d(x[0], {1, 1}); };
  e.samples = [] {
    Generator gen(17);
    return std::vector<OpSample>{
        sample("[3, 4, 5, 3]", {uniform({3, 4, 5, 3}, gen)}),
        sample("[2, 3, 4, 3]", {uniform({2, 3, 4, 3}, gen)}),
        sample("[2, 3, 9, 11]", {uniform({2, 3, 9, 11}, gen)}),
        model_shape("ResNet-18 [2, 512, 4, 4]", {uniform({2, 512, 4, 4}, gen)}),
        empty_batch("[0, 3, 4, 4]", {uniform({0, 3, 4, 4}, gen)}),
    };
  };
  e.bad_inputs = [] {
    std::vector<OpBadInput> bad = common_bad_inputs("adaptive_avg_pool2d", {zeros({1, 2, 3, 3})});
    bad.push_back({"output size 2x2", {zeros({1, 2, 4, 4})}, "is not implemented", [](const V& x) {
                     return adaptive_avg_pool2d(x[0], {2, 2});
                   }});
    bad.push_back({"empty plane", {zeros({1, 2, 0, 4})}, "has an empty spatial dimension"});
    bad.push_back({"3-d input", {zeros({2, 4, 4})}, "expected a 4-d tensor"});
    return bad;
  };
  return e;
}

// ---- batch_norm.h ----

using BatchNormOp = Tensor (*)(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                               const Tensor&, bool, double, double);

OpFn bn(bool training, bool affine, bool stats, double eps = 1e-5, BatchNormOp op = &batch_norm) {
  // inputs: x, then weight and bias when affine, then running mean and var when stats.
  return [=](const V& v) {
    const Tensor w = affine ? v[1] : Tensor(), b = affine ? v[2] : Tensor();
    const size_t s = affine ? 3 : 1;
    return op(v[0], stats ? v[s] : Tensor(), stats ? v[s + 1] : Tensor(), w, b, training, 0.1, eps);
  };
}

// batch_norm and the fused batch_norm_relu: the same samples and bad inputs (the fused op's
// agreement with relu(batch_norm(...)) bit for bit is tests/ops/batch_norm_relu_test.cpp).
OpEntry batch_norm_entry(const std::string& name = "batch_norm", BatchNormOp op = &batch_norm) {
  const auto bn = [op](bool training, bool affine, bool stats, double eps = 1e-5) {
    return ::rg::testing::bn(training, affine, stats, eps, op);
  };
  OpEntry e;
  e.name = name;
  e.forward = bn(true, true, false);
  e.half_tolerance_scale = 4;  // statistics over a batch, normalized by them
  e.samples = [bn] {
    Generator gen(18);
    auto affine = [&](const Shape& x, int64_t c, double lo = -2, double hi = 3) {
      return V{uniform(x, gen, lo, hi), uniform({c}, gen, 0.5, 1.5), uniform({c}, gen)};
    };
    std::vector<OpSample> s = {
        sample("[3, 4, 3, 2] training", affine({3, 4, 3, 2}, 4)),
        sample("[3, 2, 3, 2] training", affine({3, 2, 3, 2}, 2, -1, 1)),
        sample("[3, 4, 3, 2] training without affine", {uniform({3, 4, 3, 2}, gen)},
               bn(true, false, false)),
        sample("[6, 5] training eps 1e-3", affine({6, 5}, 5, -1, 2), bn(true, true, false, 1e-3)),
        sample("[5, 3] training", affine({5, 3}, 3)),
        sample(
            "[3, 4, 2, 3] eval",
            with_stats(affine({3, 4, 2, 3}, 4, -1, 1), {0.1, -0.2, 0.3, 0.0}, {0.5, 1.5, 2.0, 0.8}),
            bn(false, true, true)),
        sample("[3, 2, 2, 2] eval",
               with_stats(affine({3, 2, 2, 2}, 2, -1, 1), {0.1, -0.2}, {0.5, 2.0}),
               bn(false, true, true)),
        model_shape("ResNet-18 [4, 16, 8, 8] training", affine({4, 16, 8, 8}, 16)),
        empty_batch("[0, 3, 2, 2] eval",
                    with_stats(affine({0, 3, 2, 2}, 3), {0.1, 0.2, 0.3}, {1.0, 2.0, 0.5}),
                    bn(false, true, true)),
    };
    // Training with running statistics: they are constants of the call, updated in place; the
    // device comparison checks their new values too.
    OpSample stats =
        sample("[4, 3, 5, 5] training with running statistics",
               with_stats(affine({4, 3, 5, 5}, 3), {0, 0, 0}, {1, 1, 1}), bn(true, true, true));
    stats.grad_inputs = 3;
    s.push_back(stats);
    for (OpSample& x : s)
      if (x.inputs.size() == 5) x.grad_inputs = 3;
    return s;
  };
  e.bad_inputs = [bn, name] {
    const V good{zeros({2, 3}), ones({3}), zeros({3})};
    std::vector<OpBadInput> bad = common_bad_inputs(name, good);
    bad.push_back({"3-d input",
                   {zeros({2, 3, 4}), ones({3}), zeros({3})},
                   "expected a 2-d [N, C] or 4-d [N, C, H, W] input"});
    bad.push_back({"weight of the wrong size",
                   {zeros({2, 3}), ones({4}), zeros({3})},
                   name + ": weight has shape"});
    bad.push_back({"negative eps", good, "eps must be non-negative", bn(true, true, false, -1.0)});
    bad.push_back({"evaluation without running statistics", good, "are required in evaluation mode",
                   bn(false, true, false)});
    OpBadInput empty = {"training on an empty batch",
                        {zeros({0, 3}), ones({3}), zeros({3})},
                        "expected more than 1 value per channel when training"};
    bad.push_back(empty);
    bad.push_back({"training on one value per channel",
                   {zeros({1, 3}), ones({3}), zeros({3})},
                   "expected more than 1 value per channel when training"});
    return bad;
  };
  return e;
}

// batch_norm_add_relu: relu(batch_norm(x) + residual), inputs x, residual, then weight and bias
// when affine, then running mean and var when stats (the fused op's agreement with the
// composition bit for bit is tests/device/batch_norm_relu_device_test.cpp).
OpFn bn_add_relu(bool training, bool affine, bool stats) {
  return [=](const V& v) {
    const Tensor w = affine ? v[2] : Tensor(), b = affine ? v[3] : Tensor();
    const size_t s = affine ? 4 : 2;
    return batch_norm_add_relu(v[0], v[1], stats ? v[s] : Tensor(), stats ? v[s + 1] : Tensor(), w,
                               b, training);
  };
}

OpEntry batch_norm_add_relu_entry() {
  OpEntry e;
  e.name = "batch_norm_add_relu";
  e.forward = bn_add_relu(true, true, false);
  e.half_tolerance_scale = 4;  // as batch_norm's
  e.samples = [] {
    Generator gen(19);
    // Residuals of magnitude 4 to 5, either sign: the sum stays clear of relu's threshold (the
    // normalized values are within about 3.6), where f16/bf16, rounded before the add as the
    // unfused add sees them, and the f32 reference could fall on different sides. The mask's
    // exact semantics are the composition tests' (tests/device/batch_norm_relu_device_test.cpp).
    auto residual = [&](const Shape& x) { return away_from_zero(x, gen, 4, 5); };
    auto affine = [&](const Shape& x, int64_t c) {
      return V{uniform(x, gen, -2, 3), residual(x), uniform({c}, gen, 0.5, 1.5), uniform({c}, gen)};
    };
    std::vector<OpSample> s = {
        sample("[3, 4, 3, 2] training", affine({3, 4, 3, 2}, 4)),
        sample("[3, 4, 3, 2] training without affine",
               {uniform({3, 4, 3, 2}, gen), residual({3, 4, 3, 2})},
               bn_add_relu(true, false, false)),
        sample("[5, 3] training", affine({5, 3}, 3)),
        sample("[3, 4, 2, 3] eval",
               with_stats(affine({3, 4, 2, 3}, 4), {0.1, -0.2, 0.3, 0.0}, {0.5, 1.5, 2.0, 0.8}),
               bn_add_relu(false, true, true)),
        model_shape("ResNet-18 [4, 16, 8, 8] training", affine({4, 16, 8, 8}, 16)),
        empty_batch("[0, 3, 2, 2] eval",
                    with_stats(affine({0, 3, 2, 2}, 3), {0.1, 0.2, 0.3}, {1.0, 2.0, 0.5}),
                    bn_add_relu(false, true, true)),
    };
    OpSample stats = sample("[4, 3, 5, 5] training with running statistics",
                            with_stats(affine({4, 3, 5, 5}, 3), {0, 0, 0}, {1, 1, 1}),
                            bn_add_relu(true, true, true));
    s.push_back(stats);
    for (OpSample& x : s)
      if (x.inputs.size() == 6) x.grad_inputs = 4;
    return s;
  };
  e.bad_inputs = [] {
    const V good{zeros({2, 3}), zeros({2, 3}), ones({3}), zeros({3})};
    std::vector<OpBadInput> bad = common_bad_inputs("batch_norm_add_relu", good);
    bad.push_back({"residual of another shape",
                   {zeros({2, 3}), zeros({2, 1}), ones({3}), zeros({3})},
                   "the residual's shape [2, 1] differs from the input's [2, 3]"});
    bad.push_back({"residual of another dtype",
                   {zeros({2, 3}), zeros({2, 3}, DType::f64), ones({3}), zeros({3})},
                   "dtype mismatch"});
    bad.push_back({"3-d input",
                   {zeros({2, 3, 4}), zeros({2, 3, 4}), ones({3}), zeros({3})},
                   "expected a 2-d [N, C] or 4-d [N, C, H, W] input"});
    bad.push_back({"training on one value per channel",
                   {zeros({1, 3}), zeros({1, 3}), ones({3}), zeros({3})},
                   "expected more than 1 value per channel when training"});
    return bad;
  };
  return e;
}

// ---- sync_batch_norm.h ----

// `replicas` copies of one process: every replica's batch is this one, so the global statistics
// are the local ones over replicas times the count (the running variance's n / (n - 1) sees the
// global count), and the input gradient is batch_norm's. Exercises the gather, the combination
// and the all-reduce of the gradient sums without processes; tests/dist/sync_batch_norm_test.cpp
// runs real ranks with different batches.
class MirroredCollectives final : public BatchNormCollectives {
 public:
  explicit MirroredCollectives(int replicas) : replicas_(replicas) {}
  int size() const override { return replicas_; }
  Tensor all_gather(const Tensor& local) override {
    Tensor out = Tensor::empty({replicas_ * local.numel()}, local.dtype(), local.device());
    for (int r = 0; r < replicas_; ++r)
      out.narrow(0, r * local.numel(), local.numel()).copy_(local);
    return out;
  }
  void all_reduce_sum(const Tensor& t) override { Tensor(t).copy_(t * double(replicas_)); }

 private:
  int replicas_;
};

OpFn sync_bn(int replicas, bool affine, bool stats, double eps = 1e-5) {
  // inputs as bn()'s: x, then weight and bias when affine, then running mean and var when stats.
  return [=](const V& v) {
    const Tensor w = affine ? v[1] : Tensor(), b = affine ? v[2] : Tensor();
    const size_t s = affine ? 3 : 1;
    return sync_batch_norm(v[0], stats ? v[s] : Tensor(), stats ? v[s + 1] : Tensor(), w, b, 0.1,
                           eps, std::make_shared<MirroredCollectives>(replicas));
  };
}

OpEntry sync_batch_norm_entry() {
  OpEntry e;
  e.name = "sync_batch_norm";
  e.forward = sync_bn(2, true, false);
  e.half_tolerance_scale = 4;  // as batch_norm
  e.samples = [] {
    Generator gen(23);
    auto affine = [&](const Shape& x, int64_t c) {
      return V{uniform(x, gen, -2, 3), uniform({c}, gen, 0.5, 1.5), uniform({c}, gen)};
    };
    std::vector<OpSample> s = {
        sample("[3, 4, 3, 2] 2 replicas", affine({3, 4, 3, 2}, 4)),
        sample("[3, 4, 3, 2] 1 replica", affine({3, 4, 3, 2}, 4), sync_bn(1, true, false)),
        sample("[5, 3] 3 replicas", affine({5, 3}, 3), sync_bn(3, true, false)),
        sample("[3, 4, 3, 2] 2 replicas without affine", {uniform({3, 4, 3, 2}, gen)},
               sync_bn(2, false, false)),
        sample("[1, 3] 2 replicas: one value each, two in all", affine({1, 3}, 3),
               sync_bn(2, true, false, 1e-3)),
        model_shape("ResNet-18 [4, 16, 8, 8] 2 replicas", affine({4, 16, 8, 8}, 16)),
    };
    // Running statistics: constants of the call, updated in place with the global count's
    // unbiased variance; the device comparison checks their new values too.
    V in = affine({4, 3, 5, 5}, 3);
    in.push_back(constant({0.1, -0.2, 0.3}));
    in.push_back(constant({1.0, 0.5, 2.0}));
    OpSample stats =
        sample("[4, 3, 5, 5] 3 replicas with running statistics", in, sync_bn(3, true, true));
    stats.grad_inputs = 3;
    s.push_back(stats);
    return s;
  };
  e.bad_inputs = [] {
    const V good{zeros({2, 3}), ones({3}), zeros({3})};
    std::vector<OpBadInput> bad = common_bad_inputs("sync_batch_norm", good);
    bad.push_back({"3-d input",
                   {zeros({2, 3, 4}), ones({3}), zeros({3})},
                   "sync_batch_norm: expected a 2-d [N, C] or 4-d [N, C, H, W] input"});
    bad.push_back({"bias of the wrong size",
                   {zeros({2, 3}), ones({3}), zeros({2})},
                   "sync_batch_norm: bias has shape"});
    bad.push_back({"one value per channel in all",
                   {zeros({1, 3}), ones({3}), zeros({3})},
                   "expected more than 1 value per channel when training, got 1 over all replicas",
                   sync_bn(1, true, false)});
    bad.push_back({"empty batches everywhere",
                   {zeros({0, 3}), ones({3}), zeros({3})},
                   "expected more than 1 value per channel when training, got 0"});
    bad.push_back(
        {"no collectives", good, "sync_batch_norm: collectives must not be null", [](const V& v) {
           return sync_batch_norm(v[0], Tensor(), Tensor(), v[1], v[2], 0.1, 1e-5, nullptr);
         }});
    return bad;
  };
  return e;
}

// ---- layer_norm.h ----

// inputs: x, then weight when `weight`, then bias when `bias`.
OpFn ln(bool weight, bool bias, double eps = 1e-5) {
  return [=](const V& v) {
    return layer_norm(v[0], weight ? v[1] : Tensor(), bias ? v[weight ? 2 : 1] : Tensor(), eps);
  };
}

OpEntry layer_norm_entry() {
  OpEntry e;
  e.name = "layer_norm";
  e.forward = ln(true, true);
  e.half_tolerance_scale = 4;  // statistics over a row, normalized by them
  e.samples = [] {
    Generator gen(31);
    auto affine = [&](const Shape& x, double lo = -2, double hi = 3) {
      const int64_t d = x.back();
      return V{uniform(x, gen, lo, hi), uniform({d}, gen, 0.5, 1.5), uniform({d}, gen)};
    };
    return std::vector<OpSample>{
        sample("[4, 33]", affine({4, 33})),
        sample("[2, 3, 5]", affine({2, 3, 5}, -1, 1)),
        sample("[2, 3, 2, 7]", affine({2, 3, 2, 7})),
        sample("[5, 1]", affine({5, 1})),
        sample("[2, 4097]", affine({2, 4097})),
        sample("[33]", affine({33})),
        sample("[3, 2, 33] without affine", {uniform({3, 2, 33}, gen, -2, 3)}, ln(false, false)),
        sample("[3, 6] weight only", {uniform({3, 6}, gen), uniform({6}, gen, 0.5, 1.5)},
               ln(true, false)),
        sample("[3, 6] bias only", {uniform({3, 6}, gen), uniform({6}, gen)}, ln(false, true)),
        sample("[4, 9] eps 1e-3", affine({4, 9}, -0.1, 0.1), ln(true, true, 1e-3)),
        model_shape("minGPT [4, 64, 128]", affine({4, 64, 128})),
        empty_batch("[0, 5]", affine({0, 5})),
    };
  };
  e.bad_inputs = [] {
    const V good{zeros({2, 3}), ones({3}), zeros({3})};
    std::vector<OpBadInput> bad = common_bad_inputs("layer_norm", good);
    bad.push_back({"0-d input",
                   {zeros({}), ones({1}), zeros({1})},
                   "layer_norm: expected an input of at least 1 dimension"});
    bad.push_back({"weight of the wrong size",
                   {zeros({2, 3}), ones({4}), zeros({3})},
                   "layer_norm: weight has shape"});
    bad.push_back({"bias of the wrong size",
                   {zeros({2, 3}), ones({3}), zeros({3, 1})},
                   "layer_norm: bias has shape"});
    bad.push_back({"negative eps", good, "eps must be non-negative", ln(true, true, -1.0)});
    return bad;
  };
  return e;
}

// ---- loss.h ----

// softmax and log_softmax (op) along a dimension: the same samples and bad inputs.
OpEntry softmax_entry(const std::string& name, Tensor (*op)(const Tensor&, int64_t),
                      uint64_t seed) {
  OpEntry e;
  e.name = name;
  e.forward = [op](const V& x) { return op(x[0], 1); };
  e.samples = [op, seed] {
    Generator gen(seed);
    auto along = [op](int64_t d) { return [op, d](const V& x) { return op(x[0], d); }; };
    const Tensor a = uniform({3, 4, 5}, gen, -2, 2), b = uniform({33, 10}, gen, -4, 4);
    return std::vector<OpSample>{
        sample("[3, 4, 5] dim 0", {a}, along(0)),
        sample("[3, 4, 5] dim 1", {a}, along(1)),
        sample("[3, 4, 5] dim 2", {a}, along(2)),
        sample("[3, 4, 5] dim -1", {a}, along(-1)),
        sample("[4, 6] dim 1 (the [N, C] fast path)", {uniform({4, 6}, gen, -2, 2)}),
        sample("[33, 10] dim 1", {b}),
        sample("[33, 10] dim 0", {b}, along(0)),
        empty_batch("[0, 10] dim 1", {uniform({0, 10}, gen)}),
    };
  };
  e.bad_inputs = [name, op] {
    std::vector<OpBadInput> bad = common_bad_inputs(name, {zeros({2, 3})});
    bad.push_back(
        {"dim out of range", {zeros({2, 3})}, name + ": dim 2 is out of range", [op](const V& x) {
           return op(x[0], 2);
         }});
    return bad;
  };
  return e;
}

OpEntry mse_loss_entry() {
  OpEntry e;
  e.name = "mse_loss";
  e.forward = [](const V& x) { return mse_loss(x[0], x[1]); };
  e.half_tolerance_scale = 4;  // a mean over every element
  e.samples = [] {
    Generator gen(21);
    auto pair = [&](const Shape& s) { return V{uniform(s, gen, -2, 2), uniform(s, gen, -2, 2)}; };
    return std::vector<OpSample>{
        sample("[5]", pair({5})),
        sample("[33, 10]", pair({33, 10})),
        sample("[2, 3, 4, 5]", pair({2, 3, 4, 5})),
        sample("0-d", pair({})),
        model_shape("[1000, 7] (more values than partial sums)", pair({1000, 7})),
        empty_batch("[0, 4]", pair({0, 4})),
    };
  };
  e.bad_inputs = [] {
    std::vector<OpBadInput> bad = common_bad_inputs("mse_loss", {zeros({2, 3}), zeros({2, 3})});
    bad.push_back({"shape mismatch",
                   {zeros({2, 3}), zeros({3, 2})},
                   "mse_loss: input shape [2, 3] does not match target shape [3, 2]"});
    bad.push_back({"no broadcasting", {zeros({2, 3}), zeros({3})}, "does not match target shape"});
    return bad;
  };
  return e;
}

// (input, target) whose differences d have |d| in [0.05, 0.8 beta) or (1.2 beta, 2.5), random
// signs: both sides of beta (every |d| >= 0.1 when beta == 0), each far from smooth_l1_loss's
// kinks (d == +-beta, and d == 0 for the L1 loss) compared with the finite-difference step.
V smooth_l1_pair(const Shape& shape, Generator& gen, double beta) {
  const Tensor target = uniform(shape, gen, -2, 2);
  const std::vector<double> u = rand(shape, gen, f64).to_vector<double>();
  const std::vector<double> side = rand(shape, gen, f64).to_vector<double>();
  const std::vector<double> sign = rand(shape, gen, f64).to_vector<double>();
  Tensor input = target.clone();
  double* x = input.data<double>();
  for (size_t i = 0; i < u.size(); ++i) {
    double d = beta == 0.0     ? 0.1 + 2.4 * u[i]
               : side[i] < 0.5 ? 0.05 + (0.8 * beta - 0.05) * u[i]
                               : 1.2 * beta + (2.5 - 1.2 * beta) * u[i];
    x[i] += sign[i] < 0.5 ? -d : d;
  }
  return {input, target};
}

OpEntry smooth_l1_loss_entry() {
  OpEntry e;
  e.name = "smooth_l1_loss";
  e.forward = [](const V& x) { return smooth_l1_loss(x[0], x[1]); };
  e.half_tolerance_scale = 4;  // a mean over every element
  e.samples = [] {
    Generator gen(22);
    auto with_beta = [](double beta) {
      return [beta](const V& x) { return smooth_l1_loss(x[0], x[1], beta); };
    };
    return std::vector<OpSample>{
        sample("[5] beta 1", smooth_l1_pair({5}, gen, 1.0)),
        sample("[33, 10] beta 1", smooth_l1_pair({33, 10}, gen, 1.0)),
        sample("[33, 10] beta 0.5", smooth_l1_pair({33, 10}, gen, 0.5), with_beta(0.5)),
        sample("[2, 3, 4, 5] beta 0 (L1)", smooth_l1_pair({2, 3, 4, 5}, gen, 0.0), with_beta(0.0)),
        sample("0-d beta 2", smooth_l1_pair({}, gen, 2.0), with_beta(2.0)),
        model_shape("[1000, 7] (more values than partial sums)",
                    smooth_l1_pair({1000, 7}, gen, 1.0)),
        empty_batch("[0, 4]", smooth_l1_pair({0, 4}, gen, 1.0)),
    };
  };
  e.bad_inputs = [] {
    std::vector<OpBadInput> bad =
        common_bad_inputs("smooth_l1_loss", {zeros({2, 3}), zeros({2, 3})});
    bad.push_back({"shape mismatch",
                   {zeros({2, 3}), zeros({3, 2})},
                   "smooth_l1_loss: input shape [2, 3] does not match target shape [3, 2]"});
    bad.push_back({"no broadcasting", {zeros({2, 3}), zeros({3})}, "does not match target shape"});
    bad.push_back({"negative beta",
                   {zeros({2, 3}), zeros({2, 3})},
                   "smooth_l1_loss: beta must be >= 0, got -1",
                   [](const V& x) { return smooth_l1_loss(x[0], x[1], -1.0); }});
    bad.push_back({"NaN beta",
                   {zeros({2, 3}), zeros({2, 3})},
                   "smooth_l1_loss: beta must be >= 0, got nan",
                   [](const V& x) { return smooth_l1_loss(x[0], x[1], NAN); }});
    return bad;
  };
  return e;
}

// The bad targets of nll_loss and cross_entropy (inputs: [N, C] scores and i64 targets).
std::vector<OpBadInput> class_target_bad_inputs(const std::string& op) {
  const Tensor x = zeros({2, 3}), t = from_vector<int64_t>({0, 2}, {2});
  std::vector<OpBadInput> bad = common_bad_inputs(op, {x, t});
  bad.push_back({"3-d input", {zeros({2, 3, 1}), t}, "expected a 2-d tensor"});
  bad.push_back({"f32 target", {x, zeros({2})}, "target must be an i64 tensor"});
  bad.push_back({"target of the wrong length",
                 {x, from_vector<int64_t>({0}, {1})},
                 "does not match input shape"});
  bad.push_back({"target out of range",
                 {x, from_vector<int64_t>({0, 3}, {2})},
                 "target 3 at index 1 is out of range for 3 classes"});
  bad.push_back({"negative target",
                 {x, from_vector<int64_t>({-1, 2}, {2})},
                 "target -1 at index 0 is out of range for 3 classes"});
  return bad;
}

OpEntry nll_loss_entry() {
  OpEntry e;
  e.name = "nll_loss";
  e.forward = [](const V& x) { return nll_loss(x[0], x[1]); };
  e.half_tolerance_scale = 4;  // a mean over the batch
  e.samples = [] {
    Generator gen(20);
    auto after_log_softmax = [](const V& x) { return nll_loss(log_softmax(x[0], 1), x[1]); };
    return std::vector<OpSample>{
        sample("[5, 4]", {uniform({5, 4}, gen, -3, 0), targets(5, 4, gen)}),
        sample("[5, 4] after log_softmax", {uniform({5, 4}, gen, -3, 0), targets(5, 4, gen)},
               after_log_softmax),
        sample("[33, 10] after log_softmax", {uniform({33, 10}, gen, -4, 4), targets(33, 10, gen)},
               after_log_softmax),
        model_shape("MNIST batch [64, 10]", {uniform({64, 10}, gen, -4, 0), targets(64, 10, gen)}),
        empty_batch("[0, 4]", {uniform({0, 4}, gen, -3, 0), targets(0, 4, gen)}),
    };
  };
  e.bad_inputs = [] { return class_target_bad_inputs("nll_loss"); };
  return e;
}

OpEntry cross_entropy_entry() {
  OpEntry e;
  e.name = "cross_entropy";
  e.forward = [](const V& x) { return cross_entropy(x[0], x[1]); };
  e.half_tolerance_scale = 4;
  e.samples = [] {
    Generator gen(21);
    auto smoothing = [](double eps) {
      return [eps](const V& x) { return cross_entropy(x[0], x[1], eps); };
    };
    const V small{uniform({6, 5}, gen, -2, 2), targets(6, 5, gen)};
    const V odd{uniform({33, 10}, gen, -4, 4), targets(33, 10, gen)};
    return std::vector<OpSample>{
        sample("[6, 5]", small),
        sample("[6, 5] label smoothing 0.1", small, smoothing(0.1)),
        sample("[6, 5] label smoothing 1", small, smoothing(1.0)),
        sample("[33, 10]", odd),
        sample("[33, 10] label smoothing 0.1", odd, smoothing(0.1)),
        model_shape("MNIST batch [64, 10]", {uniform({64, 10}, gen, -4, 4), targets(64, 10, gen)}),
        empty_batch("[0, 5]", {uniform({0, 5}, gen), targets(0, 5, gen)}),
    };
  };
  e.bad_inputs = [] {
    std::vector<OpBadInput> bad = class_target_bad_inputs("cross_entropy");
    bad.push_back({"label smoothing 1.5",
                   {zeros({2, 3}), from_vector<int64_t>({0, 2}, {2})},
                   "label_smoothing",
                   [](const V& x) { return cross_entropy(x[0], x[1], 1.5); }});
    return bad;
  };
  return e;
}

// ---- matmul.h ----

OpEntry matmul_entry() {
  OpEntry e;
  e.name = "matmul";
  e.tf32 = OpEntry::Tf32::matmul;
  e.forward = [](const V& x) { return matmul(x[0], x[1]); };
  e.half_tolerance_scale = 4;  // dot products of up to 784 terms
  e.samples = [] {
    Generator gen(22);
    const std::vector<std::pair<Shape, Shape>> shapes = {
        {{3, 4}, {4, 5}},       {{4}, {4, 2}},          {{3, 4}, {4}},       {{4}, {4}},
        {{2, 3, 4}, {2, 4, 5}}, {{2, 3, 4}, {4, 5}},    {{3, 4}, {2, 4, 5}}, {{4}, {2, 4, 3}},
        {{7, 33}, {33, 5}},     {{3, 7, 4}, {3, 4, 5}}, {{33}, {33, 5}},     {{7, 33}, {33}},
        {{7, 0}, {0, 5}},  // an empty inner dimension: zeros
    };
    std::vector<OpSample> s;
    for (const auto& [sa, sb] : shapes)
      s.push_back(
          sample(shape_str(sa) + " x " + shape_str(sb), {uniform(sa, gen), uniform(sb, gen)}));
    s.push_back(empty_batch("[0, 4] x [4, 5]", {uniform({0, 4}, gen), uniform({4, 5}, gen)}));
    s.push_back(empty_batch("[0, 3, 4] x [4, 5]", {uniform({0, 3, 4}, gen), uniform({4, 5}, gen)}));
    return s;
  };
  e.bad_inputs = [] {
    std::vector<OpBadInput> bad = common_bad_inputs("matmul", {zeros({2, 3}), zeros({3, 4})});
    bad.push_back({"inner sizes differ", {zeros({2, 3}), zeros({4, 5})}, "cannot be multiplied"});
    bad.push_back(
        {"4-d operand", {zeros({1, 2, 2, 3}), zeros({3, 4})}, "expected 1-d, 2-d or 3-d operands"});
    bad.push_back(
        {"batch sizes differ", {zeros({2, 2, 3}), zeros({3, 3, 4})}, "batch sizes differ"});
    return bad;
  };
  return e;
}

OpEntry linear_entry() {
  OpEntry e;
  e.name = "linear";
  e.tf32 = OpEntry::Tf32::matmul;
  e.forward = [](const V& x) { return linear(x[0], x[1], x.size() > 2 ? x[2] : Tensor()); };
  e.half_tolerance_scale = 4;
  e.samples = [] {
    Generator gen(23);
    const Tensor w = uniform({4, 3}, gen), b = uniform({4}, gen);
    const Tensor w33 = uniform({17, 33}, gen), b33 = uniform({17}, gen);
    return std::vector<OpSample>{
        sample("[5, 3] with bias", {uniform({5, 3}, gen), w, b}),
        sample("[5, 3] without bias", {uniform({5, 3}, gen), w}),
        // Leading dimensions are flattened into rows.
        sample("[2, 3, 3] with bias", {uniform({2, 3, 3}, gen), w, b}),
        sample("[2, 9, 33] with bias", {uniform({2, 9, 33}, gen), w33, b33}),
        sample("[2, 9, 33] without bias", {uniform({2, 9, 33}, gen), w33}),
        model_shape(
            "MLP [4, 784] -> 512",
            {uniform({4, 784}, gen), uniform({512, 784}, gen, -0.05, 0.05), uniform({512}, gen)}),
        model_shape("ToyNet fc2 [8, 128] -> 10",
                    {uniform({8, 128}, gen), uniform({10, 128}, gen), uniform({10}, gen)}),
        empty_batch("[0, 3] with bias", {uniform({0, 3}, gen), w, b}),
    };
  };
  e.bad_inputs = [] {
    const Tensor x = zeros({2, 3}), w = zeros({4, 3});
    std::vector<OpBadInput> bad = common_bad_inputs("linear", {x, w});
    bad.push_back({"in_features mismatch", {zeros({2, 5}), w}, "linear: input shape"});
    bad.push_back({"bias of the wrong size", {x, w, zeros({3})}, "linear: bias shape"});
    bad.push_back({"1-d weight", {x, zeros({3})}, "expected a 2-d tensor"});
    return bad;
  };
  return e;
}

// matmul_out and orthonormalize_columns_ write into a tensor: the entries return it.
OpFn matmul_out_fn(bool ta, bool tb) {
  return [=](const V& x) {
    Tensor out;  // undefined for undefined inputs: matmul_out names them
    if (x[0].defined() && x[0].dim() >= 2 && x[1].defined() && x[1].dim() >= 2) {
      const int64_t m = ta ? x[0].size(1) : x[0].size(0), n = tb ? x[1].size(0) : x[1].size(1);
      out = Tensor::empty({m, n}, x[0].dtype(), x[0].device());
    }
    matmul_out(x[0], ta, x[1], tb, out);
    return out;
  };
}

OpEntry matmul_out_entry() {
  OpEntry e;
  e.name = "matmul_out";
  e.tf32 = OpEntry::Tf32::matmul;
  e.forward = matmul_out_fn(false, false);
  e.differentiable = false;
  e.cpu_dtypes = {f32, f64};  // writes into a given tensor: no f32 route for the half types
  e.half_tolerance_scale = 4;
  e.samples = [] {
    Generator gen(24);
    const int64_t m = 37, n = 5, k = 70;
    std::vector<OpSample> s;
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        s.push_back(
            sample(std::string("[37, 70] x [70, 5]") + (ta ? " a^T" : "") + (tb ? " b^T" : ""),
                   {uniform(ta ? Shape{k, m} : Shape{m, k}, gen),
                    uniform(tb ? Shape{n, k} : Shape{k, n}, gen)},
                   matmul_out_fn(ta, tb)));
      }
    s.push_back(empty_batch("[0, 4] x [4, 3]", {uniform({0, 4}, gen), uniform({4, 3}, gen)}));
    return s;
  };
  e.bad_inputs = [] {
    std::vector<OpBadInput> bad = common_bad_inputs("matmul_out", {zeros({2, 3}), zeros({3, 4})});
    bad.push_back({"inner sizes differ",
                   {zeros({2, 3}), zeros({4, 5})},
                   "matmul_out: shapes",
                   [](const V& x) {
                     Tensor out = zeros({2, 5}, x[0].dtype(), x[0].device());
                     matmul_out(x[0], false, x[1], false, out);
                     return out;
                   }});
    bad.push_back({"3-d operand", {zeros({1, 2, 3}), zeros({3, 4})}, "expected a 2-d tensor"});
    return bad;
  };
  return e;
}

OpEntry orthonormalize_columns_entry() {
  OpEntry e;
  e.name = "orthonormalize_columns_";
  e.forward = [](const V& x) {
    Tensor p = x[0].detach().clone();
    orthonormalize_columns_(p);
    return p;
  };
  e.differentiable = false;
  e.cpu_dtypes = {f32, f64};
  e.cuda_dtypes = {f32, f64};
  e.samples = [] {
    Generator gen(25);
    // A column that repeats an earlier one becomes zero.
    Tensor dependent = uniform({9, 3}, gen);
    double* p = dependent.data<double>();
    for (int64_t i = 0; i < 9; ++i) p[i * 3 + 2] = 2.0 * p[i * 3];
    return std::vector<OpSample>{
        sample("[37, 4]", {uniform({37, 4}, gen)}),
        sample("[9, 3] with a dependent column", {dependent}),
        model_shape("PowerSGD rank 4 of a [512, 784] gradient", {uniform({784, 4}, gen)}),
        empty_batch("[0, 2]", {uniform({0, 2}, gen)}),
    };
  };
  e.bad_inputs = [] {
    std::vector<OpBadInput> bad;
    bad.push_back({"3-d input", {zeros({2, 3, 4})}, "expected a 2-d tensor"});
    bad.push_back({"i64 input", {zeros({3, 2}, DType::i64)}, "needs f32 or f64, got i64"});
    bad.push_back({"undefined input", {Tensor()}, "input 0 is an undefined tensor", [](const V& x) {
                     return orthonormalize_columns_(x[0]);
                   }});
    return bad;
  };
  return e;
}

// ---- dropout.h, flatten.h ----

OpFn dropout_fn(double p, bool training = true) {
  // A fresh generator per call: every finite-difference probe and every device sees one mask.
  return [=](const V& x) {
    Generator g(99);
    return dropout(x[0], p, training, g);
  };
}

OpEntry dropout_entry() {
  OpEntry e;
  e.name = "dropout";
  e.forward = dropout_fn(0.4);
  e.samples = [] {
    Generator gen(26);
    const Tensor x = uniform({6, 7}, gen);
    return std::vector<OpSample>{
        sample("[6, 7] p 0.4", {x}),
        sample("[4097] p 0.5", {uniform({4097}, gen)}, dropout_fn(0.5)),
        sample("[4097] p 0.3", {uniform({4097}, gen)}, dropout_fn(0.3)),
        sample("[6, 7] p 0", {x}, dropout_fn(0.0)),
        sample("[6, 7] p 1", {x}, dropout_fn(1.0)),
        sample("[6, 7] eval", {x}, dropout_fn(0.5, false)),
        model_shape("ToyNet [8, 64, 12, 12] p 0.25", {uniform({8, 64, 12, 12}, gen)},
                    dropout_fn(0.25)),
        empty_batch("[0, 7] p 0.4", {uniform({0, 7}, gen)}),
    };
  };
  e.bad_inputs = [] {
    std::vector<OpBadInput> bad = common_bad_inputs("dropout", {zeros({2, 3})});
    bad.push_back(
        {"p 1.5", {zeros({2, 3})}, "probability p must be in [0, 1], got 1.5", dropout_fn(1.5)});
    bad.push_back({"p -0.1", {zeros({2, 3})}, "probability p must be in [0, 1]", dropout_fn(-0.1)});
    return bad;
  };
  return e;
}

OpEntry flatten_entry() {
  OpEntry e;
  e.name = "flatten";
  e.forward = [](const V& x) { return flatten(x[0]); };
  e.samples = [] {
    Generator gen(27);
    const Tensor x = uniform({2, 3, 2, 2}, gen);
    return std::vector<OpSample>{
        sample("[2, 3, 2, 2]", {x}),
        sample("[2, 3, 2, 2] dims 1..2", {x}, [](const V& v) { return flatten(v[0], 1, 2); }),
        sample("[2, 3, 9, 11]", {uniform({2, 3, 9, 11}, gen)}),
        sample("0-d", {uniform({}, gen)}, [](const V& v) { return flatten(v[0], 0); }),
        empty_batch("[0, 3, 2, 2]", {uniform({0, 3, 2, 2}, gen)}),
    };
  };
  e.bad_inputs = [] {
    const Tensor x = zeros({2, 3, 4});
    return std::vector<OpBadInput>{
        {"start_dim out of range",
         {x},
         "flatten: start_dim 3 is out of range",
         [](const V& v) { return flatten(v[0], 3); }},
        {"start_dim after end_dim",
         {x},
         "comes after end_dim",
         [](const V& v) { return flatten(v[0], 2, 1); }},
        {"undefined input", {Tensor()}, "flatten: input is an undefined tensor"},
    };
  };
  return e;
}

// ---- metrics.h: never differentiable; topk_correct and accuracy answer on the host ----

Tensor scalar(double v) { return from_vector<double>({v}, {}); }

// ---- grad_clip.h: total_norm, scale_by_clip_coef_, clamp_ (gradient clipping) ----

OpFn norm_of_order(double p) {
  return [p](const V& x) { return total_norm(x, p); };
}

OpEntry total_norm_entry() {
  OpEntry e;
  e.name = "total_norm";
  e.cpu_dtypes = {f32, f64};  // gradients in place: no f32 route for the half types
  e.forward = norm_of_order(2.0);
  e.differentiable = false;
  e.half_tolerance_scale = 4;  // rounds the f64 norm to the half type once, as the others
  e.samples = [] {
    Generator gen(29);
    // The gradients of a Linear(33, 17) and a bias of 4097: several tensors, awkward sizes.
    const V grads{uniform({17, 33}, gen), uniform({17}, gen), uniform({4097}, gen, -3, 3)};
    const V with_empty{uniform({5, 3}, gen), uniform({0, 4}, gen), uniform({7}, gen)};
    return std::vector<OpSample>{
        sample("[33, 10]", {uniform({33, 10}, gen)}),
        sample("three tensors", grads),
        sample("three tensors p=1", grads, norm_of_order(1.0)),
        sample("three tensors p=3", grads, norm_of_order(3.0)),
        // Small: a 0.5-norm of many elements exceeds f16's range (inf, as PyTorch's would be).
        sample("two small tensors p=0.5", {uniform({5}, gen), uniform({3}, gen)},
               norm_of_order(0.5)),
        sample("three tensors p=inf", grads, norm_of_order(INFINITY)),
        sample("an empty tensor among them", with_empty),
        sample("an empty tensor among them p=inf", with_empty, norm_of_order(INFINITY)),
        sample("0-d", {uniform({}, gen)}),
        model_shape("[100000] (more values than partial sums)", {uniform({100000}, gen)}),
        empty_batch("[0, 4]", {uniform({0, 4}, gen)}),
    };
  };
  e.bad_inputs = [] {
    std::vector<OpBadInput> bad = common_bad_inputs("total_norm", {zeros({2, 3}), zeros({3})});
    bad.push_back({"dtype mismatch", {zeros({3}), zeros({3}, f64)}, "total_norm: dtype mismatch"});
    bad.push_back({"no tensors", {}, "total_norm: needs at least one tensor"});
    for (double p : {0.0, -1.0, double(NAN)}) {
      bad.push_back({"norm_type " + std::to_string(p),
                     {zeros({3})},
                     "total_norm: norm_type must be > 0 (or inf)",
                     norm_of_order(p)});
    }
    return bad;
  };
  return e;
}

// An in-place op as a function: applied to a copy of x[0] (so the harness's inputs stay as they
// were), or to x[0] itself when it is undefined, for the op's own error.
OpFn on_a_copy(std::function<void(Tensor&, const V&)> op) {
  return [op](const V& x) {
    NoGradGuard no_grad;  // gradcheck hands in leaves that require grad
    Tensor y = x[0].defined() ? x[0].clone() : x[0];
    op(y, x);
    return y;
  };
}

OpFn clip_by(double max_norm) {
  return on_a_copy([max_norm](Tensor& y, const V& x) { scale_by_clip_coef_(y, x[1], max_norm); });
}

OpEntry scale_by_clip_coef_entry() {
  OpEntry e;
  e.name = "scale_by_clip_coef_";
  e.cpu_dtypes = {f32, f64};  // gradients in place: no f32 route for the half types
  e.forward = clip_by(1.0);
  e.differentiable = false;
  e.samples = [] {
    Generator gen(30);
    const Tensor g = uniform({33, 10}, gen, -2, 2);
    return std::vector<OpSample>{
        sample("[33, 10] norm 4 max 1 (scaled by 1/4)", {g, constant({4.0})}),
        sample("[33, 10] norm 0.5 max 1 (coefficient clamped to 1)", {g, constant({0.5})}),
        sample("[4097] norm 3 max 0 (zeroed)", {uniform({4097}, gen), constant({3.0})}, clip_by(0)),
        sample("0-d norm 2 max 1.5", {uniform({}, gen), constant({2.0})}, clip_by(1.5)),
        sample("total_norm then scale (clip_grad_norm_)", {g, uniform({17}, gen)},
               [](const V& x) {
                 NoGradGuard no_grad;
                 Tensor y = x[0].clone();
                 const Tensor norm = total_norm({x[0], x[1]});
                 return scale_by_clip_coef_(y, norm, 0.5);
               }),
        empty_batch("[0, 4]", {uniform({0, 4}, gen), constant({2.0})}),
    };
  };
  e.bad_inputs = [] {
    std::vector<OpBadInput> bad =
        common_bad_inputs("scale_by_clip_coef_", {zeros({2, 3}), full({1}, 1.0)});
    bad.push_back({"norm of two elements",
                   {zeros({2, 3}), zeros({2})},
                   "scale_by_clip_coef_: total_norm must have one element, got [2]"});
    bad.push_back({"negative max_norm",
                   {zeros({2, 3}), full({1}, 1.0)},
                   "scale_by_clip_coef_: max_norm must be >= 0, got -1",
                   clip_by(-1)});
    bad.push_back({"dtype mismatch", {zeros({3}), zeros({1}, f64)}, "dtype mismatch"});
    return bad;
  };
  return e;
}

OpFn clamp_to(double lo, double hi) {
  return on_a_copy([lo, hi](Tensor& y, const V&) { clamp_(y, lo, hi); });
}

OpEntry clamp_entry() {
  OpEntry e;
  e.name = "clamp_";
  e.cpu_dtypes = {f32, f64};  // gradients in place: no f32 route for the half types
  e.forward = clamp_to(-0.5, 0.5);
  e.differentiable = false;
  e.samples = [] {
    Generator gen(31);
    return std::vector<OpSample>{
        sample("[33, 10] [-0.5, 0.5]", {uniform({33, 10}, gen)}),
        sample("[4097] [-2, 0.25]", {uniform({4097}, gen, -3, 3)}, clamp_to(-2, 0.25)),
        sample("[7] [0, 0]", {uniform({7}, gen)}, clamp_to(0, 0)),
        sample("[5] [-inf, 0.1]", {uniform({5}, gen)}, clamp_to(-INFINITY, 0.1)),
        empty_batch("[0, 4]", {uniform({0, 4}, gen)}),
    };
  };
  e.bad_inputs = [] {
    std::vector<OpBadInput> bad = common_bad_inputs("clamp_", {zeros({2, 3})});
    bad.push_back({"min > max",
                   {zeros({3})},
                   "clamp_: needs min <= max (neither NaN), got min 1 "
                   "and max -1",
                   clamp_to(1, -1)});
    bad.push_back({"NaN bound", {zeros({3})}, "clamp_: needs min <= max", clamp_to(NAN, 1)});
    return bad;
  };
  return e;
}

OpEntry argmax_entry() {
  OpEntry e;
  e.name = "argmax";
  e.forward = [](const V& x) { return argmax(x[0], 1); };
  e.differentiable = false;
  e.samples = [] {
    Generator gen(28);
    const Tensor x = uniform({33, 10}, gen);
    return std::vector<OpSample>{
        sample("[33, 10] dim 1", {x}),
        sample("[33, 10] dim 0 keepdim", {x}, [](const V& v) { return argmax(v[0], 0, true); }),
        sample("[3, 4, 5] dim -1", {uniform({3, 4, 5}, gen)},
               [](const V& v) { return argmax(v[0], -1); }),
        empty_batch("[0, 10] dim 1", {uniform({0, 10}, gen)}),
    };
  };
  e.bad_inputs = [] {
    std::vector<OpBadInput> bad = common_bad_inputs("argmax", {zeros({2, 3})});
    bad.push_back(
        {"dim out of range", {zeros({2, 3})}, "argmax: dim 2 is out of range", [](const V& x) {
           return argmax(x[0], 2);
         }});
    bad.push_back({"empty dimension", {zeros({2, 0})}, "cannot take the argmax of an empty"});
    return bad;
  };
  return e;
}

OpFn topk_fn(int64_t k) {
  return [k](const V& x) { return scalar(double(topk_correct(x[0], x[1], k))); };
}
OpFn accuracy_fn(int64_t k) {
  return [k](const V& x) { return scalar(accuracy(x[0], x[1], k)); };
}

std::vector<OpSample> metric_samples(OpFn (*fn)(int64_t), bool empty_works) {
  Generator gen(29);
  const Tensor x = uniform({33, 10}, gen);
  const Tensor t = targets(33, 10, gen);
  std::vector<OpSample> s;
  for (int64_t k : {1, 3, 10})
    s.push_back(sample("[33, 10] k " + std::to_string(k), {x, t}, fn(k)));
  if (empty_works)
    s.push_back(empty_batch("[0, 10]", {uniform({0, 10}, gen), targets(0, 10, gen)}));
  return s;
}

std::vector<OpBadInput> metric_bad_inputs(const std::string& op, OpFn (*fn)(int64_t)) {
  const Tensor x = zeros({2, 3}), t = from_vector<int64_t>({0, 2}, {2});
  std::vector<OpBadInput> bad = common_bad_inputs(op, {x, t});
  bad.push_back({"k 4 of 3 classes", {x, t}, "k = 4 must be in [1, 3]", fn(4)});
  bad.push_back({"f32 target", {x, zeros({2})}, "topk_correct"});
  bad.push_back(
      {"target out of range", {x, from_vector<int64_t>({0, 3}, {2})}, "target 3 at index 1"});
  return bad;
}

OpEntry topk_correct_entry() {
  OpEntry e;
  e.name = "topk_correct";
  e.forward = topk_fn(1);
  e.differentiable = false;
  e.host_result = true;
  e.samples = [] { return metric_samples(topk_fn, true); };
  e.bad_inputs = [] { return metric_bad_inputs("topk_correct", topk_fn); };
  return e;
}

OpEntry accuracy_entry() {
  OpEntry e;
  e.name = "accuracy";
  e.forward = accuracy_fn(1);
  e.differentiable = false;
  e.host_result = true;
  e.samples = [] { return metric_samples(accuracy_fn, false); };
  e.bad_inputs = [] {
    std::vector<OpBadInput> bad = metric_bad_inputs("accuracy", accuracy_fn);
    OpBadInput empty = {"an empty batch",
                        {zeros({0, 3}), from_vector<int64_t>({}, {0})},
                        "accuracy: needs at least one row"};
    bad.push_back(empty);
    return bad;
  };
  return e;
}

// ---- embedding.h ----

// i64 indices of `shape`, uniform in [0, v) from gen, with the given values written first (to
// force duplicates and the padding row into small samples).
Tensor indices(const Shape& shape, int64_t v, Generator& gen, std::vector<int64_t> first = {}) {
  std::vector<int64_t> t = targets(shape_numel(shape), v, gen).to_vector<int64_t>();
  std::copy(first.begin(), first.end(), t.begin());
  return from_vector<int64_t>(t, shape);
}

OpSample without_gradcheck(OpSample s) {
  s.gradcheck = false;
  return s;
}

OpEntry embedding_entry() {
  OpEntry e;
  e.name = "embedding";
  e.forward = [](const V& x) { return embedding(x[0], x[1]); };
  e.half_tolerance_scale = 4;  // a duplicated row's gradient is a sum (in f32, rounded once)
  e.samples = [] {
    Generator gen(40);
    auto padding = [](int64_t p) { return [p](const V& x) { return embedding(x[0], x[1], p); }; };
    return std::vector<OpSample>{
        sample("[7, 5], indices [6] with duplicates",
               {uniform({7, 5}, gen), from_vector<int64_t>({3, 1, 3, 0, 3, 6}, {6})}),
        // The padding row's gradient is zero by definition, not the finite difference (as in
        // PyTorch): device comparisons only (tests/engine/nn_ops_test.cpp checks the values).
        without_gradcheck(sample(
            "[7, 5], padding_idx 2",
            {uniform({7, 5}, gen), from_vector<int64_t>({2, 1, 2, 4, 1, 2}, {2, 3})}, padding(2))),
        sample("[7, 5], padding_idx 0 never used",
               {uniform({7, 5}, gen), from_vector<int64_t>({5, 5, 6}, {3})}, padding(0)),
        sample("[33, 17], indices [4, 9]", {uniform({33, 17}, gen), indices({4, 9}, 33, gen)}),
        sample("[5, 3], 0-d index", {uniform({5, 3}, gen), from_vector<int64_t>({4}, {})}),
        sample("[1, 4097], indices [3]",
               {uniform({1, 4097}, gen), from_vector<int64_t>({0, 0, 0}, {3})}),
        model_shape("gpt-nano tokens [65, 48], indices [8, 64], padding_idx 0",
                    {uniform({65, 48}, gen), indices({8, 64}, 65, gen, {0, 0, 7})}, padding(0)),
        empty_batch("[7, 5], indices [0, 3]", {uniform({7, 5}, gen), indices({0, 3}, 7, gen)}),
    };
  };
  e.bad_inputs = [] {
    const Tensor w = zeros({5, 3}), i = from_vector<int64_t>({0, 4}, {2});
    std::vector<OpBadInput> bad = common_bad_inputs("embedding", {w, i});
    bad.push_back({"1-d weight", {zeros({5}), i}, "expected a 2-d tensor"});
    bad.push_back({"3-d weight", {zeros({5, 3, 1}), i}, "expected a 2-d tensor"});
    bad.push_back({"f32 indices", {w, zeros({2})}, "embedding: indices must be an i64 tensor"});
    bad.push_back({"index out of range",
                   {w, from_vector<int64_t>({0, 1, 5, 7}, {2, 2})},
                   "embedding: index 5 at position 2 is out of range for 5 embeddings"});
    bad.push_back({"negative index",
                   {w, from_vector<int64_t>({-1, 2}, {2})},
                   "embedding: index -1 at position 0 is out of range for 5 embeddings"});
    bad.push_back({"padding_idx out of range",
                   {w, i},
                   "embedding: padding_idx 5 is out of range",
                   [](const V& x) { return embedding(x[0], x[1], 5); }});
    return bad;
  };
  return e;
}

// ---- attention.h ----

OpFn attn(double scale = 0) {
  return [=](const V& v) { return causal_attention(v[0], v[1], v[2], scale); };
}

// With dropout: a generator reset per call (at a non-zero offset), so every finite-difference
// probe and every device sees one mask.
OpFn attn_dropout(double p, double scale = 0) {
  return [=](const V& v) {
    Generator g;
    g.set_state(71, 1000);
    return causal_attention(v[0], v[1], v[2], scale, p, &g);
  };
}

OpEntry causal_attention_entry() {
  OpEntry e;
  e.name = "causal_attention";
  e.forward = attn();
  e.half_tolerance_scale = 4;  // a softmax over the row, then a weighted sum of Dh products
  e.samples = [] {
    Generator gen(37);
    auto qkv = [&](const Shape& s, double lo = -1, double hi = 1) {
      return V{uniform(s, gen, lo, hi), uniform(s, gen, lo, hi), uniform(s, gen, lo, hi)};
    };
    return std::vector<OpSample>{
        sample("[2, 2, 33, 8]", qkv({2, 2, 33, 8})),
        sample("[1, 2, 5, 64]", qkv({1, 2, 5, 64})),
        sample("[3, 1, 1, 4] T = 1", qkv({3, 1, 1, 4})),
        sample("[1, 1, 7, 3] scale 0.7", qkv({1, 1, 7, 3}, -2, 2), attn(0.7)),
        sample("[2, 3, 16, 16]", qkv({2, 3, 16, 16})),
        model_shape("gpt-nano [2, 3, 16, 16]", qkv({2, 3, 16, 16}, -3, 3)),
        model_shape("[1, 2, 70, 64]", qkv({1, 2, 70, 64})),
        sample("[2, 2, 33, 8] dropout 0.3", qkv({2, 2, 33, 8}), attn_dropout(0.3)),
        sample("[1, 1, 7, 3] dropout 0.5 scale 0.7", qkv({1, 1, 7, 3}, -2, 2),
               attn_dropout(0.5, 0.7)),
        model_shape("[1, 2, 70, 64] dropout 0.1", qkv({1, 2, 70, 64}), attn_dropout(0.1)),
        empty_batch("[0, 2, 3, 4]", qkv({0, 2, 3, 4})),
    };
  };
  e.bad_inputs = [] {
    const V good{zeros({1, 2, 3, 4}), zeros({1, 2, 3, 4}), zeros({1, 2, 3, 4})};
    std::vector<OpBadInput> bad = common_bad_inputs("causal_attention", good);
    bad.push_back({"3-d inputs",
                   {zeros({2, 3, 4}), zeros({2, 3, 4}), zeros({2, 3, 4})},
                   "causal_attention: expected q, k, v of shape [B, H, T, Dh]"});
    bad.push_back({"k of another shape",
                   {zeros({1, 2, 3, 4}), zeros({1, 2, 4, 4}), zeros({1, 2, 3, 4})},
                   "causal_attention: q, k and v must have one shape"});
    bad.push_back({"v of another head size",
                   {zeros({1, 2, 3, 4}), zeros({1, 2, 3, 4}), zeros({1, 2, 3, 5})},
                   "causal_attention: q, k and v must have one shape"});
    bad.push_back({"dropout_p 1", good, "causal_attention: dropout_p must be in [0, 1), got 1",
                   attn_dropout(1.0)});
    bad.push_back({"dropout_p -0.5", good,
                   "causal_attention: dropout_p must be in [0, 1), got -0.5", attn_dropout(-0.5)});
    return bad;
  };
  return e;
}

// ---- shape.h: permute (transpose wraps it) and narrow_copy (split wraps it) ----

OpEntry permute_entry() {
  OpEntry e;
  e.name = "permute";
  auto perm = [](std::vector<int64_t> dims) {
    return [dims](const V& x) { return permute(x[0], dims); };
  };
  e.forward = perm({0, 2, 1, 3});
  e.samples = [perm] {
    Generator gen(41);
    return std::vector<OpSample>{
        sample("[2, 3, 4, 5] dims {0, 2, 1, 3}", {uniform({2, 3, 4, 5}, gen)}),
        sample("[2, 3, 4, 5] dims {3, 1, 0, 2}", {uniform({2, 3, 4, 5}, gen)}, perm({3, 1, 0, 2})),
        sample("[2, 3, 4, 5] dims {-1, -2, -3, -4}", {uniform({2, 3, 4, 5}, gen)},
               perm({-1, -2, -3, -4})),
        sample("[7] identity", {uniform({7}, gen)}, perm({0})),
        sample("[3, 4, 5] identity", {uniform({3, 4, 5}, gen)}, perm({0, 1, 2})),
        sample("[33, 17] transpose", {uniform({33, 17}, gen)}, perm({1, 0})),
        sample("0-d", {uniform({}, gen)}, perm({})),
        sample("[1, 2, 1, 3, 1, 2, 1, 2] 8-d", {uniform({1, 2, 1, 3, 1, 2, 1, 2}, gen)},
               perm({7, 6, 5, 4, 3, 2, 1, 0})),
        model_shape("gpt-nano [8, 64, 3, 16] dims {0, 2, 1, 3}", {uniform({8, 64, 3, 16}, gen)}),
        empty_batch("[0, 3, 4, 5]", {uniform({0, 3, 4, 5}, gen)}),
    };
  };
  e.bad_inputs = [perm] {
    const Tensor x = zeros({2, 3, 4});
    return std::vector<OpBadInput>{
        {"undefined input", {Tensor()}, "permute: input 0 is an undefined tensor"},
        {"repeated dim",
         {x},
         "permute: dims [0, 0, 1] is not a permutation of the 3 dimensions of shape [2, 3, 4]",
         perm({0, 0, 1})},
        {"too few dims", {x}, "permute: dims [1, 0] is not a permutation", perm({1, 0})},
        {"dim out of range", {x}, "permute: dims [0, 1, 3] is not a permutation", perm({0, 1, 3})},
        {"9-d",
         {zeros({1, 1, 1, 1, 1, 1, 1, 1, 1})},
         "permute: at most 8 dimensions",
         perm({0, 1, 2, 3, 4, 5, 6, 7, 8})},
    };
  };
  return e;
}

OpEntry narrow_copy_entry() {
  OpEntry e;
  e.name = "narrow_copy";
  auto narrow = [](int64_t dim, int64_t start, int64_t length) {
    return [=](const V& x) { return narrow_copy(x[0], dim, start, length); };
  };
  e.forward = narrow(-1, 1, 3);
  e.samples = [narrow] {
    Generator gen(42);
    return std::vector<OpSample>{
        sample("[2, 3, 4, 5] last dim 1..4", {uniform({2, 3, 4, 5}, gen)}),
        sample("[2, 3, 4, 5] dim 1 from 1, 2", {uniform({2, 3, 4, 5}, gen)}, narrow(1, 1, 2)),
        sample("[2, 3, 4, 5] dim 0 from 1, 1", {uniform({2, 3, 4, 5}, gen)}, narrow(0, 1, 1)),
        sample("[2, 3, 4, 5] dim -2 whole", {uniform({2, 3, 4, 5}, gen)}, narrow(-2, 0, 4)),
        sample("[9] from 2, 5", {uniform({9}, gen)}, narrow(0, 2, 5)),
        sample("[3, 4, 5] zero length", {uniform({3, 4, 5}, gen)}, narrow(1, 4, 0)),
        model_shape("gpt-nano qkv [8, 64, 144] last dim 48..96", {uniform({8, 64, 144}, gen)},
                    narrow(2, 48, 48)),
        empty_batch("[0, 3, 5]", {uniform({0, 3, 5}, gen)}),
    };
  };
  e.bad_inputs = [narrow] {
    const Tensor x = zeros({2, 3, 4});
    return std::vector<OpBadInput>{
        {"undefined input", {Tensor()}, "narrow_copy: input 0 is an undefined tensor"},
        {"dim out of range",
         {x},
         "narrow_copy: dim 3 is out of range for shape [2, 3, 4]",
         narrow(3, 0, 1)},
        {"past the end",
         {x},
         "narrow_copy: start 2 and length 3 are out of range for size 4 of dim -1 of shape [2, 3, "
         "4]",
         narrow(-1, 2, 3)},
        {"negative start",
         {x},
         "narrow_copy: start -1 and length 1 are out of range",
         narrow(0, -1, 1)},
        {"negative length",
         {x},
         "narrow_copy: start 0 and length -1 are out of range",
         narrow(0, 0, -1)},
        {"0-d", {zeros({})}, "narrow_copy: dim 0 is out of range for shape []", narrow(0, 0, 1)},
    };
  };
  return e;
}

// The ops that take channels_last tensors (engine/ops/check.h's Formats): each of their samples
// with a 4-d input again in channels last, named "... channels_last": the 4-d inputs converted
// before the op, a 4-d result converted back after it, so that every check of the entry (dtypes,
// devices, gradients, gradcheck) runs the op's channels-last path against the same expectations.
const std::set<std::string> kChannelsLastOps = {"add",
                                                "relu",
                                                "conv2d",
                                                "max_pool2d",
                                                "avg_pool2d",
                                                "batch_norm",
                                                "batch_norm_relu",
                                                "batch_norm_add_relu",
                                                "adaptive_avg_pool2d"};

void add_channels_last_samples(OpEntry& e) {
  const auto base = e.samples;
  const OpFn entry_forward = e.forward;
  // Binary ops take channels_last on equal shapes only (broadcasting reads by position).
  const bool equal_shapes = e.name == "add";
  e.samples = [base, entry_forward, equal_shapes] {
    std::vector<OpSample> s = base();
    const size_t n = s.size();
    for (size_t i = 0; i < n; ++i) {
      const OpSample& o = s[i];
      const auto four_d = [](const Tensor& t) { return t.dim() == 4; };
      const auto same_shape = [&o](const Tensor& t) { return t.shape() == o.inputs[0].shape(); };
      if (!o.gradcheck || std::none_of(o.inputs.begin(), o.inputs.end(), four_d) ||
          (equal_shapes && !std::all_of(o.inputs.begin(), o.inputs.end(), same_shape)))
        continue;
      OpSample c = o;
      c.name += " channels_last";
      const OpFn f = o.forward ? o.forward : entry_forward;
      c.forward = [f](const V& v) {
        V in;
        for (const Tensor& t : v)
          in.push_back(t.defined() && t.dim() == 4 ? t.contiguous(MemoryFormat::channels_last) : t);
        const Tensor out = f(in);
        return out.dim() == 4 ? out.contiguous() : out;
      };
      s.push_back(std::move(c));
    }
    return s;
  };
}

std::vector<OpEntry> build_table() {
  std::vector<OpEntry> t;
  t.push_back(binary_entry("add", &add, &add, -1.0));
  t.push_back(binary_entry("sub", &sub, &sub, -1.0));
  t.push_back(binary_entry("mul", &mul, &mul, -1.0));
  t.push_back(binary_entry("div", &div, &div, 0.5));  // divisors away from 0
  t.push_back(reversed_scalar_entry("rsub", "sub", &rsub));
  t.push_back(reversed_scalar_entry("rdiv", "div", &rdiv));
  t.push_back(elementwise_entry("neg", unary(&neg), -1, 1));
  t.push_back(elementwise_entry("exp", unary(&exp), -1, 1));
  t.push_back(elementwise_entry("log", unary(&log), 0.5, 3));
  t.push_back(elementwise_entry("sqrt", unary(&sqrt), 0.5, 3));
  auto power = [](double p) { return [p](const V& x) { return pow(x[0], p); }; };
  t.push_back(elementwise_entry("pow", power(2.0), 0.5, 2,
                                {{"p 3", power(3.0)},
                                 {"p 0.5", power(0.5)},
                                 {"p -1.5", power(-1.5)},
                                 {"p 0", power(0.0)},
                                 {"p 1", power(1.0)}}));
  t.push_back(elementwise_entry("relu", unary(&relu), -1, 1, {}, true));
  auto leaky = [](double s) { return [s](const V& x) { return leaky_relu(x[0], s); }; };
  t.push_back(elementwise_entry("leaky_relu", leaky(0.01), -1, 1,
                                {{"slope 0.2", leaky(0.2)}, {"slope -0.5", leaky(-0.5)}}, true));
  t.push_back(elementwise_entry("gelu", [](const V& x) { return gelu(x[0]); }, -3, 3,
                                {{"tanh", [](const V& x) { return gelu(x[0], true); }}}));
  t.push_back(elementwise_entry("sigmoid", unary(&sigmoid), -4, 4));
  t.push_back(elementwise_entry("tanh", unary(&tanh), -2, 2));
  t.push_back(reduction_entry("sum", &sum_all, &sum_dims));
  t.push_back(reduction_entry("mean", &mean_all, &mean_dims));
  t.push_back(matmul_entry());
  t.push_back(linear_entry());
  t.push_back(matmul_out_entry());
  t.push_back(conv2d_entry());
  t.push_back(max_pool2d_entry());
  t.push_back(avg_pool2d_entry());
  t.push_back(adaptive_avg_pool2d_entry());
  t.push_back(batch_norm_entry());
  t.push_back(batch_norm_entry("batch_norm_relu", &batch_norm_relu));
  t.push_back(batch_norm_add_relu_entry());
  t.push_back(sync_batch_norm_entry());
  t.push_back(layer_norm_entry());
  t.push_back(dropout_entry());
  t.push_back(flatten_entry());
  t.push_back(total_norm_entry());
  t.push_back(scale_by_clip_coef_entry());
  t.push_back(clamp_entry());
  t.push_back(softmax_entry("softmax", softmax, 18));
  t.push_back(softmax_entry("log_softmax", log_softmax, 19));
  t.push_back(mse_loss_entry());
  t.push_back(smooth_l1_loss_entry());
  t.push_back(nll_loss_entry());
  t.push_back(cross_entropy_entry());
  t.push_back(argmax_entry());
  t.push_back(topk_correct_entry());
  t.push_back(accuracy_entry());
  t.push_back(orthonormalize_columns_entry());
  t.push_back(embedding_entry());
  t.push_back(causal_attention_entry());
  t.push_back(permute_entry());
  t.push_back(narrow_copy_entry());
  for (OpEntry& e : t)
    if (kChannelsLastOps.contains(e.name)) add_channels_last_samples(e);
  return t;
}

}  // namespace

const std::vector<OpEntry>& op_table() {
  static const std::vector<OpEntry> table = build_table();
  return table;
}

const OpEntry& op_entry(const std::string& name) {
  for (const OpEntry& e : op_table())
    if (e.name == name) return e;
  RG_FAIL("op table: no entry named ", name);
}

std::vector<std::string> op_names() {
  std::vector<std::string> names;
  for (const OpEntry& e : op_table()) names.push_back(e.name);
  return names;
}

}  // namespace rg::testing
