// DataParallel: scatter, replicate, parallel apply, gather; gradients reduced into the module.
#include "layers/data_parallel.h"

#include <algorithm>
#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

#include "engine/autocast.h"
#include "engine/autograd/function.h"
#include "engine/autograd/grad_mode.h"
#include "engine/ops/binary.h"
#include "kernels/error.h"

namespace rg::nn {

std::vector<Tensor> scatter(const Tensor& input, const std::vector<Device>& devices) {
  RG_CHECK(input.defined() && input.dim() >= 1, "DataParallel: the input must have a batch dim");
  RG_CHECK(!devices.empty(), "DataParallel: no devices");
  const int64_t rows = input.size(0), n = int64_t(devices.size());
  const int64_t chunk = (rows + n - 1) / n;
  std::vector<Tensor> parts;
  for (int64_t k = 0; k < n && k * chunk < rows; ++k) {
    const int64_t len = std::min(chunk, rows - k * chunk);
    parts.push_back(input.narrow(0, k * chunk, len).to(devices[size_t(k)]));
  }
  return parts;
}

Tensor gather(const std::vector<Tensor>& parts, Device device) {
  RG_CHECK(!parts.empty(), "gather: no parts");
  const Tensor& first = parts[0];
  Shape shape = first.shape();
  RG_CHECK(!shape.empty(), "gather: the parts must have a dim 0");
  int64_t rows = 0;
  for (const Tensor& p : parts) {
    RG_CHECK(p.defined() && p.dtype() == first.dtype() && p.dim() == first.dim() &&
                 std::equal(p.shape().begin() + 1, p.shape().end(), shape.begin() + 1),
             "gather: part ", shape_str(p.shape()), " ", dtype_name(p.dtype()),
             " does not fit part 0's ", shape_str(shape), " ", dtype_name(first.dtype()));
    rows += p.size(0);
  }
  shape[0] = rows;
  Tensor out = Tensor::empty(shape, first.dtype(), device);
  // Where each part's rows are, and where its gradient goes.
  std::vector<int64_t> offsets, counts;
  std::vector<Device> sources;
  {
    NoGradGuard no_grad;
    int64_t off = 0;
    for (const Tensor& p : parts) {
      out.narrow(0, off, p.size(0)).copy_(p);
      offsets.push_back(off);
      counts.push_back(p.size(0));
      sources.push_back(p.device());
      off += p.size(0);
    }
  }
  if (!is_floating(first.dtype())) return out;
  return autograd::record(out, "GatherBackward", std::span<const Tensor>(parts),
                          [offsets, counts, sources](const Tensor& g) {
                            std::vector<Tensor> grads;
                            for (size_t k = 0; k < offsets.size(); ++k)
                              grads.push_back(g.narrow(0, offsets[k], counts[k]).to(sources[k]));
                            return grads;
                          });
}

// One thread per further replica, each waiting for its part of a forward: run(task) gives every
// thread task(k) with k = 1, 2, ... (its replica), and returns when all are done.
class DataParallel::Workers {
 public:
  explicit Workers(size_t n) : done_(n) {
    for (size_t k = 1; k <= n; ++k) threads_.emplace_back([this, k] { loop(k); });
  }
  ~Workers() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    wake_.notify_all();
    for (std::thread& t : threads_) t.join();
  }
  // Starts task(k) on thread k; wait() returns once every thread has finished it.
  void start(const std::function<void(size_t)>& task) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      task_ = &task;
      std::fill(done_.begin(), done_.end(), false);
      ++round_;
    }
    wake_.notify_all();
  }
  void wait() {
    std::unique_lock<std::mutex> lock(mu_);
    finished_.wait(
        lock, [this] { return std::all_of(done_.begin(), done_.end(), [](bool d) { return d; }); });
    task_ = nullptr;
  }

 private:
  void loop(size_t k) {
    uint64_t seen = 0;
    for (;;) {
      const std::function<void(size_t)>* task = nullptr;
      {
        std::unique_lock<std::mutex> lock(mu_);
        wake_.wait(lock, [&] { return stop_ || round_ != seen; });
        if (stop_) return;
        seen = round_;
        task = task_;
      }
      (*task)(k);  // catches its own exceptions (DataParallel::forward's run)
      {
        std::lock_guard<std::mutex> lock(mu_);
        done_[k - 1] = true;
      }
      finished_.notify_all();
    }
  }

  std::mutex mu_;
  std::condition_variable wake_, finished_;
  const std::function<void(size_t)>* task_ = nullptr;
  uint64_t round_ = 0;
  std::vector<bool> done_;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

DataParallel::~DataParallel() = default;

DataParallel::DataParallel(std::shared_ptr<Module> module, std::vector<Device> devices,
                           const ReplicaFactory& make_replica)
    : module_(std::move(module)), devices_(std::move(devices)) {
  RG_CHECK(module_ != nullptr, "DataParallel: module is null");
  RG_CHECK(!devices_.empty(), "DataParallel: no devices");
  for (size_t i = 0; i < devices_.size(); ++i)
    for (size_t j = 0; j < i; ++j)
      RG_CHECK(!(devices_[i] == devices_[j]), "DataParallel: device ", devices_[i].str(),
               " is given twice");
  const NamedTensors params = module_->named_parameters(), buffers = module_->named_buffers();
  for (const auto& [name, t] : params)
    RG_CHECK(t.device() == devices_[0], "DataParallel: parameter '", name, "' is on ",
             t.device().str(), ", not on the first device ", devices_[0].str());
  replicas_.push_back(module_);
  for (size_t k = 1; k < devices_.size(); ++k) {
    RG_CHECK(make_replica != nullptr, "DataParallel: a replica factory is needed for ",
             devices_.size(), " devices");
    std::shared_ptr<Module> r = make_replica();
    RG_CHECK(r != nullptr, "DataParallel: the replica factory returned null");
    r->to(devices_[k]);
    const NamedTensors rp = r->named_parameters(), rb = r->named_buffers();
    const auto same = [&](const NamedTensors& a, const NamedTensors& b, const char* what) {
      RG_CHECK(a.size() == b.size(), "DataParallel: the replica for ", devices_[k].str(), " has ",
               b.size(), " ", what, ", the module ", a.size());
      for (size_t i = 0; i < a.size(); ++i)
        RG_CHECK(a[i].first == b[i].first && a[i].second.shape() == b[i].second.shape() &&
                     a[i].second.dtype() == b[i].second.dtype(),
                 "DataParallel: the replica's ", what, " '", b[i].first, "' ",
                 shape_str(b[i].second.shape()), " does not match the module's '", a[i].first, "' ",
                 shape_str(a[i].second.shape()));
    };
    same(params, rp, "parameters");
    same(buffers, rb, "buffers");
    {  // The replica lies in memory as the module does (Module::to(MemoryFormat)), so that
       // replicate() copies and the gradients come back without layout conversions.
      NoGradGuard no_grad;
      for (const auto* pair : {&params, &buffers}) {
        const NamedTensors& mine = pair == &params ? rp : rb;
        for (size_t i = 0; i < mine.size(); ++i) {
          const MemoryFormat f = (*pair)[i].second.memory_format();
          if (mine[i].second.memory_format() != f)
            assign_in_place(mine[i].second, mine[i].second.detach().contiguous(f));
        }
      }
    }
    // Backward: each replica gradient is added into the module's parameter on the first device
    // as soon as it is accumulated, and the replica's own is dropped for the next iteration.
    for (size_t i = 0; i < rp.size(); ++i) {
      rp[i].second.register_post_accumulate_grad_hook([target = params[i].second](Tensor& p) {
        const Tensor g = p.grad();
        if (!g.defined()) return;
        Tensor here = g.to(target.device());  // a new tensor: the devices differ
        Tensor existing = target.grad();
        if (existing.defined()) {
          add_(existing, here);
        } else {
          target.set_grad(here);
        }
        p.set_grad(Tensor());
      });
    }
    replicas_.push_back(std::move(r));
  }
  if (devices_.size() > 1) workers_ = std::make_unique<Workers>(devices_.size() - 1);
}

void DataParallel::replicate() {
  NoGradGuard no_grad;
  const NamedTensors params = module_->named_parameters(), buffers = module_->named_buffers();
  for (size_t k = 1; k < replicas_.size(); ++k) {
    Module& r = *replicas_[k];
    r.train(module_->is_training());
    NamedTensors rp = r.named_parameters(), rb = r.named_buffers();
    for (size_t i = 0; i < rp.size(); ++i) rp[i].second.copy_(params[i].second);
    for (size_t i = 0; i < rb.size(); ++i) rb[i].second.copy_(buffers[i].second);
  }
}

Tensor DataParallel::forward(const Tensor& input) {
  replicate();
  const std::vector<Tensor> parts = scatter(input, devices_);
  const size_t n = parts.size();
  std::vector<Tensor> outputs(n);
  std::vector<std::exception_ptr> errors(n);
  // Each thread runs its replica under the caller's grad mode and autocast state (both are per
  // thread), as PyTorch's parallel_apply does.
  const bool grad = GradMode::is_enabled();
  const bool cast_cuda = autocast_enabled(DeviceType::cuda),
             cast_cpu = autocast_enabled(DeviceType::cpu);
  const DType cuda_dtype = autocast_dtype(DeviceType::cuda),
              cpu_dtype = autocast_dtype(DeviceType::cpu);
  const std::function<void(size_t)> run = [&](size_t k) {
    try {
      GradMode::set_enabled(grad);
      AutocastGuard cuda_cast(DeviceType::cuda, cuda_dtype, cast_cuda);
      AutocastGuard cpu_cast(DeviceType::cpu, cpu_dtype, cast_cpu);
      outputs[k] = replicas_[k]->forward(parts[k]);
    } catch (...) {
      errors[k] = std::current_exception();
    }
  };
  // Fewer parts than devices (a batch smaller than the device count): the threads without a part
  // have nothing to do.
  const std::function<void(size_t)> part = [&](size_t k) {
    if (k < n) run(k);
  };
  if (workers_ != nullptr) workers_->start(part);
  {
    const bool caller_grad = GradMode::is_enabled();
    run(0);
    GradMode::set_enabled(caller_grad);
  }
  if (workers_ != nullptr) workers_->wait();
  for (size_t k = 0; k < n; ++k) {
    if (!errors[k]) continue;
    try {
      std::rethrow_exception(errors[k]);
    } catch (const std::exception& e) {
      RG_FAIL("DataParallel: the replica on ", devices_[k].str(), " failed: ", e.what());
    }
  }
  return gather(outputs, devices_[0]);
}

}  // namespace rg::nn
