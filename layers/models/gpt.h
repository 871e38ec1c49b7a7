// GPT as Karpathy's minGPT (mingpt/model.py): token and position embeddings, n_layer pre-norm
// blocks (LayerNorm, causal multi-head self-attention, residual; LayerNorm, MLP with the tanh
// GELU, residual), a final LayerNorm and a bias-free linear head. Module and parameter names are
// minGPT's ("transformer.h.0.attn.c_attn.weight", "lm_head.weight"), so a state_dict moves to and
// from PyTorch through safetensors (layers/weights.h); minGPT's causal-mask buffers
// ("transformer.h.N.attn.bias") are not kept here: drop them on the PyTorch side, as its own
// from_pretrained does.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/generator.h"
#include "layers/activation.h"
#include "layers/embedding.h"
#include "layers/layer_norm.h"
#include "layers/linear.h"
#include "layers/sequential.h"

namespace rg::nn {

struct GptConfig {
  int64_t n_layer = 3, n_head = 3, n_embd = 48;
  int64_t vocab_size = 0, block_size = 0;
  // minGPT's dropout rates (0.1 each). attn_pdrop drops attention probabilities inside the fused
  // causal attention (engine/ops/attention.h), with attn_dropout's generator.
  double embd_pdrop = 0.1, resid_pdrop = 0.1, attn_pdrop = 0.1;
  // lm_head.weight is transformer.wte.weight (one parameter, both names in the state_dict).
  bool tie_weights = false;
};

// minGPT's named sizes: gpt-nano (3 layers, 3 heads, 48 wide), gpt-micro (4, 4, 128),
// gpt-mini (6, 6, 192). Any other name is an rg::Error listing them.
GptConfig gpt_config(const std::string& model_type, int64_t vocab_size, int64_t block_size);

// The attention block: c_attn (C -> 3C: q, k, v), causal_attention over n_head heads (its
// probabilities dropped at attn_pdrop in training mode, attn_dropout's p and generator), c_proj.
class CausalSelfAttention final : public Module {
 public:
  CausalSelfAttention(const GptConfig& config, Generator& gen,
                      std::shared_ptr<Generator> dropout_gen);
  Tensor forward_impl(const Tensor& x) override;  // [B, T, C] -> [B, T, C]
  std::string type_name() const override { return "CausalSelfAttention"; }
  std::shared_ptr<Linear> c_attn, c_proj;
  std::shared_ptr<Dropout> attn_dropout, resid_dropout;

 private:
  int64_t n_head_, n_embd_;
};

// The MLP of a block: c_fc (C -> 4C), GELU (tanh), c_proj (4C -> C), dropout.
class GptMlp final : public Module {
 public:
  GptMlp(const GptConfig& config, Generator& gen, std::shared_ptr<Generator> dropout_gen);
  Tensor forward_impl(const Tensor& x) override;
  std::string type_name() const override { return "ModuleDict"; }
  std::shared_ptr<Linear> c_fc, c_proj;
  std::shared_ptr<Dropout> dropout;
};

class Block final : public Module {
 public:
  Block(const GptConfig& config, Generator& gen, std::shared_ptr<Generator> dropout_gen);
  Tensor forward_impl(const Tensor& x) override;  // x + attn(ln_1(x)), then + mlp(ln_2(x))
  std::string type_name() const override { return "Block"; }
  std::shared_ptr<LayerNorm> ln_1, ln_2;
  std::shared_ptr<CausalSelfAttention> attn;
  std::shared_ptr<GptMlp> mlp;
};

// minGPT's `transformer` ModuleDict: wte, wpe, drop, h (the blocks, run in order), ln_f. GPT
// calls its members; calling it is an error, as calling a ModuleDict.
class GptTransformer final : public Module {
 public:
  GptTransformer(const GptConfig& config, Generator& gen, std::shared_ptr<Generator> dropout_gen);
  Tensor forward_impl(const Tensor& x) override;
  std::string type_name() const override { return "ModuleDict"; }
  std::shared_ptr<Embedding> wte, wpe;
  std::shared_ptr<Dropout> drop;
  std::shared_ptr<Sequential> h;
  std::shared_ptr<LayerNorm> ln_f;
};

class GPT final : public Module {
 public:
  // Weights as minGPT's _init_weights: N(0, 0.02) for Linear and Embedding weights, c_proj weights
  // N(0, 0.02 / sqrt(2 n_layer)), zero biases, LayerNorm ones and zeros; drawn from `init_gen`.
  // Dropout masks come from `dropout_gen` (null: default_generator()).
  GPT(const GptConfig& config, Generator& init_gen,
      std::shared_ptr<Generator> dropout_gen = nullptr);
  // idx: i64 token ids [B, T] with T <= block_size -> logits [B, T, vocab_size].
  Tensor forward_impl(const Tensor& idx) override;
  std::string type_name() const override { return "GPT"; }
  const GptConfig& config() const { return config_; }

  // minGPT's generate(): appends `max_new_tokens` ids to `prompt` (at least one id), one at a
  // time, each from the logits of the last position over the last block_size ids: greedy (argmax,
  // the lowest id on ties) when temperature is 0, otherwise drawn from softmax(logits /
  // temperature) restricted to the top_k largest (top_k 0: all) with one uniform draw of `gen`
  // per token. Runs in eval mode without grad (the mode is restored); `on_token` (optional) sees
  // each new id as it comes. Returns prompt and the new ids.
  std::vector<int64_t> generate(std::vector<int64_t> prompt, int64_t max_new_tokens,
                                double temperature, int64_t top_k, Generator& gen,
                                const std::function<void(int64_t)>& on_token = {});
  std::shared_ptr<GptTransformer> transformer;
  std::shared_ptr<Linear> lm_head;

 private:
  GptConfig config_;
  // Position ids 0..block_size-1 on the device they were last asked on: built once, so a forward
  // on CUDA copies nothing from the host (a pageable copy would stall the step).
  Tensor positions_;
};

}  // namespace rg::nn
