// Embedding: a [num_embeddings, embedding_dim] table looked up by i64 indices (engine/ops/
// embedding.h), with PyTorch's nn.Embedding initialization (N(0, 1), the padding row zeroed) and
// parameter name `weight`.
#pragma once

#include "engine/generator.h"
#include "layers/module.h"

namespace rg::nn {

class Embedding final : public Module {
 public:
  // padding_idx: -1 for none, otherwise a row in [0, num_embeddings) that starts at zero and gets
  // no gradient.
  Embedding(int64_t num_embeddings, int64_t embedding_dim, Generator& gen,
            int64_t padding_idx = -1);
  // Initialized from default_generator() (seed it with rg::manual_seed).
  Embedding(int64_t num_embeddings, int64_t embedding_dim, int64_t padding_idx = -1)
      : Embedding(num_embeddings, embedding_dim, default_generator(), padding_idx) {}
  // indices: i64 of any shape; the output has shape indices.shape() + [embedding_dim].
  Tensor forward_impl(const Tensor& indices) override;
  std::string type_name() const override { return "Embedding"; }
  Tensor weight;

 protected:
  std::string extra_repr() const override;

 private:
  int64_t num_, dim_, padding_idx_;
};

}  // namespace rg::nn
