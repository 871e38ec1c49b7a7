// Dropout with an explicit Generator: the mask depends only on (seed, offset), never on threads.
#pragma once

#include "engine/generator.h"
#include "engine/tensor.h"

namespace rg {

// In training, zeroes each element with probability p and scales the kept ones by 1/(1-p);
// reserves (numel+3)/4 Philox counters from `gen`. Returns x itself when !training or p == 0,
// zeros when p == 1 (no counters reserved in those cases). p outside [0, 1] is an error.
Tensor dropout(const Tensor& x, double p, bool training, Generator& gen);

}  // namespace rg
