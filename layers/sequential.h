// Sequential: runs its children in registration order, like torch.nn.Sequential. Children are
// named "0", "1", ... or by the caller ({"conv1", ...}), which names their state_dict keys.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "layers/module.h"

namespace rg::nn {

class Sequential final : public Module {
 public:
  using NamedModules = std::vector<std::pair<std::string, std::shared_ptr<Module>>>;

  Sequential() = default;
  // Children named "0", "1", ...
  explicit Sequential(std::vector<std::shared_ptr<Module>> modules);
  // Children named by the caller, as torch.nn.Sequential(OrderedDict(...)):
  //   Sequential({{"conv1", std::make_shared<Conv2d>(1, 32, std::array<int64_t, 2>{3, 3})},
  //               {"relu1", std::make_shared<ReLU>()}})
  explicit Sequential(NamedModules modules);

  // Appends a child named after its position.
  template <class M>
  std::shared_ptr<M> push_back(std::shared_ptr<M> m) {
    return register_module(std::to_string(size()), std::move(m));
  }
  // Appends a named child (what register_module does on a Sequential too: it runs in order).
  template <class M>
  std::shared_ptr<M> push_back(const std::string& name, std::shared_ptr<M> m) {
    return register_module(name, std::move(m));
  }
  Tensor forward_impl(const Tensor& x) override;
  std::string type_name() const override { return "Sequential"; }
  size_t size() const { return named_children().size(); }
  Module& operator[](size_t i) const { return *named_children().at(i).second; }
};

}  // namespace rg::nn
