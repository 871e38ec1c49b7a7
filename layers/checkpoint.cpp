// Checkpoint layout on top of safetensors: prefixes per part, metadata for scalars.
#include "layers/checkpoint.h"

#include <cstdlib>

#include "engine/ops/factory.h"
#include "engine/serialization.h"
#include "kernels/error.h"
#include "layers/activation.h"
#include "layers/amp/grad_scaler.h"
#include "layers/optim/optimizer.h"

namespace rg::nn {
namespace {

constexpr const char* kFormatKey = "rg.checkpoint";
constexpr const char* kFormat = "1";

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.compare(0, prefix.size(), prefix) == 0;
}

std::vector<std::pair<std::string, Dropout*>> dropout_layers(Module& model) {
  std::vector<std::pair<std::string, Dropout*>> out;
  for (auto& [name, m] : model.named_modules()) {
    if (auto* d = dynamic_cast<Dropout*>(m)) out.emplace_back(name, d);
  }
  return out;
}

std::string metadata_value(const Metadata& m, const std::string& key, const std::string& path) {
  const auto it = m.find(key);
  RG_CHECK(it != m.end(), path, ": the checkpoint has no '", key, "' entry");
  return it->second;
}

double parse_number(const std::string& s, const std::string& key, const std::string& path) {
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  RG_CHECK(!s.empty() && end == s.c_str() + s.size(), path, ": checkpoint entry '", key, "' = '", s,
           "' is not a number");
  return v;
}

// Round-trips doubles exactly (17 significant digits).
std::string exact(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

}  // namespace

void save_checkpoint(const std::string& path, Module& model, const optim::Optimizer* optimizer,
                     const amp::GradScaler* scaler, const Metadata& metadata,
                     const NamedTensors& extra) {
  NamedTensors tensors;
  for (auto& [name, t] : model.state_dict()) tensors.emplace_back("model." + name, t);
  Metadata meta;
  for (const auto& [k, v] : metadata) {
    RG_CHECK(!starts_with(k, "rg.") && !starts_with(k, "optimizer") && !starts_with(k, "scaler."),
             "save_checkpoint: metadata key '", k, "' is reserved");
    meta[k] = v;
  }
  // A moved std::string, not operator=(const char*): GCC 12 reports a false -Wrestrict on the
  // latter here once inlined (GCC bug 105329).
  meta[kFormatKey] = std::string(kFormat);
  if (optimizer != nullptr) {
    for (auto& [name, t] : optimizer->state()) tensors.emplace_back("optimizer." + name, t);
    meta["optimizer"] = optimizer->name();
    meta["optimizer.lr"] = exact(optimizer->lr());
  }
  for (auto& [name, d] : dropout_layers(model)) {
    const Generator& g = d->generator();
    tensors.emplace_back("rng." + name,
                         from_vector<int64_t>({int64_t(g.seed()), int64_t(g.offset())}, {2}));
  }
  if (scaler != nullptr && scaler->is_enabled()) {  // a disabled scaler has no state (PyTorch)
    const amp::GradScaler::State s = scaler->state();
    meta["scaler.scale"] = exact(s.scale);
    meta["scaler.growth_tracker"] = std::to_string(s.growth_tracker);
  }
  for (const auto& [name, t] : extra) {
    RG_CHECK(!starts_with(name, "model.") && !starts_with(name, "optimizer.") &&
                 !starts_with(name, "rng."),
             "save_checkpoint: tensor name '", name, "' is reserved");
    tensors.emplace_back(name, t);
  }
  save_safetensors(path, tensors, meta);
}

Metadata load_checkpoint(const std::string& path, Module& model, optim::Optimizer* optimizer,
                         amp::GradScaler* scaler,
                         const std::function<void(const Metadata&)>& check_metadata,
                         NamedTensors* extra) {
  return load_checkpoint(load_safetensors(path), path, model, optimizer, scaler, check_metadata,
                         extra);
}

Metadata load_checkpoint(SafetensorsFile f, const std::string& path, Module& model,
                         optim::Optimizer* optimizer, amp::GradScaler* scaler,
                         const std::function<void(const Metadata&)>& check_metadata,
                         NamedTensors* extra) {
  RG_CHECK(f.metadata.count(kFormatKey) != 0, path,
           ": not a ringgrad checkpoint (no rg.checkpoint metadata; a plain safetensors file of "
           "weights loads with nn::load_weights)");
  RG_CHECK(f.metadata[kFormatKey] == kFormat, path, ": checkpoint format ", f.metadata[kFormatKey],
           ", this build reads format ", kFormat);
  NamedTensors model_state, optimizer_state;
  std::map<std::string, Tensor> rng;
  for (auto& [name, t] : f.tensors) {
    if (starts_with(name, "model.")) {
      model_state.emplace_back(name.substr(6), t);
    } else if (starts_with(name, "optimizer.")) {
      optimizer_state.emplace_back(name.substr(10), t);
    } else if (starts_with(name, "rng.")) {
      rng[name.substr(4)] = t;
    } else if (extra != nullptr) {
      extra->emplace_back(name, t);
    } else {
      RG_FAIL(path, ": unexpected tensor '", name, "' in a checkpoint");
    }
  }
  // Everything that can be checked without changing anything comes first: the caller's checks,
  // the optimizer's kind and lr, the generators, the scaler.
  if (check_metadata) check_metadata(f.metadata);
  double lr = 0;
  if (optimizer != nullptr) {
    const std::string kind = metadata_value(f.metadata, "optimizer", path);
    RG_CHECK(kind == optimizer->name(), path, ": the checkpoint holds ", kind,
             " state, the optimizer is ", optimizer->name());
    lr = parse_number(metadata_value(f.metadata, "optimizer.lr", path), "optimizer.lr", path);
  }
  std::vector<std::pair<Dropout*, std::vector<int64_t>>> generators;
  for (auto& [name, d] : dropout_layers(model)) {
    const auto it = rng.find(name);
    RG_CHECK(it != rng.end(), path, ": no generator state for dropout layer '", name, "'");
    auto v = it->second.to_vector<int64_t>();
    RG_CHECK(v.size() == 2, path, ": generator state of '", name, "' must be (seed, offset)");
    generators.emplace_back(d, std::move(v));
  }
  amp::GradScaler::State scaler_state{};
  const bool with_scaler = scaler != nullptr && scaler->is_enabled();
  if (with_scaler) {
    scaler_state.scale =
        parse_number(metadata_value(f.metadata, "scaler.scale", path), "scaler.scale", path);
    scaler_state.growth_tracker = int64_t(parse_number(
        metadata_value(f.metadata, "scaler.growth_tracker", path), "scaler.growth_tracker", path));
  }
  // Then the parts, each validated in full before it changes (load_state_dict and load_state
  // check everything first), so a bad model or optimizer entry changes nothing of that part.
  try {
    model.load_state_dict(model_state, /*strict=*/true);
  } catch (const Error& e) {
    RG_FAIL(path, ": the checkpoint does not fit the model: ", e.what());
  }
  if (optimizer != nullptr) {
    optimizer->load_state(optimizer_state);
    optimizer->set_lr(lr);
  }
  for (auto& [d, v] : generators) d->generator().set_state(uint64_t(v[0]), uint64_t(v[1]));
  if (with_scaler) scaler->load_state(scaler_state);
  return f.metadata;
}

}  // namespace rg::nn
