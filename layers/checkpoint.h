// Training checkpoints in one safetensors file (engine/serialization.h), so a run can stop and
// resume bit for bit, in the safetensors layout Python's safetensors.torch.load_file reads:
//   model.<name>               the model's state_dict (torchvision-compatible names)
//   optimizer.<index>.<key>    the optimizer's state (PyTorch's keys)
//   rng.<module path>          (seed, offset) of each dropout layer's generator, as i64 [2]
// and string metadata: "rg.checkpoint" (the format version), "optimizer" (its name and lr),
// "scaler.scale"/"scaler.growth_tracker" when an enabled GradScaler is given, plus the caller's
// keys. A caller may add tensors of its own under other names (a snapshot's DDP state,
// comm/reducer_snapshot.h).
#pragma once

#include <functional>
#include <map>
#include <string>

#include "engine/serialization.h"
#include "layers/module.h"

namespace rg::optim {
class Optimizer;
}
namespace rg::amp {
class GradScaler;
}

namespace rg::nn {

using Metadata = std::map<std::string, std::string>;

// Writes atomically (a crash leaves the previous checkpoint intact). `optimizer` and `scaler` may
// be null. Caller keys must not start with "rg.", "optimizer" or "scaler."; the names of `extra`
// tensors not with "model.", "optimizer." or "rng.".
void save_checkpoint(const std::string& path, Module& model, const optim::Optimizer* optimizer,
                     const amp::GradScaler* scaler, const Metadata& metadata,
                     const NamedTensors& extra = {});

// Restores the model (strictly: every mismatched, missing or unexpected name is reported), the
// optimizer's state and learning rate (it must be the same kind of optimizer), the dropout
// generators and the scaler, and returns the metadata. Tensors go to the parameters' devices.
// `check_metadata` (optional) runs on the metadata before anything is changed and may throw.
// Each part is validated in full before it is changed; a checkpoint that fails on the optimizer
// after the model fitted leaves the model loaded. With `extra` the tensors outside those parts
// (save_checkpoint's `extra`, on the CPU) go there; without, they are an error.
Metadata load_checkpoint(const std::string& path, Module& model, optim::Optimizer* optimizer,
                         amp::GradScaler* scaler,
                         const std::function<void(const Metadata&)>& check_metadata = {},
                         NamedTensors* extra = nullptr);
// The same for a file already read (load_safetensors or read_safetensors); `path` names it in
// messages. The path overload is this after load_safetensors(path); the fuzzer calls it directly.
Metadata load_checkpoint(SafetensorsFile file, const std::string& path, Module& model,
                         optim::Optimizer* optimizer, amp::GradScaler* scaler,
                         const std::function<void(const Metadata&)>& check_metadata = {},
                         NamedTensors* extra = nullptr);

}  // namespace rg::nn
