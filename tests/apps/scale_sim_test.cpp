// Tests of ringgrad-bench scale (apps/scale_sim.h): the all-reduce formulas on hand-computed
// cases, the overlap replay on a hand-made timeline, re-bucketing, and reading profiles and
// traces, good and bad.
#include "apps/scale_sim.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "kernels/error.h"

namespace rg::apps::scale {
namespace {

bool has(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

TEST(ScaleSim, RingAndTreeFormulasOnHandComputedCases) {
  const Level l{1.0, 10.0};  // 1 GB/s = 1000 bytes per microsecond, 10 us per hop
  // Ring, 4 ranks, 1 MB: 2*3/4 * 1000 us + 2*3 * 10 us.
  EXPECT_DOUBLE_EQ(ring_allreduce_us(1e6, 4, l), 1560.0);
  // Tree, 4 ranks: 2 * 1000 us + 2*log2(4) * 10 us; 5 ranks round the depth up to 3.
  EXPECT_DOUBLE_EQ(tree_allreduce_us(1e6, 4, l), 2040.0);
  EXPECT_DOUBLE_EQ(tree_allreduce_us(1e6, 5, l), 2060.0);
  EXPECT_EQ(ring_allreduce_us(1e6, 1, l), 0.0);
  EXPECT_EQ(tree_allreduce_us(1e6, 1, l), 0.0);
  // At 8 ranks small messages favour the tree (latency: 62 us against 141.75), large ones the
  // ring (bandwidth: 175140 us against 200060).
  const Cluster flat{"flat", 1024, l, l, false, 0};
  EXPECT_DOUBLE_EQ(allreduce_us(1e3, 8, flat, Algo::best), 62.0);
  EXPECT_DOUBLE_EQ(allreduce_us(1e3, 8, flat, Algo::ring), 141.75);
  EXPECT_DOUBLE_EQ(allreduce_us(1e8, 8, flat, Algo::best), 175140.0);
  EXPECT_DOUBLE_EQ(allreduce_us(1e8, 8, flat, Algo::tree), 200060.0);

  // Two levels: 2 GPUs per node at 10 GB/s + 1 us, nodes at 1 GB/s + 10 us, 8 GPUs = 4 nodes.
  // Reduce-scatter and all-gather inside: 1/2 * 1e6 B / 1e4 B/us + 1 us = 51 us each. Across:
  // a ring of 4 nodes on 5e5 B per GPU with half the node's bandwidth each:
  // 2*3/4 * 5e5 / 500 + 2*3 * 10 = 1560 us.
  const Cluster two{"two", 2, {10.0, 1.0}, {1.0, 10.0}, false, 0};
  EXPECT_DOUBLE_EQ(allreduce_us(1e6, 8, two, Algo::ring), 51 + 1560 + 51.0);
  // Inside one node only the intra level counts.
  EXPECT_DOUBLE_EQ(allreduce_us(1e6, 2, two, Algo::ring), ring_allreduce_us(1e6, 2, two.intra));
  EXPECT_THROW(allreduce_us(1e6, 3, two, Algo::ring), Error);  // not whole nodes

  // comm/sim_link's model: latency once, ring bandwidth term.
  const Cluster sim = sim_link_cluster({1.0, 50.0});
  EXPECT_DOUBLE_EQ(allreduce_us(1e6, 2, sim, Algo::best), 50 + 1000.0);
  EXPECT_DOUBLE_EQ(allreduce_us(1e6, 4, sim, Algo::ring), 50 + 1500.0);

  // A fixed cost per all-reduce adds once, at every scale, and not at one rank.
  Cluster costly = two;
  costly.launch_us = 20;
  EXPECT_DOUBLE_EQ(allreduce_us(1e6, 8, costly, Algo::ring), 20 + 51 + 1560 + 51.0);
  EXPECT_DOUBLE_EQ(allreduce_us(1e6, 2, costly, Algo::ring),
                   20 + ring_allreduce_us(1e6, 2, two.intra));
  EXPECT_EQ(allreduce_us(1e6, 1, costly, Algo::ring), 0.0);
}

TEST(ScaleSim, PresetsAreKnownAndOthersAreNamed) {
  for (const char* p : {"dgx-a100", "v100-ib", "ethernet-10g"}) {
    const Cluster c = preset(p);
    EXPECT_GT(c.intra.gbps, c.inter.gbps / c.gpus_per_node) << p;
  }
  try {
    preset("tpu");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_TRUE(has(e.what(), "unknown preset 'tpu'")) << e.what();
  }
}

TEST(ScaleSim, NoCommunicationGivesEfficiencyOne) {
  const std::vector<Bucket> buckets = {{1 << 20, 5.0}, {8 << 20, 20.0}};
  const Cluster c = preset("ethernet-10g");
  std::vector<double> us;
  for (const Bucket& b : buckets) us.push_back(allreduce_us(double(b.bytes), 1, c, Algo::best));
  const Prediction r = simulate_overlap(10, 20, 2, buckets, us);
  EXPECT_EQ(r.comm_ms, 0.0);
  EXPECT_EQ(r.exposed_ms, 0.0);
  EXPECT_DOUBLE_EQ(r.step_ms, 32.0);
  EXPECT_DOUBLE_EQ(r.compute_ms / r.step_ms, 1.0);
}

TEST(ScaleSim, ExposedCommunicationOfATwoBucketTimeline) {
  // Forward 10 ms, backward 20 ms, optimizer 2 ms. Bucket 0 ready at 5 ms runs 10 ms (5-15);
  // bucket 1 ready at 18 ms runs 6 ms (18-24): 4 ms exposed after backward's end at 20.
  const std::vector<Bucket> buckets = {{100, 5.0}, {100, 18.0}};
  Prediction r = simulate_overlap(10, 20, 2, buckets, {10000, 6000});
  EXPECT_DOUBLE_EQ(r.comm_ms, 16.0);
  EXPECT_DOUBLE_EQ(r.exposed_ms, 4.0);
  EXPECT_DOUBLE_EQ(r.step_ms, 10 + 24 + 2.0);
  // A longer first all-reduce (5-20) delays bucket 1 until the link is free (20-26).
  r = simulate_overlap(10, 20, 2, buckets, {15000, 6000});
  EXPECT_DOUBLE_EQ(r.exposed_ms, 6.0);
  EXPECT_DOUBLE_EQ(r.step_ms, 38.0);
  // Everything hidden: short all-reduces end before backward does.
  r = simulate_overlap(10, 20, 2, buckets, {1000, 1000});
  EXPECT_DOUBLE_EQ(r.exposed_ms, 0.0);
  EXPECT_DOUBLE_EQ(r.step_ms, 32.0);
  EXPECT_EQ(r.buckets, 2u);
}

StepProfile hand_profile(bool per_parameter) {
  StepProfile p;
  p.per_parameter = per_parameter;
  p.forward_ms = 10;
  p.backward_ms = 30;
  p.optimizer_ms = 1;
  const int64_t mib = 1 << 20;
  p.grads = {{"fc.weight", 3 * mib, 2.0},
             {"fc.bias", 100, 2.1},
             {"conv2.weight", 9 * mib + 5, 15.0},
             {"conv1.weight", 20 * mib + 3, 29.0}};
  return p;
}

TEST(ScaleSim, RebucketingPreservesTotalBytesAndFollowsDdpCaps) {
  for (bool per_parameter : {true, false}) {
    const StepProfile p = hand_profile(per_parameter);
    for (double cap : {1.0, 5.0, 10.0, 25.0, 100.0, 0.0}) {
      const auto b = rebucket(p, cap, std::min(1.0, cap));
      int64_t total = 0;
      double last = 0;
      for (const Bucket& x : b) {
        total += x.bytes;
        EXPECT_GE(x.ready_ms, last) << "buckets become ready in order";
        last = x.ready_ms;
      }
      EXPECT_EQ(total, p.total_bytes()) << "cap " << cap << " per_parameter " << per_parameter;
      EXPECT_DOUBLE_EQ(last, 29.0) << "the last bucket waits for the last gradient";
      if (cap == 0) {
        EXPECT_EQ(b.size(), 1u);
      }
    }
  }
  // Whole parameters, as DDP: 1 MiB first bucket (fc.weight alone closes it), then 5 MiB caps.
  const auto whole = rebucket(hand_profile(true), 5, 1);
  ASSERT_EQ(whole.size(), 3u);
  EXPECT_EQ(whole[0].bytes, 3 << 20);
  EXPECT_DOUBLE_EQ(whole[0].ready_ms, 2.0);
  // Bucket-level profiles are cut into 64 KiB pieces spread in time: a 1 MiB first bucket is
  // ready a third of the way through fc.weight's interval (0 to 2 ms).
  const auto cut = rebucket(hand_profile(false), 5, 1);
  EXPECT_EQ(cut[0].bytes, 1 << 20);
  EXPECT_NEAR(cut[0].ready_ms, 2.0 / 3, 1e-9);
}

TEST(ScaleSim, ReadsAHandWrittenProfile) {
  const StepProfile p = parse_step_profile(R"({"format": "ringgrad-step-profile", "version": 1,
    "model": "tiny", "measured_ranks": 2, "forward_ms": 4, "backward_ms": 8, "optimizer_ms": 1,
    "grads": [{"name": "b", "bytes": 400, "ready_ms": 7.5}, {"name": "a", "bytes": 40,
    "ready_ms": 0.5}]})",
                                           "p.json");
  EXPECT_EQ(p.model, "tiny");
  EXPECT_TRUE(p.per_parameter);
  EXPECT_DOUBLE_EQ(p.backward_ms, 8);
  ASSERT_EQ(p.grads.size(), 2u);
  EXPECT_EQ(p.grads[0].name, "a");  // sorted by ready time
  EXPECT_EQ(p.total_bytes(), 440);
  // And back: what --profile-out writes reads the same.
  const StepProfile q = parse_step_profile(step_profile_json(p), "q.json");
  EXPECT_EQ(q.grads[1].bytes, 400);
  EXPECT_DOUBLE_EQ(q.forward_ms, 4);
}

TEST(ScaleSim, ReadsAHandWrittenTrace) {
  // Two steps of rank 0 as ringgrad-train --trace writes them (times in microseconds); the
  // second step's backward ends in a 3 ms DDP wait, which is not backward compute.
  const std::string trace = R"({"traceEvents": [
    {"ph": "M", "name": "process_name", "pid": 0, "args": {"name": "rank 0"}},
    {"ph": "X", "cat": "step", "name": "forward", "pid": 0, "ts": 0, "dur": 5000},
    {"ph": "X", "cat": "step", "name": "backward", "pid": 0, "ts": 5000, "dur": 9000},
    {"ph": "i", "cat": "ddp", "name": "bucket 0 ready", "pid": 0, "ts": 6000,
     "args": {"bucket": 0, "bytes": 1000, "params": 2}},
    {"ph": "X", "cat": "step", "name": "optimizer step", "pid": 0, "ts": 14000, "dur": 500},
    {"ph": "X", "cat": "step", "name": "forward", "pid": 0, "ts": 20000, "dur": 4000},
    {"ph": "X", "cat": "step", "name": "backward", "pid": 0, "ts": 24000, "dur": 13000},
    {"ph": "i", "cat": "ddp", "name": "bucket 0 ready", "pid": 0, "ts": 25000,
     "args": {"bucket": 0, "bytes": 1048576, "params": 2}},
    {"ph": "i", "cat": "ddp", "name": "bucket 1 ready", "pid": 0, "ts": 34000,
     "args": {"bucket": 1, "bytes": 5000, "params": 3}},
    {"ph": "X", "cat": "comm", "name": "all_reduce bucket 1", "pid": 0, "ts": 34100,
     "dur": 2900},
    {"ph": "X", "cat": "ddp", "name": "DDP wait for buckets", "pid": 0, "ts": 34000,
     "dur": 3000},
    {"ph": "X", "cat": "step", "name": "optimizer step", "pid": 0, "ts": 37000, "dur": 700},
    {"ph": "X", "cat": "step", "name": "forward", "pid": 1, "ts": 0, "dur": 5000}]})";
  const StepProfile last = profile_from_trace(trace, "t.json", -1, 0);
  EXPECT_FALSE(last.per_parameter);
  EXPECT_EQ(last.measured_ranks, 2);
  EXPECT_DOUBLE_EQ(last.forward_ms, 4);
  EXPECT_DOUBLE_EQ(last.backward_ms, 10);  // up to the DDP wait
  EXPECT_DOUBLE_EQ(last.optimizer_ms, 0.7);
  ASSERT_EQ(last.grads.size(), 2u);
  EXPECT_DOUBLE_EQ(last.grads[0].ready_ms, 1);
  EXPECT_EQ(last.grads[0].bytes, 1048576);
  EXPECT_DOUBLE_EQ(last.grads[1].ready_ms, 10);
  const StepProfile first = profile_from_trace(trace, "t.json", 0, 0);
  EXPECT_DOUBLE_EQ(first.backward_ms, 9);  // no wait recorded: the whole backward span
  EXPECT_EQ(first.total_bytes(), 1000);
  try {
    profile_from_trace(trace, "t.json", 0, 1);  // rank 1 has no DDP events
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_TRUE(has(e.what(), "t.json: step 0 of rank 1 lacks")) << e.what();
  }
}

// A --cuda-graphs run: the first step is eager (forward, backward, buckets), the next is the
// capture (its host span "cuda graph capture" around a forward, backward and buckets that only
// queued work), the later ones are replays (one host span "cuda graph replay" each). The last
// complete step is the eager one; a capture or replay asked for by number is named as such.
TEST(ScaleSim, CudaGraphCaptureAndReplayStepsAreNotProfiles) {
  const std::string trace = R"({"traceEvents": [
    {"ph": "M", "name": "process_name", "pid": 0, "args": {"name": "rank 0"}},
    {"ph": "X", "cat": "step", "name": "forward", "pid": 0, "ts": 0, "dur": 5000},
    {"ph": "X", "cat": "step", "name": "backward", "pid": 0, "ts": 5000, "dur": 9000},
    {"ph": "i", "cat": "ddp", "name": "bucket 0 ready", "pid": 0, "ts": 6000,
     "args": {"bucket": 0, "bytes": 1000, "params": 2}},
    {"ph": "X", "cat": "step", "name": "optimizer step", "pid": 0, "ts": 14000, "dur": 500},
    {"ph": "X", "cat": "step", "name": "cuda graph capture", "pid": 0, "ts": 15000, "dur": 4000},
    {"ph": "X", "cat": "step", "name": "forward", "pid": 0, "ts": 15100, "dur": 1000},
    {"ph": "X", "cat": "step", "name": "backward", "pid": 0, "ts": 16100, "dur": 2000},
    {"ph": "i", "cat": "ddp", "name": "bucket 0 ready", "pid": 0, "ts": 17000,
     "args": {"bucket": 0, "bytes": 1000, "params": 2}},
    {"ph": "X", "cat": "step", "name": "optimizer step", "pid": 0, "ts": 18200, "dur": 100},
    {"ph": "X", "cat": "step", "name": "cuda graph replay", "pid": 0, "ts": 20000, "dur": 300},
    {"ph": "X", "cat": "step", "name": "cuda graph replay", "pid": 0, "ts": 21000, "dur": 300}]})";
  const StepProfile last = profile_from_trace(trace, "g.json", -1, 0);
  EXPECT_DOUBLE_EQ(last.forward_ms, 5);
  EXPECT_EQ(last.total_bytes(), 1000);
  for (int step : {1, 2}) {
    try {
      profile_from_trace(trace, "g.json", step, 0);
      FAIL() << "no error for step " << step;
    } catch (const Error& e) {
      EXPECT_TRUE(has(e.what(), "g.json: step " + std::to_string(step) +
                                    " of rank 0 is a CUDA graph capture or replay (--cuda-graphs)"))
          << e.what();
    }
  }
}

TEST(ScaleSim, BadInputIsAClearErrorWithExitCode2) {
  auto message = [](const std::string& text) {
    try {
      parse_step_profile(text, "x.json");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_TRUE(has(message("{nope"), "x.json is not JSON")) << message("{nope");
  EXPECT_TRUE(has(message(R"({"traceEvents": 1})"), "x.json is not a step profile"));
  EXPECT_TRUE(has(message(R"({"format": "ringgrad-step-profile", "version": 7})"),
                  "x.json is a step profile of version 7"));
  EXPECT_TRUE(has(message(R"({"format": "ringgrad-step-profile", "version": 1})"),
                  "x.json is not a valid step profile"));
  EXPECT_TRUE(has(message(R"({"format": "ringgrad-step-profile", "version": 1, "forward_ms": 1,
    "backward_ms": 1, "optimizer_ms": 1, "grads": [{"bytes": -4, "ready_ms": 0}]})"),
                  "bytes must be positive"));

  ScaleOptions o;
  o.traces = {"/no/such/profile.json"};
  EXPECT_EQ(run_scale(o), 2);
  const auto bad = std::filesystem::temp_directory_path() / "rg_scale_sim_bad.json";
  std::ofstream(bad) << "{\"traceEvents\": [";
  o.traces = {bad.string()};
  EXPECT_EQ(run_scale(o), 2);
  std::filesystem::remove(bad);
}

TEST(ScaleSim, RunsOnAProfileAndWritesTheCsv) {
  const auto dir = std::filesystem::temp_directory_path();
  const auto prof = dir / "rg_scale_sim_profile.json", csv = dir / "rg_scale_sim.csv";
  StepProfile p = hand_profile(true);
  p.model = "hand";
  std::ofstream(prof) << step_profile_json(p);
  ScaleOptions o;
  o.traces = {prof.string()};
  o.presets = {"v100-ib"};
  o.gpus = {1, 16};
  o.bucket_mb = {"1", "25", "single"};
  o.csv = csv.string();
  ASSERT_EQ(run_scale(o), 0);
  std::ifstream f(csv);
  std::string line;
  int rows = 0, best = 0;
  while (std::getline(f, line)) {
    if (rows++ == 0) continue;
    EXPECT_TRUE(line.starts_with("hand,v100-ib,best,")) << line;
    best += line.ends_with(",1");
    if (line.starts_with("hand,v100-ib,best,1,")) {
      EXPECT_TRUE(has(line, ",1.00000,")) << "efficiency 1 at one GPU: " << line;
    }
  }
  EXPECT_EQ(rows, 1 + 2 * 3);
  EXPECT_EQ(best, 2);  // one recommendation per GPU count
  std::filesystem::remove(prof);
  std::filesystem::remove(csv);
}

}  // namespace
}  // namespace rg::apps::scale
