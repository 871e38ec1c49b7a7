# Installs the build tree into WORK_DIR/prefix, checks what was installed (no internal header, no
# CUDA library linked), then configures the consumer with the CUDA toolkit hidden (a machine without
# CUDA, as far as CMake can tell), builds it and runs the consumer, the README's examples
# (train_example, api_example) and cuda_check (also with cuDNN made unloadable).
file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR})
include(${CMAKE_CURRENT_LIST_DIR}/package_test.cmake)
run(${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${WORK_DIR}/prefix)
set(prefix ${WORK_DIR}/prefix)

# Only the public tree: include/ringgrad/..., nothing at include/engine etc., no kernels/ header but
# the three public ones, and no include left in its source spelling.
file(GLOB top RELATIVE ${prefix}/include ${prefix}/include/*)
if(NOT top STREQUAL "ringgrad")
  message(FATAL_ERROR "the package installs include/{${top}}; expected include/ringgrad only")
endif()
file(GLOB_RECURSE kernel_headers RELATIVE ${prefix}/include/ringgrad ${prefix}/include/ringgrad/kernels/*)
list(SORT kernel_headers)
if(NOT kernel_headers STREQUAL "kernels/cuda/device.h;kernels/error.h;kernels/half.h")
  message(FATAL_ERROR "internal kernels/ headers are installed: ${kernel_headers}")
endif()
file(GLOB_RECURSE headers ${prefix}/include/ringgrad/*.h)
foreach(h IN LISTS headers)
  file(STRINGS ${h} bad REGEX "#include [\"<](engine|kernels|layers|comm|data)/")
  if(bad)
    message(FATAL_ERROR "${h} includes a header outside <ringgrad/...>: ${bad}")
  endif()
endforeach()
if(EXISTS ${prefix}/include/ringgrad/engine/cuda/runtime.h OR EXISTS ${prefix}/include/ringgrad/engine/dispatch.h)
  message(FATAL_ERROR "internal engine headers are installed")
endif()

# libringgrad.so links no CUDA library: they are loaded at run time, when a CUDA device is used.
file(GLOB libs ${prefix}/lib/libringgrad.so ${prefix}/lib/*/libringgrad.so)
list(GET libs 0 lib)
run(readelf -d ${lib})
string(REGEX MATCHALL "NEEDED[^\n]*" needed "${run_output}")
if(needed MATCHES "libcud|libcublas|libnccl|libcuda")
  message(FATAL_ERROR "${lib} links CUDA libraries: ${needed}")
endif()

# The consumer, configured as on a machine without CUDA.
configure_without_cuda(${SOURCE_DIR} ${WORK_DIR}/build ${prefix})
run(${CMAKE_COMMAND} --build ${WORK_DIR}/build)
run(${WORK_DIR}/build/consumer)
# The README's examples write their files into WORK_DIR (run's working directory).
run(${WORK_DIR}/build/train_example)
run(${WORK_DIR}/build/api_example)
run(${WORK_DIR}/build/cuda_check)
run(${CMAKE_COMMAND} -E env RG_CUDNN_LIBRARY=${WORK_DIR}/no-such-dir/libcudnn.so.9
    ${WORK_DIR}/build/cuda_check missing)
