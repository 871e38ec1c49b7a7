// Sequential container.
#include "layers/sequential.h"

namespace rg::nn {

Sequential::Sequential(std::vector<std::shared_ptr<Module>> modules) {
  for (auto& m : modules) push_back(std::move(m));
}

Tensor Sequential::forward_impl(const Tensor& x) {
  Tensor h = x;
  for (auto& m : layers_) h = m->forward(h);
  return h;
}

}  // namespace rg::nn
