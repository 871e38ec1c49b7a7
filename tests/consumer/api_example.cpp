// The README's C++ API example, built against the installed package by the install test: a model
// with PyTorch's layer names, seeded by rg::manual_seed, weights saved and loaded under those
// names, and an rg::Error caught. Exits non-zero when anything differs from what the README says.
#include <ringgrad/engine/error.h>
#include <ringgrad/engine/generator.h>
#include <ringgrad/engine/ops/factory.h>
#include <ringgrad/engine/threads.h>
#include <ringgrad/layers/activation.h>
#include <ringgrad/layers/conv2d.h>
#include <ringgrad/engine/ops/binary.h>
#include <ringgrad/engine/ops/reduce.h>
#include <ringgrad/layers/linear.h>
#include <ringgrad/layers/models/toynet.h>
#include <ringgrad/layers/sequential.h>
#include <ringgrad/layers/weights.h>

#include <cstdio>
#include <memory>

int main() {
  using namespace rg;
  bool ok = true;
  // README begin
  rg::set_num_threads(2);  // instead of RG_NUM_THREADS
  rg::manual_seed(0);      // layers built without a Generator& draw from the default generator
  auto make_net = [] {
    return std::make_shared<nn::Sequential>(nn::Sequential::NamedModules{
        {"conv1", std::make_shared<nn::Conv2d>(1, 4, std::array<int64_t, 2>{3, 3})},
        {"relu1", std::make_shared<nn::ReLU>()},
        {"flatten", std::make_shared<nn::Flatten>()},
        {"fc1", std::make_shared<nn::Linear>(4 * 26 * 26, 10)}});
  };
  auto net = make_net();
  Tensor logits = net->forward(zeros({2, 1, 28, 28}));  // [2, 10]
  // conv1.weight, conv1.bias, fc1.weight, fc1.bias: the names torch's state_dict() uses
  nn::save_weights(*net, "net.safetensors");

  auto copy = make_net();                      // other weights: the default generator moved on
  nn::load_weights(*copy, "net.safetensors");  // strict: every key and shape must match

  nn::Linear head(4 * 26 * 26, 10);
  auto report = nn::load_weights(head, "net.safetensors", /*strict=*/false);
  // report.missing_keys: weight, bias; report.unexpected_keys: conv1.weight, ..., fc1.bias

  try {
    nn::load_weights(head, "net.safetensors");  // strict
  } catch (const rg::Error& e) {
    // net.safetensors: Error(s) in loading state_dict for Linear: Missing key(s) in state_dict:
    // "weight", "bias"; Unexpected key(s) in state_dict: "conv1.weight", ...
    std::printf("%s\n", e.what());
  }
  // README end
  ok = ok && logits.shape() == Shape{2, 10} && rg::num_threads() == 2;
  const auto a = net->parameters(), b = copy->parameters();
  for (size_t i = 0; i < a.size(); ++i)
    ok = ok && a[i].to_vector<float>() == b[i].to_vector<float>();
  ok = ok && report.missing_keys == std::vector<std::string>{"weight", "bias"} &&
       report.unexpected_keys ==
           std::vector<std::string>{"conv1.weight", "conv1.bias", "fc1.weight", "fc1.bias"};

  // README hooks begin
  nn::ToyNet toynet;  // weights and dropout masks from the default generator
  Shape fc1_out;
  auto handle = toynet.fc1->register_forward_hook(
      [&](nn::Module&, const Tensor& in, const Tensor& out) { fc1_out = out.shape(); });
  Shape conv1_grad_out;
  toynet.conv1->register_full_backward_hook(
      [&](nn::Module&, const std::vector<Tensor>& grad_input, const std::vector<Tensor>& grad_output) {
        conv1_grad_out = grad_output[0].shape();  // grad_input[0]: undefined, images need no grad
      });
  Tensor out = toynet.forward(zeros({2, 1, 28, 28}));
  out.retain_grad();                                                // keep a non-leaf's .grad()
  out.register_hook([](const Tensor& g) { return mul(g, 0.5); });  // replace its gradient
  sum(out).backward();  // out.grad(): 0.5 everywhere; fc1_out [2, 128]; conv1_grad_out [2, 32, 26, 26]
  handle.remove();
  std::printf("%s", toynet.summary({2, 1, 28, 28}).c_str());  // a table with each output shape
  // README hooks end
  const auto g = out.grad().to_vector<float>();
  ok = ok && fc1_out == Shape{2, 128} && conv1_grad_out == Shape{2, 32, 26, 26} &&
       g == std::vector<float>(20, 0.5f) &&
       toynet.summary({2, 1, 28, 28}).find("[2, 128]") != std::string::npos;
  std::printf("api_example: %s\n", ok ? "ok" : "FAILED");
  return ok ? 0 : 1;
}
