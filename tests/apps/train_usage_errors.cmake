# ringgrad-train's usage errors for the flags of --loss, gradient clipping, early stopping,
# --check-consistency, --join, --cuda-graphs and --channels-last: each bad value or combination must exit with 2 and say what is
# wrong on stderr, before any training.
# Run by ctest (app.train_usage_errors) with -DTRAIN=<ringgrad-train>. A case is
# "ARG,ARG,...|expected fragment of stderr".
set(cases
  "--clip-grad-norm,-1|--clip-grad-norm must be >= 0"
  "--clip-grad-norm,nan|--clip-grad-norm must be >= 0 (0: off)"
  "--clip-grad-value,-0.5|--clip-grad-value must be >= 0"
  "--clip-grad-value,nan|--clip-grad-value must be >= 0"
  "--clip-grad-norm,1,--clip-grad-value,1|cannot be combined"
  "--loss,hinge|--loss: hinge not in"
  "--loss,mse,--label-smoothing,0.1|--label-smoothing applies to --loss cross-entropy only"
  "--loss,smooth-l1,--label-smoothing,0.1|--label-smoothing applies to --loss cross-entropy only"
  "--early-stop-patience,-1|--early-stop-patience must be >= 0"
  "--early-stop-patience,x|--early-stop-patience"
  "--early-stop-patience,2,--eval-every,0|--eval-every must be 1"
  "--early-stop-metric,top5|--early-stop-metric: top5 not in"
  "--check-consistency,-1|--check-consistency must be >= 0 (0: off), got -1"
  "--join,--sync-bn|--join cannot be combined with --sync-bn"
  "--join,--check-consistency,5|--join cannot be combined with --check-consistency"
  "--join,--snapshot-every,10|--join cannot be combined with --snapshot-every"
  "--join,--comm-hook,powersgd|--join cannot be combined with --comm-hook powersgd"
  "--tf32,fast|--tf32: fast not in"
  "--cuda-graphs|--cuda-graphs needs --device cuda (got cpu)"
  "--cuda-graphs,--device,cuda,--grad-accum-steps,2|--cuda-graphs cannot be combined with --grad"
  "--cuda-graphs,--device,cuda,--amp,f16,--optimizer,adam,--adam-beta2,0.99999|--cuda-graphs with --amp f16 and --optimizer adam needs betas whose bias corrections reach 1 within 2^20 steps (--adam-beta1 0.9 --adam-beta2 0.99999 do not"
  "--cuda-graphs,--device,cuda,--mode,dp|--cuda-graphs cannot be combined with --mode dp"
  "--cuda-graphs,--device,cuda,--join|--cuda-graphs cannot be combined with --join"
  "--cuda-graphs,--device,cuda,--sync-bn|--cuda-graphs cannot be combined with --sync-bn"
  "--cuda-graphs,--device,cuda,--uneven-data|--cuda-graphs cannot be combined with --uneven-data"
  "--cuda-graphs,--device,cuda,--comm-hook,powersgd|--cuda-graphs cannot be combined with --comm-hook powersgd"
  "--cuda-graphs,--device,cuda,--allreduce,ring|--cuda-graphs cannot be combined with --allreduce ring"
  "--cuda-graphs,--device,cuda,--find-unused-parameters|--find-unused-parameters needs --static-graph"
  "--channels-last,--sync-bn|--channels-last cannot be combined with --sync-bn")
foreach(case IN LISTS cases)
  string(REPLACE "|" ";" parts "${case}")
  list(POP_BACK parts fragment)
  string(REPLACE "," ";" args "${parts}")
  execute_process(COMMAND ${TRAIN} --dataset synthetic --model mlp ${args}
    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 60)
  string(FIND "${err}" "${fragment}" at)
  string(REPLACE ";" " " shown "${args}")
  if(NOT rc EQUAL 2 OR at EQUAL -1)
    message(FATAL_ERROR "ringgrad-train ${shown}: exit ${rc}, expected 2 with '${fragment}'; "
      "stderr: ${err}")
  endif()
  message(STATUS "ringgrad-train ${shown}: exit 2, '${fragment}'")
endforeach()
