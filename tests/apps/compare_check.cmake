# ringgrad-bench compare end to end on emulated devices (MLP, synthetic data, a few steps): the
# three modes run, the table and CSV have one row each with the right devices, and DataParallel's
# top-1 equals the single device's (an MLP has no dropout or batch norm, so DP computes the same
# model on the same batches). Run by ctest: cmake -DBENCH=... -DWORK=... -P compare_check.cmake
file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK})
execute_process(
  COMMAND ${BENCH} compare --model mlp --dataset synthetic --epochs 1 --max-steps 6
    --global-batch 32 --devices 2 --device emulated --workers 0 --work-dir ${WORK}/runs
    --csv ${WORK}/table.csv
  RESULT_VARIABLE code OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT code EQUAL 0)
  message(FATAL_ERROR "compare failed (${code}):\n${out}\n${err}")
endif()
message(STATUS "${out}")
file(STRINGS ${WORK}/table.csv rows)
list(LENGTH rows n)
if(NOT n EQUAL 4)
  message(FATAL_ERROR "expected a header and 3 rows, got ${n}:\n${rows}")
endif()
list(GET rows 1 single)
list(GET rows 2 dp)
list(GET rows 3 ddp)
string(REPLACE "," ";" single "${single}")
string(REPLACE "," ";" dp "${dp}")
string(REPLACE "," ";" ddp "${ddp}")
list(GET single 0 m0)
list(GET dp 0 m1)
list(GET ddp 0 m2)
list(GET dp 2 dp_devices)
list(GET ddp 2 ddp_devices)
list(GET ddp 1 ddp_where)
if(NOT "${m0};${m1};${m2}" STREQUAL "single;dp;ddp" OR NOT dp_devices EQUAL 2
   OR NOT ddp_devices EQUAL 2 OR NOT ddp_where STREQUAL "emulated devices")
  message(FATAL_ERROR "unexpected rows:\n${rows}")
endif()
list(GET single 4 single_top1)
list(GET dp 4 dp_top1)
if(NOT single_top1 STREQUAL dp_top1)
  message(FATAL_ERROR "DataParallel's top-1 ${dp_top1} differs from one device's ${single_top1}")
endif()
