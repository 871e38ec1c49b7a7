// Model factory with input-shape checks, so a wrong --model/--dataset pair fails up front.
#include "layers/models/registry.h"

#include "engine/generator.h"
#include "kernels/error.h"
#include "layers/models/gpt.h"
#include "layers/models/mlp.h"
#include "layers/models/resnet.h"
#include "layers/models/toynet.h"

namespace rg::nn {

std::shared_ptr<Module> make_model(const ModelSpec& spec) {
  Generator gen(spec.seed);
  auto dropout_gen = std::make_shared<Generator>(spec.seed ^ 0xD1B54A32D192ED03ull);
  if (spec.name == "toynet") {
    RG_CHECK(spec.sample_shape == (Shape{1, 28, 28}) && spec.num_classes == 10,
             "model toynet expects 1x28x28 inputs and 10 classes (MNIST-like), got ",
             shape_str(spec.sample_shape), " and ", spec.num_classes, " classes");
    return std::make_shared<ToyNet>(gen, dropout_gen, spec.dropout);
  }
  if (spec.name == "mlp") {
    return std::make_shared<MLP>(shape_numel(spec.sample_shape), std::vector<int64_t>{512, 256},
                                 spec.num_classes, gen);
  }
  if (spec.name == "resnet18" || spec.name == "resnet18-imagenet") {
    RG_CHECK(spec.sample_shape.size() == 3 && spec.sample_shape[0] == 3, "model ", spec.name,
             " expects 3-channel images, got samples of shape ", shape_str(spec.sample_shape));
    return std::make_shared<ResNet18>(spec.num_classes, gen, spec.name == "resnet18-imagenet");
  }
  if (spec.name.starts_with("gpt-")) {
    RG_CHECK(spec.sample_shape.size() == 1, "model ", spec.name,
             " expects token sequences (samples of shape [block_size], e.g. --dataset text), got ",
             shape_str(spec.sample_shape));
    GptConfig config = gpt_config(spec.name, spec.num_classes, spec.sample_shape[0]);
    config.tie_weights = spec.tie_weights;
    if (!spec.dropout) config.embd_pdrop = config.resid_pdrop = config.attn_pdrop = 0.0;
    return std::make_shared<GPT>(config, gen, dropout_gen);
  }
  RG_FAIL("unknown model '", spec.name,
          "' (expected toynet, mlp, resnet18, resnet18-imagenet, gpt-nano, gpt-micro or gpt-mini)");
}

}  // namespace rg::nn
