// Fuzz harness: a training checkpoint (safetensors) restored into a model, an SGD optimizer and a
// GradScaler by nn::load_checkpoint, and the same file as plain weights by nn::load_weights.
#include "layers/checkpoint.h"

#include <sstream>

#include "engine/serialization.h"
#include "fuzz/fuzz_model.h"
#include "fuzz/harness.h"
#include "layers/amp/grad_scaler.h"
#include "layers/optim/optimizer.h"
#include "layers/weights.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  rg::fuzz::expect_clean(size, [&] {
    std::istringstream in(std::string(rg::fuzz::as_text(data, size)));
    const rg::SafetensorsFile f = rg::read_safetensors(in, "fuzz.ckpt");
    auto model = rg::fuzz::fuzz_model();
    rg::optim::Sgd sgd(model->parameters(), {.lr = 0.1, .momentum = 0.9});
    rg::amp::GradScaler scaler;
    rg::fuzz::expect_clean(size,
                           [&] { rg::nn::load_checkpoint(f, "fuzz.ckpt", *model, &sgd, &scaler); });
    rg::fuzz::expect_clean(size, [&] { rg::nn::load_weights(*model, f, "fuzz.ckpt", true); });
    rg::fuzz::expect_clean(size, [&] { rg::nn::load_weights(*model, f, "fuzz.ckpt", false); });
  });
  return 0;
}
