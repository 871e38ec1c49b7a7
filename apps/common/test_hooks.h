// Test-only callbacks that ringgrad-train installs when their environment variables are set (the
// restart, resume and debug tests use them; users never need them):
//   RG_TEST_FAULT=<where>:<n>:<rank> kills rank <rank> (SIGKILL, as kill -9) on the first attempt
//     only (RG_RESTART_COUNT 0) when it reaches <where>: step (after optimizer step n), eval (the
//     evaluation after epoch n), snapshot (just before the snapshot of step n is written),
//     snapshot-write (half-way through writing it, before the rename), stop (SIGSTOP instead,
//     after step n); perturb kills nothing: it adds 1e-3 to the first element of the first
//     parameter after step n, so that rank drifts from the others (--check-consistency tests).
//   RG_TEST_SAMPLE_LOG=<dir> appends one line per batch, "<epoch> <step> <index>...", to
//     <dir>/rank<r>.txt (flushed, so a killed rank's log is whole).
#pragma once

#include <memory>

#include "train/trainer.h"

namespace rg::app {

// Adds the callbacks whose variables are set to `trainer` (nothing otherwise).
void add_test_hooks(train::Trainer& trainer);

}  // namespace rg::app
