// The Winograd transforms compiled with -mavx2 -mfma (see conv2d_winograd_kernels.h and
// kernels/CMakeLists.txt); used only when the CPU has both.
#define RG_WINOGRAD_ISA avx2
#include "kernels/cpu/conv2d_winograd_kernels.h"

namespace rg::kernels::cpu::winograd {

const Kernels* avx2_kernels() { return &avx2::kTable; }

}  // namespace rg::kernels::cpu::winograd
