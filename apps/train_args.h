// ringgrad-train's command line (apps/ringgrad_train.cpp): the flags parsed into a TrainConfig.
#pragma once

#include <ostream>

#include "apps/common/trainer.h"

namespace rg::app {

// Parses argv (argv[0] is the program) into `c` and `threads` (--threads; 0 when absent) and
// checks the flags' combinations (config_error). Returns -1 to go on and train, else the exit
// code, having written the help (0, to `out`) or the usage error (2, to `err`).
int parse_train_args(int argc, const char* const* argv, TrainConfig& c, int& threads,
                     std::ostream& out, std::ostream& err);

}  // namespace rg::app
