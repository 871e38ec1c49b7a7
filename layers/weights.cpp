// save_weights/load_weights over engine/serialization.h and Module::state_dict/load_state_dict.
#include "layers/weights.h"

#include "engine/serialization.h"
#include "kernels/error.h"

namespace rg::nn {

void save_weights(const Module& module, const std::string& path) {
  save_safetensors(path, module.state_dict());
}

IncompatibleKeys load_weights(Module& module, const std::string& path, bool strict) {
  return load_weights(module, load_safetensors(path), path, strict);
}

IncompatibleKeys load_weights(Module& module, const SafetensorsFile& f, const std::string& path,
                              bool strict) {
  // Every key of a checkpoint would be "unexpected"; say what the file is instead.
  RG_CHECK(!f.metadata.contains("rg.checkpoint"), path,
           ": a training checkpoint (its weights are under model.*): load it with "
           "nn::load_checkpoint");
  try {
    return module.load_state_dict(f.tensors, strict);
  } catch (const InternalError&) {
    throw;
  } catch (const Error& e) {
    RG_FAIL(path, ": ", e.what());
  }
}

}  // namespace rg::nn
