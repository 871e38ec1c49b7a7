// Fuzz harness: flight recorder dumps (JSON, one per rank; NUL bytes separate them in the input)
// through parse_flight_dump and the analyser (ringgrad-bench flight).
#include "apps/flight_analyzer.h"
#include "fuzz/harness.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view all = rg::fuzz::as_text(data, size);
  std::vector<rg::apps::FlightDump> dumps;
  for (size_t begin = 0; begin <= all.size() && dumps.size() < 16;) {
    const size_t end = std::min(all.find('\0', begin), all.size());
    rg::fuzz::expect_clean(size, [&] {
      dumps.push_back(rg::apps::parse_flight_dump(std::string(all.substr(begin, end - begin)),
                                                  "rank" + std::to_string(dumps.size()) + ".json"));
    });
    begin = end + 1;
  }
  rg::fuzz::expect_clean(size, [&] { rg::apps::analyze_flight_dumps(dumps); });
  return 0;
}
