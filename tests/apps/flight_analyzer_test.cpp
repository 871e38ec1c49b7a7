// Tests of ringgrad-bench flight (apps/flight_analyzer.h) on hand-written dumps: a divergence, a
// rank that never arrived, a stuck rank, rings whose windows differ, a job where all went well, a
// missing rank and bad files.
#include "apps/flight_analyzer.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kernels/error.h"

namespace rg::apps {
namespace {

using nlohmann::json;

constexpr double kT0 = 1764100000.0;  // 2025-11-25 19:46:40 UTC

// One entry of a dump as the recorder writes it; times are seconds after kT0 (negative: null).
json entry(uint64_t seq, const std::string& state, double enq, double start = -1, double end = -1,
           const std::string& op = "all_reduce", int64_t n = 1000) {
  json e = {{"id", seq},
            {"group", "default"},
            {"seq", seq},
            {"op", op},
            {"reduce_op", op == "all_reduce" ? "sum" : ""},
            {"root", op == "broadcast" ? 0 : -1},
            {"tag", 0},
            {"dtype", "f32"},
            {"shapes", json::array({json::array({n})})},
            {"device", "cpu"},
            {"state", state},
            {"enqueued_at", kT0 + enq},
            {"started_at", start < 0 ? json(nullptr) : json(kT0 + start)},
            {"ended_at", end < 0 ? json(nullptr) : json(kT0 + end)}};
  if (state == "failed") e["error"] = "connection closed by rank 1";
  return e;
}

// Calls #from..#to, each completed one second after the previous.
std::vector<json> completed(uint64_t from, uint64_t to) {
  std::vector<json> out;
  for (uint64_t s = from; s <= to; ++s)
    out.push_back(entry(s, "completed", double(s), double(s) + 0.1, double(s) + 0.2));
  return out;
}

FlightDump make_dump(int rank, int world, std::vector<json> entries, double dumped_after = 60,
                     uint64_t capacity = 2048) {
  const uint64_t recorded = entries.empty() ? 0 : entries.back()["id"].get<uint64_t>();
  const json d = {{"version", 1},
                  {"rank", rank},
                  {"world_size", world},
                  {"pid", 100 + rank},
                  {"host", "node0"},
                  {"reason", "signal"},
                  {"dumped_at", kT0 + dumped_after},
                  {"capacity", capacity},
                  {"recorded", recorded},
                  {"entries", entries}};
  return parse_flight_dump(d.dump(), "rank" + std::to_string(rank) + ".json");
}

std::vector<json> plus(std::vector<json> a, const json& b) {
  a.push_back(b);
  return a;
}

bool has(const std::string& report, const std::string& sentence) {
  return report.find(sentence) != std::string::npos;
}

TEST(FlightAnalyzer, AllGood) {
  const std::string r =
      analyze_flight_dumps({make_dump(0, 2, completed(1, 13)), make_dump(1, 2, completed(1, 13))});
  EXPECT_TRUE(has(r, "no divergence: all 2 ranks completed every call up to #13")) << r;
  EXPECT_TRUE(has(r, "times +N s count from 19:46:41.000 UTC")) << r;
  EXPECT_FALSE(has(r, "stuck")) << r;
  EXPECT_FALSE(has(r, "never reached")) << r;
}

// Sends and receives are numbered per peer: rank 0's send #1 and rank 1's recv #1 are not a
// disagreement, and an unfinished receive is reported as waiting.
TEST(FlightAnalyzer, PointToPointCallsAreNotComparedAcrossRanks) {
  auto p2p = [](const std::string& op, int peer, const std::string& state) {
    json e = entry(1, state, 14, 14.1, state == "completed" ? 14.2 : -1, op, 10);
    e["id"] = 14;
    e["root"] = peer;
    e["reduce_op"] = "";
    return e;
  };
  const std::string r =
      analyze_flight_dumps({make_dump(0, 2, plus(completed(1, 13), p2p("send", 1, "completed"))),
                            make_dump(1, 2, plus(completed(1, 13), p2p("recv", 0, "started")))});
  EXPECT_TRUE(has(r, "no divergence: all 2 ranks completed every call up to #13")) << r;
  EXPECT_TRUE(has(r, "rank 1 waits in recv #1 (f32[10] from 0, tag 0) (point-to-point)")) << r;
  EXPECT_FALSE(has(r, "disagree")) << r;
}

TEST(FlightAnalyzer, DivergenceNamesTheFirstSequenceNumberAndGroupsTheRanks) {
  auto calls = completed(1, 11);
  const auto r = analyze_flight_dumps(
      {make_dump(0, 3, plus(calls, entry(12, "started", 12, 12.1))),
       make_dump(1, 3, plus(calls, entry(12, "started", 12, 12.1, -1, "broadcast", 10))),
       make_dump(2, 3,
                 plus(plus(calls, entry(12, "started", 12, 12.1)),
                      entry(13, "enqueued", 13, -1, -1, "broadcast", 10)))});
  EXPECT_TRUE(has(r,
                  "ranks disagree at #12: ranks 0, 2 called all_reduce #12 (f32[1000], sum), "
                  "rank 1 called broadcast #12 (f32[10], root 0)"))
      << r;
  // Only the first divergence: #13 (rank 2 alone) is not a disagreement.
  EXPECT_FALSE(has(r, "disagree at #13")) << r;
}

TEST(FlightAnalyzer, RankThatNeverArrived) {
  const auto r = analyze_flight_dumps(
      {make_dump(0, 2, plus(completed(1, 12), entry(13, "started", 13, 13.5)), 54.7),
       make_dump(1, 2, completed(1, 12))});
  EXPECT_TRUE(has(r,
                  "rank 1 never reached #13 (its last call was all_reduce #12 (f32[1000], "
                  "sum), completed at +11.2 s)"))
      << r;
  EXPECT_TRUE(has(r,
                  "rank 0 is stuck in all_reduce #13 (f32[1000], sum) since 41.7 s before its "
                  "dump (enqueued at 19:46:53.000 UTC, started at 19:46:53.500 UTC)"))
      << r;
  EXPECT_FALSE(has(r, "no divergence")) << r;
}

TEST(FlightAnalyzer, StuckRankCountsTheCallsQueuedBehind) {
  auto r0 = completed(1, 4);
  r0.push_back(entry(5, "enqueued", 5));
  r0.push_back(entry(6, "enqueued", 6));
  r0.push_back(entry(7, "enqueued", 7));
  const auto r = analyze_flight_dumps({make_dump(0, 1, r0, 10)});
  EXPECT_TRUE(has(r,
                  "rank 0 is stuck in all_reduce #5 (f32[1000], sum) since 5.0 s before its dump "
                  "(enqueued at 19:46:45.000 UTC); 2 later calls wait behind it"))
      << r;
}

TEST(FlightAnalyzer, FailedCallsWithTheirError) {
  const auto r =
      analyze_flight_dumps({make_dump(0, 2,
                                      plus(plus(completed(1, 2), entry(3, "failed", 3, 3.1, 4)),
                                           entry(4, "failed", 4, -1, 4.5))),
                            make_dump(1, 2, completed(1, 4))});
  EXPECT_TRUE(has(r,
                  "rank 0's all_reduce #3 (f32[1000], sum) failed at +3.0 s: connection closed "
                  "by rank 1 (1 later call failed too)"))
      << r;
}

TEST(FlightAnalyzer, DroppedCallsLimitTheWindow) {
  // Rank 0's ring holds the last 4 calls, rank 1's the last 8: only #17..#20 can be compared.
  const auto r = analyze_flight_dumps(
      {make_dump(0, 2, completed(17, 20), 60, 4), make_dump(1, 2, completed(13, 20), 60, 8)});
  EXPECT_TRUE(has(r,
                  "the rings dropped older calls: the analysis covers #17..#20 only (rank 0 "
                  "holds #17..#20, rank 1 holds #13..#20)"))
      << r;
  EXPECT_TRUE(has(r, "no divergence: all 2 ranks completed every call up to #20")) << r;
}

TEST(FlightAnalyzer, DivergenceBeforeTheCommonWindowIsNotReported) {
  // Rank 1's #14 differs, but rank 0 no longer holds #14: nothing to compare it with.
  auto r1 = completed(13, 20);
  r1[1] = entry(14, "completed", 14, 14.1, 14.2, "broadcast", 10);
  const auto r =
      analyze_flight_dumps({make_dump(0, 2, completed(17, 20), 60, 4), make_dump(1, 2, r1, 60, 8)});
  EXPECT_FALSE(has(r, "disagree")) << r;
  EXPECT_TRUE(has(r, "covers #17..#20 only")) << r;
}

TEST(FlightAnalyzer, MissingRankIsReportedAndBlamedForTheHang) {
  // Rank 1 was stopped (SIGSTOP): no dump; ranks 0 and 2 wait for it in #8.
  const auto calls = plus(completed(1, 7), entry(8, "started", 8, 8.1));
  const auto r = analyze_flight_dumps({make_dump(0, 3, calls), make_dump(2, 3, calls)});
  EXPECT_TRUE(has(r, "no dump from rank 1: it may have died before dumping")) << r;
  EXPECT_TRUE(has(r,
                  "rank 0 is stuck in all_reduce #8 (f32[1000], sum) since 52.0 s before its dump "
                  "(enqueued at 19:46:48.000 UTC, started at 19:46:48.100 UTC)"))
      << r;
  EXPECT_TRUE(has(r, "rank 2 is stuck in all_reduce #8")) << r;
  EXPECT_TRUE(has(r, "rank 1 without a dump is the likely cause")) << r;
}

TEST(FlightAnalyzer, MissingRankWithEverythingCompleted) {
  const auto r = analyze_flight_dumps({make_dump(1, 2, completed(1, 3))});
  EXPECT_TRUE(has(r, "no dump from rank 0")) << r;
  EXPECT_TRUE(has(r,
                  "no divergence among the 1 ranks with a dump: they completed every call up "
                  "to #3"))
      << r;
}

TEST(FlightAnalyzer, TwoDumpsOfOneRankAreAnError) {
  EXPECT_THROW(analyze_flight_dumps({make_dump(0, 2, completed(1, 2)), make_dump(0, 2, {})}),
               Error);
}

TEST(FlightAnalyzer, BadFilesAreNamed) {
  try {
    parse_flight_dump("{not json", "a.json");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_TRUE(has(e.what(), "a.json is not JSON")) << e.what();
  }
  try {
    parse_flight_dump(R"({"version": 2, "entries": []})", "b.json");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_TRUE(has(e.what(), "b.json is a flight recorder dump of version 2")) << e.what();
  }
  try {
    parse_flight_dump(R"({"version": 1, "entries": [], "rank": 0})", "c.json");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_TRUE(has(e.what(), "c.json is not a valid flight recorder dump")) << e.what();
  }
  try {
    read_flight_dump("/no/such/rank0.json");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_TRUE(has(e.what(), "cannot read /no/such/rank0.json")) << e.what();
  }
}

TEST(FlightAnalyzer, RunFlightExitsWith2OnABadFileAnd0OnADirectory) {
  char tmpl[] = "/tmp/rg_flight_analyzer_XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  { std::ofstream(dir + "/rank0.json") << "[1, 2]"; }
  testing::internal::CaptureStderr();
  EXPECT_EQ(run_flight({dir + "/rank0.json"}), 2);
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_TRUE(has(err, "ringgrad-bench flight: error: " + dir +
                           "/rank0.json is not a flight "
                           "recorder dump"))
      << err;
  {
    const json d = {
        {"version", 1},     {"rank", 0},
        {"world_size", 1},  {"pid", 1},
        {"host", "h"},      {"reason", "signal"},
        {"dumped_at", kT0}, {"capacity", 8},
        {"recorded", 1},    {"entries", json::array({entry(1, "completed", 0, 0.1, 0.2)})}};
    std::ofstream(dir + "/rank0.json") << d.dump();
  }
  testing::internal::CaptureStdout();
  EXPECT_EQ(run_flight({dir}), 0);
  const std::string out = testing::internal::GetCapturedStdout();
  EXPECT_TRUE(has(out, "no divergence: all 1 ranks completed every call up to #1")) << out;
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace rg::apps
