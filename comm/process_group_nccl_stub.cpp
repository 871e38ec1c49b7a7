// ProcessGroupNCCL in builds without CUDA: it cannot be created, and says why.
#include "comm/process_group_nccl.h"
#include "kernels/error.h"

namespace rg::dist {

bool nccl_available() { return false; }

struct ProcessGroupNCCL::Impl {};

ProcessGroupNCCL::ProcessGroupNCCL(std::shared_ptr<Store>, int rank, int size,
                                   ProcessGroupOptions options, int)
    : ProcessGroup(rank, size, std::move(options)) {
  RG_FAIL(
      "the nccl backend needs a CUDA build (ringgrad was built without CUDA: RG_CUDA=OFF or "
      "no nvcc); use --backend gloo");
}
ProcessGroupNCCL::~ProcessGroupNCCL() = default;
int ProcessGroupNCCL::device() const { return -1; }
WorkPtr ProcessGroupNCCL::all_reduce(const Tensor&, ReduceOp) { return nullptr; }
WorkPtr ProcessGroupNCCL::broadcast(const Tensor&, int) { return nullptr; }
WorkPtr ProcessGroupNCCL::all_gather(const Tensor&, const Tensor&) { return nullptr; }
WorkPtr ProcessGroupNCCL::reduce_scatter(const Tensor&, const Tensor&, ReduceOp) { return nullptr; }
WorkPtr ProcessGroupNCCL::barrier() { return nullptr; }
WorkPtr ProcessGroupNCCL::send(const Tensor&, int, uint32_t) { return nullptr; }
WorkPtr ProcessGroupNCCL::recv(const Tensor&, int, uint32_t) { return nullptr; }
WorkPtr ProcessGroupNCCL::modelled_all_reduce(const Tensor&, double) { return nullptr; }

}  // namespace rg::dist
