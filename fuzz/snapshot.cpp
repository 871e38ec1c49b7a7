// Fuzz harness: a training snapshot (a checkpoint plus DDP's state as extra tensors and
// metadata, comm/reducer_snapshot.h) as ringgrad-train --snapshot reads it: nn::load_checkpoint
// with the extra tensors, then this rank's PowerSGD state out of them.
#include <sstream>

#include "comm/reducer_snapshot.h"
#include "engine/serialization.h"
#include "fuzz/fuzz_model.h"
#include "fuzz/harness.h"
#include "layers/checkpoint.h"
#include "layers/optim/optimizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  rg::fuzz::expect_clean(size, [&] {
    std::istringstream in(std::string(rg::fuzz::as_text(data, size)));
    rg::SafetensorsFile f = rg::read_safetensors(in, "fuzz.snapshot");
    auto model = rg::fuzz::fuzz_model();
    rg::optim::Sgd sgd(model->parameters(), {.lr = 0.1, .momentum = 0.9});
    rg::NamedTensors extra;
    rg::nn::Metadata meta;
    rg::fuzz::expect_clean(size, [&] {
      meta = rg::nn::load_checkpoint(f, "fuzz.snapshot", *model, &sgd, nullptr, {}, &extra);
    });
    std::ostringstream log;
    for (const int world : {1, 2}) {
      rg::fuzz::expect_clean(size, [&] {
        rg::dist::powersgd_state_for_rank(extra, f.metadata, rg::dist::PowerSgdOptions{}, 0, world,
                                          log);
      });
    }
  });
  return 0;
}
