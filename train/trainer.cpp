// The Trainer: composes the parts and runs the loop, firing the callbacks' events.
#include "train/trainer.h"

#include <fmt/format.h>

#include <cmath>

#include "comm/reducer_snapshot.h"
#include "engine/autograd/grad_mode.h"
#include "engine/device_checks.h"
#include "kernels/error.h"
#include "layers/optim/optimizer.h"

namespace rg::train {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// The run's shape with the values only the trainer knows filled in (appended when absent).
RunShape filled_shape(RunShape shape, int world, int epochs, int64_t steps_per_epoch) {
  const std::pair<std::string, std::string> fills[] = {
      {"world_size", std::to_string(world)},
      {"epochs", std::to_string(epochs)},
      {"steps_per_epoch", std::to_string(steps_per_epoch)}};
  for (const auto& [key, value] : fills) {
    auto it = std::find_if(shape.begin(), shape.end(), [&](auto& e) { return e.first == key; });
    if (it == shape.end())
      shape.emplace_back(key, value);
    else
      it->second = value;
  }
  return shape;
}

}  // namespace

std::string best_checkpoint_path(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  const size_t dot = path.find_last_of('.');
  const bool has_ext =
      dot != std::string::npos && dot > 0 && (slash == std::string::npos || dot > slash + 1);
  return has_ext ? path.substr(0, dot) + ".best" + path.substr(dot) : path + ".best";
}

Trainer::Trainer(std::shared_ptr<nn::Module> model, std::shared_ptr<optim::Optimizer> optimizer,
                 std::shared_ptr<const data::Dataset> train_data, Options options)
    : options_(std::move(options)),
      out_(&silent_),
      model_(std::move(model)),
      optimizer_(std::move(optimizer)),
      distributed_(options_.distributed, options_.device),
      feeder_(train_data, distributed_.pg(),
              {.batch_size = options_.batch_size,
               .workers = options_.workers,
               .seed = options_.seed,
               .steps_per_epoch = options_.steps_per_epoch,
               .pin_memory = distributed_.device().is_cuda(),
               .memory_format = options_.channels_last ? MemoryFormat::channels_last
                                                       : MemoryFormat::contiguous}),
      step_(model_->parameters(), *optimizer_,
            {.grad_accum_steps = options_.grad_accum_steps,
             .clip_grad_norm = options_.clip_grad_norm,
             .clip_grad_value = options_.clip_grad_value,
             .amp = options_.amp,
             .loss = options_.loss},
            distributed_.device()) {
  RG_CHECK(options_.batch_size > 0, "--batch-size must be positive, got ", options_.batch_size);
  RG_CHECK(options_.eval_batch_size > 0, "--test-batch-size must be positive");
  RG_CHECK(options_.eval_every >= 0, "--eval-every must be >= 0");
  // Only rank 0 reports; the others write into a stream without a buffer (a no-op).
  if (options_.out && distributed_.rank() == 0) out_ = options_.out;
  model_->to(distributed_.device());
  if (options_.channels_last) model_->to(MemoryFormat::channels_last);
  model_->train();
  if (options_.eval_data)
    evaluator_.emplace(
        options_.eval_data, distributed_.pg(), distributed_.device(),
        EvaluatorOptions{.batch_size = options_.eval_batch_size,
                         .workers = options_.workers,
                         .max_samples = options_.eval_samples,
                         .on_rank0 = options_.eval_on_rank0,
                         .memory_format = options_.channels_last ? MemoryFormat::channels_last
                                                                 : MemoryFormat::contiguous});
  state_.model = model_.get();
  state_.optimizer = optimizer_.get();
  state_.pg = distributed_.pg();
  state_.rank = distributed_.rank();
  state_.world = distributed_.world();
  state_.device = distributed_.device();
  state_.steps_per_epoch = feeder_.steps_per_epoch();
  state_.dataset_size = feeder_.dataset_size();
  state_.result = &result_;
}

Trainer::~Trainer() = default;

void Trainer::add_callback(std::shared_ptr<Callback> callback) {
  user_callbacks_.add(std::move(callback));
}

TrainResult Trainer::fit(int epochs) {
  RG_CHECK(epochs > 0, "--epochs must be positive, got ", epochs);
  if (!prepare(epochs)) {
    result_.total_steps = state_.step;
    return result_;
  }
  // The ops' device-side input checks (cross_entropy's targets) are read without stalling: raised
  // at a later step or at the epoch's end, naming the step (unless the caller opened a scope).
  std::optional<DeferredChecks> checks;
  if (!DeferredChecks::current()) checks.emplace();
  fire([&](Callback& c) { c.on_train_start(state_); });
  const auto run_start = Clock::now();
  for (int epoch = state_.first_epoch; epoch <= epochs && state_.step < state_.planned_steps;
       ++epoch)
    if (!run_epoch(epoch)) break;
  result_.total_steps = state_.step;
  result_.total_seconds = seconds_since(run_start);
  finish();
  return result_;
}

// Resume, wrappers, the plan and the schedule; false when a snapshot says the run is done.
bool Trainer::prepare(int epochs) {
  state_.epochs = epochs;
  const RunShape shape =
      filled_shape(options_.run_shape, state_.world, epochs, feeder_.steps_per_epoch());
  snapshots_ =
      std::make_unique<Snapshots>(SnapshotOptions{.snapshot = options_.snapshot,
                                                  .checkpoint = options_.checkpoint,
                                                  .resume = options_.resume,
                                                  .name = options_.name,
                                                  .comm_hook = options_.distributed.comm_hook,
                                                  .snapshot_every = options_.snapshot_every,
                                                  .batch_size = options_.batch_size,
                                                  .max_steps = options_.max_steps,
                                                  .epochs = epochs},
                                  shape, distributed_.pg());
  add_builtin_callbacks();
  if (!snapshots_->resume_path().empty()) {
    resume_from_file();
    if (resume_.finished) return false;
  }
  continue_resplit();
  wrap_model();
  const int first = state_.first_epoch;
  const int64_t spe = feeder_.steps_per_epoch();
  const int64_t steps_left =
      feeder_.epoch_total(first) - resume_.epoch_steps + spe * int64_t(epochs - first);
  state_.planned_steps = options_.max_steps >= 0
                             ? std::min<int64_t>(options_.max_steps, state_.step + steps_left)
                             : state_.step + steps_left;
  if (options_.schedule) step_.set_schedule(options_.schedule(spe, epochs));
  state_.devices = distributed_.devices();
  return true;
}

void Trainer::add_builtin_callbacks() {
  std::ostream& out = *out_;
  if (options_.check_consistency > 0) {
    // Buffers follow each rank's own batch between DDP's broadcasts (running statistics) unless
    // SyncBatchNorm keeps them equal, so only then are they compared.
    const bool buffers = options_.distributed.sync_bn || model_->named_buffers().empty();
    builtin_callbacks_.add(std::make_shared<ConsistencyChecks>(options_.check_consistency, buffers,
                                                               options_.name, out));
  }
  if (options_.early_stop_patience > 0) {
    early_stopping_ = std::make_shared<EarlyStopping>(
        options_.early_stop_patience, options_.early_stop_metric, options_.name, out);
    if (!options_.checkpoint.empty())
      early_stopping_->set_best_path(best_checkpoint_path(options_.checkpoint));
    builtin_callbacks_.add(early_stopping_);
  }
  builtin_callbacks_.add(std::make_shared<ProgressReporter>(options_, out));
  builtin_callbacks_.add(std::make_shared<MetricsLog>(options_, state_.rank));
  if (!options_.trace.empty())
    builtin_callbacks_.add(
        std::make_shared<TraceRecorder>(options_.trace, options_.trace_steps, options_.name, out));
}

// Restored before DDP is built, so its broadcast from rank 0 sends the restored weights.
void Trainer::resume_from_file() {
  std::ostream& out = *out_;
  resume_ = snapshots_->load(*model_, optimizer_.get(), step_.scaler(), feeder_.dataset_size(),
                             feeder_.steps_per_epoch(),
                             [&](const nn::Metadata& saved, const std::string& where) {
                               fire([&](Callback& c) { c.load_state(saved, where); });
                             });
  state_.first_epoch = resume_.first_epoch;
  state_.step = resume_.step;
  if (resume_.finished) {
    out << fmt::format("{}: the snapshot {} is of a finished run (step {}); nothing left to do\n",
                       options_.name, resume_.path, resume_.step);
  } else if (resume_.epoch_steps > 0) {
    out << fmt::format("{}: resumed from {} in epoch {} after {} of its steps (step {})\n",
                       options_.name, resume_.path, resume_.first_epoch, resume_.epoch_steps,
                       resume_.step);
  } else {
    out << fmt::format("{}: resumed from {} after epoch {} (step {})\n", options_.name,
                       resume_.path, resume_.first_epoch - 1, resume_.step);
  }
}

// The rest of a mid-epoch snapshot's epoch at another world size: the samples of the epoch's
// order past what every rank had trained on, re-split over this run's ranks (each exactly once,
// every rank the same number of steps). A snapshot taken inside such an epoch at this world size
// rebuilds the same re-split and continues it, so restarts there are exact too.
void Trainer::continue_resplit() {
  std::ostream& out = *out_;
  const int world = state_.world, saved_world = resume_.saved_world;
  const int first = state_.first_epoch;
  if (resume_.epoch_steps > 0 && (saved_world != world || resume_.resplit_from >= 0)) {
    RG_CHECK(options_.steps_per_epoch == 0, "--snapshot ", resume_.path,
             ": resuming an epoch at another world size (", saved_world, " ranks, now ", world,
             ") re-splits the rest of the whole epoch, which --steps-per-epoch cuts short; resume "
             "at ",
             saved_world, " ranks or from an epoch end");
    const int64_t from = saved_world != world ? resume_.consumed : resume_.resplit_from;
    const int64_t steps = feeder_.resplit(first, from);
    resplit_epoch_ = first;
    if (saved_world != world) {
      resume_.epoch_steps = 0;
      const int64_t left = feeder_.dataset_size() - resume_.consumed;
      out << fmt::format(
          "{}: the snapshot is from {} ranks, this run has {}: the {} samples left of epoch {} "
          "are re-split into {} steps of {} to {} samples per rank\n",
          options_.name, saved_world, world, left, first, steps, left / (steps * world),
          (left + steps * world - 1) / (steps * world));
    }
    RG_CHECK(resume_.epoch_steps < steps, "--snapshot ", resume_.path, ": the snapshot's position ",
             resume_.epoch_steps, " is not inside the re-split epoch's ", steps, " steps");
  } else if (!resume_.path.empty() && saved_world != world) {
    out << fmt::format(
        "{}: the checkpoint is from {} ranks, this run has {}: {} steps per epoch from epoch {} "
        "on\n",
        options_.name, saved_world, world, feeder_.steps_per_epoch(), first);
  }
}

void Trainer::wrap_model() {
  distributed_.wrap(model_, options_.batch_size, options_.seed, options_.model_name, options_.name,
                    *out_);
  // On CUDA the next batch is copied while the current step runs (DataParallel scatters the host
  // batch itself).
  if (distributed_.device().is_cuda() && !distributed_.scatters_host_batch())
    feeder_.prefetch_to(distributed_.device());
  if (options_.cuda_graphs) make_graph_step();
  dist::DistributedDataParallel* ddp = distributed_.ddp();
  if (!ddp) return;
  // The buckets the interrupted run had rebuilt, so every all-reduce sums as it did there.
  const auto& d = options_.distributed;
  if (!resume_.bucket_order.empty() && (!d.find_unused_parameters || d.static_graph))
    ddp->reducer().restore_rebuilt_order(resume_.bucket_order);
  // Then what DDP carries between iterations (PowerSGD's errors and factors, the iteration
  // count), into those buckets.
  if (!resume_.path.empty())
    dist::restore_reducer(ddp->reducer(), resume_.tensors, resume_.metadata, state_.rank,
                          state_.world, *out_);
}

std::string cuda_graphs_refusal(const Options& o) {
  const DistributedOptions& d = o.distributed;
  if (!o.device.starts_with("cuda"))
    return "--cuda-graphs needs --device cuda (got " + o.device + ")";
  if (o.grad_accum_steps > 1)
    return "--cuda-graphs cannot be combined with --grad-accum-steps (one step, one replay)";
  if (d.mode == "dp")
    return "--cuda-graphs cannot be combined with --mode dp (DataParallel's replicas are not "
           "captured); use --mode ddp";
  if (d.sync_bn)
    return "--cuda-graphs cannot be combined with --sync-bn (SyncBatchNorm's forward copies the "
           "ranks' counts to the host, which a capture cannot do)";
  if (o.uneven_data)
    return "--cuda-graphs cannot be combined with --uneven-data (a rank out of data shadows the "
           "others' replayed collectives eagerly)";
  if (d.join)
    return "--cuda-graphs cannot be combined with --join (joined ranks shadow each iteration on "
           "the host)";
  if (d.comm_hook == "powersgd")
    return "--cuda-graphs cannot be combined with --comm-hook powersgd (its factors and error "
           "feedback are new tensors every iteration)";
  if (d.allreduce == "ring")
    return "--cuda-graphs cannot be combined with --allreduce ring (its receive buffer is "
           "allocated for the communication stream); use native";
  if (d.find_unused_parameters && !d.static_graph)
    return "--cuda-graphs with --find-unused-parameters needs --static-graph (otherwise the used "
           "parameters are all-reduced and read back every iteration)";
  return "";
}

// What a replayed step cannot do is refused here, by name; the rest GraphStep refuses.
void Trainer::make_graph_step() {
  const std::string refused = cuda_graphs_refusal(options_);
  RG_CHECK(refused.empty(), refused);
  RG_CHECK(!distributed_.scatters_host_batch(),
           "--cuda-graphs: DataParallel's replicas are not captured (use --mode ddp)");
  dist::DistributedDataParallel* ddp = distributed_.ddp();
  if (ddp) {
    const std::string why = ddp->reducer().not_capturable();
    RG_CHECK(why.empty(), "--cuda-graphs: ", why);
  }
  const auto* adam = dynamic_cast<const optim::Adam*>(optimizer_.get());
  RG_CHECK(options_.amp != "f16" || dynamic_cast<const optim::Sgd*>(optimizer_.get()) != nullptr ||
               (adam != nullptr && adam->counts_fit_on_device()),
           "--cuda-graphs with --amp f16 needs SGD, Adam or AdamW, whose overflowed steps the "
           "device skips without the host reading the flag (",
           optimizer_->name(),
           adam != nullptr ? " with these betas: its bias corrections take more than 2^20 steps to "
                             "reach 1, so its step counts stay on the host"
                           : " does not",
           "); use --amp bf16 or off");
  graph_step_ =
      std::make_unique<GraphStep>(*optimizer_, distributed_.device(), 2, options_.batch_size);
  // f16: captured once the GradScaler leaves the skip to the device (SGD's momentum buffers made).
  if (amp::GradScaler* scaler = step_.scaler())
    graph_step_->add_dependency(
        [scaler, opt = optimizer_.get()] { return scaler->decides_on_device(*opt); },
        [] { return uint64_t(0); });
  // DDP's iterations are captured with their collectives once its buckets are final.
  if (ddp)
    graph_step_->add_dependency([ddp] { return ddp->reducer().ready_to_capture(); },
                                [ddp] { return ddp->reducer().buckets_version(); });
}

void Trainer::begin_epoch(int epoch) {
  State& s = state_;
  // A snapshot taken mid-epoch continues that epoch where it stopped.
  const bool resumed_here = epoch == s.first_epoch && resume_.epoch_steps > 0;
  feeder_.start_epoch(epoch, resumed_here ? resume_.epoch_steps : 0);
  epoch_start_ = Clock::now();
  s.epoch = epoch;
  // The epoch's loss so far (all ranks' sum) goes to rank 0 and the epoch total stays right; it
  // is added in another order than without the interruption (last digits of the logged loss).
  s.epoch_loss_sum = resumed_here && s.rank == 0 ? resume_.loss_sum : 0;
  s.epoch_samples = resumed_here && s.rank == 0 ? resume_.samples : 0;
  s.epoch_loss_samples = s.epoch_samples;
  s.epoch_steps = resumed_here ? resume_.epoch_steps : 0;
  samples_before_ = s.epoch_samples;
  s.epoch_planned = std::min(feeder_.epoch_total(epoch), s.planned_steps - s.step + s.epoch_steps);
  // This rank's batches: all of them, or with uneven_data the last `rank` left out (at least
  // one kept).
  s.my_planned =
      options_.uneven_data && s.pg
          ? std::max<int64_t>(std::min<int64_t>(1, s.epoch_planned), s.epoch_planned - s.rank)
          : s.epoch_planned;
  s.joined = false;
  fire([&](Callback& c) { c.on_epoch_start(s); });
}

// One epoch: its steps (inside dist::Join with join on), evaluation, files; false: stop.
bool Trainer::run_epoch(int epoch) {
  begin_epoch(epoch);
  // Join: a rank that ran out shadows each remaining iteration of the others: DDP's collectives
  // (its joinable, first), then this loop's own (joined_step).
  std::unique_ptr<dist::CallbackJoinable> loop_joinable;
  std::optional<dist::Join> join;
  dist::DistributedDataParallel* ddp = distributed_.ddp();
  if (ddp && options_.distributed.join) {
    loop_joinable = std::make_unique<dist::CallbackJoinable>(
        [this](const dist::JoinRound& r) { joined_step(r); });
    join.emplace(std::vector<dist::Joinable*>{ddp, loop_joinable.get()}, distributed_.group());
  }
  join_ = join.has_value();
  while (state_.step < state_.planned_steps && state_.epoch_steps < state_.my_planned)
    if (!train_step()) break;
  collect_losses(/*wait=*/true);
  fire([&](Callback& c) { c.on_train_epoch_end(state_); });
  end_epoch_data(join);
  state_.summary = summarize(epoch);
  result_.epochs.push_back(state_.summary);
  fire([&](Callback& c) { c.on_eval_end(state_); });
  save_epoch_files(epoch);
  fire([&](Callback& c) { c.on_epoch_end(state_); });
  const bool stop = should_stop();
  if (stop) result_.stopped_early = true;
  if (state_.summary.evaluated) {
    result_.final_top1 = state_.summary.top1;
    result_.final_top5 = state_.summary.top5;
    result_.final_test_loss = state_.summary.test_loss;
  }
  return !stop;
}

// One step: the batch, forward and backward (the k-th of an accumulation window, or the epoch's
// last, synchronizes and steps the optimizer), then the events; false when the data ran out.
bool Trainer::train_step() {
  State& s = state_;
  if (DeferredChecks* checks = DeferredChecks::current()) {
    checks->poll();  // raises a failed check of an earlier step whose flag has arrived
    checks->set_context(fmt::format("training step {} of epoch {}", s.step + 1, s.epoch));
  }
  fire([&](Callback& c) { c.on_step_start(s); });
  std::optional<data::Batch> batch =
      feeder_.next(s.epoch_steps + 1 < s.my_planned && s.step + 1 < s.planned_steps);
  if (!batch) return false;
  s.batch = &*batch;
  fire([&](Callback& c) { c.on_batch(s); });
  const int accum = options_.grad_accum_steps;
  const int64_t micro = s.epoch_steps % accum;
  // Under Join every rank synchronizes at the same steps (Join needs the active ranks to agree),
  // so a rank that runs out inside an accumulation window drops that window's micro-batches;
  // without Join its last batch synchronizes.
  s.sync = micro + 1 == accum || s.epoch_steps + 1 == (join_ ? s.epoch_planned : s.my_planned);
  dist::DistributedDataParallel* ddp = distributed_.ddp();
  // Without Join DDP compares, in this backward's status element, whether every rank's data ends
  // here: a rank that runs out before the others is an error naming it on every rank.
  if (ddp && !join_ && s.sync &&
      (s.epoch_steps + 1 == s.my_planned || s.step + 1 == s.planned_steps))
    ddp->announce_last_iteration();
  if (micro == 0) {
    step_.set_lr(feeder_.schedule_step(s.epoch, s.epoch_steps));
    step_.zero_grad();
  }
  const auto forward = [this](const Tensor& x) { return distributed_.forward(x); };
  // With cuda_graphs the whole step (forward, backward, optimizer) is one GraphStep::run: a
  // replay, or after the warm-up and for short batches the same body eagerly.
  Tensor loss;
  if (graph_step_) {
    const Device device = distributed_.device();
    loss = graph_step_->run(
        [&](const Tensor& inputs, const Tensor& targets) {
          const Tensor l = step_.forward_backward(forward, data::Batch{inputs, targets, {}},
                                                  /*host_inputs=*/true, nullptr, true);
          step_.optimizer_step();
          return l;
        },
        batch_to_device(batch->inputs, device), batch_to_device(batch->targets, device),
        /*replayable=*/s.epoch != resplit_epoch_);
  } else {
    loss = step_.forward_backward(forward, *batch, distributed_.scatters_host_batch(), ddp, s.sync);
  }
  if (s.sync) {
    // With cuda_graphs the optimizer step has been queued already (the gradients are this step's).
    fire([&](Callback& c) { c.on_before_optimizer_step(s); });
    ++s.optimizer_steps;
    if (!graph_step_) step_.optimizer_step();
  }
  s.batch_samples = batch->targets.numel();
  s.epoch_samples += s.batch_samples;
  pending_losses_.push_back({AsyncScalar(loss), s.step, s.batch_samples});
  collect_losses(/*wait=*/false);
  ++s.step;
  ++s.epoch_steps;
  fire([&](Callback& c) { c.on_step_end(s); });
  s.batch = nullptr;
  // Mid-epoch snapshots on optimizer-step boundaries (the epoch's end has its own).
  if (!options_.snapshot.empty() && options_.snapshot_every > 0 && s.sync &&
      s.step % options_.snapshot_every == 0 && s.epoch_steps < feeder_.epoch_total(s.epoch) &&
      s.step < s.planned_steps)
    save_snapshot(s.epoch);
  return true;
}

// The losses that have arrived (all of them with `wait`, and the deferred checks then too):
// the epoch's sums, the divergence check naming the step.
void Trainer::collect_losses(bool wait) {
  State& s = state_;
  while (!pending_losses_.empty() && (wait || pending_losses_.front().loss.ready())) {
    const PendingLoss p = std::move(pending_losses_.front());
    pending_losses_.pop_front();
    const double l = p.loss.get();
    RG_CHECK(std::isfinite(l), "training diverged: loss is ", l, " at step ", p.step,
             " (try a lower --lr)");
    s.batch_loss = l;
    s.loss_step = p.step;
    s.epoch_loss_sum += l * double(p.samples);
    s.epoch_loss_samples += p.samples;
  }
  if (wait)
    if (DeferredChecks* checks = DeferredChecks::current()) checks->flush();
}

// A joined rank's shadow of the others' iteration: the same optimizer step on the averaged
// gradients its shadow all-reduce received (so parameters and optimizer state stay theirs) and
// the events (the progress output sends zeros for the loss sums at the same steps).
void Trainer::joined_step(const dist::JoinRound& r) {
  State& s = state_;
  if (s.epoch_steps % options_.grad_accum_steps == 0)
    step_.set_lr(feeder_.schedule_step(s.epoch, s.epoch_steps));
  if (r.sync) {
    ++s.optimizer_steps;
    step_.optimizer_step();
    step_.zero_grad();
  }
  ++s.step;
  ++s.epoch_steps;
  s.joined = true;
  s.sync = r.sync;
  s.batch_loss = 0;
  s.batch_samples = 0;
  fire([&](Callback& c) { c.on_step_end(s); });
}

void Trainer::end_epoch_data(std::optional<dist::Join>& join) {
  if (join) {
    // What it accumulated past its last optimizer step is not the others' (they zeroed theirs).
    step_.zero_grad();
    join->finish();
    join.reset();
  } else if (distributed_.ddp()) {
    distributed_.ddp()->end_of_data();  // a no-op when every rank announced its last batch
  }
  join_ = false;
  state_.joined = false;
}

// The epoch's summary over all ranks, with the evaluation when one is due.
EpochSummary Trainer::summarize(int epoch) {
  const State& st = state_;
  EpochSummary s;
  s.epoch = epoch;
  s.steps = st.epoch_steps;
  s.seconds = seconds_since(epoch_start_);
  std::vector<double> totals = {st.epoch_loss_sum, double(st.epoch_samples),
                                double(st.epoch_samples - samples_before_)};
  sum_over_ranks(st.pg, totals);
  s.train_loss = totals[1] > 0 ? totals[0] / totals[1] : 0;
  s.img_per_s = totals[2] / std::max(s.seconds, 1e-9);
  const bool last = epoch == st.epochs || st.step >= st.planned_steps;
  const int every = options_.eval_every;
  if (evaluator_ && ((every > 0 && epoch % every == 0) || last)) {
    fire([&](Callback& c) { c.on_eval_start(state_); });
    const auto amp_scope = step_.autocast();  // evaluated as trained
    DeferredChecks* checks = DeferredChecks::current();
    if (checks) checks->set_context(fmt::format("evaluation after epoch {}", epoch));
    const EvalResult e = evaluator_->evaluate(*model_, epoch);
    if (checks) checks->flush();  // the evaluation's own checks are raised with it
    s.evaluated = true;
    s.test_loss = e.loss;
    s.top1 = e.top1;
    s.top5 = e.top5;
  }
  return s;
}

void Trainer::save_epoch_files(int epoch) {
  const bool complete = state_.epoch_steps == feeder_.epoch_total(epoch);
  if (!options_.checkpoint.empty()) save_checkpoint(epoch, complete, options_.checkpoint);
  if (!options_.checkpoint.empty() && early_stopping_ && early_stopping_->improved())
    save_checkpoint(epoch, complete, best_checkpoint_path(options_.checkpoint));
  if (!options_.snapshot.empty()) save_snapshot(epoch);
}

void Trainer::save_checkpoint(int epoch, bool complete, const std::string& path) {
  std::ostream& out = *out_;
  if (!complete) {
    out << fmt::format(
        "epoch {} | no checkpoint: the epoch was cut short by --max-steps "
        "(checkpoints are taken at epoch ends)\n",
        epoch);
    return;
  }
  nn::Metadata meta;
  fire([&](Callback& c) { c.save_state(meta); });
  snapshots_->save(path, epoch, state_.step, *model_, optimizer_.get(), step_.scaler(), meta,
                   "checkpoint");
  out << fmt::format("epoch {} | checkpoint saved to {}\n", epoch, path);
  out.flush();
}

// A snapshot: as an epoch checkpoint, plus the position inside the epoch (when mid-epoch) and
// DDP's state. Every rank takes part, so they agree on the step it belongs to.
void Trainer::save_snapshot(int epoch) {
  const State& s = state_;
  nn::Metadata meta;
  fire([&](Callback& c) { c.save_state(meta); });
  const bool mid_epoch = s.epoch_steps < feeder_.epoch_total(epoch);
  collect_losses(/*wait=*/true);  // the snapshot holds the epoch's loss so far
  std::optional<EpochPosition> position;
  if (mid_epoch) {
    // The epoch's loss so far over all ranks; a resumed run hands it to rank 0.
    std::vector<double> totals = {s.epoch_loss_sum, double(s.epoch_samples)};
    sum_over_ranks(s.pg, totals);
    position =
        EpochPosition{.epoch_steps = s.epoch_steps,
                      .consumed = feeder_.consumed_after(epoch, s.epoch_steps),
                      .resplit_from = feeder_.resplit_epoch(epoch) ? feeder_.resplit_from() : -1,
                      .samples = int64_t(totals[1]),
                      .loss_sum = totals[0]};
  }
  NamedTensors tensors;
  snapshots_->snapshot_state(position, distributed_.ddp(), meta, tensors);  // collective
  fire([&](Callback& c) { c.on_snapshot(s); });
  // A write killed before its rename left its temporary file; this job is the path's only
  // writer, so whatever is there is such a leftover.
  if (s.rank == 0)
    if (const int n = remove_save_temporaries(options_.snapshot); n > 0)
      *out_ << fmt::format("{}: removed {} temporary file(s) of an unfinished write of {}\n",
                           options_.name, n, options_.snapshot);
  snapshots_->save(options_.snapshot, mid_epoch ? epoch - 1 : epoch, s.step, *model_,
                   optimizer_.get(), step_.scaler(), meta, "snapshot", tensors);
  out_->flush();
}

void Trainer::finish() {
  if (graph_step_) {
    result_.graph_captures = graph_step_->captures();
    result_.graph_replays = graph_step_->replays();
    result_.graph_eager_steps = graph_step_->eager_steps();
    *out_ << fmt::format("{}: CUDA graphs: {} capture(s), {} replayed steps, {} eager steps\n",
                         options_.name, result_.graph_captures, result_.graph_replays,
                         result_.graph_eager_steps);
  }
  if (early_stopping_) {
    result_.best_epoch = early_stopping_->best_epoch();
    result_.best_metric = early_stopping_->best_metric();
  }
  fire([&](Callback& c) { c.on_train_end(state_); });
  distributed_.finish();
}

}  // namespace rg::train
