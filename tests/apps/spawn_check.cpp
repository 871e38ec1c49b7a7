// dist::spawn end to end (ctest dist.spawn.*): `spawn_check ok` runs 3 ranks that meet through the
// store rank 0 hosts and all-reduce their rank + 1 (each must return 6); `spawn_check fail` runs 2
// ranks of which rank 1 throws, and spawn must report that rank and its message. One spawn per
// run, as comm/spawn.h asks. Prints PASS or what went wrong; exit code 0 only on PASS.
#include <cstdio>
#include <string>

#include "comm/init.h"
#include "comm/spawn.h"
#include "engine/ops/factory.h"
#include "kernels/error.h"

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "ok") {
    const auto results = rg::dist::spawn(3, [](int rank) {
      auto pg = rg::dist::init_process_group();
      const rg::Tensor t = rg::full({4}, double(rank + 1));
      pg->all_reduce(t)->wait();
      const std::string out =
          std::to_string(int(t.to_vector<float>()[0])) + " from " + std::to_string(pg->rank());
      rg::dist::destroy_process_group();
      return out;
    });
    const bool ok = results == std::vector<std::string>{"6 from 0", "6 from 1", "6 from 2"};
    for (const auto& r : results) std::printf("result: %s\n", r.c_str());
    std::printf("%s\n", ok ? "PASS" : "FAIL: unexpected results");
    return ok ? 0 : 1;
  }
  if (mode == "fail") {
    try {
      rg::dist::spawn(2, [](int rank) -> std::string {
        if (rank == 1) throw rg::Error("boom at rank 1");
        return "fine";
      });
    } catch (const rg::Error& e) {
      const std::string m = e.what();
      const bool ok = m.find("spawn: rank 1 of 2 failed: boom at rank 1") != std::string::npos;
      std::printf("error: %s\n%s\n", m.c_str(), ok ? "PASS" : "FAIL: wrong message");
      return ok ? 0 : 1;
    }
    std::printf("FAIL: no error\n");
    return 1;
  }
  std::printf("usage: spawn_check ok|fail\n");
  return 2;
}
