# RG_COVERAGE: gcov line coverage of the engine, comm and the emulated kernels (scripts/coverage.sh
# measures engine/cuda/ and ProcessGroupNCCL under the CUDA emulator). Off by default; GCC only.
option(RG_COVERAGE "Instrument the engine, comm and emulated launchers for gcov (-O0)" OFF)
if(RG_COVERAGE)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    message(FATAL_ERROR "RG_COVERAGE needs GCC (gcov); the compiler is ${CMAKE_CXX_COMPILER_ID}")
  endif()
  # Every program that links an instrumented library needs libgcov.
  add_link_options($<$<LINK_LANGUAGE:CXX>:--coverage>)
endif()

# rg_instrument_for_coverage(<target>... [KERNELS <target>...]): with RG_COVERAGE, compiles the
# C++ sources of each target unoptimized (-O0: line counts of optimized code are unreliable) with
# atomic gcov counters (streams, watchdogs and test threads run instrumented code concurrently).
# KERNELS targets, the emulated kernels and their launchers, get -Og -fno-inline and plain
# counters: at -O0 with atomic counters in every emulated thread's loop, the 64 MiB collectives of
# the emulated NCCL tests outlast their timeouts (a lost increment cannot turn a count to 0), and
# inlined code counts 0 (cuDNN descriptors' destructors did). Other targets are not instrumented.
function(rg_instrument_for_coverage)
  if(NOT RG_COVERAGE)
    return()
  endif()
  cmake_parse_arguments(PARSE_ARGV 0 ARG "" "" "KERNELS")
  foreach(target IN LISTS ARG_UNPARSED_ARGUMENTS)
    target_compile_options(${target} PRIVATE
      $<$<COMPILE_LANGUAGE:CXX>:--coverage -O0 -g -fprofile-update=atomic>)
  endforeach()
  foreach(target IN LISTS ARG_KERNELS)
    target_compile_options(${target} PRIVATE
      $<$<COMPILE_LANGUAGE:CXX>:--coverage -Og -fno-inline -g>)
  endforeach()
endfunction()
