// ringgrad-bench profile (apps/profile_table.h): exact totals, means and shares on a hand-written
// trace, its errors (label unit), and a ResNet-18 trace from ringgrad-train-emu whose forward ops,
// loss, optimizer step and data copy are spans on the emulated stream's lane (label emu).
#include "apps/profile_table.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "kernels/error.h"
#include "support/errors.h"
#include "support/processes.h"
#include "support/scratch_dir.h"

namespace rg::apps {
namespace {

using testing::error_of;
using testing::file_contents;

// Three steps of 1000 us, each: host forward/backward/optimizer step/data wait; on the stream
// lane a data copy, two forward convs, a batch norm, the loss, a backward node and an SGD step;
// one all-reduce on the NCCL lane. Step 2's first conv takes 100 us instead of 40.
std::string hand_trace(bool with_gpu = true) {
  std::vector<std::string> ev = {
      R"({"ph":"M","name":"process_name","pid":0,"tid":0,"args":{"name":"rank 0"}})",
      R"({"ph":"M","name":"thread_name","pid":0,"tid":16,"args":{"name":"cuda:0/default stream"}})",
      R"({"ph":"M","name":"thread_name","pid":0,"tid":17,"args":{"name":"cuda:0 NCCL stream"}})"};
  const auto span = [&](const std::string& name, const std::string& cat, int ts, int dur, int tid) {
    ev.push_back(R"({"name":")" + name + R"(","cat":")" + cat + R"(","ph":"X","ts":)" +
                 std::to_string(ts) + R"(,"dur":)" + std::to_string(dur) + R"(,"pid":0,"tid":)" +
                 std::to_string(tid) + "}");
  };
  for (int k = 0; k < 3; ++k) {
    const int o = 1000 * k;
    span("forward", "step", o, 200, 0);
    span("backward", "step", o + 200, 500, 0);
    span("optimizer step", "step", o + 700, 50, 0);
    span("data wait", "data", o + 900, 100, 0);
    span("conv1", "module", o + 1, 50, 0);  // host module spans are not in the tables
    if (!with_gpu) continue;
    span("copy to device", "data copy", o + 5, 5, 16);
    span("conv1: conv2d", "op", o + 10, k == 2 ? 100 : 40, 16);
    span("layer1.0.conv1: conv2d", "op", o + 160, 20, 16);
    span("layer1.0.bn1: batch_norm", "op", o + 190, 10, 16);
    span("loss", "loss", o + 200, 10, 16);
    span("layer1.0.conv1: Conv2dBackward", "backward kernels", o + 300, 60, 16);
    span("sgd.step", "optimizer", o + 710, 20, 16);
    span("all_reduce f32[2048] (bucket 0)", "nccl", o + 400, 30, 17);
    // Host-blocking calls (the emulated runtime's instants): step 1 reads a value back twice.
    const auto stall = [&](const std::string& call, int ts) {
      ev.push_back(R"({"name":")" + call + R"(","cat":"host stall","ph":"i","s":"t","ts":)" +
                   std::to_string(ts) + R"(,"pid":0,"tid":0})");
    };
    if (k == 1) {
      stall("cudaMemcpy", o + 205);
      stall("cudaStreamSynchronize", o + 800);
      stall("cudaStreamSynchronize", o + 850);
    }
    // cuDNN descriptors (the emulated cuDNN's instants): step 0 creates three.
    if (k == 0) {
      for (const char* f :
           {"cudnnBackendCreateDescriptor (tensor)", "cudnnBackendCreateDescriptor (tensor)",
            "cudnnCreateTensorDescriptor", "cudnnBackendCreateDescriptor (variant pack)"}) {
        ev.push_back(std::string(R"({"name":")") + f +
                     R"(","cat":"cudnn descriptor","ph":"i","s":"t","ts":)" +
                     std::to_string(o + 15) + R"(,"pid":0,"tid":0})");
      }
    }
  }
  std::string out = R"({"traceEvents":[)";
  for (size_t i = 0; i < ev.size(); ++i) out += (i ? "," : "") + ev[i];
  return out + "]}";
}

std::map<std::string, ProfileRow> by_name(const std::vector<ProfileRow>& rows) {
  std::map<std::string, ProfileRow> m;
  for (const auto& r : rows) m[r.name] = r;
  return m;
}

TEST(ProfileTable, GroupsStreamSpansByOpWithExactTotalsMeansAndShares) {
  const Profile p = compute_profile(parse_trace(hand_trace(), "t.json"), 0, "");
  EXPECT_EQ(p.first_step, 0);
  EXPECT_EQ(p.end_step, 3);
  // Per step 195 us (255 in step 2, whose first conv is 60 us longer).
  EXPECT_DOUBLE_EQ(p.gpu_us, 645);
  // Steps 0 and 1 end at the next forward, step 2 at the end of its data wait.
  EXPECT_DOUBLE_EQ(p.host_us, 3000);
  ASSERT_EQ(p.ops.size(), 7u);
  EXPECT_EQ(p.ops[0].name, "conv2d");  // sorted by total
  EXPECT_EQ(p.ops[0].category, "op");
  EXPECT_EQ(p.ops[0].calls, 6);
  EXPECT_DOUBLE_EQ(p.ops[0].total_us, 240);
  EXPECT_DOUBLE_EQ(p.ops[0].mean_us(), 40);
  EXPECT_EQ(p.ops[1].name, "Conv2dBackward");
  EXPECT_DOUBLE_EQ(p.ops[1].total_us, 180);
  const auto ops = by_name(p.ops);
  EXPECT_EQ(ops.at("all_reduce").calls, 3);  // collectives grouped without their details
  EXPECT_EQ(ops.at("all_reduce").category, "nccl");
  EXPECT_DOUBLE_EQ(ops.at("loss").total_us, 30);
  EXPECT_EQ(ops.at("sgd.step").category, "optimizer");
  EXPECT_EQ(ops.at("copy to device").category, "data copy");
  const auto host = by_name(p.host);
  ASSERT_EQ(p.host.size(), 4u);  // module spans left out
  EXPECT_EQ(p.host[0].name, "backward");
  EXPECT_DOUBLE_EQ(host.at("backward").total_us, 1500);
  EXPECT_EQ(host.at("data wait").calls, 3);

  // Host stalls counted per step and by call (3 in step 1 only).
  EXPECT_EQ(p.stall_calls, 3);
  ASSERT_EQ(p.stalls.size(), 2u);
  EXPECT_EQ(p.stalls[0].name, "cudaStreamSynchronize");
  EXPECT_EQ(p.stalls[0].calls, 2);
  EXPECT_EQ(compute_profile(parse_trace(hand_trace(), "t.json"), 0, "2:3").stall_calls, 0);
  EXPECT_NE(profile_table(p).find("host-blocking calls per step: 1.0"), std::string::npos)
      << profile_table(p);
  // cuDNN descriptors counted the same way (3 and a variant pack in step 0 only), not as stalls.
  EXPECT_EQ(p.descriptor_calls, 3);
  EXPECT_EQ(p.variant_pack_calls, 1);
  ASSERT_EQ(p.descriptors.size(), 3u);
  EXPECT_EQ(p.descriptors[0].name, "cudnnBackendCreateDescriptor (tensor)");
  EXPECT_EQ(p.descriptors[0].calls, 2);
  EXPECT_EQ(compute_profile(parse_trace(hand_trace(), "t.json"), 0, "1:3").descriptor_calls, 0);
  EXPECT_NE(profile_table(p).find("cuDNN descriptors created per step: 1.0, and variant packs "
                                  "0.3"),
            std::string::npos)
      << profile_table(p);

  const std::string csv = profile_csv(p);
  std::istringstream lines(csv);
  std::string header, first;
  std::getline(lines, header);
  std::getline(lines, first);
  EXPECT_EQ(header, "op,category,calls,total_us,us_per_step,mean_us,share");
  // 240 / 645 of the GPU time, 80 us per step.
  EXPECT_EQ(first, "conv2d,op,6,240.000,80.000,40.000,0.372093");
  EXPECT_EQ(std::count(csv.begin(), csv.end(), '\n'), 8);
  const std::string table = profile_table(p);
  EXPECT_NE(table.find("GPU time per step 0.215 ms"), std::string::npos) << table;
  EXPECT_NE(table.find("host time per step 1.000 ms"), std::string::npos) << table;
  EXPECT_LT(table.find("conv2d"), table.find("Conv2dBackward")) << table;
  EXPECT_NE(table.find("37.2%"), std::string::npos) << table;
}

// A host that runs ahead queues step 0's kernel during step 0 but the GPU runs it during step 1's
// host time: "queued_us" puts it back into step 0. Without the argument a span counts where it
// ran (traces from before the argument existed).
TEST(ProfileTable, AGpuSpanCountsInTheStepThatQueuedIt) {
  const auto trace = [](const std::string& late_span_args) {
    return std::string(R"({"traceEvents":[)") +
           R"({"ph":"M","name":"thread_name","pid":0,"tid":16,"args":{"name":"cuda:0/default stream"}},)" +
           R"({"name":"forward","cat":"step","ph":"X","ts":0,"dur":100,"pid":0,"tid":0},)" +
           R"({"name":"forward","cat":"step","ph":"X","ts":1000,"dur":100,"pid":0,"tid":0},)" +
           R"({"name":"conv1: conv2d","cat":"op","ph":"X","ts":10,"dur":30,"pid":0,"tid":16,"args":{"queued_us":0}},)" +
           R"({"name":"conv1: Conv2dBackward","cat":"backward kernels","ph":"X","ts":1200,"dur":70,"pid":0,"tid":16)" +
           late_span_args + "}]}";
  };
  const Trace queued = parse_trace(trace(R"(,"args":{"queued_us":1150})"), "t.json");
  EXPECT_EQ(compute_profile(queued, 0, "0:1").ops.size(), 2u);
  EXPECT_DOUBLE_EQ(compute_profile(queued, 0, "0:1").gpu_us, 100);
  const Trace unmarked = parse_trace(trace(""), "t.json");
  EXPECT_DOUBLE_EQ(compute_profile(unmarked, 0, "0:1").gpu_us, 30);
  EXPECT_DOUBLE_EQ(compute_profile(unmarked, 0, "1:2").gpu_us, 70);
}

TEST(ProfileTable, StepsChooseTheWindow) {
  const Trace t = parse_trace(hand_trace(), "t.json");
  const Profile first_two = compute_profile(t, 0, "0:2");
  EXPECT_DOUBLE_EQ(first_two.gpu_us, 390);
  EXPECT_DOUBLE_EQ(first_two.host_us, 2000);
  const ProfileRow conv = by_name(first_two.ops).at("conv2d");
  EXPECT_EQ(conv.calls, 4);
  EXPECT_DOUBLE_EQ(conv.total_us, 120);
  EXPECT_DOUBLE_EQ(conv.mean_us(), 30);
  const Profile last = compute_profile(t, 0, "2");
  EXPECT_EQ(last.steps(), 1);
  EXPECT_DOUBLE_EQ(by_name(last.ops).at("conv2d").total_us, 120);
  EXPECT_DOUBLE_EQ(last.host_us, 1000);
  const Profile from_one = compute_profile(t, 0, "1:");
  EXPECT_EQ(from_one.first_step, 1);
  EXPECT_EQ(from_one.end_step, 3);
  EXPECT_DOUBLE_EQ(from_one.gpu_us, 450);
  EXPECT_EQ(compute_profile(t, 0, ":1").end_step, 1);
}

TEST(ProfileTable, OpOfDropsTheModuleScopeAndCollectiveDetails) {
  const auto op = [](const char* name, const char* cat) {
    TraceEvent e;
    e.name = name;
    e.cat = cat;
    return op_of(e);
  };
  EXPECT_EQ(op("layer1.0.conv1: conv2d", "op"), "conv2d");
  EXPECT_EQ(op("conv2d", "op"), "conv2d");
  EXPECT_EQ(op("all_reduce f32[9] (bucket 1)", "nccl"), "all_reduce");
  EXPECT_EQ(op("copy to device", "data copy"), "copy to device");
}

class ProfileErrors : public testing::ScratchDirTest {};

TEST_F(ProfileErrors, BadInputsAreOneLineErrors) {
  const Trace good = parse_trace(hand_trace(), "t.json");
  const std::vector<std::pair<std::string, std::string>> cases = {
      {error_of([&] { read_trace((dir_ / "missing.json").string()); }), "cannot read"},
      {error_of([&] { parse_trace("{nope", "x.json"); }), "x.json is not JSON"},
      {error_of([&] { parse_trace(R"({"a":1})", "x.json"); }), "is not a Chrome trace"},
      {error_of([&] { compute_profile(parse_trace(hand_trace(false), "cpu.json"), 0, ""); }),
       "cpu.json has no GPU spans on rank 0"},
      {error_of([&] { compute_profile(parse_trace(R"({"traceEvents":[]})", "e.json"), 0, ""); }),
       "e.json has 0 ranks"},
      {error_of([&] { compute_profile(good, 1, ""); }), "--rank 1 is not one of them"},
      {error_of([&] { compute_profile(good, 0, "0:4"); }),
       "t.json: --steps 0:4 is out of range: the trace has 3 traced steps (0 to 2)"},
      {error_of([&] { compute_profile(good, 0, "3"); }), "--steps 3 is out of range"},
      {error_of([&] { compute_profile(good, 0, "2:1"); }), "--steps 2:1 is out of range"},
      {error_of([&] { compute_profile(good, 0, "a:b"); }), "--steps 'a:b' is not a step range"},
  };
  for (const auto& [message, expected] : cases) {
    EXPECT_NE(message.find(expected), std::string::npos) << message << " | want: " << expected;
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  }
}

TEST_F(ProfileErrors, TheCommandExitsWithCode2AndOneLine) {
  std::ofstream(dir_ / "cpu.json") << hand_trace(false);
  std::ofstream(dir_ / "t.json") << hand_trace();
  const auto bench = [&](std::vector<std::string> args) {
    args.insert(args.begin(), {RG_BENCH_BINARY, "profile"});
    return rg::testing::run_processes({{args, {}}}, dir_, 60)[0];
  };
  for (const auto& [args, expected] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{(dir_ / "missing.json").string()}, "cannot read"},
           {{(dir_ / "cpu.json").string()}, "has no GPU spans"},
           {{(dir_ / "t.json").string(), "--steps", "1:9"}, "is out of range"}}) {
    const auto r = bench(args);
    EXPECT_EQ(r.exit_code, 2) << r.out;
    EXPECT_EQ(r.out.rfind("ringgrad-bench profile: error: ", 0), 0u) << r.out;
    EXPECT_NE(r.out.find(expected), std::string::npos) << r.out;
    EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
  }
  const auto ok = bench({(dir_ / "t.json").string(), "--csv", (dir_ / "t.csv").string()});
  EXPECT_EQ(ok.exit_code, 0) << ok.out;
  EXPECT_EQ(file_contents(dir_ / "t.csv"),
            profile_csv(compute_profile(parse_trace(hand_trace(), "t.json"), 0, "")));
}

// ResNet-18 (CIFAR stem: 20 convolutions) for 3 steps of batch 2 on the emulated device.
class EmulatedProfile : public testing::ScratchDirTest {};

// ringgrad-train-emu on ResNet-18 with `extra` arguments, tracing every step into `trace`.
rg::testing::ProcessResult train_resnet18(const std::filesystem::path& dir, int steps,
                                          const std::string& trace,
                                          const std::vector<std::string>& extra = {}) {
  std::vector<std::string> args{RG_TRAIN_EMU_BINARY,
                                "--model",
                                "resnet18",
                                "--dataset",
                                "synthetic-cifar",
                                "--device",
                                "cuda",
                                "--batch-size",
                                "2",
                                "--test-batch-size",
                                "2",
                                "--eval-samples",
                                "2",
                                "--max-steps",
                                std::to_string(steps),
                                "--epochs",
                                "1",
                                "--workers",
                                "0",
                                "--trace",
                                trace,
                                "--trace-steps",
                                std::to_string(steps)};
  args.insert(args.end(), extra.begin(), extra.end());
  return rg::testing::run_processes({{args, {"RG_NUM_THREADS=2"}}}, dir, 300)[0];
}

TEST_F(EmulatedProfile, ResNet18TraceHasForwardOpsLossStepAndCopyOnTheStreamLane) {
  constexpr int kSteps = 3, kConvs = 20;
  const std::string trace = (dir_ / "resnet.json").string(), csv = (dir_ / "ops.csv").string();
  const auto train = train_resnet18(dir_, kSteps, trace);
  ASSERT_EQ(train.exit_code, 0) << train.out;

  const Trace t = read_trace(trace);
  std::map<std::string, int> count;  // "category/op" on a stream lane
  double conv_us = 0;
  std::string first_conv;
  std::set<std::string> copy_lanes, conv_lanes;
  for (const TraceEvent& e : t.events) {
    if (e.pid != 0 || !t.on_stream(e)) continue;
    ++count[e.cat + "/" + op_of(e)];
    if (e.cat == "data copy") copy_lanes.insert(t.lane_name(e));
    if (op_of(e) == "conv2d") conv_lanes.insert(t.lane_name(e));
    if (e.cat == "op" && op_of(e) == "conv2d") {
      conv_us += e.dur;
      if (first_conv.empty()) first_conv = e.name;
    }
  }
  std::string seen;
  for (const auto& [k, n] : count) seen += " " + k + "=" + std::to_string(n);
  EXPECT_EQ(count["op/conv2d"], kSteps * kConvs) << seen;
  EXPECT_GT(conv_us, 0) << seen;
  EXPECT_EQ(first_conv, "conv1: conv2d");  // named in its module's scope
  // Every convolution is followed by a batch norm; the stem's and each block's first are fused
  // with their ReLU (BatchNorm2d::forward_relu): 1 + 8 of the 20; each block's second with the
  // shortcut's add and the ReLU (forward_add_relu): 8; the 3 downsample branches' stay plain.
  EXPECT_EQ(count["op/batch_norm_relu"], kSteps * 9) << seen;
  EXPECT_EQ(count["op/batch_norm_add_relu"], kSteps * 8) << seen;
  EXPECT_EQ(count["op/batch_norm"], kSteps * 3) << seen;
  EXPECT_EQ(count["op/batch_norm"] + count["op/batch_norm_relu"] + count["op/batch_norm_add_relu"],
            kSteps * kConvs)
      << seen;
  EXPECT_EQ(count["op/relu"] + count["op/relu_"], 0) << "every ReLU is fused:" << seen;
  EXPECT_EQ(count["loss/loss"], kSteps) << seen;
  EXPECT_EQ(count["optimizer/sgd.step"], kSteps) << seen;
  EXPECT_EQ(count["data copy/copy to device"], 2 * kSteps) << "inputs and targets:" << seen;
  // The batches are copied on a copy stream of their own (train::Feeder::prefetch_to), the next
  // one while a step runs; nothing past the last step.
  ASSERT_EQ(copy_lanes.size(), 1u);
  ASSERT_EQ(conv_lanes.size(), 1u);
  EXPECT_NE(*copy_lanes.begin(), *conv_lanes.begin());
  EXPECT_EQ(count["backward kernels/Conv2dBackward"], kSteps * kConvs) << seen;
  EXPECT_EQ(count["op/cross_entropy"], 0) << "the loss's ops are inside its span:" << seen;

  // No host stall in the steady steps: after the first (where the tracer anchors its clock with
  // one event synchronization) and before the last (whose end waits for the epoch's losses and
  // checks): pinned batches copied without blocking, losses and the loss's target check read as
  // they arrive (issue "ResNet-18 on Hopper", item 1).
  const Profile steady = compute_profile(t, 0, "1:" + std::to_string(kSteps - 1));
  EXPECT_EQ(steady.stall_calls, 0) << "host stalls in the steady steps";
  EXPECT_GT(compute_profile(t, 0, "").stall_calls, 0) << "the epoch's end reads the losses back";
  // No cuDNN descriptor made in the steady steps (the graph API's plans, the legacy API's batch
  // norm and pooling descriptors are kept); the first step makes them. The graph API's variant
  // packs are kept per pointer set: fewer than one per convolution call (60 per step) once
  // the step's buffers repeat (2 per step after 3 steps, when the batch buffers still rotate).
  EXPECT_EQ(steady.descriptor_calls, 0) << "cuDNN descriptors created in the steady steps";
  EXPECT_GT(compute_profile(t, 0, "0:1").descriptor_calls, 0) << "the first step makes them";
  EXPECT_LE(steady.variant_pack_calls, 60);
  EXPECT_EQ(compute_profile(t, 0, "").conversion_calls, 0) << "a contiguous model converts nothing";

  const auto bench = rg::testing::run_processes(
      {{{RG_BENCH_BINARY, "profile", trace, "--csv", csv}, {}}}, dir_, 60)[0];
  ASSERT_EQ(bench.exit_code, 0) << bench.out;
  EXPECT_NE(bench.out.find("GPU op"), std::string::npos) << bench.out;
  EXPECT_NE(bench.out.find("cuDNN descriptors created per step"), std::string::npos) << bench.out;
  std::istringstream rows(file_contents(csv));
  std::string line;
  std::getline(rows, line);
  bool conv_row = false;
  const Profile p = compute_profile(t, 0, "");
  const auto ops = by_name(p.ops);
  int n = 0;
  while (std::getline(rows, line)) {
    ++n;
    const std::string op = line.substr(0, line.find(','));
    ASSERT_TRUE(ops.contains(op)) << line;
    EXPECT_NE(bench.out.find(op), std::string::npos) << op << " not in the table\n" << bench.out;
    if (op != "conv2d") continue;
    conv_row = true;
    std::istringstream fields(line);
    std::string f[7];
    for (auto& x : f) std::getline(fields, x, ',');
    EXPECT_EQ(f[1], "op");
    EXPECT_EQ(std::stoi(f[2]), kSteps * kConvs) << line;
    EXPECT_GT(std::stod(f[3]), 0) << line;
  }
  EXPECT_TRUE(conv_row) << file_contents(csv);
  EXPECT_EQ(n, int(p.ops.size()));
  std::cout << bench.out;
}

// --amp f16 (issue "ResNet-18 on Hopper", the f16 target): the GradScaler's scale, its overflow
// flag and SGD's skip stay on the device, so once the momentum buffers exist (the first steps,
// where the f16 gradients overflow at the initial scale of 2^16, read the flag back) a step reads
// nothing back.
TEST_F(EmulatedProfile, AnF16ResNet18StepWithItsGradScalerHasNoHostStall) {
  constexpr int kSteps = 5;
  const std::string trace = (dir_ / "resnet_f16.json").string();
  const auto train = train_resnet18(dir_, kSteps, trace, {"--amp", "f16"});
  ASSERT_EQ(train.exit_code, 0) << train.out;
  const Trace t = read_trace(trace);
  const Profile steady = compute_profile(t, 0, "2:" + std::to_string(kSteps - 1));
  EXPECT_EQ(steady.stall_calls, 0) << profile_table(steady);
  EXPECT_GT(compute_profile(t, 0, "1:2").stall_calls, 0)
      << "step 1 (SGD's first momentum step after an overflow at step 0) reads the flag back";
}

// --cuda-graphs: a replayed step runs no forward of its own (its body ran once, at the capture),
// yet each is a traced step (its host span "cuda graph replay"), the capture's step starts at its
// forward, and a replayed step neither blocks the host nor makes a cuDNN descriptor.
TEST_F(EmulatedProfile, EveryStepOfACudaGraphsRunIsATracedStepAndAReplayHasNoHostStall) {
  constexpr int kSteps = 5;  // 2 eager warm-up steps, the capture (and its replay), 2 replays
  const std::string trace = (dir_ / "resnet_graphs.json").string();
  const auto train = train_resnet18(dir_, kSteps, trace, {"--cuda-graphs"});
  ASSERT_EQ(train.exit_code, 0) << train.out;
  const Trace t = read_trace(trace);
  const Profile all = compute_profile(t, 0, "");
  EXPECT_EQ(all.traced_steps, kSteps) << profile_table(all);
  const auto host = by_name(all.host);
  ASSERT_TRUE(host.contains("cuda graph replay")) << profile_table(all);
  EXPECT_EQ(host.at("cuda graph replay").calls, kSteps - 3);
  ASSERT_TRUE(host.contains("cuda graph capture")) << profile_table(all);
  EXPECT_EQ(host.at("cuda graph capture").calls, 1);
  ASSERT_TRUE(host.contains("forward"));
  EXPECT_EQ(host.at("forward").calls, 3) << "the warm-up steps' and the capture's";
  // The capture's span (and the forward captured inside it) belong to step 2, not to step 1.
  const auto capture_step = by_name(compute_profile(t, 0, "2:3").host);
  EXPECT_EQ(
      capture_step.contains("cuda graph capture") ? capture_step.at("cuda graph capture").calls : 0,
      1);
  EXPECT_EQ(capture_step.contains("forward") ? capture_step.at("forward").calls : 0, 1);
  const auto warm_up = by_name(compute_profile(t, 0, "1:2").host);
  EXPECT_FALSE(warm_up.contains("cuda graph capture"));
  const Profile replayed = compute_profile(t, 0, "3:4");
  EXPECT_EQ(replayed.stall_calls, 0) << profile_table(replayed);
  EXPECT_EQ(replayed.descriptor_calls, 0) << profile_table(replayed);
  const auto gpu = by_name(replayed.ops);
  ASSERT_TRUE(gpu.contains("cuda graph replay")) << profile_table(replayed);
  EXPECT_EQ(gpu.at("cuda graph replay").calls, 1);
  EXPECT_FALSE(gpu.contains("conv2d")) << "a replay's kernels are one span";
}

// --channels-last (issue "ResNet-18 on Hopper", item 4): the weights are NHWC from the start and
// the loader lays the batches out NHWC on the CPU, so no layout conversion runs on the GPU in
// any step, forward or backward; every convolution and batch norm runs channels last.
TEST_F(EmulatedProfile, ChannelsLastResNet18RunsNoLayoutConversionOnTheGpu) {
  constexpr int kSteps = 3, kConvs = 20;
  const std::string trace = (dir_ / "resnet_cl.json").string();
  const auto train = train_resnet18(dir_, kSteps, trace, {"--channels-last"});
  ASSERT_EQ(train.exit_code, 0) << train.out;
  const Trace t = read_trace(trace);
  const Profile all = compute_profile(t, 0, "");
  EXPECT_EQ(all.conversion_calls, 0) << profile_table(all);
  const auto ops = by_name(all.ops);
  ASSERT_TRUE(ops.contains("conv2d"));
  EXPECT_EQ(ops.at("conv2d").calls, kSteps * kConvs);
  EXPECT_FALSE(ops.contains("layout_conversion")) << profile_table(all);
  const auto bench = rg::testing::run_processes(
      {{{RG_BENCH_BINARY, "profile", trace, "--steps", "1:2"}, {}}}, dir_, 60)[0];
  ASSERT_EQ(bench.exit_code, 0) << bench.out;
  EXPECT_NE(bench.out.find("layout conversions on the GPU per step: 0.0"), std::string::npos)
      << bench.out;
}

}  // namespace
}  // namespace rg::apps
