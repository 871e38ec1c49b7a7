// Sequential container.
#include "layers/sequential.h"

namespace rg::nn {

Sequential::Sequential(std::vector<std::shared_ptr<Module>> modules) {
  for (auto& m : modules) push_back(std::move(m));
}

Sequential::Sequential(NamedModules modules) {
  for (auto& [name, m] : modules) push_back(name, std::move(m));
}

Tensor Sequential::forward_impl(const Tensor& x) {
  Tensor h = x;
  for (const auto& [name, m] : named_children()) h = m->forward(h);
  return h;
}

}  // namespace rg::nn
