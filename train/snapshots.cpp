// Snapshots, checkpoints and resume: the run shape check, the position, rank-0 saves.
#include "train/snapshots.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <charconv>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <sstream>

#include "comm/reducer_snapshot.h"
#include "kernels/error.h"
#include "train/distributed.h"

namespace rg::train {

int64_t metadata_count(const nn::Metadata& saved, const std::string& key,
                       const std::string& where) {
  const auto it = saved.find(key);
  RG_CHECK(it != saved.end() && !it->second.empty() &&
               it->second.find_first_not_of("0123456789") == std::string::npos &&
               it->second.size() < 16,
           where, ": the checkpoint's ", key, " entry is missing or not a count");
  return std::stoll(it->second);
}

Snapshots::Snapshots(const SnapshotOptions& options, RunShape shape, dist::ProcessGroup* pg)
    : options_(options), shape_(std::move(shape)), pg_(pg), world_(pg ? pg->size() : 1) {
  // A snapshot that exists is where this run continues (a restarted identical command).
  from_snapshot_ = !options.snapshot.empty() && std::filesystem::exists(options.snapshot);
  RG_CHECK(!from_snapshot_ || options.resume.empty(), "--resume ", options.resume,
           " and --snapshot ", options.snapshot,
           " (which exists) both say where to continue; give one");
  resume_path_ = from_snapshot_ ? options.snapshot : options.resume;
}

Resume Snapshots::load(
    nn::Module& model, optim::Optimizer* optimizer, amp::GradScaler* scaler, int64_t dataset_size,
    int64_t steps_per_epoch,
    const std::function<void(const nn::Metadata&, const std::string&)>& load_state) {
  RG_CHECK(options_.comm_hook != "powersgd" || from_snapshot_,
           "--resume with --comm-hook powersgd is not supported: epoch checkpoints do not carry "
           "PowerSGD's error feedback and factors (--snapshot files do)");
  Resume r;
  r.path = resume_path_;
  r.from_snapshot = from_snapshot_;
  r.saved_world = world_;
  const std::string where = (from_snapshot_ ? "--snapshot " : "--resume ") + resume_path_;
  const auto check = [&](const nn::Metadata& saved) {
    check_shape(saved, r);
    r.first_epoch = int(metadata_count(saved, "epoch", where)) + 1;
    r.step = metadata_count(saved, "step", where);
    read_position(saved, r, dataset_size, steps_per_epoch);
    if (load_state) load_state(saved, where);
    // A snapshot of a finished run: a restarted command has nothing left to do (the recipe's
    // loop would not run); --resume of one is a mistake worth saying.
    const int64_t max_steps = options_.max_steps;
    const bool finished =
        r.first_epoch > options_.epochs || (max_steps >= 0 && max_steps <= r.step);
    RG_CHECK(from_snapshot_ || r.first_epoch <= options_.epochs, where, ": the run is complete (",
             r.first_epoch - 1, " of ", options_.epochs, " epochs)");
    RG_CHECK(from_snapshot_ || max_steps < 0 || max_steps > r.step, where, ": --max-steps ",
             max_steps, " is not beyond the checkpoint's step ", r.step);
    r.finished = from_snapshot_ && finished;
  };
  r.metadata = nn::load_checkpoint(resume_path_, model, optimizer, scaler, check, &r.tensors);
  return r;
}

void Snapshots::check_shape(const nn::Metadata& saved, Resume& r) const {
  const std::string where = (from_snapshot_ ? "--snapshot " : "--resume ") + resume_path_;
  // Keys added after the first checkpoints: one that is missing was the default.
  const std::map<std::string, std::string> added_later = {
      {"loss", "cross-entropy"},    {"clip_grad", "norm=0 value=0"}, {"sync_bn", "0"},
      {"channels_last", "0"},       {"model.dropout", "1"},          {"model.tie_weights", "0"},
      {"optimizer.groups", "auto"}, {"optimizer.betas", "0.9,0.999"}};
  const auto saved_world_entry = saved.find("run.world_size");
  if (saved_world_entry != saved.end())
    r.saved_world = int(std::strtol(saved_world_entry->second.c_str(), nullptr, 10));
  RG_CHECK(r.saved_world >= 1, where, ": the checkpoint's world size '", saved_world_entry->second,
           "' is not a count");
  for (const auto& [key, value] : shape_) {
    // Another world size resumes too (the rest of the epoch is re-split), and changes the steps
    // per epoch.
    if (r.saved_world != world_ && (key == "world_size" || key == "steps_per_epoch")) continue;
    const auto it = saved.find("run." + key);
    const auto later = added_later.find(key);
    const bool was_default =
        it == saved.end() && later != added_later.end() && later->second == value;
    RG_CHECK(was_default || (it != saved.end() && it->second == value), where,
             ": the checkpoint's ", key, " is ",
             it == saved.end() ? "missing" : "'" + it->second + "'", ", this run's is '", value,
             "' (resuming continues the same run)");
  }
}

void Snapshots::read_position(const nn::Metadata& saved, Resume& r, int64_t dataset_size,
                              int64_t steps_per_epoch) const {
  const std::string where = (from_snapshot_ ? "--snapshot " : "--resume ") + resume_path_;
  const auto number = [&](const char* key) { return metadata_count(saved, key, where); };
  if (saved.count("snapshot.epoch_steps")) {  // taken mid-epoch: continue that epoch
    r.epoch_steps = number("snapshot.epoch_steps");
    r.samples = number("snapshot.samples");
    r.loss_sum = std::strtod(saved.at("snapshot.loss_sum").c_str(), nullptr);
    // Snapshots before re-splitting existed held full steps of the sampler's layout only.
    r.consumed = saved.count("snapshot.epoch_consumed")
                     ? number("snapshot.epoch_consumed")
                     : r.epoch_steps * options_.batch_size * r.saved_world;
    if (saved.count("snapshot.resplit_from")) r.resplit_from = number("snapshot.resplit_from");
    RG_CHECK(r.epoch_steps > 0 && r.consumed > 0 && r.consumed < dataset_size &&
                 r.resplit_from < r.consumed,
             where, ": the snapshot's position (", r.epoch_steps, " steps, ", r.consumed,
             " samples) is not inside an epoch of ", dataset_size, " samples");
    RG_CHECK(r.saved_world != world_ || r.resplit_from >= 0 || r.epoch_steps < steps_per_epoch,
             where, ": the snapshot's position ", r.epoch_steps, " is not inside an epoch of ",
             steps_per_epoch, " steps");
  }
  if (const auto order = saved.find("snapshot.bucket_order");
      order != saved.end() && !order->second.empty()) {
    std::stringstream in(order->second);
    for (std::string item; std::getline(in, item, ',');) {
      int64_t bucket = -1;
      const auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), bucket);
      RG_CHECK(ec == std::errc() && end == item.data() + item.size() && bucket >= 0, where,
               ": the snapshot's bucket order holds '", item, "', not a bucket index");
      r.bucket_order.push_back(bucket);
    }
  }
}

void Snapshots::save(const std::string& path, int epoch, int64_t step, nn::Module& model,
                     const optim::Optimizer* optimizer, const amp::GradScaler* scaler,
                     const nn::Metadata& extra, const std::string& what,
                     const NamedTensors& tensors) const {
  const int rank = pg_ ? pg_->rank() : 0;
  std::string error;
  if (rank == 0) {
    nn::Metadata meta;
    for (const auto& [key, value] : shape_) meta["run." + key] = value;
    meta["epoch"] = std::to_string(epoch);
    meta["step"] = std::to_string(step);
    meta.insert(extra.begin(), extra.end());
    try {
      nn::save_checkpoint(path, model, optimizer, scaler, meta, tensors);
    } catch (const Error& e) {
      error = e.what();
    }
  }
  std::vector<double> failed = {error.empty() ? 0.0 : 1.0};
  sum_over_ranks(pg_, failed);
  RG_CHECK(failed[0] == 0.0, "--", what, ": ",
           rank == 0 ? error : fmt::format("rank 0 could not save the {}", what));
}

void Snapshots::snapshot_state(const std::optional<EpochPosition>& position,
                               dist::DistributedDataParallel* ddp, nn::Metadata& meta,
                               NamedTensors& tensors) const {
  if (position) {
    meta["snapshot.epoch_steps"] = std::to_string(position->epoch_steps);
    meta["snapshot.epoch_consumed"] = std::to_string(position->consumed);
    if (position->resplit_from >= 0)
      meta["snapshot.resplit_from"] = std::to_string(position->resplit_from);
    meta["snapshot.samples"] = fmt::format("{}", position->samples);
    meta["snapshot.loss_sum"] = fmt::format("{}", position->loss_sum);  // shortest exact form
  }
  if (ddp) {
    meta["snapshot.bucket_order"] =
        fmt::format("{}", fmt::join(ddp->reducer().rebuilt_order(), ","));
    dist::ReducerSnapshot reducer_state = dist::snapshot_reducer(ddp->reducer(), *pg_);
    meta.insert(reducer_state.metadata.begin(), reducer_state.metadata.end());
    tensors = std::move(reducer_state.tensors);
  }
}

}  // namespace rg::train
