# RG_COVERAGE: gcov line coverage of the engine and comm libraries (scripts/coverage.sh measures
# engine/cuda/ and ProcessGroupNCCL under the CUDA emulator). Off by default; GCC only.
option(RG_COVERAGE "Instrument the engine and comm libraries for gcov (--coverage -O0 -g)" OFF)
if(RG_COVERAGE)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    message(FATAL_ERROR "RG_COVERAGE needs GCC (gcov); the compiler is ${CMAKE_CXX_COMPILER_ID}")
  endif()
  # Every program that links an instrumented library needs libgcov.
  add_link_options($<$<LINK_LANGUAGE:CXX>:--coverage>)
endif()

# rg_instrument_for_coverage(<target>...): with RG_COVERAGE, compiles the C++ sources of each
# target unoptimized with gcov counters (atomic ones: streams, watchdogs and test threads run
# instrumented code concurrently). Only these targets: the emulated kernels stay optimized, so the
# emulated tests run at their usual speed.
function(rg_instrument_for_coverage)
  if(NOT RG_COVERAGE)
    return()
  endif()
  foreach(target IN LISTS ARGN)
    target_compile_options(${target} PRIVATE
      $<$<COMPILE_LANGUAGE:CXX>:--coverage -O0 -g -fprofile-update=atomic>)
  endforeach()
endfunction()
