# The installed package that find_package(ringgrad) finds: one shared library, libringgrad.so,
# holding every layer (the static libraries the programs and tests link, whole), and the public
# headers under one prefix, <ringgrad/...>, with <ringgrad/ringgrad.h> including them all.
#
# Nothing of the build machine leaks into it: cuBLAS, cuDNN and NCCL are loaded at run time
# (kernels/cuda/dynload.h) and the CUDA runtime is linked in statically, so the package needs
# neither the CUDA toolkit at find_package time nor a CUDA library at run time until a CUDA device
# is asked for; Gloo, OpenBLAS, OpenMP and zlib are ordinary shared-library dependencies of
# libringgrad.so, invisible to the consumer's CMake. Internal headers (kernels/, engine/cuda/ and
# the few listed below) are not installed; a public header that includes one fails the build.

# Public: every header of engine/ (and its autograd/, ops/), layers/, data/, comm/ and train/, except these
# internals, plus the three kernels/ headers that public ones need (rg::Error, rg::Half/BFloat16,
# CUDA device queries).
file(GLOB RG_PUBLIC_HEADERS CONFIGURE_DEPENDS RELATIVE ${PROJECT_SOURCE_DIR}
  engine/*.h engine/autograd/*.h engine/ops/*.h layers/*.h layers/*/*.h data/*.h comm/*.h train/*.h)
list(REMOVE_ITEM RG_PUBLIC_HEADERS
  engine/dispatch.h        # dtype dispatch for op implementations
  engine/ops/check.h       # boundary checks shared by op implementations
  engine/ops/autocast_policy.h  # how op implementations apply autocast
  comm/socket.h            # TCP helpers of the store and process groups
  comm/progress_board.h)   # the process groups' per-rank progress, published through the store
list(APPEND RG_PUBLIC_HEADERS kernels/error.h kernels/half.h kernels/cuda/device.h)
list(SORT RG_PUBLIC_HEADERS)

# Generated tree: build/include/ringgrad/<header> with its project includes spelled
# "ringgrad/<header>", the umbrella ringgrad/ringgrad.h and ringgrad/version.h. The installed
# headers are this tree; the source keeps its short includes.
set(RG_PUBLIC_INCLUDE_DIR ${PROJECT_BINARY_DIR}/include)
set(RG_PUBLIC_HEADER_OUTPUTS)
foreach(h IN LISTS RG_PUBLIC_HEADERS)
  list(APPEND RG_PUBLIC_HEADER_OUTPUTS ${RG_PUBLIC_INCLUDE_DIR}/ringgrad/${h})
endforeach()
list(APPEND RG_PUBLIC_HEADER_OUTPUTS ${RG_PUBLIC_INCLUDE_DIR}/ringgrad/ringgrad.h)
list(TRANSFORM RG_PUBLIC_HEADERS PREPEND ${PROJECT_SOURCE_DIR}/ OUTPUT_VARIABLE RG_PUBLIC_HEADER_SOURCES)
add_custom_command(
  OUTPUT ${RG_PUBLIC_HEADER_OUTPUTS}
  COMMAND ${CMAKE_COMMAND} -DSOURCE_DIR=${PROJECT_SOURCE_DIR} -DOUT_DIR=${RG_PUBLIC_INCLUDE_DIR}
    "-DHEADERS=${RG_PUBLIC_HEADERS}" -P ${PROJECT_SOURCE_DIR}/cmake/PublicHeaders.cmake
  DEPENDS ${RG_PUBLIC_HEADER_SOURCES} ${PROJECT_SOURCE_DIR}/cmake/PublicHeaders.cmake
  COMMENT "Generating the public headers under ${RG_PUBLIC_INCLUDE_DIR}/ringgrad"
  VERBATIM)
add_custom_target(rg_public_headers ALL DEPENDS ${RG_PUBLIC_HEADER_OUTPUTS})
configure_file(cmake/version.h.in ${RG_PUBLIC_INCLUDE_DIR}/ringgrad/version.h @ONLY)

# libringgrad.so. Its one source is the version query; everything else comes whole from the
# static libraries. The CUDA runtime's symbols stay inside (--exclude-libs), so a consumer's own
# CUDA code keeps its own runtime.
set(RG_PACKAGE_ARCHIVES rg_train rg_comm rg_layers rg_data rg_engine rg_kernels_cpu)
if(RG_HAS_CUDA)
  list(APPEND RG_PACKAGE_ARCHIVES rg_kernels_cuda)
else()
  list(APPEND RG_PACKAGE_ARCHIVES rg_kernels_cuda_emu rg_kernels_emu)
endif()
add_library(ringgrad SHARED cmake/libringgrad.cpp)
add_library(ringgrad::ringgrad ALIAS ringgrad)
add_dependencies(ringgrad rg_public_headers)
target_include_directories(ringgrad PUBLIC
  $<BUILD_INTERFACE:${RG_PUBLIC_INCLUDE_DIR}>
  $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
target_compile_features(ringgrad PUBLIC cxx_std_20)
# (Not $<LINK_LIBRARY:WHOLE_ARCHIVE,...>: CMake 3.25 refuses it when the archives also occur as
# each other's dependencies, as they do.)
target_link_libraries(ringgrad
  PRIVATE -Wl,--whole-archive ${RG_PACKAGE_ARCHIVES} -Wl,--no-whole-archive rg_warnings
  PUBLIC Threads::Threads)
target_link_options(ringgrad PRIVATE -Wl,--exclude-libs,libcudart_static.a -Wl,--no-undefined)
set_target_properties(ringgrad PROPERTIES
  VERSION ${PROJECT_VERSION} SOVERSION ${PROJECT_VERSION_MAJOR}.${PROJECT_VERSION_MINOR})
install(TARGETS ringgrad EXPORT ringgradTargets)
install(DIRECTORY ${RG_PUBLIC_INCLUDE_DIR}/ringgrad DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})

include(CMakePackageConfigHelpers)
install(EXPORT ringgradTargets NAMESPACE ringgrad:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/ringgrad)
configure_package_config_file(cmake/ringgradConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/ringgradConfig.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/ringgrad)
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/ringgradConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/ringgradConfig.cmake
  ${CMAKE_CURRENT_BINARY_DIR}/ringgradConfigVersion.cmake
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/ringgrad)
