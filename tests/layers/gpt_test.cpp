// GPT (minGPT): names, initialization, a forward pass checked against a scalar reference written
// out from minGPT's equations, causality, weight tying and generation.
#include "layers/models/gpt.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <numbers>
#include <string>
#include <vector>

#include "engine/autograd/grad_mode.h"
#include "engine/ops/binary.h"
#include "engine/ops/factory.h"
#include "engine/ops/loss.h"
#include "kernels/attention.h"
#include "kernels/error.h"
#include "layers/models/registry.h"

namespace rg::nn {
namespace {

GptConfig tiny_config(int64_t n_layer = 2, int64_t n_head = 2, int64_t n_embd = 4,
                      int64_t vocab = 5, int64_t block = 6) {
  GptConfig c;
  c.n_layer = n_layer, c.n_head = n_head, c.n_embd = n_embd;
  c.vocab_size = vocab, c.block_size = block;
  c.embd_pdrop = c.resid_pdrop = c.attn_pdrop = 0.0;
  return c;
}

// Every parameter N(0, 0.5) in f64: large enough that attention is far from uniform.
void randomize(GPT& model, uint64_t seed) {
  model.to(DType::f64);
  Generator gen(seed);
  NamedTensors state;
  for (auto& [name, p] : model.state_dict())
    state.emplace_back(name, mul(randn(p.shape(), gen, DType::f64), 0.5));
  model.load_state_dict(state);
}

TEST(Gpt, NamesAndShapesAreMinGpts) {
  Generator gen(1);
  GPT model(gpt_config("gpt-nano", 65, 128), gen);
  std::map<std::string, Shape> expected = {{"transformer.wte.weight", {65, 48}},
                                           {"transformer.wpe.weight", {128, 48}},
                                           {"transformer.ln_f.weight", {48}},
                                           {"transformer.ln_f.bias", {48}},
                                           {"lm_head.weight", {65, 48}}};
  for (int l = 0; l < 3; ++l) {
    const std::string b = "transformer.h." + std::to_string(l) + ".";
    expected[b + "ln_1.weight"] = {48};
    expected[b + "ln_1.bias"] = {48};
    expected[b + "attn.c_attn.weight"] = {144, 48};
    expected[b + "attn.c_attn.bias"] = {144};
    expected[b + "attn.c_proj.weight"] = {48, 48};
    expected[b + "attn.c_proj.bias"] = {48};
    expected[b + "ln_2.weight"] = {48};
    expected[b + "ln_2.bias"] = {48};
    expected[b + "mlp.c_fc.weight"] = {192, 48};
    expected[b + "mlp.c_fc.bias"] = {192};
    expected[b + "mlp.c_proj.weight"] = {48, 192};
    expected[b + "mlp.c_proj.bias"] = {48};
  }
  std::map<std::string, Shape> got;
  for (auto& [name, t] : model.state_dict()) got[name] = t.shape();
  EXPECT_EQ(got, expected);
  // minGPT reports 0.09M for gpt-nano on a 65-character vocabulary: the transformer's parameters
  // (12 C^2 + 13 C per block, the embeddings, ln_f), without the head.
  const int64_t C = 48, transformer = 3 * (12 * C * C + 13 * C) + 65 * C + 128 * C + 2 * C;
  EXPECT_EQ(model.parameter_count(), transformer + 65 * C);
  EXPECT_EQ(transformer, 94176);
}

TEST(Gpt, InitializationIsMinGpts) {
  Generator gen(3);
  GPT model(gpt_config("gpt-mini", 65, 128), gen);
  const auto std_of = [](const Tensor& t) {
    const std::vector<double> v = t.to(DType::f64).to_vector<double>();
    double s = 0, s2 = 0;
    for (double x : v) s += x, s2 += x * x;
    const double n = double(v.size()), m = s / n;
    return std::sqrt(s2 / n - m * m);
  };
  const double proj = 0.02 / std::sqrt(2.0 * 6);
  for (auto& [name, p] : model.named_parameters()) {
    const std::vector<double> v = p.to(DType::f64).to_vector<double>();
    if (name.find(".ln_") != std::string::npos) {
      for (double x : v) ASSERT_EQ(x, name.ends_with("weight") ? 1.0 : 0.0) << name;
    } else if (name.ends_with(".bias")) {
      for (double x : v) ASSERT_EQ(x, 0.0) << name;
    } else {
      const double want = name.ends_with("c_proj.weight") ? proj : 0.02;
      EXPECT_NEAR(std_of(p), want, 0.1 * want) << name;
    }
  }
}

// minGPT's forward written out in scalar f64 loops over the same weights.
std::vector<double> reference_logits(const GPT& model, const std::vector<int64_t>& idx) {
  const GptConfig& c = model.config();
  std::map<std::string, std::vector<double>> w;
  for (auto& [name, t] : model.state_dict()) w[name] = t.to_vector<double>();
  const int64_t T = int64_t(idx.size()), C = c.n_embd, H = c.n_head, Dh = C / H, V = c.vocab_size;
  using Mat = std::vector<std::vector<double>>;
  const auto linear = [](const Mat& x, const std::vector<double>& W, const std::vector<double>* b,
                         int64_t out) {
    Mat y(x.size(), std::vector<double>(static_cast<size_t>(out)));
    const size_t in = x[0].size();
    for (size_t t = 0; t < x.size(); ++t)
      for (int64_t o = 0; o < out; ++o) {
        double s = b ? (*b)[size_t(o)] : 0.0;
        for (size_t i = 0; i < in; ++i) s += x[t][i] * W[size_t(o) * in + i];
        y[t][size_t(o)] = s;
      }
    return y;
  };
  const auto layer_norm = [&](const Mat& x, const std::string& p) {
    Mat y = x;
    for (auto& row : y) {
      double m = 0, var = 0;
      for (double v : row) m += v;
      m /= double(row.size());
      for (double v : row) var += (v - m) * (v - m);
      var /= double(row.size());
      for (size_t i = 0; i < row.size(); ++i)
        row[i] = (row[i] - m) / std::sqrt(var + 1e-5) * w[p + ".weight"][i] + w[p + ".bias"][i];
    }
    return y;
  };
  Mat x(static_cast<size_t>(T), std::vector<double>(static_cast<size_t>(C)));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < C; ++i)
      x[size_t(t)][size_t(i)] = w["transformer.wte.weight"][size_t(idx[size_t(t)] * C + i)] +
                                w["transformer.wpe.weight"][size_t(t * C + i)];
  for (int64_t l = 0; l < c.n_layer; ++l) {
    const std::string b = "transformer.h." + std::to_string(l) + ".";
    const Mat qkv = linear(layer_norm(x, b + "ln_1"), w[b + "attn.c_attn.weight"],
                           &w[b + "attn.c_attn.bias"], 3 * C);
    Mat y(static_cast<size_t>(T), std::vector<double>(static_cast<size_t>(C), 0.0));
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < T; ++i) {
        std::vector<double> s(static_cast<size_t>(i + 1));
        double mx = -1e300, z = 0;
        for (int64_t j = 0; j <= i; ++j) {
          double d = 0;
          for (int64_t e = 0; e < Dh; ++e)
            d += qkv[size_t(i)][size_t(h * Dh + e)] * qkv[size_t(j)][size_t(C + h * Dh + e)];
          s[size_t(j)] = d / std::sqrt(double(Dh));
          mx = std::max(mx, s[size_t(j)]);
        }
        for (double& v : s) z += v = std::exp(v - mx);
        for (int64_t j = 0; j <= i; ++j)
          for (int64_t e = 0; e < Dh; ++e)
            y[size_t(i)][size_t(h * Dh + e)] +=
                s[size_t(j)] / z * qkv[size_t(j)][size_t(2 * C + h * Dh + e)];
      }
    const Mat a = linear(y, w[b + "attn.c_proj.weight"], &w[b + "attn.c_proj.bias"], C);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t i = 0; i < C; ++i) x[size_t(t)][size_t(i)] += a[size_t(t)][size_t(i)];
    Mat f =
        linear(layer_norm(x, b + "ln_2"), w[b + "mlp.c_fc.weight"], &w[b + "mlp.c_fc.bias"], 4 * C);
    for (auto& row : f)
      for (double& v : row)
        v = 0.5 * v * (1 + std::tanh(std::sqrt(2 / std::numbers::pi) * (v + 0.044715 * v * v * v)));
    const Mat m = linear(f, w[b + "mlp.c_proj.weight"], &w[b + "mlp.c_proj.bias"], C);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t i = 0; i < C; ++i) x[size_t(t)][size_t(i)] += m[size_t(t)][size_t(i)];
  }
  const Mat logits = linear(layer_norm(x, "transformer.ln_f"), w["lm_head.weight"], nullptr, V);
  std::vector<double> flat;
  for (const auto& row : logits) flat.insert(flat.end(), row.begin(), row.end());
  return flat;
}

TEST(Gpt, ForwardEqualsTheScalarReference) {
  for (const int64_t heads : {1, 2}) {
    Generator gen(5);
    GPT model(tiny_config(2, heads, 4, 5, 6), gen);
    randomize(model, 11 + uint64_t(heads));
    const std::vector<int64_t> a = {0, 3, 1, 4, 4, 2}, b = {2, 2, 0};
    // Two sequences of the same length in one batch: b padded to a's length with its own ids.
    const std::vector<int64_t> b6 = {2, 2, 0, 1, 3, 0};
    std::vector<int64_t> both = a;
    both.insert(both.end(), b6.begin(), b6.end());
    const Tensor logits = model.forward(from_vector(both, {2, 6}));
    ASSERT_EQ(logits.shape(), (Shape{2, 6, 5}));
    const std::vector<double> got = logits.to_vector<double>();
    const std::vector<double> want_a = reference_logits(model, a),
                              want_b = reference_logits(model, b6);
    for (size_t i = 0; i < want_a.size(); ++i) EXPECT_NEAR(got[i], want_a[i], 1e-11) << i;
    for (size_t i = 0; i < want_b.size(); ++i)
      EXPECT_NEAR(got[want_a.size() + i], want_b[i], 1e-11) << i;
    // A shorter sequence is the prefix of the longer one's positions (causal, positions from 0).
    const std::vector<double> short_b = model.forward(from_vector(b, {1, 3})).to_vector<double>();
    const std::vector<double> want_short = reference_logits(model, b);
    for (size_t i = 0; i < want_short.size(); ++i) {
      EXPECT_NEAR(short_b[i], want_short[i], 1e-11) << i;
      EXPECT_NEAR(short_b[i], want_b[i], 1e-11) << i;
    }
  }
}

// The smallest case by hand: one layer, C = 2, one head, every weight zero except the
// embeddings and the head. Attention and MLP then add nothing (zero projections), so the logits
// are ln_f(wte[i] + wpe[t]) W_head^T: with wte + wpe = (a, b), ln gives (+1, -1) when a > b and
// (-1, +1) when a < b (times 1/sqrt(1 + 1e-5 / ((a - b)/2)^2)).
TEST(Gpt, ZeroBlocksLeaveTheLayerNormOfTheEmbeddings) {
  Generator gen(1);
  GptConfig c = tiny_config(1, 1, 2, 3, 4);
  GPT model(c, gen);
  model.to(DType::f64);
  NoGradGuard no_grad;
  for (auto& [name, p] : model.named_parameters())
    if (name.find(".ln_") == std::string::npos) p.zero_();
  model.transformer->wte->weight.copy_(from_vector<double>({1, 0, 0, 1, 2, 2}, {3, 2}));
  model.transformer->wpe->weight.copy_(from_vector<double>({0, 0, 0.5, 0, 0, 3, 0, 0}, {4, 2}));
  model.lm_head->weight.copy_(from_vector<double>({1, 0, 0, 1, 1, -1}, {3, 2}));
  const std::vector<double> got =
      model.forward(from_vector<int64_t>({0, 0, 0, 1}, {1, 4})).to_vector<double>();
  // Position 0: (1, 0) -> d = 0.5; position 1: (1.5, 0) -> d = 0.75; position 2: (1, 3) -> d = -1;
  // position 3: (0, 1) -> d = -0.5. ln = (s, -s) with s = sign(d) / sqrt(1 + 1e-5 / d^2).
  const double ds[] = {0.5, 0.75, -1, -0.5};
  for (int t = 0; t < 4; ++t) {
    const double s = (ds[t] > 0 ? 1 : -1) / std::sqrt(1 + 1e-5 / (ds[t] * ds[t]));
    EXPECT_NEAR(got[size_t(t * 3 + 0)], s, 1e-12) << t;      // head row (1, 0)
    EXPECT_NEAR(got[size_t(t * 3 + 1)], -s, 1e-12) << t;     // head row (0, 1)
    EXPECT_NEAR(got[size_t(t * 3 + 2)], 2 * s, 1e-12) << t;  // head row (1, -1)
  }
}

TEST(Gpt, ALaterTokenDoesNotChangeEarlierLogits) {
  Generator gen(2);
  GPT model(tiny_config(), gen);
  randomize(model, 4);
  const std::vector<double> x =
      model.forward(from_vector<int64_t>({1, 2, 3, 4}, {1, 4})).to_vector<double>();
  const std::vector<double> y =
      model.forward(from_vector<int64_t>({1, 2, 3, 0}, {1, 4})).to_vector<double>();
  for (size_t i = 0; i < 15; ++i) EXPECT_EQ(x[i], y[i]) << i;
  bool last_differs = false;
  for (size_t i = 15; i < 20; ++i) last_differs |= x[i] != y[i];
  EXPECT_TRUE(last_differs);
}

TEST(Gpt, TiedHeadIsOneParameterWithBothGradients) {
  GptConfig c = tiny_config();
  c.tie_weights = true;
  Generator g1(9), g2(9);
  GPT tied(c, g1);
  c.tie_weights = false;
  GPT untied(c, g2);
  randomize(tied, 21);
  untied.to(DType::f64);
  // The untied twin gets the same weights, the head a copy of the embedding.
  NamedTensors state = tied.state_dict();
  untied.load_state_dict(state);
  EXPECT_TRUE(tied.lm_head->weight.is_same(tied.transformer->wte->weight));
  EXPECT_EQ(tied.named_parameters().size() + 1, untied.named_parameters().size());
  EXPECT_EQ(tied.state_dict().size(), untied.state_dict().size());  // both names saved
  const Tensor idx = from_vector<int64_t>({1, 2, 3, 4, 0, 1}, {1, 6});
  const Tensor tgt = from_vector<int64_t>({2, 3, 4, 0, 1, 2}, {6});
  cross_entropy(tied.forward(idx).view({6, 5}), tgt).backward();
  cross_entropy(untied.forward(idx).view({6, 5}), tgt).backward();
  const std::vector<double> g = tied.transformer->wte->weight.grad().to_vector<double>();
  const std::vector<double> ge = untied.transformer->wte->weight.grad().to_vector<double>();
  const std::vector<double> gh = untied.lm_head->weight.grad().to_vector<double>();
  for (size_t i = 0; i < g.size(); ++i) EXPECT_NEAR(g[i], ge[i] + gh[i], 1e-12) << i;
}

TEST(Gpt, AttentionDropoutDrawsFromTheModelsGeneratorInTrainingOnly) {
  // Only attention dropout (embd/resid 0): training forwards differ call to call, repeat from the
  // same generator state, and draw n_layer x attention_dropout_groups(B * H, T) counters; eval
  // mode equals the model without attention dropout, drawing nothing.
  GptConfig c = tiny_config();
  c.attn_pdrop = 0.3;
  EXPECT_EQ(gpt_config("gpt-nano", 5, 6).attn_pdrop, 0.1);  // minGPT's default
  auto drop = std::make_shared<Generator>(77);
  Generator init(4), init_plain(4);
  GPT model(c, init, drop);
  GPT plain(tiny_config(), init_plain);
  randomize(model, 9);
  randomize(plain, 9);
  const Tensor idx = from_vector<int64_t>({0, 3, 1, 4, 4, 2, 2, 2, 0, 1, 3, 0}, {2, 6});
  model.train();
  const std::vector<double> a = model.forward(idx).to_vector<double>();
  EXPECT_EQ(drop->offset(), 2 * kernels::attention_dropout_groups(2 * 2, 6));
  const std::vector<double> b = model.forward(idx).to_vector<double>();
  EXPECT_NE(a, b);
  drop->set_state(77, 0);
  EXPECT_EQ(model.forward(idx).to_vector<double>(), a);
  const uint64_t before = drop->offset();
  model.eval();
  plain.eval();
  const std::vector<double> e = model.forward(idx).to_vector<double>();
  EXPECT_EQ(drop->offset(), before);
  EXPECT_EQ(e, plain.forward(idx).to_vector<double>());
  EXPECT_NE(e, a);
  // Training mode with attn_pdrop 0 is the eval result too (no other dropout here).
  plain.train();
  EXPECT_EQ(plain.forward(idx).to_vector<double>(), e);
}

TEST(Gpt, BadInputsAreNamed) {
  Generator gen(1);
  GPT model(tiny_config(), gen);
  EXPECT_THROW(model.forward(zeros({1, 7}, DType::i64)), Error);  // longer than block_size 6
  EXPECT_THROW(model.forward(zeros({1, 3})), Error);              // not token ids
  GptConfig c = tiny_config();
  c.attn_pdrop = 1.0;  // the kernel's dropout keeps no probability at 1
  EXPECT_THROW(GPT(c, gen), Error);
  c.attn_pdrop = -0.1;
  EXPECT_THROW(GPT(c, gen), Error);
  c = tiny_config(1, 3, 4);  // 4 is not a multiple of 3 heads
  EXPECT_THROW(GPT(c, gen), Error);
  EXPECT_THROW(gpt_config("gpt-huge", 5, 6), Error);
  EXPECT_THROW(make_model({.name = "gpt-nano", .sample_shape = {1, 28, 28}, .num_classes = 10}),
               Error);
}

TEST(Gpt, GreedyGenerationIsTheArgmaxOfEachForward) {
  Generator gen(2);
  GPT model(tiny_config(), gen);
  randomize(model, 8);
  Generator draws(1);
  const std::vector<int64_t> out = model.generate({1, 3}, 9, 0.0, 0, draws);  // past block 6
  ASSERT_EQ(out.size(), 11u);
  EXPECT_EQ(out[0], 1);
  EXPECT_EQ(out[1], 3);
  for (size_t n = 2; n < out.size(); ++n) {
    const size_t T = std::min<size_t>(n, 6);
    const std::vector<int64_t> window(out.begin() + long(n - T), out.begin() + long(n));
    const std::vector<double> l =
        model.forward(from_vector(window, {1, int64_t(T)})).to_vector<double>();
    const auto last = l.begin() + long((T - 1) * 5);
    EXPECT_EQ(out[n], std::max_element(last, last + 5) - last) << n;
  }
  EXPECT_TRUE(model.is_training());  // mode restored
  // top-k 1 is greedy at any temperature; the same seed draws the same text.
  Generator d1(4), d2(4), d3(4);
  EXPECT_EQ(model.generate({1, 3}, 9, 2.0, 1, d1), out);
  const auto s1 = model.generate({1, 3}, 20, 1.0, 3, d2),
             s2 = model.generate({1, 3}, 20, 1.0, 3, d3);
  EXPECT_EQ(s1, s2);
  EXPECT_THROW(model.generate({}, 1, 1.0, 0, d1), Error);
  EXPECT_THROW(model.generate({7}, 1, 1.0, 0, d1), Error);
}

// Sampling at temperature 1 without top-k follows softmax(logits): the frequencies of the first
// new token over many draws match the probabilities.
TEST(Gpt, SampledTokensFollowTheSoftmax) {
  Generator gen(2);
  GPT model(tiny_config(1, 1, 4, 3, 4), gen);
  randomize(model, 6);
  const std::vector<double> l =
      model.forward(from_vector<int64_t>({2}, {1, 1})).to_vector<double>();
  std::vector<double> p(3, 0.0);
  double z = 0;
  for (size_t i = 0; i < 3; ++i) z += p[i] = std::exp(l[i]);
  Generator draws(7);
  std::vector<int> counts(3, 0);
  const int n = 4000;
  for (int k = 0; k < n; ++k) ++counts[size_t(model.generate({2}, 1, 1.0, 0, draws)[1])];
  for (size_t i = 0; i < 3; ++i)
    EXPECT_NEAR(double(counts[i]) / n, p[i] / z, 4 * std::sqrt(p[i] / z / n) + 1e-3) << i;
}

}  // namespace
}  // namespace rg::nn
