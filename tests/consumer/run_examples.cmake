# Builds examples/ against an installed copy of the build tree, as a user's project would (its own
# CMake project, find_package(ringgrad), CUDA hidden), and runs every example with small settings:
#   mnist_cnn        a few dozen steps on MNIST_DIR when it exists (skipped otherwise), and its
#                    error for a missing data directory (exit 1, not an uncaught exception)
#   resnet18_cifar   2 steps on CIFAR-10 files written here (real binary format, random content;
#                    only two of the five training files, as the loader allows), then
#                    check_resnet18_in_pytorch.py when /usr/bin/python3 can import torch
#   ddp              with the installed ringgrad-run, 2 processes
#   custom_function  its gradient check
#   mingpt_char      20 steps of gpt-nano on a small text written here, then a sample (and 4
#                    steps with ringgrad-run, 2 processes), and its error for a missing file
#   trainer          rg::train::Trainer killed (kill -9) and restarted from its snapshot, 1 process
#                    and 2 ranks: the same final snapshot as the uninterrupted run
# Variables: BUILD_DIR, SOURCE_DIR (examples/), WORK_DIR, GENERATOR, MNIST_DIR.
file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR})
include(${CMAKE_CURRENT_LIST_DIR}/package_test.cmake)
set(prefix ${WORK_DIR}/prefix)
set(bin ${WORK_DIR}/build)
run(${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${prefix})
configure_without_cuda(${SOURCE_DIR} ${bin} ${prefix})
run(${CMAKE_COMMAND} --build ${bin} -j2)

# mnist_cnn
if(EXISTS ${MNIST_DIR}/train-images-idx3-ubyte OR EXISTS ${MNIST_DIR}/train-images-idx3-ubyte.gz)
  run(${bin}/mnist_cnn --data-dir ${MNIST_DIR} --steps 40 --batch-size 32 --test-samples 500)
else()
  message(STATUS "mnist_cnn: training skipped: no MNIST files in ${MNIST_DIR} "
                 "(scripts/get-data.sh mnist puts them there)")
endif()
execute_process(COMMAND ${bin}/mnist_cnn --data-dir ${WORK_DIR}/no-such-dir
  RESULT_VARIABLE rc ERROR_VARIABLE err OUTPUT_QUIET)
if(NOT rc EQUAL 1 OR NOT err MATCHES "no-such-dir: no such directory; run scripts/get-data.sh")
  message(FATAL_ERROR "mnist_cnn with a missing data directory: exit ${rc}, stderr: ${err}")
endif()

# resnet18_cifar on two CIFAR-10 training files of 12 records each: <label byte><3072 pixel
# bytes>. CMake strings hold no NUL byte, so the labels are 1..9 and the pixels random printable
# characters: the format is what matters here, not the content.
set(cifar ${WORK_DIR}/cifar10)
file(MAKE_DIRECTORY ${cifar})
foreach(file data_batch_1.bin data_batch_2.bin)
  set(records "")
  foreach(i RANGE 1 12)
    math(EXPR label "${i} % 9 + 1")
    string(ASCII ${label} label_byte)
    string(RANDOM LENGTH 3072 ALPHABET
      "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789!#$%&()*+,-./:<=>?@^_{|}~"
      pixels)
    string(APPEND records "${label_byte}${pixels}")
  endforeach()
  file(WRITE ${cifar}/${file} "${records}")
  file(SIZE ${cifar}/${file} size)
  if(NOT size EQUAL 36876)  # 12 * 3073
    message(FATAL_ERROR "${cifar}/${file}: wrote ${size} bytes, expected 12 records of 3073")
  endif()
endforeach()
run(${bin}/resnet18_cifar --data-dir ${cifar} --steps 2 --batch-size 8 --out-dir ${WORK_DIR}/resnet18)
execute_process(COMMAND /usr/bin/python3 -c "import torch"
  RESULT_VARIABLE rc OUTPUT_QUIET ERROR_VARIABLE err)
if(rc EQUAL 0)
  run(/usr/bin/python3 ${SOURCE_DIR}/check_resnet18_in_pytorch.py ${WORK_DIR}/resnet18)
else()
  string(STRIP "${err}" err)
  string(REGEX REPLACE ".*\n" "" err "${err}")  # the last line: the exception
  message(STATUS "check_resnet18_in_pytorch.py skipped: /usr/bin/python3 cannot import torch "
                 "(${err}); apt-get install python3-torch to run it")
endif()

# ddp: two ranks started by the installed launcher; each exits 1 unless the parameters agree.
run(${prefix}/bin/ringgrad-run --nproc-per-node 2 --master-port 0 ${bin}/ddp --steps 10)

# custom_function
run(${bin}/custom_function)

# mingpt_char: gpt-nano for 20 steps on a small text (its characters include the prompt's), then a
# sample; one thread per process, as a busy 2-core machine needs. Under ringgrad-run, 2 ranks.
string(REPEAT "In the beginning God created the heaven and the earth.\n\
And God said, Let there be light: and there was light.\n" 40 text)
file(WRITE ${WORK_DIR}/text.txt "${text}")
set(gpt_flags --data-file ${WORK_DIR}/text.txt --block-size 32 --batch-size 16 --eval-every 10
  --sample-tokens 40 --prompt "And God said")
# check_mingpt(OUT_DIR): the last run printed a validation loss and a sample (under ringgrad-run
# with its "[rank 0] " prefix) and saved the weights into OUT_DIR.
function(check_mingpt out_dir)
  if(NOT run_output MATCHES "validation loss [0-9.]+\n"
     OR NOT run_output MATCHES "--- sample ---\n(\\[rank 0\\] )?And God said[^\n]"
     OR NOT EXISTS ${out_dir}/gpt.safetensors)
    message(FATAL_ERROR "mingpt_char: no validation loss, sample or ${out_dir}/gpt.safetensors:\n"
                        "${run_output}")
  endif()
endfunction()
run(${CMAKE_COMMAND} -E env RG_NUM_THREADS=1
  ${bin}/mingpt_char ${gpt_flags} --steps 20 --out ${WORK_DIR}/mingpt)
check_mingpt(${WORK_DIR}/mingpt)
run(${prefix}/bin/ringgrad-run --nproc-per-node 2 --master-port 0
  ${bin}/mingpt_char ${gpt_flags} --steps 4 --out ${WORK_DIR}/mingpt-ddp)
check_mingpt(${WORK_DIR}/mingpt-ddp)
execute_process(COMMAND ${bin}/mingpt_char --data-file ${WORK_DIR}/no-such-file.txt
  RESULT_VARIABLE rc ERROR_VARIABLE err OUTPUT_QUIET)
if(NOT rc EQUAL 1 OR NOT err MATCHES "no-such-file.txt: no such file; run scripts/get-data.sh kjv")
  message(FATAL_ERROR "mingpt_char with a missing text file: exit ${rc}, stderr: ${err}")
endif()

# trainer: rg::train::Trainer with snapshots. Uninterrupted, and killed (SIGKILL after step 25, the
# snapshot of step 20 on disk) then started again with the same command: the same final snapshot,
# byte for byte. With 1 process, and with 2 ranks under ringgrad-run.
function(check_trainer_restart name)
  set(launch ${ARGN})
  run(${launch} ${bin}/trainer --snapshot ${WORK_DIR}/${name}-whole.safetensors)
  execute_process(COMMAND ${launch} ${bin}/trainer --snapshot ${WORK_DIR}/${name}-killed.safetensors
    --kill-after-step 25 WORKING_DIRECTORY ${WORK_DIR} RESULT_VARIABLE rc OUTPUT_QUIET ERROR_QUIET)
  if(rc EQUAL 0)
    message(FATAL_ERROR "trainer (${name}) with --kill-after-step 25 exited 0")
  endif()
  run(${launch} ${bin}/trainer --snapshot ${WORK_DIR}/${name}-killed.safetensors)
  if(NOT run_output MATCHES "resumed from [^\n]* of its steps \\(step 20\\)")
    message(FATAL_ERROR "trainer (${name}): the restart did not resume mid-epoch:\n${run_output}")
  endif()
  file(SHA256 ${WORK_DIR}/${name}-whole.safetensors whole)
  file(SHA256 ${WORK_DIR}/${name}-killed.safetensors killed)
  if(NOT whole STREQUAL killed)
    message(FATAL_ERROR "trainer (${name}): the restarted run's snapshot differs from the "
                        "uninterrupted run's")
  endif()
endfunction()
check_trainer_restart(one)
check_trainer_restart(ddp ${prefix}/bin/ringgrad-run --nproc-per-node 2 --master-port 0)
