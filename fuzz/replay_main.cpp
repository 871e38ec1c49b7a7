// The replay driver of the CI tests (fuzz.replay.*): runs a harness's LLVMFuzzerTestOneInput on
// every file of the directories (or files) given, each input at most --max-ms milliseconds, under
// AddressSanitizer and UBSan (built in), so a fixed crash stays fixed. libFuzzer is not needed.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "fuzz/harness.h"

namespace fs = std::filesystem;

int main(int argc, char** argv) {
  double max_ms = 1000;
  std::vector<fs::path> inputs;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--max-ms=", 0) == 0) {
      max_ms = std::stod(a.substr(9));
      continue;
    }
    std::error_code ec;
    if (fs::is_directory(a, ec)) {
      std::vector<fs::path> files;
      for (const auto& e : fs::recursive_directory_iterator(a))
        if (e.is_regular_file() && e.path().filename() != "README.md") files.push_back(e.path());
      std::sort(files.begin(), files.end());
      inputs.insert(inputs.end(), files.begin(), files.end());
    } else if (fs::exists(a, ec)) {
      inputs.emplace_back(a);
    }  // a missing directory (no regressions yet) is fine
  }
  int slow = 0;
  for (const fs::path& p : inputs) {
    std::ifstream in(p, std::ios::binary);
    const std::vector<char> bytes((std::istreambuf_iterator<char>(in)), {});
    std::fprintf(stderr, "replay %s (%zu bytes)\n", p.c_str(), bytes.size());
    const auto t0 = std::chrono::steady_clock::now();
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (ms > max_ms) {
      std::fprintf(stderr, "SLOW: %s took %.0f ms (limit %.0f)\n", p.c_str(), ms, max_ms);
      ++slow;
    }
  }
  std::printf("replayed %zu inputs, %d too slow\n", inputs.size(), slow);
  return slow == 0 && !inputs.empty() ? 0 : 1;
}
