// Closed-form learning-rate schedules.
#include "layers/optim/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "kernels/error.h"

namespace rg::optim {

StepLr::StepLr(double base_lr, int64_t step_size, double gamma)
    : base_(base_lr), step_size_(step_size), gamma_(gamma) {
  RG_CHECK(step_size > 0, "StepLr: step_size must be positive, got ", step_size);
}
double StepLr::lr_at(int64_t step) const {
  return base_ * std::pow(gamma_, double(std::max<int64_t>(step, 0) / step_size_));
}

MultiStepLr::MultiStepLr(double base_lr, std::vector<int64_t> milestones, double gamma)
    : base_(base_lr), milestones_(std::move(milestones)), gamma_(gamma) {
  RG_CHECK(std::is_sorted(milestones_.begin(), milestones_.end()),
           "MultiStepLr: milestones must be increasing");
}
double MultiStepLr::lr_at(int64_t step) const {
  const auto passed = std::upper_bound(milestones_.begin(), milestones_.end(), step) -
                      milestones_.begin();
  return base_ * std::pow(gamma_, double(passed));
}

CosineLr::CosineLr(double base_lr, int64_t t_max, double eta_min)
    : base_(base_lr), t_max_(t_max), eta_min_(eta_min) {
  RG_CHECK(t_max > 0, "CosineLr: t_max must be positive, got ", t_max);
}
double CosineLr::lr_at(int64_t step) const {
  const double t = double(std::clamp<int64_t>(step, 0, t_max_));
  return eta_min_ + (base_ - eta_min_) * (1 + std::cos(std::numbers::pi * t / double(t_max_))) / 2;
}

WarmupLr::WarmupLr(double base_lr, int64_t warmup_steps, double start_factor,
                   std::shared_ptr<const LrSchedule> main)
    : base_(base_lr), warmup_(warmup_steps), start_factor_(start_factor), main_(std::move(main)) {
  RG_CHECK(warmup_steps >= 0, "WarmupLr: warmup_steps must be >= 0, got ", warmup_steps);
  RG_CHECK(start_factor > 0 && start_factor <= 1, "WarmupLr: start_factor must be in (0, 1], got ",
           start_factor);
  RG_CHECK(main_ != nullptr, "WarmupLr: the main schedule is missing");
}
double WarmupLr::lr_at(int64_t step) const {
  if (step >= warmup_) return main_->lr_at(step - warmup_);
  const double frac = double(std::max<int64_t>(step, 0)) / double(warmup_);
  return base_ * (start_factor_ + (1.0 - start_factor_) * frac);
}

std::shared_ptr<const LrSchedule> make_schedule(const std::string& kind, double base_lr,
                                                int64_t total_steps, int64_t warmup_steps,
                                                double warmup_start_factor, int64_t step_size,
                                                std::vector<int64_t> milestones, double gamma) {
  std::shared_ptr<const LrSchedule> main;
  if (kind == "constant") {
    main = std::make_shared<ConstantLr>(base_lr);
  } else if (kind == "step") {
    main = std::make_shared<StepLr>(base_lr, step_size, gamma);
  } else if (kind == "multistep") {
    main = std::make_shared<MultiStepLr>(base_lr, std::move(milestones), gamma);
  } else if (kind == "cosine") {
    main = std::make_shared<CosineLr>(base_lr, std::max<int64_t>(1, total_steps - warmup_steps));
  } else {
    RG_FAIL("unknown lr schedule '", kind, "' (expected constant, step, multistep or cosine)");
  }
  if (warmup_steps == 0) return main;
  return std::make_shared<WarmupLr>(base_lr, warmup_steps, warmup_start_factor, std::move(main));
}

}  // namespace rg::optim
