// The test programs' malloc policy, set first thing in their main(): glibc keeps freed heap memory
// instead of giving it back to the kernel. The tests compare whole models by copying them into
// std::vectors (to_vector, 90 MB for an f64 ResNet-18), and by default glibc maps each such block
// afresh and unmaps it when freed (its mmap threshold only adapts up to a point, and the top of
// the heap is trimmed), so every comparison faulted its pages in again: measured on the 2-core
// VM, the 3-rank SyncBatchNorm ResNet-18 test took 16.5-18.1 s (9-11 s of it system time) by
// default and 8.7-8.9 s with this; the whole suite (ctest -j2) 790 -> 739 s. Tensors never go
// through malloc for their big blocks (the CPU allocator maps and caches those itself,
// engine/storage.cpp), so what the tests check is unchanged. Programs users run keep glibc's
// defaults.
#pragma once

#include <malloc.h>

#include <cstdio>
#include <cstdlib>

// Defined only in programs linked with AddressSanitizer (this main is compiled once, without it).
extern "C" void __asan_init() __attribute__((weak));

namespace rg::testing {

inline void keep_freed_heap() {
  if (&__asan_init != nullptr) return;  // ASan's own allocator serves malloc (and refuses mallopt)
  // Both at once: setting either turns off glibc's moving thresholds. Blocks up to 1 GiB come from
  // the heap (the collectives' tests copy 64 MiB); glibc before 2.35 accepts at most 32 MiB.
  const bool mmap_set =
      mallopt(M_MMAP_THRESHOLD, 1 << 30) == 1 || mallopt(M_MMAP_THRESHOLD, 32 << 20) == 1;
  if (!mmap_set || mallopt(M_TRIM_THRESHOLD, 1 << 30) != 1) {
    std::fprintf(stderr, "keep_freed_heap: mallopt refused the thresholds\n");
    std::abort();
  }
}

}  // namespace rg::testing
