// Fuzz harness: ringgrad-train's command line (parse_train_args); the input's lines are the
// arguments after the program's name.
#include "apps/train_args.h"

#include <sstream>

#include "fuzz/harness.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text = rg::fuzz::as_text(data, size);
  std::vector<std::string> args{"ringgrad-train"};
  for (size_t begin = 0; begin < text.size() && args.size() < 256;) {
    const size_t end = std::min(text.find('\n', begin), text.size());
    args.emplace_back(text.substr(begin, end - begin));
    begin = end + 1;
  }
  std::vector<const char*> argv;
  for (const std::string& a : args) argv.push_back(a.c_str());
  argv.push_back(nullptr);
  rg::fuzz::expect_clean(size, [&] {
    rg::app::TrainConfig c;
    int threads = 0;
    std::ostringstream out, err;
    const int code = rg::app::parse_train_args(int(args.size()), argv.data(), c, threads, out, err);
    rg::fuzz::require(code == -1 || code == 0 || code == 2, "an exit code other than 0 or 2");
  });
  return 0;
}
