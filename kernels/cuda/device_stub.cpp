// Device queries for builds without CUDA: no devices, and clear errors for anything else.
#include "kernels/cuda/device.h"

#include "kernels/error.h"

namespace rg::cuda {
bool built_with_cuda() { return false; }
int device_count() { return 0; }
std::string unavailable_reason() { return "ringgrad was built without CUDA (RG_CUDA=OFF or no nvcc)"; }
std::string device_name(int index) {
  RG_FAIL("cuda device ", index, ": ringgrad was built without CUDA (RG_CUDA=OFF or no nvcc)");
}
std::string library_versions() { return "built without CUDA"; }
void self_test(int index) {
  RG_FAIL("cuda self-test on device ", index, ": ringgrad was built without CUDA");
}
}  // namespace rg::cuda
