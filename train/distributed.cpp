// The distributed wiring: process group, device, SyncBatchNorm / DataParallel / DDP wrappers.
#include "train/distributed.h"

#include <fmt/format.h>

#include <ostream>

#include "comm/debug_level.h"
#include "comm/init.h"
#include "comm/sync_batch_norm.h"
#include "engine/cuda/runtime.h"
#include "engine/ops/factory.h"
#include "kernels/error.h"

namespace rg::train {

void sum_over_ranks(dist::ProcessGroup* pg, std::vector<double>& v) {
  if (!pg) return;
  Tensor t = dist::on_group_device(*pg, from_vector(v, {int64_t(v.size())}));
  pg->all_reduce(t)->wait();
  v = t.to_vector<double>();
}

Distributed::Distributed(const DistributedOptions& o, const std::string& device)
    : options_(o), device_(parse_device(device)) {
  const dist::LaunchEnv env = dist::read_launch_env();
  if (!o.debug.empty()) dist::set_debug_level(dist::parse_debug_level(o.debug));
  if (env.world_size > 1) {
    RG_CHECK(device_.is_cuda() || o.backend != "nccl",
             "--backend nccl reduces CUDA tensors: add --device cuda (or use --backend gloo)");
    RG_CHECK(!device_.is_cuda() || o.backend != "gloo",
             "--device cuda needs --backend nccl (or auto): gloo reduces CPU tensors");
    dist::InitOptions io;
    io.backend = device_.is_cuda() ? "nccl" : o.backend == "auto" ? "gloo" : o.backend;
    io.group.algorithm = dist::parse_algorithm(o.allreduce);
    io.init_method = o.init_method;
    io.group.timeout = dist::Millis(int64_t(o.timeout_s * 1000));
    pg_ = dist::is_initialized() ? dist::default_group() : dist::init_process_group(env, io);
  }
  const int world = this->world();
  // The mode asked for must be the one the launch gives: ddp needs ranks, dp and single one
  // process.
  RG_CHECK(o.mode != "ddp" || world > 1,
           "--mode ddp needs several ranks: start it with ringgrad-run --nproc-per-node N (or set "
           "the launch variables); one process is --mode single or dp");
  RG_CHECK(o.mode == "auto" || o.mode == "ddp" || world == 1, "--mode ", o.mode,
           " runs in one process, but this job has ", world, " ranks (use --mode ddp)");
  RG_CHECK(o.mode != "dp" || device_.is_cuda(),
           "--mode dp spreads the batch over CUDA devices: add --device cuda");
  // Under DDP "cuda" is the GPU the rank's NCCL group uses.
  if (pg_ && device_.is_cuda() && device == "cuda") device_ = pg_->tensor_device();
}

std::vector<Device> Distributed::devices() const {
  return dp_ ? dp_->devices() : std::vector<Device>{device_};
}

void Distributed::wrap(const std::shared_ptr<nn::Module>& model, int64_t batch_size, uint64_t seed,
                       const std::string& model_name, const std::string& name, std::ostream& out) {
  model_ = model;
  if (options_.sync_bn) wrap_sync_bn(*model, model_name, name, out);
  if (options_.mode == "dp") wrap_data_parallel(model, batch_size, name, out);
  if (pg_) wrap_ddp(model, seed);
}

// Before DDP wraps the model, as torch.nn.SyncBatchNorm.convert_sync_batchnorm; its collectives
// run on DDP's group, in issue order with the buckets' all-reduces.
void Distributed::wrap_sync_bn(nn::Module& model, const std::string& model_name,
                               const std::string& name, std::ostream& out) {
  if (!pg_) {
    out << name << ": --sync-bn with one process: plain batch norm\n";
  } else if (const int64_t n = dist::convert_sync_batchnorm(model, pg_); n == 0) {
    out << fmt::format(
        "{}: warning: --sync-bn: model {} has no batch norm, nothing "
        "to synchronize\n",
        name, model_name);
  } else {
    out << fmt::format(
        "{}: --sync-bn: {} batch norm layers synchronized over {} "
        "ranks\n",
        name, n, world());
  }
}

// --mode dp: one process, the batch scattered over several devices (torch.nn.DataParallel).
void Distributed::wrap_data_parallel(const std::shared_ptr<nn::Module>& model, int64_t batch_size,
                                     const std::string& name, std::ostream& out) {
  const int visible = cuda::runtime().device_count();
  const int n = options_.dp_devices > 0 ? options_.dp_devices : visible;
  RG_CHECK(n <= visible, "--dp-devices ", n, ": this process sees ", visible, " CUDA device",
           visible == 1 ? "" : "s");
  std::vector<Device> devices;
  for (int k = 0; k < n; ++k) devices.push_back(Device::cuda(k));
  RG_CHECK(device_ == devices[0], "--mode dp keeps the module on cuda:0 (got ", device_.str(), ")");
  RG_CHECK(bool(options_.make_replica), "--mode dp needs DistributedOptions::make_replica");
  dp_ = std::make_unique<nn::DataParallel>(model, devices, options_.make_replica);
  out << fmt::format("{}: DataParallel over {} devices (batch {} split along dim 0)\n", name, n,
                     batch_size);
}

void Distributed::wrap_ddp(const std::shared_ptr<nn::Module>& model, uint64_t seed) {
  dist::DdpOptions o;
  o.bucket_cap_mb = options_.bucket_cap_mb;
  o.first_bucket_mb = options_.first_bucket_mb;
  o.overlap = options_.overlap;
  o.comm_hook = dist::parse_comm_hook(options_.comm_hook);
  o.powersgd.rank = options_.powersgd_rank;
  o.powersgd.start_iter = options_.powersgd_start_iter;
  o.powersgd.seed = seed;
  o.find_unused_parameters = options_.find_unused_parameters;
  o.gradient_as_bucket_view = options_.gradient_as_bucket_view;
  o.static_graph = options_.static_graph;
  ddp_ = std::make_unique<dist::DistributedDataParallel>(model, pg_, o);
}

Tensor Distributed::forward(const Tensor& inputs) const {
  return ddp_ ? ddp_->forward(inputs) : dp_ ? dp_->forward(inputs) : model_->forward(inputs);
}

void Distributed::finish() {
  ddp_.reset();
  if (pg_ && pg_ == dist::default_group()) pg_->barrier()->wait();  // nobody leaves early
}

}  // namespace rg::train
