// The TF32 contract of f32 work on CUDA, PyTorch's: whether f32 convolutions (cuDNN's math type)
// and f32 matrix products (cuBLAS's compute type) may run on TF32 tensor cores.
#pragma once

namespace rg::cuda {

// TF32 rounds each input of a product to a 10-bit mantissa (f32 keeps 23) and accumulates in f32:
// about 3 decimal digits per product instead of 7, several times faster on Ampere and later. The
// defaults are PyTorch's: convolutions on (torch.backends.cudnn.allow_tf32), matrix products off
// (torch.backends.cuda.matmul.allow_tf32). f64, f16 and bf16 are not affected, nor is the CPU.
// NVIDIA_TF32_OVERRIDE=0 in the environment turns TF32 off in the libraries whatever these say.
void set_allow_tf32_conv(bool allow);
bool allow_tf32_conv();
void set_allow_tf32_matmul(bool allow);
bool allow_tf32_matmul();

// Sets both switches for a scope and restores the previous values on exit.
class Tf32Guard {
 public:
  Tf32Guard(bool conv, bool matmul);
  ~Tf32Guard();
  Tf32Guard(const Tf32Guard&) = delete;
  Tf32Guard& operator=(const Tf32Guard&) = delete;

 private:
  bool conv_, matmul_;
};

}  // namespace rg::cuda
