// DataParallel as torch.nn.DataParallel: one process drives several devices. Each forward
// scatters the batch along dim 0 over the devices, brings every replica's parameters and buffers
// up to date from the module on the first device (a broadcast), runs the replicas on one thread
// per device (the caller's for the first; for each other one a thread kept for the object's
// life, so that what ops cache per thread, cuDNN's plans and descriptors, is built once rather
// than every forward as with a new thread each time), and gathers the outputs on the first device.
// In backward, each replica's gradients are added into the module's parameters on the first device,
// so the optimizer steps the module alone, as with one device and the whole batch.
//
// Differences from PyTorch's, and why: replicas are built once (by the given factory: a Module
// cannot copy itself) and refreshed every forward instead of being rebuilt; the reduction into
// the first device runs from each replica parameter's post-accumulate-grad hook rather than a
// Broadcast node's backward, which adds the same gradients. As in PyTorch, the first replica is
// the module itself, so its buffer updates (batch-norm statistics) are kept and the others'
// are not, and batch norm normalizes each device's chunk on its own.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "layers/module.h"

namespace rg::nn {

// Splits `input` along dim 0 into at most devices.size() chunks as torch.chunk (ceil(B / n) rows
// each, the last smaller; fewer chunks when B < n), chunk k moved to devices[k].
std::vector<Tensor> scatter(const Tensor& input, const std::vector<Device>& devices);

// Concatenates `parts` (equal trailing shapes and dtypes, any devices) along dim 0 on `device`.
// Differentiable: each part gets its slice of the gradient, on its own device.
Tensor gather(const std::vector<Tensor>& parts, Device device);

class DataParallel {
 public:
  using ReplicaFactory = std::function<std::shared_ptr<Module>()>;

  // `module` must be on devices[0]; `make_replica` builds a module of the same structure (the
  // same parameter and buffer names and shapes), called once per further device.
  DataParallel(std::shared_ptr<Module> module, std::vector<Device> devices,
               const ReplicaFactory& make_replica);
  ~DataParallel();
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  // Scatter, replicate, run the replicas in parallel, gather on devices[0].
  Tensor forward(const Tensor& input);

  Module& module() { return *module_; }
  const std::vector<Device>& devices() const { return devices_; }

 private:
  void replicate();

  class Workers;  // the threads of replicas 1, 2, ...

  std::shared_ptr<Module> module_;
  std::vector<Device> devices_;
  std::vector<std::shared_ptr<Module>> replicas_;  // replicas_[0] is module_
  std::unique_ptr<Workers> workers_;
};

}  // namespace rg::nn
