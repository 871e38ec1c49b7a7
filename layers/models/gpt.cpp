// minGPT's model, written out like mingpt/model.py.
#include "layers/models/gpt.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "engine/autograd/grad_mode.h"
#include "engine/ops/activation.h"
#include "engine/ops/attention.h"
#include "engine/ops/binary.h"
#include "engine/ops/factory.h"
#include "engine/ops/shape.h"
#include "kernels/error.h"

namespace rg::nn {

namespace {

std::shared_ptr<Dropout> make_dropout(double p, const std::shared_ptr<Generator>& gen) {
  return gen ? std::make_shared<Dropout>(p, gen) : std::make_shared<Dropout>(p);
}

}  // namespace

GptConfig gpt_config(const std::string& model_type, int64_t vocab_size, int64_t block_size) {
  GptConfig c;
  if (model_type == "gpt-nano") {
    c.n_layer = 3, c.n_head = 3, c.n_embd = 48;
  } else if (model_type == "gpt-micro") {
    c.n_layer = 4, c.n_head = 4, c.n_embd = 128;
  } else if (model_type == "gpt-mini") {
    c.n_layer = 6, c.n_head = 6, c.n_embd = 192;
  } else {
    RG_FAIL("unknown GPT model type '", model_type, "' (expected gpt-nano, gpt-micro or gpt-mini)");
  }
  c.vocab_size = vocab_size;
  c.block_size = block_size;
  return c;
}

CausalSelfAttention::CausalSelfAttention(const GptConfig& c, Generator& gen,
                                         std::shared_ptr<Generator> dropout_gen)
    : n_head_(c.n_head), n_embd_(c.n_embd) {
  RG_CHECK(c.n_embd % c.n_head == 0, "GPT: n_embd ", c.n_embd, " is not a multiple of n_head ",
           c.n_head);
  RG_CHECK(c.attn_pdrop >= 0.0 && c.attn_pdrop < 1.0, "GPT: attn_pdrop must be in [0, 1), got ",
           c.attn_pdrop);
  c_attn = register_module("c_attn", std::make_shared<Linear>(c.n_embd, 3 * c.n_embd, gen));
  c_proj = register_module("c_proj", std::make_shared<Linear>(c.n_embd, c.n_embd, gen));
  attn_dropout = register_module("attn_dropout", make_dropout(c.attn_pdrop, dropout_gen));
  resid_dropout = register_module("resid_dropout", make_dropout(c.resid_pdrop, dropout_gen));
}

Tensor CausalSelfAttention::forward_impl(const Tensor& x) {
  RG_CHECK(x.dim() == 3 && x.size(2) == n_embd_, "CausalSelfAttention: expected [B, T, ", n_embd_,
           "], got ", shape_str(x.shape()));
  const int64_t B = x.size(0), T = x.size(1), C = n_embd_, H = n_head_;
  // q, k, v for all heads in one matmul, then [B, T, H, Dh] -> [B, H, T, Dh].
  std::vector<Tensor> qkv = split(c_attn->forward(x), C, 2);
  for (Tensor& t : qkv) t = transpose(t.view({B, T, H, C / H}), 1, 2);
  // Scale 1 / sqrt(Dh); attn_dropout's rate and mask stream drop probabilities inside the kernel
  // (minGPT's attn_dropout(att)), in training mode only.
  const double p = attn_dropout->is_training() ? attn_dropout->p() : 0.0;
  Tensor y = causal_attention(qkv[0], qkv[1], qkv[2], 0.0, p, &attn_dropout->generator());
  y = transpose(y, 1, 2).view({B, T, C});  // heads side by side again
  return resid_dropout->forward(c_proj->forward(y));
}

GptMlp::GptMlp(const GptConfig& c, Generator& gen, std::shared_ptr<Generator> dropout_gen) {
  c_fc = register_module("c_fc", std::make_shared<Linear>(c.n_embd, 4 * c.n_embd, gen));
  c_proj = register_module("c_proj", std::make_shared<Linear>(4 * c.n_embd, c.n_embd, gen));
  dropout = register_module("dropout", make_dropout(c.resid_pdrop, dropout_gen));
}

Tensor GptMlp::forward_impl(const Tensor& x) {
  return dropout->forward(c_proj->forward(gelu(c_fc->forward(x), /*approximate=*/true)));
}

Block::Block(const GptConfig& c, Generator& gen, std::shared_ptr<Generator> dropout_gen) {
  ln_1 = register_module("ln_1", std::make_shared<LayerNorm>(c.n_embd));
  attn = register_module("attn", std::make_shared<CausalSelfAttention>(c, gen, dropout_gen));
  ln_2 = register_module("ln_2", std::make_shared<LayerNorm>(c.n_embd));
  mlp = register_module("mlp", std::make_shared<GptMlp>(c, gen, dropout_gen));
}

Tensor Block::forward_impl(const Tensor& x) {
  Tensor h = x + attn->forward(ln_1->forward(x));
  return h + mlp->forward(ln_2->forward(h));
}

GptTransformer::GptTransformer(const GptConfig& c, Generator& gen,
                               std::shared_ptr<Generator> dropout_gen) {
  wte = register_module("wte", std::make_shared<Embedding>(c.vocab_size, c.n_embd, gen));
  wpe = register_module("wpe", std::make_shared<Embedding>(c.block_size, c.n_embd, gen));
  drop = register_module("drop", make_dropout(c.embd_pdrop, dropout_gen));
  h = register_module("h", std::make_shared<Sequential>());
  for (int64_t i = 0; i < c.n_layer; ++i)
    h->push_back(std::make_shared<Block>(c, gen, dropout_gen));
  ln_f = register_module("ln_f", std::make_shared<LayerNorm>(c.n_embd));
}

Tensor GptTransformer::forward_impl(const Tensor&) {
  RG_FAIL("GPT's transformer is a ModuleDict: call GPT, not its transformer");
}

GPT::GPT(const GptConfig& c, Generator& gen, std::shared_ptr<Generator> dropout_gen) : config_(c) {
  RG_CHECK(c.vocab_size > 0 && c.block_size > 0 && c.n_layer > 0 && c.n_head > 0 && c.n_embd > 0,
           "GPT: vocab_size, block_size, n_layer, n_head and n_embd must be positive, got ",
           c.vocab_size, ", ", c.block_size, ", ", c.n_layer, ", ", c.n_head, ", ", c.n_embd);
  transformer =
      register_module("transformer", std::make_shared<GptTransformer>(c, gen, dropout_gen));
  lm_head = register_module("lm_head", std::make_shared<Linear>(c.n_embd, c.vocab_size, gen,
                                                                /*bias=*/false));
  if (c.tie_weights) {
    lm_head->weight = lm_head->replace_parameter("weight", transformer->wte->weight);
  }
  // minGPT's _init_weights, then the scaled init of every c_proj weight (GPT-2's residual
  // scaling), in named_parameters() order from one generator.
  const double proj_std = 0.02 / std::sqrt(2.0 * double(c.n_layer));
  NoGradGuard no_grad;
  for (auto& [name, p] : named_parameters()) {
    const bool is_bias = name.ends_with(".bias");
    const bool is_ln = name.find(".ln_") != std::string::npos;
    if (is_ln) {
      p.fill_(is_bias ? 0.0 : 1.0);
    } else if (is_bias) {
      p.zero_();
    } else {
      normal_(p, 0.0, name.ends_with("c_proj.weight") ? proj_std : 0.02, gen);
    }
  }
}

Tensor GPT::forward_impl(const Tensor& idx) {
  RG_CHECK(idx.dim() == 2 && idx.dtype() == DType::i64, "GPT: expected i64 token ids [B, T], got ",
           dtype_name(idx.dtype()), shape_str(idx.shape()));
  const int64_t T = idx.size(1);
  RG_CHECK(T <= config_.block_size, "GPT: cannot forward a sequence of length ", T,
           ", the block size is only ", config_.block_size);
  if (!positions_.defined() || positions_.device() != idx.device())
    positions_ = arange(double(config_.block_size)).to(idx.device());
  const Tensor pos = positions_.narrow(0, 0, T);
  Tensor x = transformer->wte->forward(idx) + transformer->wpe->forward(pos);  // [B,T,C] + [T,C]
  x = transformer->drop->forward(x);
  x = transformer->h->forward(x);
  x = transformer->ln_f->forward(x);
  return lm_head->forward(x);
}

std::vector<int64_t> GPT::generate(std::vector<int64_t> idx, int64_t max_new_tokens,
                                   double temperature, int64_t top_k, Generator& gen,
                                   const std::function<void(int64_t)>& on_token) {
  RG_CHECK(!idx.empty(), "GPT::generate: the prompt is empty (give at least one token)");
  RG_CHECK(max_new_tokens >= 0, "GPT::generate: max_new_tokens must be >= 0, got ", max_new_tokens);
  RG_CHECK(temperature >= 0, "GPT::generate: temperature must be >= 0, got ", temperature);
  RG_CHECK(top_k >= 0, "GPT::generate: top_k must be >= 0, got ", top_k);
  const int64_t V = config_.vocab_size;
  for (const int64_t id : idx)
    RG_CHECK(id >= 0 && id < V, "GPT::generate: prompt token ", id,
             " is outside the vocabulary of ", V);
  const bool was_training = is_training();
  eval();
  NoGradGuard no_grad;
  const Device device = lm_head->weight.device();
  std::vector<double> logits(static_cast<size_t>(V), 0.0);
  std::vector<int64_t> order(static_cast<size_t>(V));
  for (int64_t n = 0; n < max_new_tokens; ++n) {
    const int64_t T = std::min<int64_t>(int64_t(idx.size()), config_.block_size);
    const std::vector<int64_t> window(idx.end() - T, idx.end());
    const Tensor out = forward(from_vector(window, {1, T}).to(device));  // [1, T, V]
    const Tensor last = out.view({T, V}).narrow(0, T - 1, 1).to(DType::f64).to(Device::cpu());
    std::copy_n(last.data<double>(), V, logits.begin());
    int64_t next = 0;
    if (temperature == 0) {
      next = std::max_element(logits.begin(), logits.end()) - logits.begin();
    } else {
      // The candidates, largest logit first (ties: lower id first); top-k keeps the first k.
      std::iota(order.begin(), order.end(), 0);
      const int64_t k = top_k > 0 ? std::min(top_k, V) : V;
      std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int64_t a, int64_t b) {
        return logits[size_t(a)] > logits[size_t(b)] ||
               (logits[size_t(a)] == logits[size_t(b)] && a < b);
      });
      const double top = logits[size_t(order[0])];
      std::vector<double> weights(static_cast<size_t>(k));
      double total = 0;
      for (int64_t i = 0; i < k; ++i)
        total += weights[size_t(i)] =
            std::exp((logits[size_t(order[size_t(i)])] - top) / temperature);
      double u = rand({1}, gen, DType::f64).item() * total;
      next = order[size_t(k - 1)];
      for (int64_t i = 0; i < k; ++i) {
        if (u < weights[size_t(i)]) {
          next = order[size_t(i)];
          break;
        }
        u -= weights[size_t(i)];
      }
    }
    idx.push_back(next);
    if (on_token) on_token(next);
  }
  train(was_training);
  return idx;
}

}  // namespace rg::nn
