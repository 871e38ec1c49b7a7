// Module registration, traversal, conversion and state_dict loading.
#include "layers/module.h"

#include <algorithm>
#include <functional>
#include <map>
#include <set>
#include <unordered_set>

#include "engine/autograd/grad_mode.h"
#include "engine/ops/factory.h"
#include "kernels/error.h"

namespace rg::nn {

void assign_in_place(const Tensor& t, const Tensor& value) {
  TensorImpl* impl = t.impl();
  impl->storage = value.storage();
  impl->offset = value.storage_offset();
  impl->dtype = value.dtype();
  impl->memory_format = value.memory_format();
  if (impl->autograd && impl->autograd->grad) {
    Tensor g(impl->autograd->grad);
    if (g.dtype() != value.dtype() || g.device() != value.device() ||
        g.memory_format() != value.memory_format()) {
      impl->autograd->grad =
          g.to(value.dtype()).to(value.device()).contiguous(value.memory_format()).impl_ptr();
    }
  }
}

void Module::check_new_name(const std::string& name) const {
  RG_CHECK(!name.empty() && name.find('.') == std::string::npos, type_name(),
           ": invalid member name '", name, "' (must be non-empty without '.')");
  auto taken = [&](const auto& list) {
    return std::any_of(list.begin(), list.end(), [&](const auto& p) { return p.first == name; });
  };
  RG_CHECK(!taken(params_) && !taken(buffers_) && !taken(children_), type_name(), ": member name '",
           name, "' is already registered");
}

Tensor& Module::register_parameter(const std::string& name, Tensor t, bool requires_grad) {
  check_new_name(name);
  RG_CHECK(t.defined(), type_name(), ": parameter '", name, "' is undefined");
  RG_CHECK(t.is_leaf(), type_name(), ": parameter '", name, "' must be a leaf tensor");
  t.set_requires_grad(requires_grad);
  params_.emplace_back(name, t);
  return params_.back().second;
}

Tensor& Module::replace_parameter(const std::string& name, Tensor t) {
  auto it = std::find_if(params_.begin(), params_.end(), [&](auto& p) { return p.first == name; });
  RG_CHECK(it != params_.end(), type_name(), ": no parameter '", name, "' to replace");
  RG_CHECK(t.defined() && t.is_leaf(), type_name(), ": parameter '", name,
           "' must be replaced by a defined leaf tensor");
  RG_CHECK(t.shape() == it->second.shape(), type_name(), ": parameter '", name, "' has shape ",
           shape_str(it->second.shape()), ", its replacement ", shape_str(t.shape()));
  it->second = std::move(t);
  return it->second;
}

Tensor& Module::register_buffer(const std::string& name, Tensor t) {
  check_new_name(name);
  RG_CHECK(t.defined(), type_name(), ": buffer '", name, "' is undefined");
  buffers_.emplace_back(name, t);
  return buffers_.back().second;
}

void Module::add_child(const std::string& name, std::shared_ptr<Module> m) {
  check_new_name(name);
  RG_CHECK(m != nullptr, type_name(), ": child module '", name, "' is null");
  m->parent_ = this;
  m->local_name_ = name;
  children_.emplace_back(name, std::move(m));
}

std::string Module::path() const {
  if (!parent_) return "";
  const std::string up = parent_->path();
  return up.empty() ? local_name_ : up + "." + local_name_;
}

void Module::collect(const std::string& prefix, bool params, bool buffers,
                     NamedTensors& out) const {
  if (params) {
    for (const auto& [n, t] : params_) out.emplace_back(prefix + n, t);
  }
  if (buffers) {
    for (const auto& [n, t] : buffers_) out.emplace_back(prefix + n, t);
  }
  for (const auto& [n, c] : children_) c->collect(prefix + n + ".", params, buffers, out);
}

NamedTensors Module::named_parameters() const {
  NamedTensors all;
  collect("", true, false, all);
  // A parameter registered in two modules (a tied weight) is listed once, under its first name,
  // as PyTorch's named_parameters(remove_duplicate=True); state_dict() keeps every name.
  NamedTensors out;
  std::unordered_set<const TensorImpl*> seen;
  for (auto& [n, t] : all)
    if (seen.insert(t.impl()).second) out.emplace_back(std::move(n), std::move(t));
  return out;
}

std::vector<Tensor> Module::parameters() const {
  std::vector<Tensor> out;
  for (auto& [n, t] : named_parameters()) out.push_back(t);
  return out;
}

NamedTensors Module::named_buffers() const {
  NamedTensors out;
  collect("", false, true, out);
  return out;
}

NamedTensors Module::state_dict() const {
  NamedTensors out;
  collect("", true, true, out);
  return out;
}

std::vector<std::pair<std::string, Module*>> Module::named_modules() {
  std::vector<std::pair<std::string, Module*>> out{{"", this}};
  for (auto& [n, c] : children_) {
    for (auto& [cn, cm] : c->named_modules()) out.emplace_back(cn.empty() ? n : n + "." + cn, cm);
  }
  return out;
}

int64_t Module::parameter_count() const {
  int64_t n = 0;
  for (const Tensor& p : parameters()) n += p.numel();
  return n;
}

void Module::train(bool on) {
  training_ = on;
  for (auto& [n, c] : children_) c->train(on);
}

void Module::to(Device device) {
  NoGradGuard no_grad;
  for (auto& [n, t] : state_dict()) {
    if (t.device() != device) assign_in_place(t, t.detach().to(device));
  }
}

void Module::to(DType dtype) {
  RG_CHECK(is_floating(dtype), type_name(), ".to(", dtype_name(dtype),
           "): modules can only be converted to a floating-point dtype");
  NoGradGuard no_grad;
  for (auto& [n, t] : state_dict()) {
    if (!is_floating(t.dtype()) || t.dtype() == dtype) continue;
    assign_in_place(t, t.detach().to(dtype));
  }
}

void Module::to(MemoryFormat format) {
  NoGradGuard no_grad;
  for (auto& [n, t] : state_dict()) {
    if (t.dim() == 4 && t.memory_format() != format) {
      assign_in_place(t, t.detach().contiguous(format));
    }
  }
}

void Module::zero_grad(bool set_to_none) {
  for (const Tensor& p : parameters()) p.zero_grad(set_to_none);
}

IncompatibleKeys Module::load_state_dict(const NamedTensors& state, bool strict) {
  const NamedTensors mine = state_dict();
  std::map<std::string, Tensor> given;
  for (const auto& [n, t] : state) {
    RG_CHECK(given.emplace(n, t).second, "load_state_dict: key '", n, "' appears twice");
  }
  IncompatibleKeys keys;
  std::vector<std::string> mismatched;
  std::set<std::string> used;
  for (const auto& [n, t] : mine) {
    auto it = given.find(n);
    if (it == given.end()) {
      keys.missing_keys.push_back(n);
      continue;
    }
    used.insert(n);
    const Tensor& v = it->second;
    if (v.shape() != t.shape()) {
      mismatched.push_back(
          "size mismatch for " + n + ": copying a param with shape " + shape_str(v.shape()) +
          " from checkpoint, the shape in current model is " + shape_str(t.shape()));
    } else if (is_floating(v.dtype()) != is_floating(t.dtype())) {
      mismatched.push_back(
          "dtype mismatch for " + n + ": copying a param of dtype " + dtype_name(v.dtype()) +
          " from checkpoint, the dtype in current model is " + dtype_name(t.dtype()));
    }
  }
  for (const auto& [n, t] : state) {  // in the state's order, as PyTorch lists them
    if (!used.count(n)) keys.unexpected_keys.push_back(n);
  }
  auto quoted = [](const std::vector<std::string>& v) {
    std::string s;
    for (size_t i = 0; i < v.size(); ++i) s += (i ? ", \"" : "\"") + v[i] + "\"";
    return s;
  };
  // PyTorch's order and wording, on one line: missing, unexpected, then each mismatch.
  std::vector<std::string> problems;
  if (strict && !keys.missing_keys.empty()) {
    problems.push_back("Missing key(s) in state_dict: " + quoted(keys.missing_keys));
  }
  if (strict && !keys.unexpected_keys.empty()) {
    problems.push_back("Unexpected key(s) in state_dict: " + quoted(keys.unexpected_keys));
  }
  problems.insert(problems.end(), mismatched.begin(), mismatched.end());
  if (!problems.empty()) {
    std::string msg = "Error(s) in loading state_dict for " + type_name() + ": ";
    for (size_t i = 0; i < problems.size(); ++i) msg += (i ? "; " : "") + problems[i];
    RG_FAIL(msg);
  }
  NoGradGuard no_grad;
  for (const auto& [n, t] : mine) {
    auto it = given.find(n);
    if (it != given.end()) Tensor(t).copy_(it->second);
  }
  return keys;
}

void Module::str_into(std::string& out, int indent) const {
  out += type_name() + "(" + extra_repr();
  if (!children_.empty()) {
    out += "\n";
    for (const auto& [n, c] : children_) {
      out += std::string(size_t(indent + 2), ' ') + "(" + n + "): ";
      c->str_into(out, indent + 2);
      out += "\n";
    }
    out += std::string(size_t(indent), ' ');
  }
  out += ")";
}

namespace {

std::string thousands(int64_t v) {
  std::string digits = std::to_string(v), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

}  // namespace

std::string Module::summary() const { return summary_table(nullptr); }

std::string Module::summary(const Shape& input_shape) {
  RG_CHECK(!input_shape.empty() &&
               std::all_of(input_shape.begin(), input_shape.end(), [](int64_t d) { return d > 0; }),
           type_name(), ".summary: the input shape must have positive sizes, got ",
           shape_str(input_shape));
  std::map<const Module*, Shape> output_shapes;
  std::vector<RemovableHandle> handles;
  std::vector<std::pair<Module*, bool>> modes;
  for (auto& [name, m] : named_modules()) {
    modes.emplace_back(m, m->is_training());
    handles.push_back(
        m->register_forward_hook([&output_shapes](Module& mod, const Tensor&, const Tensor& out) {
          output_shapes[&mod] = out.shape();
        }));
  }
  // Restores each module's mode and removes the hooks, also when the forward throws.
  struct Restore {
    std::vector<std::pair<Module*, bool>>& modes;
    std::vector<RemovableHandle>& handles;
    ~Restore() {
      for (auto& h : handles) h.remove();
      for (auto& [m, training] : modes) m->training_ = training;
    }
  } restore{modes, handles};
  eval();
  const std::vector<Tensor> params = parameters();
  const DType dtype = params.empty() ? DType::f32 : params[0].dtype();
  const Device device = params.empty() ? Device::cpu() : params[0].device();
  {
    NoGradGuard no_grad;
    forward(zeros(input_shape, dtype, device));
  }
  return summary_table([&output_shapes](const Module& m) {
    auto it = output_shapes.find(&m);
    return it == output_shapes.end() ? std::string("-") : shape_str(it->second);
  });
}

std::string Module::summary_table(
    const std::function<std::string(const Module&)>& output_shape) const {
  struct Row {
    std::string name, output, shapes;
    int64_t params = 0;
  };
  std::vector<Row> rows;
  int64_t trainable = 0, frozen = 0, buffer_elems = 0, bytes = 0;
  // Depth first, like named_modules(), on a const module.
  const std::function<void(const Module&, const std::string&, int)> visit =
      [&](const Module& m, const std::string& name, int depth) {
        Row r;
        r.name = std::string(size_t(2 * depth), ' ') +
                 (name.empty() ? m.type_name() : name + " (" + m.type_name() + ")");
        if (output_shape) r.output = output_shape(m);
        for (const auto& [pn, t] : m.params_) {
          r.shapes += (r.shapes.empty() ? "" : " ") + pn + shape_str(t.shape());
          r.params += t.numel();
          (t.requires_grad() ? trainable : frozen) += t.numel();
          bytes += t.numel() * int64_t(element_size(t.dtype()));
        }
        for (const auto& [bn, t] : m.buffers_) {
          buffer_elems += t.numel();
          bytes += t.numel() * int64_t(element_size(t.dtype()));
        }
        rows.push_back(r);
        for (const auto& [cn, c] : m.children_) visit(*c, cn, depth + 1);
      };
  visit(*this, "", 0);
  size_t w_name = 6, w_output = 12, w_shapes = 10;
  for (const Row& r : rows) {
    w_name = std::max(w_name, r.name.size());
    w_output = std::max(w_output, r.output.size());
    w_shapes = std::max(w_shapes, r.shapes.size());
  }
  const auto pad = [](const std::string& s, size_t w) {
    return s + std::string(w - s.size(), ' ');
  };
  // The output column, when there is one.
  const auto output = [&](const std::string& s) {
    return output_shape ? pad(s, w_output) + "  " : std::string();
  };
  const size_t width = w_name + (output_shape ? w_output + 2 : 0) + w_shapes + 14;
  std::string out = pad("module", w_name) + "  " + output("output shape") +
                    pad("parameters", w_shapes) + "  elements\n";
  out += std::string(width, '-') + "\n";
  for (const Row& r : rows) {
    out += pad(r.name, w_name) + "  " + output(r.output) + pad(r.shapes, w_shapes) + "  " +
           (r.params ? thousands(r.params) : std::string("-")) + "\n";
  }
  out += std::string(width, '-') + "\n";
  out += "trainable parameters: " + thousands(trainable) + "\n";
  out += "frozen parameters: " + thousands(frozen) + "\n";
  out += "buffer elements: " + thousands(buffer_elems) + "\n";
  out += "parameter and buffer bytes: " + thousands(bytes) + "\n";
  return out;
}

std::string Module::str() const {
  std::string out;
  str_into(out, 0);
  return out;
}

}  // namespace rg::nn
