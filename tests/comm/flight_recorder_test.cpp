// Tests of the flight recorder (comm/flight_recorder.h): the ring keeps the last N calls in order,
// their states and times, the JSON dump, the atomic file and the SIGUSR1 dump.
#include "comm/flight_recorder.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "support/scratch_dir.h"

namespace rg::dist {
namespace {

CollectiveCall all_reduce(uint64_t seq, int64_t n) {
  CollectiveCall c;
  c.seq = seq;
  c.op = "all_reduce";
  c.reduce_op = "sum";
  c.dtype = "f32";
  c.shapes = {{n}};
  c.device = "cpu";
  return c;
}

nlohmann::json dump(const FlightRecorder& r) {
  return nlohmann::json::parse(r.dump_json("test", 1, 2));
}

// A fresh directory as RG_FLIGHT_RECORDER_DIR for one test; removed after.
class DumpDir {
 public:
  DumpDir() {
    char tmpl[] = "/tmp/rg_flight_test_XXXXXX";
    EXPECT_NE(::mkdtemp(tmpl), nullptr);
    path_ = std::string(tmpl) + "/nested";  // created by the dump
    ::setenv("RG_FLIGHT_RECORDER_DIR", path_.c_str(), 1);
  }
  ~DumpDir() {
    ::unsetenv("RG_FLIGHT_RECORDER_DIR");
    std::filesystem::remove_all(std::filesystem::path(path_).parent_path());
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

TEST(FlightRecorder, RingKeepsTheLastCallsInOrderAndCountsAll) {
  FlightRecorder r(4);
  for (uint64_t seq = 1; seq <= 10; ++seq) r.enqueued(all_reduce(seq, int64_t(seq) * 10));
  const auto j = dump(r);
  EXPECT_EQ(j["capacity"], 4);
  EXPECT_EQ(j["recorded"], 10);
  ASSERT_EQ(j["entries"].size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(j["entries"][i]["seq"], 7 + i);
    EXPECT_EQ(j["entries"][i]["id"], 7 + i);
    EXPECT_EQ(j["entries"][i]["shapes"],
              nlohmann::json::parse("[[" + std::to_string((7 + i) * 10) + "]]"));
  }
}

TEST(FlightRecorder, StatesAndTimes) {
  FlightRecorder r(8);
  const double before = unix_seconds();
  const uint64_t a = r.enqueued(all_reduce(1, 4));
  const uint64_t b = r.enqueued(all_reduce(2, 4));
  const uint64_t c = r.enqueued(all_reduce(3, 4));
  const uint64_t d = r.enqueued(all_reduce(4, 4));
  const double after = unix_seconds();
  r.started(b, 100.5);
  r.started(c, 200.25);
  r.ended(c, 201.75);
  r.started(d, 300);
  r.ended(d, 301, "connection reset by rank 1");
  const auto e = dump(r)["entries"];
  ASSERT_EQ(e.size(), 4u);
  EXPECT_EQ(e[0]["id"], a);
  EXPECT_EQ(e[0]["state"], "enqueued");
  EXPECT_GE(e[0]["enqueued_at"].get<double>(), before);
  EXPECT_LE(e[0]["enqueued_at"].get<double>(), after);
  EXPECT_TRUE(e[0]["started_at"].is_null());
  EXPECT_TRUE(e[0]["ended_at"].is_null());
  EXPECT_FALSE(e[0].contains("error"));
  EXPECT_EQ(e[1]["state"], "started");
  EXPECT_EQ(e[1]["started_at"], 100.5);
  EXPECT_TRUE(e[1]["ended_at"].is_null());
  EXPECT_EQ(e[2]["state"], "completed");
  EXPECT_EQ(e[2]["started_at"], 200.25);
  EXPECT_EQ(e[2]["ended_at"], 201.75);
  EXPECT_FALSE(e[2].contains("error"));
  EXPECT_EQ(e[3]["state"], "failed");
  EXPECT_EQ(e[3]["ended_at"], 301);
  EXPECT_EQ(e[3]["error"], "connection reset by rank 1");
}

TEST(FlightRecorder, OverwrittenIdsAreIgnored) {
  FlightRecorder r(2);
  const uint64_t first = r.enqueued(all_reduce(1, 4));
  r.enqueued(all_reduce(2, 4));
  r.enqueued(all_reduce(3, 4));  // takes the first call's slot
  r.started(first, 5);
  r.ended(first, 6, "late error");
  r.started(0, 5);  // the id of a recorder that is off
  const auto e = dump(r)["entries"];
  ASSERT_EQ(e.size(), 2u);
  EXPECT_EQ(e[1]["seq"], 3);
  EXPECT_EQ(e[1]["state"], "enqueued");
  EXPECT_TRUE(e[1]["started_at"].is_null());
  EXPECT_EQ(e[0]["state"], "enqueued");
}

TEST(FlightRecorder, JsonHasTheDocumentedFields) {
  FlightRecorder r(16);
  CollectiveCall bc;
  bc.group = "model";
  bc.seq = 3;
  bc.op = "broadcast";
  bc.root = 2;
  bc.dtype = "bf16";
  bc.shapes = {{2, 3}, {4}};
  bc.device = "cuda:1";
  r.enqueued(bc);
  const auto j = dump(r);
  EXPECT_EQ(j["version"], 1);
  EXPECT_EQ(j["rank"], 1);
  EXPECT_EQ(j["world_size"], 2);
  EXPECT_EQ(j["pid"], ::getpid());
  EXPECT_TRUE(j["host"].is_string());
  EXPECT_EQ(j["reason"], "test");
  EXPECT_NEAR(j["dumped_at"].get<double>(), unix_seconds(), 60);
  const auto& e = j["entries"][0];
  EXPECT_EQ(e["group"], "model");
  EXPECT_EQ(e["op"], "broadcast");
  EXPECT_EQ(e["reduce_op"], "");
  EXPECT_EQ(e["root"], 2);
  EXPECT_EQ(e["tag"], 0);
  EXPECT_EQ(e["dtype"], "bf16");
  EXPECT_EQ(e["shapes"], nlohmann::json::parse("[[2, 3], [4]]"));
  EXPECT_EQ(e["device"], "cuda:1");
}

TEST(FlightRecorder, OffRecordsNothingAndWritesNoFile) {
  const DumpDir dir;
  FlightRecorder r(0);
  EXPECT_EQ(r.enqueued(all_reduce(1, 4)), 0u);
  r.started(1, 1);
  EXPECT_EQ(dump(r)["entries"].size(), 0u);
  EXPECT_EQ(r.dump_to_file("error", 0, 1), "");
  EXPECT_FALSE(std::filesystem::exists(dir.path()));
}

TEST(FlightRecorder, DumpToFileWritesTheRanksFileAtomically) {
  const DumpDir dir;
  FlightRecorder r(8);
  r.enqueued(all_reduce(1, 4));
  const std::string path = r.dump_to_file("timeout", 3, 4);
  EXPECT_EQ(path, dir.path() + "/rank3.json");
  const auto j = nlohmann::json::parse(rg::testing::file_contents(path));
  EXPECT_EQ(j["reason"], "timeout");
  EXPECT_EQ(j["rank"], 3);
  EXPECT_EQ(j["entries"].size(), 1u);
  // A second dump replaces the file through a rename (a new inode), leaving no temporary behind.
  struct stat before {};
  ASSERT_EQ(::stat(path.c_str(), &before), 0);
  r.enqueued(all_reduce(2, 4));
  EXPECT_EQ(r.dump_to_file("error", 3, 4), path);
  struct stat after {};
  ASSERT_EQ(::stat(path.c_str(), &after), 0);
  EXPECT_NE(before.st_ino, after.st_ino);
  EXPECT_EQ(nlohmann::json::parse(rg::testing::file_contents(path))["entries"].size(), 2u);
  size_t files = 0;
  for ([[maybe_unused]] const auto& f : std::filesystem::directory_iterator(dir.path())) ++files;
  EXPECT_EQ(files, 1u);
}

TEST(FlightRecorder, UnwritableDirectoryGivesAnEmptyPathNotAnException) {
  ::setenv("RG_FLIGHT_RECORDER_DIR", "/proc/no/such/dir", 1);
  FlightRecorder r(8);
  r.enqueued(all_reduce(1, 4));
  EXPECT_EQ(r.dump_to_file("error", 0, 1), "");
  ::unsetenv("RG_FLIGHT_RECORDER_DIR");
}

TEST(FlightRecorder, Sigusr1WritesTheDump) {
  const DumpDir dir;
  const uint64_t id = FlightRecorder::global().enqueued(all_reduce(41, 8));
  FlightRecorder::install_signal_dump(5, 6);
  ::raise(SIGUSR1);
  const std::string path = dir.path() + "/rank5.json";
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  while (!std::filesystem::exists(path) && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_TRUE(std::filesystem::exists(path)) << "no dump within 1 s of SIGUSR1";
  const auto j = nlohmann::json::parse(rg::testing::file_contents(path));
  EXPECT_EQ(j["reason"], "signal");
  EXPECT_EQ(j["world_size"], 6);
  ASSERT_FALSE(j["entries"].empty());
  EXPECT_EQ(j["entries"].back()["id"], id);
  EXPECT_EQ(j["entries"].back()["seq"], 41);
}

}  // namespace
}  // namespace rg::dist
