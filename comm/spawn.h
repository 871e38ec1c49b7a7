// dist::spawn: runs a function as the ranks of one job in fresh processes, like
// torch.multiprocessing.spawn with its "spawn" start method. The program is executed again (the
// same file, under its own name, with the same arguments) once per rank, with RANK, WORLD_SIZE,
// LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR=127.0.0.1 and a free MASTER_PORT set (rank 0 then
// hosts the store, comm/init.h); when a child reaches the same spawn() call it runs fn(rank) there
// and exits with its result, never returning. So, as with Python's `if __name__ == "__main__"`,
// everything before the call runs again in every child and must lead there: call spawn early in
// main(), once per run of the program (a child runs the first spawn() call it reaches).
//
//   int main() {
//     auto results = rg::dist::spawn(2, [](int rank) {
//       rg::dist::init_process_group();  // reads the variables spawn set
//       ... train ...
//       return std::to_string(loss);      // what the parent gets back for this rank
//     });
//   }
//
// The parent waits for every rank and returns their results in rank order. The first rank to
// fail (an exception, a non-zero exit, a signal) makes spawn stop the others (SIGTERM, then
// SIGKILL) and throw rg::Error naming that rank and its message, as mp.spawn raises
// ProcessRaisedException.
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace rg::dist {

struct SpawnOptions {
  double timeout_s = 0;  // > 0: every rank killed after this long (an error naming the wait)
};

std::vector<std::string> spawn(int nprocs, const std::function<std::string(int rank)>& fn,
                               SpawnOptions options = {});

// True in a process that spawn() started (it will run fn when it reaches the call).
bool is_spawned_child();

}  // namespace rg::dist
