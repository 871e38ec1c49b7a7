// The small model the checkpoint and snapshot harnesses load into (fuzz/seeds.cpp saves it):
// fc (Linear 3 -> 2) and drop (Dropout, so a checkpoint carries a generator state).
#pragma once

#include <memory>

#include "layers/activation.h"
#include "layers/linear.h"
#include "layers/sequential.h"

namespace rg::fuzz {

inline std::shared_ptr<nn::Sequential> fuzz_model() {
  return std::make_shared<nn::Sequential>(nn::Sequential::NamedModules{
      {"fc", std::make_shared<nn::Linear>(3, 2)}, {"drop", std::make_shared<nn::Dropout>(0.5)}});
}

}  // namespace rg::fuzz
