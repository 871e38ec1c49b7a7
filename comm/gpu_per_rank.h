// One GPU per NCCL rank: every rank's GPU (UUID, index, host) exchanged through the store before
// NCCL is called, and the one-line error that names the ranks sharing a GPU.
#pragma once

#include <string>
#include <vector>

#include "comm/store.h"

namespace rg::dist {

struct RankGpu {
  std::string uuid;      // as nvidia-smi prints it: "GPU-52fa1c0e-..."
  int device = 0;        // the index this rank uses (cuda:N)
  int device_count = 0;  // the GPUs this rank sees
  std::string host;
};

// "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" from the 16 bytes of a cudaUUID_t.
std::string format_gpu_uuid(const char* bytes16);

// Publishes `mine` under `key_prefix`/<rank> and returns every rank's, in rank order. A rank that
// does not publish within `timeout` is named in the rg::Error.
std::vector<RankGpu> exchange_rank_gpus(Store& store, const std::string& key_prefix, int rank,
                                        int size, const RankGpu& mine, Millis timeout);

// Exchanges the GPUs (exchange_rank_gpus) and, when ranks share one, throws shared_gpu_error's
// message on every rank. Rank 0, which may host the store, throws only after every rank has read
// the table (or `timeout`), so that all of them fail with that message and none with a lost store.
void check_one_gpu_per_rank(Store& store, const std::string& key_prefix, int rank, int size,
                            const RankGpu& mine, Millis timeout);

// "" when no two ranks share a GPU (same UUID); otherwise one line naming every group of ranks
// that do and saying what to do: "ranks 0 and 1 both use GPU 0 (GPU-52fa...): NCCL needs one GPU
// per rank; start at most 1 rank per node (--nproc-per-node) or use --backend gloo".
std::string shared_gpu_error(const std::vector<RankGpu>& gpus);

}  // namespace rg::dist
