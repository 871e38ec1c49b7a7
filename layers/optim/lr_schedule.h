// Learning-rate schedules as closed-form functions of the step (an epoch or an iteration, as
// the caller counts): linear warm-up chained into step, multi-step or cosine decay, matching
// torch.optim.lr_scheduler's LinearLR, StepLR, MultiStepLR, CosineAnnealingLR and SequentialLR.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace rg::optim {

class LrSchedule {
 public:
  virtual ~LrSchedule() = default;
  virtual double lr_at(int64_t step) const = 0;
};

class ConstantLr final : public LrSchedule {
 public:
  explicit ConstantLr(double base_lr) : base_(base_lr) {}
  double lr_at(int64_t) const override { return base_; }

 private:
  double base_;
};

// base * gamma^floor(step / step_size)
class StepLr final : public LrSchedule {
 public:
  StepLr(double base_lr, int64_t step_size, double gamma = 0.1);
  double lr_at(int64_t step) const override;

 private:
  double base_;
  int64_t step_size_;
  double gamma_;
};

// base * gamma^(number of milestones <= step)
class MultiStepLr final : public LrSchedule {
 public:
  MultiStepLr(double base_lr, std::vector<int64_t> milestones, double gamma = 0.1);
  double lr_at(int64_t step) const override;

 private:
  double base_;
  std::vector<int64_t> milestones_;
  double gamma_;
};

// eta_min + (base - eta_min) * (1 + cos(pi * step / t_max)) / 2, the closed form PyTorch documents.
class CosineLr final : public LrSchedule {
 public:
  CosineLr(double base_lr, int64_t t_max, double eta_min = 0.0);
  double lr_at(int64_t step) const override;

 private:
  double base_;
  int64_t t_max_;
  double eta_min_;
};

// LinearLR(start_factor, end_factor=1, total_iters=warmup_steps) for the first warmup_steps
// steps, then `main` counted from 0 at the end of warm-up (SequentialLR's milestone behaviour).
class WarmupLr final : public LrSchedule {
 public:
  WarmupLr(double base_lr, int64_t warmup_steps, double start_factor,
           std::shared_ptr<const LrSchedule> main);
  double lr_at(int64_t step) const override;

 private:
  double base_;
  int64_t warmup_;
  double start_factor_;
  std::shared_ptr<const LrSchedule> main_;
};

// Builds "constant" | "step" | "multistep" | "cosine" with optional warm-up, as ringgrad-train's
// flags describe: step_size/milestones/t_max in the same unit as `step`.
std::shared_ptr<const LrSchedule> make_schedule(const std::string& kind, double base_lr,
                                                int64_t total_steps, int64_t warmup_steps,
                                                double warmup_start_factor = 0.1,
                                                int64_t step_size = 30,
                                                std::vector<int64_t> milestones = {},
                                                double gamma = 0.1);

}  // namespace rg::optim
