// The two TF32 switches of engine/tf32.h, read by conv2d (engine/ops/conv2d.cpp) and the GEMM ops
// (engine/ops/matmul.cpp) at every call.
#include "engine/tf32.h"

#include <atomic>

namespace rg::cuda {
namespace {
std::atomic<bool> tf32_conv{true};
std::atomic<bool> tf32_matmul{false};
}  // namespace

void set_allow_tf32_conv(bool allow) { tf32_conv.store(allow); }
bool allow_tf32_conv() { return tf32_conv.load(); }
void set_allow_tf32_matmul(bool allow) { tf32_matmul.store(allow); }
bool allow_tf32_matmul() { return tf32_matmul.load(); }

Tf32Guard::Tf32Guard(bool conv, bool matmul)
    : conv_(allow_tf32_conv()), matmul_(allow_tf32_matmul()) {
  set_allow_tf32_conv(conv);
  set_allow_tf32_matmul(matmul);
}
Tf32Guard::~Tf32Guard() {
  set_allow_tf32_conv(conv_);
  set_allow_tf32_matmul(matmul_);
}

}  // namespace rg::cuda
