// PowerSGD gradient compression (Vogels et al. 2019, as PyTorch's powerSGD_hook): each bucket
// matrix M (a parameter's gradient viewed as [shape[0], rest]) is sent as two thin factors:
// P = M Q is all-reduced and orthonormalized, then Q = M^T P is all-reduced, and M ~ P Q^T.
// Vectors (and matrices too small to gain) go uncompressed with the P's. Error feedback adds
// what compression lost last time to this time's gradient; warm start reuses last Q. As in
// PyTorch, the error is kept in units of this rank's own gradient: local gradient + error minus
// the global average's approximation, so the errors of all ranks sum to what was lost.
#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include "engine/tensor.h"

namespace rg::dist {

struct PowerSgdOptions {
  int rank = 1;                     // matrix approximation rank
  int64_t start_iter = 10;          // plain all-reduce before (PyTorch needs > 1: buckets rebuild)
  double min_compression_rate = 2;  // compress only when n*m >= rate * (n + m) * rank
  bool error_feedback = true;
  bool warm_start = true;
  uint64_t seed = 0;  // initial Q, identical on every rank
};

class PowerSgd {
 public:
  // The buckets it sees hold gradient / world_size (DDP's pre-scaled average).
  PowerSgd(PowerSgdOptions options, int world_size) : opt_(options), world_(world_size) {}
  const PowerSgdOptions& options() const { return opt_; }

  // Phase 1, when bucket `id` is full: `flat` (f32) holds the bucket, parameter shapes in bucket
  // order. Applies error feedback and returns what to all-reduce: the uncompressed values
  // followed by every P.
  Tensor begin(size_t id, const Tensor& flat, const std::vector<Shape>& shapes);
  // Phase 2, given phase 1's all-reduced tensor: orthonormalizes the P's and returns the Q's
  // (M^T P, from this rank's `flat`) to all-reduce.
  Tensor middle(size_t id, const Tensor& flat, const Tensor& reduced_p);
  // Phase 3, given the all-reduced Q's: writes the approximation into `flat` and keeps the error.
  void finish(size_t id, const Tensor& flat, const Tensor& reduced_q);
  // Bucket layout changed: forget errors and Q's (restored ones too: they belong to the old
  // layout).
  void reset() {
    buckets_.clear();
    restored_.clear();
  }

  // What PowerSGD carries from one iteration to the next, per bucket it has compressed: this
  // rank's error feedback (different on every rank) and the Q factors back to back (all-reduced,
  // so the same on every rank). The p's are scratch within an iteration.
  struct BucketState {
    Tensor error, q;
  };
  using State = std::map<size_t, BucketState>;
  // Copies of the current state, on the buckets' device.
  State state() const;
  // Continues from `state` (as state() gave, on any device) instead of zero errors and random
  // Q's: each bucket takes its entry the next time begin() sees it, after checking that the
  // sizes fit its layout (a clear error otherwise). An undefined error starts at zero: a snapshot
  // of another world size keeps its Q's (warm start) but cannot map its ranks' errors to ours.
  // Load after the buckets have their final layout: reset() forgets what is not taken yet.
  void load_state(State state);

 private:
  struct Entry {
    int64_t offset = 0, numel = 0, n = 0, m = 0, r = 0;  // r = 0: uncompressed
  };
  struct Bucket {
    std::vector<Entry> entries;
    int64_t uncompressed = 0, p_total = 0, q_total = 0;
    Tensor error, q, p, reduced_p;  // q, p: the factors back to back
  };
  PowerSgdOptions opt_;
  int world_;
  std::map<size_t, Bucket> buckets_;
  State restored_;  // load_state's entries, until begin() lays their bucket out
};

}  // namespace rg::dist
