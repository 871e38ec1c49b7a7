// Test-only callbacks: fault injection (RG_TEST_FAULT) and the sample log (RG_TEST_SAMPLE_LOG).
#include "apps/common/test_hooks.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <csignal>
#include <cstdlib>
#include <fstream>
#include <string>
#include <string_view>

#include "comm/env.h"
#include "engine/autograd/grad_mode.h"
#include "engine/serialization.h"
#include "kernels/error.h"

namespace rg::app {
namespace {

class FaultInjection : public train::Callback {
 public:
  FaultInjection(std::string spec, int rank, int restart)
      : spec_(std::move(spec)), rank_(rank), restart_(restart) {}
  void on_step_end(const train::State& s) override {
    if (s.joined) return;
    kill_at("step", s.step);
    // stop:N:R stops rank R after step N (SIGSTOP, as a hung process), for the debug tests.
    if (at("stop", s.step)) ::raise(SIGSTOP);
    if (at("perturb", s.step)) {
      NoGradGuard no_grad;
      Tensor first = s.model->parameters().front().flat_narrow(0, 1);
      first.fill_(first.item() + 1e-3);
    }
  }
  void on_eval_start(const train::State& s) override { kill_at("eval", s.epoch); }
  void on_snapshot(const train::State& s) override {
    kill_at("snapshot", s.step);
    if (at("snapshot-write", s.step)) set_partial_write_hook([] { ::raise(SIGKILL); });
  }

 private:
  bool at(const char* where, int64_t n) const {
    return restart_ == 0 && spec_ == fmt::format("{}:{}:{}", where, n, rank_);
  }
  void kill_at(const char* where, int64_t n) const {
    if (at(where, n)) ::raise(SIGKILL);
  }
  std::string spec_;
  int rank_, restart_;
};

class SampleLog : public train::Callback {
 public:
  SampleLog(const std::string& dir, int rank)
      : file_(fmt::format("{}/rank{}.txt", dir, rank), std::ios::app) {
    RG_CHECK(file_.good(), "RG_TEST_SAMPLE_LOG: cannot write into ", dir);
  }
  void on_batch(const train::State& s) override {
    file_ << fmt::format("{} {} {}", s.epoch, s.step + 1, fmt::join(s.batch->indices, " "))
          << std::endl;
  }

 private:
  std::ofstream file_;
};

}  // namespace

void add_test_hooks(train::Trainer& trainer) {
  const int rank = trainer.state().rank;
  if (const char* spec = std::getenv("RG_TEST_FAULT"); spec && *spec)
    trainer.add_callback(
        std::make_shared<FaultInjection>(spec, rank, dist::read_launch_env().restart_count));
  if (const char* dir = std::getenv("RG_TEST_SAMPLE_LOG"); dir && *dir)
    trainer.add_callback(std::make_shared<SampleLog>(dir, rank));
}

}  // namespace rg::app
