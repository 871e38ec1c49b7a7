// DistributedDataParallel: the cross-rank checks, the state broadcasts and the forward wrapper.
#include "comm/ddp.h"

#include "comm/init.h"
#include "engine/autograd/grad_mode.h"
#include "engine/ops/factory.h"
#include "kernels/error.h"

namespace rg::dist {
namespace {

constexpr int kMaxDims = 4;
constexpr int64_t kRecord = 4 + kMaxDims;  // dtype, ndim, numel, memory format, dims...

std::string describe(const int64_t* r) {
  std::string s = "[";
  for (int64_t d = 0; d < std::min<int64_t>(r[1], kMaxDims); ++d)
    s += (d ? ", " : "") + std::to_string(r[4 + d]);
  if (r[1] > kMaxDims) s += ", ...";
  s += "] ";
  s += dtype_name(DType(r[0]));
  // The layouts must agree too: buckets and broadcasts move memory as it lies.
  if (MemoryFormat(r[3]) != MemoryFormat::contiguous) {
    s += ' ';
    s += memory_format_name(MemoryFormat(r[3]));
  }
  return s;
}

}  // namespace

DistributedDataParallel::DistributedDataParallel(std::shared_ptr<nn::Module> module,
                                                 std::shared_ptr<ProcessGroup> pg,
                                                 DdpOptions options)
    : module_(std::move(module)), pg_(pg ? std::move(pg) : default_group()), options_(options) {
  RG_CHECK(module_ != nullptr, "DistributedDataParallel: module is null");
  check_module_device(module_->named_parameters(), *pg_);
  verify_parameter_shapes();
  broadcast_state(/*params=*/true, /*buffers=*/true);
  reducer_ = std::make_unique<Reducer>(module_->named_parameters(), pg_, options_);
}

void DistributedDataParallel::verify_parameter_shapes() {
  const auto named = module_->named_parameters();
  const int n = pg_->size();
  const Device dev = pg_->tensor_device();
  Tensor count = full({1}, double(named.size()), DType::i64, dev);
  Tensor counts = Tensor::empty({n}, DType::i64, dev);
  pg_->all_gather(counts, count)->wait();
  counts = counts.to(Device::cpu());
  for (int r = 0; r < n; ++r)
    RG_CHECK(counts.data<int64_t>()[r] == int64_t(named.size()), "DDP: rank ", r, " has ",
             counts.data<int64_t>()[r], " parameters but rank ", pg_->rank(), " has ", named.size(),
             "; every rank must build the same model");
  Tensor mine = zeros({int64_t(named.size()) * kRecord}, DType::i64);
  for (size_t i = 0; i < named.size(); ++i) {
    const Tensor& t = named[i].second;
    int64_t* rec = mine.data<int64_t>() + i * kRecord;
    rec[0] = int64_t(t.dtype());
    rec[1] = t.dim();
    rec[2] = t.numel();
    rec[3] = int64_t(t.memory_format());
    for (int64_t d = 0; d < std::min<int64_t>(t.dim(), kMaxDims); ++d) rec[4 + d] = t.size(d);
  }
  Tensor all = Tensor::empty({int64_t(n) * mine.numel()}, DType::i64, dev);
  pg_->all_gather(all, on_group_device(*pg_, mine))->wait();
  all = all.to(Device::cpu());
  // Every rank sees the same table, so every rank reports the same first mismatch.
  const int64_t* base = all.data<int64_t>();
  for (size_t i = 0; i < named.size(); ++i)
    for (int r = 1; r < n; ++r) {
      const int64_t* a = base + i * kRecord;
      const int64_t* b = base + size_t(r) * size_t(mine.numel()) + i * kRecord;
      RG_CHECK(std::equal(a, a + kRecord, b), "DDP: parameter ", i, " ('", named[i].first, "') is ",
               describe(a), " on rank 0 but ", describe(b), " on rank ", r,
               "; every rank must build the same model");
    }
}

void DistributedDataParallel::broadcast_state(bool params, bool buffers, int src) {
  NoGradGuard no_grad;
  std::vector<WorkPtr> works;
  if (params)
    for (auto& [name, t] : module_->named_parameters()) works.push_back(pg_->broadcast(t, src));
  if (buffers)
    for (auto& [name, t] : module_->named_buffers()) works.push_back(pg_->broadcast(t, src));
  for (auto& w : works) w->wait();
}

bool DistributedDataParallel::broadcasts_buffers() const {
  return options_.broadcast_buffers && module_->is_training() && pg_->size() > 1;
}

Tensor DistributedDataParallel::forward(const Tensor& x) {
  // First, before any collective of this forward: a previous backward that never finished
  // reduction ends here in the named error, its buckets sent so that no rank hangs.
  reducer_->finish_abandoned_iteration();
  const bool synchronized = sync_ && module_->is_training() && GradMode::is_enabled();
  int src = 0;
  if (join_) {
    // Under Join: tell the joined ranks that this iteration runs (and whether it synchronizes),
    // and average over the ranks that still have data.
    const JoinRound round = join_->notify(synchronized, reducer_->synced_iterations());
    src = round.authoritative();
    reducer_->set_divisor(join_->options().divide_by_initial_world_size ? pg_->size()
                                                                        : int(round.active.size()));
  }
  if (broadcasts_buffers()) broadcast_state(/*params=*/false, /*buffers=*/true, src);
  Tensor out = module_->forward(x);
  if (synchronized) reducer_->prepare_for_backward({out});
  return out;
}

void DistributedDataParallel::end_of_data() {
  RG_CHECK(join_ == nullptr,
           "DDP: end_of_data() inside a Join context (Join's finish() ends the data there)");
  // Nothing to do once a synchronized backward has ended every rank's data (its status is read one
  // iteration late: consume_all_ended reads it here); otherwise the collectives of one
  // synchronized forward and backward, in their order, flagged out of data, until the statuses
  // say that every rank's data has ended or the shadow iteration's finalize raises the error that
  // the other ranks raise at the same point.
  while (!reducer_->consume_all_ended()) {
    if (broadcasts_buffers()) broadcast_state(/*params=*/false, /*buffers=*/true);
    reducer_->end_of_data();
  }
}

void DistributedDataParallel::join_main_hook(const JoinRound& round) {
  reducer_->finish_abandoned_iteration();
  if (broadcasts_buffers())
    broadcast_state(/*params=*/false, /*buffers=*/true, round.authoritative());
  if (round.sync) reducer_->shadow_iteration(round.synced);
}

void DistributedDataParallel::join_post_hook(bool is_last_joiner) {
  // The last Join iteration's findings (read one iteration late) are raised here, where every rank
  // is, rather than at some later backward.
  reducer_->check_pending_status();
  // PyTorch's _sync_final_model: the highest rank among the last to join is the authority.
  Tensor t = full({1}, is_last_joiner ? double(pg_->rank()) : -1.0, DType::i64);
  Tensor on_group = on_group_device(*pg_, t);
  pg_->all_reduce(on_group, ReduceOp::max)->wait();
  const int src = int(on_group.to(Device::cpu()).data<int64_t>()[0]);
  broadcast_state(/*params=*/true, /*buffers=*/true, src);
}

void DistributedDataParallel::set_join(Join* join) {
  RG_CHECK(join == nullptr || &join->process_group() == pg_.get(),
           "Join: the context's process group is not DDP's");
  reducer_->set_join_active(join != nullptr);
  join_ = join;
}

}  // namespace rg::dist
