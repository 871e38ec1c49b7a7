#include "layers/optim/param_groups.h"

#include <functional>
#include <map>
#include <string>

#include "layers/linear.h"

namespace rg::optim {

std::vector<ParamGroup> linear_weight_decay_groups(const nn::Module& model, double weight_decay) {
  // Each distinct parameter in named_parameters() order (a module's own parameters, then its
  // children's), and whether every name it has is a Linear's weight.
  std::vector<Tensor> order;
  std::map<const TensorImpl*, bool> decays;
  const std::function<void(const nn::Module&)> visit = [&](const nn::Module& m) {
    const bool linear = dynamic_cast<const nn::Linear*>(&m) != nullptr;
    for (const auto& [name, t] : m.named_parameters()) {
      if (name.find('.') != std::string::npos) continue;  // a child's, visited below
      const bool linear_weight = linear && name == "weight";
      const auto [it, first] = decays.emplace(t.impl(), linear_weight);
      if (first) order.push_back(t);
      it->second = it->second && linear_weight;
    }
    for (const auto& [name, child] : m.named_children()) visit(*child);
  };
  visit(model);

  std::vector<ParamGroup> groups{{{}, weight_decay}, {{}, 0.0}};
  for (const Tensor& t : order) groups[decays.at(t.impl()) ? 0 : 1].params.push_back(t);
  return groups;
}

}  // namespace rg::optim
