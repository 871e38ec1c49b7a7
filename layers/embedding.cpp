// Embedding layer.
#include "layers/embedding.h"

#include <algorithm>

#include "engine/ops/embedding.h"
#include "engine/ops/factory.h"
#include "kernels/error.h"

namespace rg::nn {

Embedding::Embedding(int64_t num_embeddings, int64_t embedding_dim, Generator& gen,
                     int64_t padding_idx)
    : num_(num_embeddings), dim_(embedding_dim), padding_idx_(padding_idx) {
  RG_CHECK(num_embeddings > 0 && embedding_dim > 0,
           "Embedding: num_embeddings and embedding_dim must be positive, got (", num_embeddings,
           ", ", embedding_dim, ")");
  RG_CHECK(padding_idx == -1 || (padding_idx >= 0 && padding_idx < num_embeddings),
           "Embedding: padding_idx ", padding_idx, " is out of range for ", num_embeddings,
           " embeddings (-1 for none)");
  Tensor w = empty({num_embeddings, embedding_dim});
  normal_(w, 0.0, 1.0, gen);
  if (padding_idx >= 0)
    std::fill_n(w.data<float>() + padding_idx * embedding_dim, embedding_dim, 0.f);
  weight = register_parameter("weight", w);
}

Tensor Embedding::forward_impl(const Tensor& indices) {
  return embedding(weight, indices, padding_idx_);
}

std::string Embedding::extra_repr() const {
  std::string s = std::to_string(num_) + ", " + std::to_string(dim_);
  if (padding_idx_ >= 0) s += ", padding_idx=" + std::to_string(padding_idx_);
  return s;
}

}  // namespace rg::nn
