// PyTorch's default parameter initializations, drawing from an explicit Generator.
#pragma once

#include <cstdint>

#include "engine/generator.h"
#include "engine/tensor.h"

namespace rg::nn::init {

// fan_in = size(1) * receptive field, fan_out = size(0) * receptive field.
int64_t fan_in(const Tensor& w);
int64_t fan_out(const Tensor& w);
// U(-b, b) with b = gain * sqrt(3 / fan_in), gain = sqrt(2 / (1 + a^2)) (torch kaiming_uniform_).
void kaiming_uniform_(Tensor& w, double a, Generator& gen);
// N(0, std) with std = sqrt(2 / fan) for ReLU (torch kaiming_normal_, nonlinearity='relu').
void kaiming_normal_fan_out_(Tensor& w, Generator& gen);
void uniform_(Tensor& t, double bound, Generator& gen);  // U(-bound, bound)

}  // namespace rg::nn::init
