// The README's C++ training example, built against the installed package by the install test:
// a model, AdamW, a DataLoader, autocast to f16 with loss scaling by amp::GradScaler (unscaled
// before clipping the gradient norm), and a checkpoint that a fresh model resumes from. Exits
// non-zero when the loss does not fall or the restore is not exact.
#include <ringgrad/data/dataloader.h>
#include <ringgrad/data/synthetic.h>
#include <ringgrad/engine/autocast.h>
#include <ringgrad/engine/ops/loss.h>
#include <ringgrad/layers/amp/grad_scaler.h>
#include <ringgrad/layers/checkpoint.h>
#include <ringgrad/layers/clip_grad.h>
#include <ringgrad/layers/models/registry.h>
#include <ringgrad/layers/optim/optimizer.h>

#include <cstdio>
#include <memory>

int main() {
  using namespace rg;
  // 512 samples of 1x28x28 noise with 10 labels; the model memorizes them.
  auto data = std::make_shared<data::SyntheticDataset>(512, Shape{1, 28, 28}, 10, /*seed=*/7);
  data::DataLoader loader(data, std::make_shared<data::RandomSampler>(data->size(), 7),
                          {.batch_size = 64, .workers = 2});
  auto model =
      nn::make_model({.name = "mlp", .sample_shape = {1, 28, 28}, .num_classes = 10, .seed = 1});
  auto opt = optim::make_adamw(model->parameters(), {.lr = 1e-3, .weight_decay = 0.01});
  amp::GradScaler scaler;  // dynamic loss scaling, as torch.amp.GradScaler

  double first = 0, last = 0;
  for (int epoch = 0; epoch < 5; ++epoch) {
    loader.start_epoch(epoch);
    double sum = 0;
    int batches = 0;
    while (auto batch = loader.next()) {
      opt->zero_grad();
      Tensor loss;
      {
        const AutocastGuard autocast(Device::cpu(), DType::f16);  // as torch.autocast
        loss = cross_entropy(model->forward(batch->inputs), batch->targets);  // f32 (its list)
      }
      scaler.scale(loss).backward();
      scaler.unscale_(*opt);  // the true gradients, for the clip; step will not unscale again
      nn::utils::clip_grad_norm_(model->parameters(), /*max_norm=*/5.0);
      scaler.step(*opt);  // skipped if a gradient overflowed
      scaler.update();
      sum += loss.item();
      ++batches;
    }
    last = sum / batches;
    if (epoch == 0) first = last;
    std::printf("train_example: epoch %d loss %.4f (scale %g)\n", epoch, last, scaler.get_scale());
  }
  nn::save_checkpoint("train_example.safetensors", *model, opt.get(), &scaler, {{"epoch", "5"}});

  // A fresh model, optimizer and scaler pick up exactly where the first left off.
  auto restored =
      nn::make_model({.name = "mlp", .sample_shape = {1, 28, 28}, .num_classes = 10, .seed = 99});
  auto restored_opt = optim::make_adamw(restored->parameters(), {.lr = 1e-3, .weight_decay = 0.01});
  amp::GradScaler restored_scaler;
  const auto meta = nn::load_checkpoint("train_example.safetensors", *restored, restored_opt.get(),
                                        &restored_scaler);
  bool same = meta.at("epoch") == "5" && restored_scaler.get_scale() == scaler.get_scale();
  const auto a = model->parameters(), b = restored->parameters();
  for (size_t i = 0; i < a.size(); ++i)
    same = same && a[i].to_vector<float>() == b[i].to_vector<float>();
  const bool ok = last < 0.5 * first && same;
  std::printf("train_example: loss %.4f -> %.4f, restored %s: %s\n", first, last,
              same ? "exactly" : "WRONG", ok ? "ok" : "FAILED");
  return ok ? 0 : 1;
}
