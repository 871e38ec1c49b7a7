// ProcessGroup's argument checks and names shared by the backends.
#include "comm/process_group.h"

#include "kernels/error.h"

namespace rg::dist {

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      return "sum";
    case ReduceOp::avg:
      return "avg";
    case ReduceOp::max:
      return "max";
    case ReduceOp::min:
      return "min";
  }
  return "?";
}

const char* algorithm_name(Algorithm a) {
  switch (a) {
    case Algorithm::native:
      return "native";
    case Algorithm::ring:
      return "ring";
    case Algorithm::shm:
      return "shm";
    case Algorithm::automatic:
      return "auto";
  }
  return "?";
}

Algorithm parse_algorithm(std::string_view name) {
  for (Algorithm a : {Algorithm::native, Algorithm::ring, Algorithm::shm, Algorithm::automatic})
    if (name == algorithm_name(a)) return a;
  RG_FAIL("unknown all-reduce algorithm '", name, "' (expected native, ring, shm or auto)");
}

Tensor on_group_device(const ProcessGroup& pg, const Tensor& t) {
  return t.device() == pg.tensor_device() ? t : t.to(pg.tensor_device());
}

ProcessGroup::ProcessGroup(int rank, int size, ProcessGroupOptions options)
    : rank_(rank), size_(size), options_(std::move(options)) {
  RG_CHECK(size >= 1, "process group size must be >= 1, got ", size);
  RG_CHECK(rank >= 0 && rank < size, "rank ", rank, " is outside the process group of size ", size);
  RG_CHECK(options_.timeout.count() > 0, "process group timeout must be positive");
  RG_CHECK(options_.ring_chunk_bytes >= 64, "ring_chunk_bytes must be >= 64");
}

void ProcessGroup::check_tensor(const Tensor& t, const char* op, const char* what) const {
  RG_CHECK(t.defined(), op, ": the ", what, " tensor is undefined");
  RG_CHECK(t.numel() == 0 || t.raw_data() != nullptr, op, ": the ", what, " tensor has no storage");
}

void ProcessGroup::check_rank(int r, const char* op, const char* what) const {
  RG_CHECK(r >= 0 && r < size_, op, ": ", what, " rank ", r, " is outside the group of size ",
           size_);
}

std::string ProcessGroup::describe(const std::string& op, uint64_t seq,
                                   const std::string& detail) const {
  return detail::cat(op, " #", seq, " (", detail, ") on rank ", rank_, " of ", size_);
}

}  // namespace rg::dist
