// rg_fuzz_seeds OUTDIR: writes the seed corpus of every fuzz harness, OUTDIR/<target>/..., each a
// small valid input made by the project's own writers where it has one (save_safetensors,
// save_checkpoint, the flight recorder's and the tracer's JSON, step_profile_json).
#include <zlib.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "apps/scale_sim.h"
#include "comm/flight_recorder.h"
#include "engine/ops/factory.h"
#include "engine/serialization.h"
#include "engine/trace.h"
#include "fuzz/fuzz_model.h"
#include "layers/amp/grad_scaler.h"
#include "layers/checkpoint.h"
#include "layers/optim/optimizer.h"
#include "layers/weights.h"

namespace fs = std::filesystem;
using rg::Tensor;

namespace {

fs::path g_out;

fs::path file(const std::string& target, const std::string& name) {
  fs::create_directories(g_out / target);
  return g_out / target / name;
}

void write(const std::string& target, const std::string& name, const std::string& bytes) {
  std::ofstream(file(target, name), std::ios::binary) << bytes;
}

std::string le32(uint32_t v) {
  std::string s(4, '\0');
  for (int i = 0; i < 4; ++i) s[size_t(i)] = char(v >> (8 * i));
  return s;
}
std::string le64(uint64_t v) { return le32(uint32_t(v)) + le32(uint32_t(v >> 32)); }
std::string str(const std::string& s) { return le32(uint32_t(s.size())) + s; }
std::string frame(const std::string& payload) { return le32(uint32_t(payload.size())) + payload; }

void safetensors_seeds() {
  rg::save_safetensors(file("safetensors", "tensors.safetensors").string(),
                       {{"w", rg::full({2, 3}, 0.5)},
                        {"ids", rg::from_vector<int64_t>({1, -2}, {2})},
                        {"half", rg::full({3}, 1.0, rg::DType::f16)},
                        {"bytes", rg::full({4}, 7, rg::DType::u8)},
                        {"empty", Tensor::empty({0, 2})}},
                       {{"note", "seed"}});
}

void checkpoint_seeds() {
  auto model = rg::fuzz::fuzz_model();
  for (Tensor& p : model->parameters()) p.set_grad(rg::full(p.shape(), 0.25));
  rg::optim::Sgd sgd(model->parameters(), {.lr = 0.1, .momentum = 0.9});
  sgd.step();
  rg::amp::GradScaler scaler;
  rg::nn::save_checkpoint(file("checkpoint", "model.ckpt").string(), *model, &sgd, &scaler,
                          {{"epoch", "1"}});
  rg::nn::save_weights(*model, file("checkpoint", "weights.safetensors").string());
  // A snapshot: the checkpoint plus a 2-rank PowerSGD state (comm/reducer_snapshot.h).
  rg::nn::save_checkpoint(
      file("snapshot", "run.snapshot").string(), *model, &sgd, nullptr,
      {{"ddp.synced_iterations", "12"},
       {"powersgd.world_size", "2"},
       {"powersgd.options",
        "rank=1 start_iter=10 min_compression_rate=2 error_feedback=1 warm_start=1 seed=0"}},
      {{"powersgd.bucket0.q", rg::full({3, 1}, 0.5)},
       {"powersgd.rank0.bucket0.error", rg::full({2, 3}, 0.0)},
       {"powersgd.rank1.bucket0.error", rg::full({2, 3}, 0.0)}});
}

void idx_seeds() {
  const std::string images = std::string("\0\0\x08\x03", 4) + std::string("\0\0\0\x02", 4) +
                             std::string("\0\0\0\x02", 4) + std::string("\0\0\0\x02", 4) +
                             "\x01\x02\x03\x04\x05\x06\x07\x08";
  const std::string labels =
      std::string("\0\0\x08\x01", 4) + std::string("\0\0\0\x03", 4) + "\x07\x02\x01";
  write("idx", "images.idx", images);
  write("idx", "labels.idx", labels);
  gzFile gz = gzopen(file("idx", "labels.idx.gz").c_str(), "wb");
  gzwrite(gz, labels.data(), unsigned(labels.size()));
  gzclose(gz);
}

void cifar_seeds() {
  std::string c10, c100;
  for (int r = 0; r < 2; ++r) {
    c10 += char(r + 3) + std::string(3072, char(r * 40 + 1));
    c100 += std::string(1, char(r + 1)) + char(r + 42) + std::string(3072, char(r * 40 + 2));
  }
  write("cifar", "cifar10.bin", c10);
  write("cifar", "cifar100.bin", c100);
}

void text_seeds() {
  write("text", "hello.txt", "Hello, w\xC3\xB6rld \xE2\x80\x94 \xE2\x88\x91 \xF0\x9D\x84\x9E\n");
  write("text", "kjv.txt", "In the beginning God created the heaven and the earth.\n");
}

void store_seeds() {
  const std::string hello = frame(le32(0x54534752) + le32(1) + str("fuzz-token"));
  std::string session = hello;
  session += frame(std::string(1, '\x01') + str("a") + str("1"));             // set
  session += frame(std::string(1, '\x02') + str("a") + le64(10));             // get
  session += frame(std::string(1, '\x03') + str("n") + le64(5));              // add
  session += frame(std::string(1, '\x04') + str("a") + str("1") + str("2"));  // compare_set
  session += frame(std::string(1, '\x05') + le32(2) + str("a") + str("b") + le64(0));  // wait
  session += frame(std::string(1, '\x06') + le32(1) + str("a"));                       // check
  session += frame(std::string(1, '\x07') + str("a"));                                 // delete
  session += frame(std::string(1, '\x08'));                                            // num_keys
  write("tcp_store_server", "session.bin", session);
  write("tcp_store_server", "wrong_token.bin", frame(le32(0x54534752) + le32(1) + str("x")));
  // Replies, each prefixed by the request it answers (tcp_store_client.cpp).
  write("tcp_store_client", "handshake.bin", std::string(1, '\0') + frame(std::string(1, '\0')));
  write("tcp_store_client", "set.bin", "\x01" + frame(std::string(1, '\0')));
  write("tcp_store_client", "get.bin", "\x02" + frame(std::string(1, '\0') + str("value")));
  write("tcp_store_client", "add.bin", "\x03" + frame(std::string(1, '\0') + le64(42)));
  write("tcp_store_client", "wait_timeout.bin",
        "\x05" + frame(std::string(1, '\x02') + le32(2) + str("a") + str("b")));
  write("tcp_store_client", "error.bin", "\x07" + frame(std::string(1, '\x01') + str("no")));
}

void file_store_seeds() {
  const auto rec = [](int op, const std::string& k, const std::string& v) {
    return std::string(1, char(op)) + str(k) + str(v);
  };
  write("file_store", "log.bin",
        rec(0, "a", "1") + rec(0, "rg.filestore.left", "1") + rec(1, "a", "") +
            rec(0, "counter", "-12"));
}

void flight_seeds() {
  std::string dumps;
  for (int rank = 0; rank < 2; ++rank) {
    rg::dist::FlightRecorder rec(8);
    for (uint64_t seq = 1; seq <= uint64_t(3 - rank); ++seq) {
      rg::dist::CollectiveCall call;
      call.seq = seq;
      call.op = "all_reduce";
      call.reduce_op = "sum";
      call.dtype = "f32";
      call.shapes = {{4}};
      call.device = "cpu";
      const uint64_t id = rec.enqueued(call);
      rec.started(id, 1.0e9 + double(seq));
      if (seq < 3) rec.ended(id, 1.0e9 + double(seq) + 0.5);
    }
    const std::string dump = rec.dump_json("seed", rank, 2);
    write("flight", "rank" + std::to_string(rank) + ".json", dump);
    dumps += (rank ? std::string(1, '\0') : std::string()) + dump;
  }
  write("flight", "both_ranks.bin", dumps);
}

void trace_seeds() {
  // Two steps of one rank of a DDP run: what ringgrad-train --trace writes (engine/trace.h).
  using rg::trace::Event;
  std::vector<Event> ev;
  for (int s = 0; s < 2; ++s) {
    const int64_t t = 1000 * s;
    ev.push_back({"forward", "step", 'X', t, 200, 0, ""});
    ev.push_back({"linear", "op", 'X', t + 10, 50, 1, ""});
    ev.push_back({"backward", "step", 'X', t + 210, 400, 0, ""});
    ev.push_back({"bucket 0 ready", "ddp", 'i', t + 400, 0, 0, R"({"bytes": 4096, "seq": 1})"});
    ev.push_back({"all_reduce f32[1024]", "comm", 'X', t + 410, 100, 2, R"({"bytes": 4096})"});
    ev.push_back({"DDP wait for buckets", "ddp", 'X', t + 580, 30, 0, ""});
    ev.push_back({"optimizer step", "step", 'X', t + 620, 80, 0, ""});
  }
  const std::string json = rg::trace::chrome_trace_json(
      {ev}, {"rank 0"}, {{0, "host"}, {1, "cuda:0/default stream"}, {2, "cuda:0 NCCL stream"}});
  write("trace", "steps.json", json);
  write("step_profile", "trace.json", json);
}

void step_profile_seeds() {
  rg::apps::scale::StepProfile p;
  p.model = "seed";
  p.source = "rg_fuzz_seeds";
  p.forward_ms = 1.5;
  p.backward_ms = 3;
  p.optimizer_ms = 0.5;
  p.grads = {{"fc.bias", 8, 0.5}, {"fc.weight", 24, 1.0}, {"conv.weight", 1 << 20, 2.5}};
  write("step_profile", "profile.json", rg::apps::scale::step_profile_json(p));
}

void train_args_seeds() {
  write("train_args", "mnist.txt",
        "--model\ntoynet\n--dataset\nmnist\n--epochs\n2\n--batch-size\n64\n--lr\n0.01\n"
        "--lr-schedule\nmultistep\n--lr-milestones\n1\n2\n--amp\nbf16");
  write("train_args", "gpt.txt",
        "--model=gpt-nano\n--dataset=text\n--block-size=32\n--optimizer=adamw\n"
        "--weight-decay-groups=auto\n--early-stop-patience=2\n--eval-every=1\n--clip-grad-norm=1");
  write("train_args", "usage_error.txt", "--early-stop-patience\n3\n--eval-every\n2");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: rg_fuzz_seeds OUTDIR\n");
    return 2;
  }
  g_out = argv[1];
  safetensors_seeds();
  checkpoint_seeds();
  idx_seeds();
  cifar_seeds();
  text_seeds();
  store_seeds();
  file_store_seeds();
  flight_seeds();
  trace_seeds();
  step_profile_seeds();
  train_args_seeds();
  return 0;
}
