// Run-time loading of cuBLAS, cuDNN and NCCL (see dynload.h): the loader, and one stub per
// function ringgrad calls (dynload_symbols.h), defined under the library's own name so that every
// call site stays an ordinary call.
#include "kernels/cuda/dynload.h"

#include <cublas_v2.h>
#include <cudnn.h>
#include <dlfcn.h>
#include <nccl.h>

#include <cstdlib>
#include <mutex>

#include "kernels/error.h"

namespace rg::cuda::dynload {
namespace {

#define RG_DYNLOAD_STR2(x) #x
#define RG_DYNLOAD_STR(x) RG_DYNLOAD_STR2(x)

const LibraryInfo kLibraries[] = {
    {"cuBLAS", "libcublas.so." RG_DYNLOAD_STR(CUBLAS_VER_MAJOR), "RG_CUBLAS_LIBRARY"},
    {"cuDNN", "libcudnn.so." RG_DYNLOAD_STR(CUDNN_MAJOR), "RG_CUDNN_LIBRARY"},
    {"NCCL", "libnccl.so." RG_DYNLOAD_STR(NCCL_MAJOR), "RG_NCCL_LIBRARY"},
};

struct Loaded {
  std::once_flag once;
  void* handle = nullptr;
  std::string error;
};

Loaded& loaded(Library library) {
  static Loaded state[std::size(kLibraries)];
  Loaded& l = state[static_cast<int>(library)];
  std::call_once(l.once, [&] {
    const LibraryInfo& lib = info(library);
    const char* override_file = std::getenv(lib.env);
    const std::string file = override_file != nullptr && *override_file != '\0'
                                 ? std::string(override_file)
                                 : std::string(lib.soname);
    l.handle = open(library, file, &l.error);
  });
  return l;
}

}  // namespace

const LibraryInfo& info(Library library) { return kLibraries[static_cast<int>(library)]; }

void* open(Library library, const std::string& file, std::string* error) {
  // RTLD_LOCAL: the library's symbols must not interpose on ours (the stubs below share its names).
  void* handle = dlopen(file.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const LibraryInfo& lib = info(library);
    const char* reason = dlerror();
    *error = ::rg::detail::cat(
        "CUDA needs ", lib.name, ", which could not be loaded: ", reason ? reason : file.c_str(),
        ". Install ", lib.name, " (", lib.soname, ") where the dynamic loader finds it (for example "
        "in LD_LIBRARY_PATH), or set ", lib.env, " to the library file");
  }
  return handle;
}

std::string load_error(Library library) { return loaded(library).error; }

void* symbol(Library library, const char* symbol) {
  Loaded& l = loaded(library);
  if (l.handle == nullptr) ::rg::detail::throw_error(l.error);
  void* address = dlsym(l.handle, symbol);
  RG_CHECK(address != nullptr, "CUDA needs ", symbol, " from ", info(library).name,
           ", but the library that was loaded (", info(library).soname,
           " or $", info(library).env, ") does not have it: it is older than the headers "
           "ringgrad was built with");
  return address;
}

}  // namespace rg::cuda::dynload

// The stubs. Hidden, so that a program that links the real libraries as well keeps its own calls
// bound to them; each resolves its function once (a thread-safe static) and then forwards.
#define RG_DYNLOAD(library, ret, name, params, args)                                         \
  extern "C" __attribute__((visibility("hidden"))) ret name params {                        \
    using Fn = ret(*) params;                                                                \
    static const Fn fn = reinterpret_cast<Fn>(                                               \
        ::rg::cuda::dynload::symbol(::rg::cuda::dynload::Library::library, #name));         \
    return fn args;                                                                          \
  }
#include "kernels/cuda/dynload_symbols.h"
#undef RG_DYNLOAD
