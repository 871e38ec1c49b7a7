// cuBLAS, cuDNN and NCCL are loaded at run time (dlopen), not linked: one ringgrad build then
// runs on machines with and without them, and the first call that needs a missing library throws
// rg::Error naming it (which library, which file was looked for, the loader's reason, how to point
// ringgrad at it). The CUDA runtime is linked statically (cudart_static), and it loads the driver
// (libcuda.so.1) itself. Plain C++ header: no CUDA includes. Real CUDA builds only; the emulated
// builds define the same functions in kernels/emu.
#pragma once

#include <string>

namespace rg::cuda::dynload {

enum class Library { Cublas, Cudnn, Nccl };

struct LibraryInfo {
  const char* name;    // "cuDNN"
  const char* soname;  // "libcudnn.so.9": the major version of the headers ringgrad was built with
  const char* env;     // "RG_CUDNN_LIBRARY": a file name or path to load instead of soname
};
const LibraryInfo& info(Library library);

// The address of `symbol` in `library`, loading the library on first use (once per process).
// Throws rg::Error when the library cannot be loaded or lacks the symbol.
void* symbol(Library library, const char* symbol);

// "" when `library` is loaded (or loadable), otherwise why not, in one sentence; never throws.
std::string load_error(Library library);

// Opens `file` with dlopen; on failure returns nullptr and sets *error to the message that
// symbol() throws for `library` (exposed for tests, which cannot unload the real libraries).
void* open(Library library, const std::string& file, std::string* error);

}  // namespace rg::cuda::dynload
