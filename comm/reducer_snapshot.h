// DDP's state between iterations in a training snapshot (ringgrad-train --snapshot), kept next to
// the model and optimizer in the same file (nn::save_checkpoint's extra tensors and metadata):
//   metadata "ddp.synced_iterations"       Reducer::synced_iterations (PowerSGD's start_iter
//                                           counts it)
//   metadata "powersgd.world_size", "powersgd.options"   with the powersgd comm hook
//   powersgd.bucket<k>.q                   the Q factors of bucket k (rank 0's; all-reduced, so
//                                           every rank's, else each differing rank's follows)
//   powersgd.rank<r>.bucket<k>.q           rank r's Q factors, only where they differ from rank 0's
//   powersgd.rank<r>.bucket<k>.error       rank r's error feedback of bucket k
// Every rank's errors are gathered to rank 0, the writer; on resume every rank reads the file and
// takes its own.
#pragma once

#include <map>
#include <ostream>
#include <string>

#include "comm/process_group.h"
#include "comm/reducer.h"

namespace rg::dist {

struct ReducerSnapshot {
  NamedTensors tensors;  // complete on rank 0; empty on the others
  std::map<std::string, std::string> metadata;
};

// Collective: every rank calls it at the same point of the run (the errors travel by all_gather).
ReducerSnapshot snapshot_reducer(const Reducer& reducer, ProcessGroup& pg);

// This rank's PowerSGD state out of a snapshot's tensors and metadata (those snapshot_reducer
// wrote; other tensors are ignored), for a job of `world` ranks. When the snapshot was taken at
// another world size the ranks' errors cannot be mapped: the Q's are kept (warm start), every
// error starts at zero, and `log` gets one line saying so. Damaged or mismatched entries (another
// PowerSGD configuration, a missing error) are errors.
PowerSgd::State powersgd_state_for_rank(const NamedTensors& tensors,
                                        const std::map<std::string, std::string>& metadata,
                                        const PowerSgdOptions& options, int rank, int world,
                                        std::ostream& log);

// Every rank, after the Reducer's restore_rebuilt_order: restores the synchronized-iteration count
// and, with the powersgd hook, this rank's PowerSGD state. A snapshot without these entries (an
// older one, or an epoch checkpoint) leaves the Reducer as it is, except that PowerSGD is then
// refused: its state is not there to continue from.
void restore_reducer(Reducer& reducer, const NamedTensors& tensors,
                     const std::map<std::string, std::string>& metadata, int rank, int world,
                     std::ostream& log);

}  // namespace rg::dist
