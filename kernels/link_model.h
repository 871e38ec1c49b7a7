// The flat link model of one all-reduce, shared by the simulated link (comm/sim_link.h,
// ringgrad-bench overlap --sim-link and scale --sim-link) and the emulated NCCL's link
// (RG_EMU_NCCL_LINK, kernels/emu/nccl.cpp): a ring among n ranks sends 2(n-1)/n of the buffer
// over each rank's link, after a fixed start-up latency.
#pragma once

namespace rg {

// Microseconds for one all-reduce of `bytes` among n ranks over links of `gbps` GB/s (1e9 bytes
// per second) with `latency_us` per collective; 0 for a single rank (nothing to exchange).
inline double ring_link_allreduce_us(double bytes, int n, double gbps, double latency_us) {
  if (n <= 1) return 0;
  return latency_us + 2.0 * (n - 1) / n * bytes / (gbps * 1e3);
}

}  // namespace rg
