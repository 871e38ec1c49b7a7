# ctest bench.micro_overhead: rg_micro_bench's per-op cost benchmarks (BENCH) exit 0 and print
# both rows in the form that bench/pytorch/compare.py's `overhead` reads (the name, then the time
# in ns). Their figures are not checked.
execute_process(COMMAND ${BENCH} --benchmark_filter=^overhead/
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "rg_micro_bench exited with ${rc}:\n${out}${err}")
endif()
foreach(row "add" "add\\+backward")
  if(NOT out MATCHES "overhead/${row}/1/[^ ]+ +[0-9.]+ ns")
    message(FATAL_ERROR "no overhead/${row}/1 row with a time in ns in:\n${out}")
  endif()
endforeach()
