# Shared by the install tests (run_consumer.cmake, run_examples.cmake): run a command, and configure
# a downstream project against an installed prefix as on a machine without CUDA.

# run(COMMAND...): runs it in WORK_DIR; a non-zero exit fails the test with its output. The output
# is printed and left in run_output.
function(run)
  execute_process(COMMAND ${ARGV} WORKING_DIRECTORY ${WORK_DIR}
    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "command failed (${rc}): ${ARGV}\n${out}\n${err}")
  endif()
  message(STATUS "${out}")
  set(run_output "${out}" PARENT_SCOPE)
endfunction()

# configure_without_cuda(SOURCE BUILD PREFIX): configures SOURCE into BUILD with PREFIX on
# CMAKE_PREFIX_PATH, with no nvcc on PATH, the toolkit's prefix ignored and find_package(CUDAToolkit)
# disabled (the old package config required it).
function(configure_without_cuda source build prefix)
  string(REGEX REPLACE "[^:]*cuda[^:]*:?" "" path_without_cuda "$ENV{PATH}")
  run(${CMAKE_COMMAND} -E env PATH=${path_without_cuda} --unset=CUDACXX --unset=CUDA_PATH
      --unset=CUDAToolkit_ROOT
      ${CMAKE_COMMAND} -S ${source} -B ${build} -G ${GENERATOR}
      -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_BUILD_TYPE=Release
      -DCMAKE_DISABLE_FIND_PACKAGE_CUDAToolkit=ON -DCMAKE_DISABLE_FIND_PACKAGE_CUDA=ON
      "-DCMAKE_IGNORE_PREFIX_PATH=/usr/local/cuda;/usr/local/cuda-13.0")
endfunction()
