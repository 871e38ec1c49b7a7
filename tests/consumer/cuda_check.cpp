// What an installed ringgrad says about CUDA on this machine, through the public headers only:
//   cuda_check            prints the device count, why there is none, and the CUDA libraries'
//                         versions; fails if any of that throws.
//   cuda_check missing    expects library_versions() to throw an rg::Error that names cuDNN and
//                         RG_CUDNN_LIBRARY (run with RG_CUDNN_LIBRARY pointing at no file).
// In builds without CUDA both modes just report "built without CUDA".
#include <ringgrad/ringgrad.h>

#include <cstdio>
#include <string>

int main(int argc, char** argv) {
  const bool expect_missing = argc > 1 && std::string(argv[1]) == "missing";
  std::printf("ringgrad %s (headers %s), CUDA backend %s\n", ringgrad_version(), RINGGRAD_VERSION,
              RINGGRAD_WITH_CUDA ? "built" : "not built");
  if (std::string(ringgrad_version()) != RINGGRAD_VERSION) return 1;
  const int n = rg::cuda::device_count();
  const std::string reason = rg::cuda::unavailable_reason();
  std::printf("CUDA devices: %d%s%s\n", n, reason.empty() ? "" : ": ", reason.c_str());
  if ((n == 0) == reason.empty()) return 1;  // a reason exactly when there is no device
  try {
    const std::string versions = rg::cuda::library_versions();
    std::printf("CUDA libraries: %s\n", versions.c_str());
    return expect_missing && RINGGRAD_WITH_CUDA ? 1 : 0;
  } catch (const rg::Error& e) {
    const std::string msg = e.what();
    std::printf("CUDA libraries: rg::Error: %s\n", msg.c_str());
    const bool named = msg.find("cuDNN") != std::string::npos &&
                       msg.find("RG_CUDNN_LIBRARY") != std::string::npos;
    return expect_missing && named ? 0 : 1;
  }
}
