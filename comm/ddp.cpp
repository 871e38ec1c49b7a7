// DistributedDataParallel: the cross-rank checks, the state broadcasts and the forward wrapper.
#include "comm/ddp.h"

#include "comm/init.h"
#include "engine/autograd/grad_mode.h"
#include "engine/ops/factory.h"
#include "kernels/error.h"

namespace rg::dist {
namespace {

constexpr int kMaxDims = 4;
constexpr int64_t kRecord = 3 + kMaxDims;  // dtype, ndim, numel, dims...

std::string describe(const int64_t* r) {
  std::string s = "[";
  for (int64_t d = 0; d < std::min<int64_t>(r[1], kMaxDims); ++d)
    s += (d ? ", " : "") + std::to_string(r[3 + d]);
  if (r[1] > kMaxDims) s += ", ...";
  return s + "] " + dtype_name(DType(r[0]));
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
    for (int64_t d = 0; d < std::min<int64_t>(t.dim(), kMaxDims); ++d) rec[3 + d] = t.size(d);
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

void DistributedDataParallel::broadcast_state(bool params, bool buffers) {
  NoGradGuard no_grad;
  std::vector<WorkPtr> works;
  if (params)
    for (auto& [name, t] : module_->named_parameters()) works.push_back(pg_->broadcast(t, 0));
  if (buffers)
    for (auto& [name, t] : module_->named_buffers()) works.push_back(pg_->broadcast(t, 0));
  for (auto& w : works) w->wait();
}

Tensor DistributedDataParallel::forward(const Tensor& x) {
  // First, before any collective of this forward: a previous backward that never finished
  // reduction ends here in the named error, its buckets sent so that no rank hangs.
  reducer_->finish_abandoned_iteration();
  if (options_.broadcast_buffers && module_->is_training() && pg_->size() > 1)
    broadcast_state(/*params=*/false, /*buffers=*/true);
  Tensor out = module_->forward(x);
  if (sync_ && module_->is_training() && GradMode::is_enabled())
    reducer_->prepare_for_backward({out});
  return out;
}

}  // namespace rg::dist
