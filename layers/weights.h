// Plain weight files: a module's state_dict in one safetensors file under the module's own names
// (PyTorch's state_dict keys, no prefix), what Python's
// safetensors.torch.save_file(model.state_dict(), path) writes and load_file reads back.
// Training checkpoints (model + optimizer + RNG + scaler) are layers/checkpoint.h.
#pragma once

#include <string>

#include "engine/serialization.h"
#include "layers/module.h"

namespace rg::nn {

// Writes module.state_dict() (parameters and buffers, any device) to `path` atomically
// (engine/serialization.h: a crash leaves the old file or the new one).
void save_weights(const Module& module, const std::string& path);

// Reads `path` and loads it with Module::load_state_dict. With strict, missing and unexpected keys
// and shape mismatches throw one rg::Error naming the file, in PyTorch's wording, and the module
// is left unchanged; without strict, the keys present in both are copied and the missing and
// unexpected ones returned (a shape mismatch still throws, as in PyTorch). Tensors are converted
// to each parameter's dtype and device.
IncompatibleKeys load_weights(Module& module, const std::string& path, bool strict = true);
// The same for a file already read (`path` names it in messages); what the path overload does
// after load_safetensors.
IncompatibleKeys load_weights(Module& module, const SafetensorsFile& file, const std::string& path,
                              bool strict = true);

}  // namespace rg::nn
