// ringgrad-train: trains a model on a dataset from the command line (flags named like the
// PyTorch examples). Exit codes: 0 success, 2 usage error, 1 runtime error (one-line message).
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <string>

#include "apps/common/trainer.h"
#include "apps/train_args.h"
#include "comm/init.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/runtime_env.h"
#include "kernels/error.h"

int main(int argc, char** argv) {
  rg::kernels::cpu::ensure_runtime_env(argc, argv);
  rg::app::TrainConfig c;
  int threads = 0;
  if (const int code = rg::app::parse_train_args(argc, argv, c, threads, std::cout, std::cerr);
      code >= 0)
    return code;
  c.progress_bar = isatty(STDOUT_FILENO) != 0;
  try {
    if (threads > 0) rg::kernels::cpu::set_num_threads(threads);
    rg::app::train(c, std::cout);
    // Rank 0 may host the store (no launcher): it leaves last, after every rank said goodbye.
    if (rg::dist::is_initialized()) rg::dist::destroy_process_group();
  } catch (const rg::InternalError& e) {  // a bug in ringgrad: EX_SOFTWARE
    std::cout.flush();
    std::cerr << "ringgrad-train: " << e.what() << "\n";
    return 70;
  } catch (const rg::Error& e) {
    std::cout.flush();
    std::cerr << "ringgrad-train: error: " << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cout.flush();
    std::cerr << "ringgrad-train: internal error: " << e.what() << "\n";
    return 70;
  }
  return 0;
}
