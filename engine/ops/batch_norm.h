// Batch normalization over the channel dimension of [N, C] or [N, C, H, W] tensors, with
// PyTorch's semantics (F.batch_norm).
#pragma once

#include <array>
#include <functional>
#include <optional>

#include "engine/tensor.h"

namespace rg {

// training: normalizes with the batch mean and biased variance, then, if running_mean/var are
// defined, updates them in place (not recorded by autograd): running = (1 - momentum) * running
// + momentum * batch, running_var taking the unbiased variance (n / (n - 1)).
// Not training: normalizes with running_mean/var, which must then be defined.
// weight (gamma) and bias (beta) are [C] or undefined (1 and 0).
Tensor batch_norm(const Tensor& x, const Tensor& running_mean, const Tensor& running_var,
                  const Tensor& weight, const Tensor& bias, bool training, double momentum = 0.1,
                  double eps = 1e-5);

// relu(batch_norm(...)) in one op (the BatchNorm2d -> ReLU of ResNet blocks): one pass over the
// activation less on either device, and its backward recomputes relu's mask from the input
// instead of saving the output. Our kernels on both devices (cuDNN's legacy batch norm cannot
// fuse an activation in NCHW). The same bits as the composition with our kernels for f32 and f64
// (and on CUDA for f16/bf16 storage); where half inputs go through f32 (autocast, or f16/bf16 on
// the CPU) the fused mask is taken before the output is rounded to the half type, so an output
// that rounds to 0 there (below 2^-24 in f16) keeps its gradient, and relu gives +0 for -0.
Tensor batch_norm_relu(const Tensor& x, const Tensor& running_mean, const Tensor& running_var,
                       const Tensor& weight, const Tensor& bias, bool training,
                       double momentum = 0.1, double eps = 1e-5);

// relu(batch_norm(...) + residual) in one op (the end of a ResNet basic block: bn2, the shortcut
// added, relu): reads x and the residual and writes the output in one pass instead of three ops'
// seven, and the backward writes the residual's gradient in its elementwise pass. It saves x and
// its output (relu's mask, as relu_backward takes it; the next layer keeps that output anyway),
// not the residual. Our kernels on both devices; the residual has x's shape, dtype and device.
// The same bits as the composition with our kernels for f32 and f64, and on CUDA for f16/bf16
// (the normalized value is rounded to the storage type before the add, as the unfused add sees
// it), with f16/bf16 or f32 parameters; through f32 (f16/bf16 on the CPU) the sum is rounded
// once, at the end.
//
// All three: f16/bf16 activations with f32 parameters and statistics on CUDA (autocast's
// BatchNorm2d) go to our kernels as they are, with f32 parameter gradients and no f32 copies; for
// batch_norm and batch_norm_relu the result is the f32 path's on the activation converted to f32,
// rounded once to its type; batch_norm_add_relu's is that batch norm, then the add in the half
// type, then relu (the unfused ops' result under autocast).
Tensor batch_norm_add_relu(const Tensor& x, const Tensor& residual, const Tensor& running_mean,
                           const Tensor& running_var, const Tensor& weight, const Tensor& bias,
                           bool training, double momentum = 0.1, double eps = 1e-5);

// num_batches_tracked += 1, in place on its device (BatchNorm2d's counter: an i64 scalar). Never
// reads the counter back to the host: on CUDA one kernel on the current stream.
void count_batch_(const Tensor& num_batches_tracked);

namespace detail {
// batch_norm's argument checks, shared with sync_batch_norm (op names the op in the errors):
// returns the [n, c, hw] view of x.
// mixed: f16/bf16 x on CUDA with f32 parameters and statistics.
std::array<int64_t, 3> check_batch_norm_args(const char* op, const Tensor& x,
                                             const Tensor& running_mean, const Tensor& running_var,
                                             const Tensor& weight, const Tensor& bias, double eps,
                                             bool mixed = false);
// training: more than one value per channel; evaluation: running statistics defined.
void check_batch_norm_mode(const char* op, const Tensor& x, const Tensor& running_mean,
                           bool training, int64_t count);
// f16/bf16 activations with f32 parameters or statistics (autocast), and f16/bf16 on the CPU:
// f32_op(x, running_mean, running_var, weight, bias) on f32 copies, its result in x's dtype, half
// running statistics updated in place from their f32 copies (training). nullopt otherwise: the
// kernels take the inputs as they are.
using BatchNormFn = std::function<Tensor(const Tensor&, const Tensor&, const Tensor&,
                                         const Tensor&, const Tensor&)>;
std::optional<Tensor> batch_norm_through_f32(const Tensor& x, const Tensor& running_mean,
                                             const Tensor& running_var, const Tensor& weight,
                                             const Tensor& bias, bool training,
                                             const BatchNormFn& f32_op);
}  // namespace detail

}  // namespace rg
