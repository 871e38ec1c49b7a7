// The sample an op-table entry is timed on: the one with most input elements (the first of equals).
// bench/op_table_bench.cpp times it and tests/ops/ops_doc.cpp names it in docs/ops.md.
#pragma once

#include <cstdint>

#include "ops/op_table.h"

namespace rg::testing {

inline int64_t input_elements(const OpSample& s) {
  int64_t n = 0;
  for (const Tensor& t : s.inputs) n += t.defined() ? t.numel() : 0;
  return n;
}

inline OpSample largest_sample(const OpEntry& e) {
  std::vector<OpSample> samples = e.samples();
  size_t best = 0;
  for (size_t i = 1; i < samples.size(); ++i)
    if (input_elements(samples[i]) > input_elements(samples[best])) best = i;
  return samples.at(best);
}

}  // namespace rg::testing
