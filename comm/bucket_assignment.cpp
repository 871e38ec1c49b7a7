// assign_buckets: PyTorch's size-capped bucketing, one open bucket per key.
#include "comm/bucket_assignment.h"

#include <algorithm>
#include <map>

#include "kernels/error.h"

namespace rg::dist {

std::vector<std::vector<size_t>> assign_buckets(const BucketAssignmentInput& in) {
  RG_CHECK(in.bytes.size() == in.key.size(), "assign_buckets: bytes and key sizes differ");
  RG_CHECK(in.cap_bytes > 0, "bucket cap must be positive");
  struct Open {
    std::vector<size_t> params;
    size_t bytes = 0;
    bool first = true;  // the key's first bucket uses first_cap_bytes
    size_t last_pos = 0;
  };
  std::map<int, Open> open;
  // (position of the bucket's last parameter in `order`, bucket): sorting by it gives the
  // order in which buckets become full.
  std::vector<std::pair<size_t, std::vector<size_t>>> done;
  for (size_t pos = 0; pos < in.order.size(); ++pos) {
    const size_t p = in.order[pos];
    RG_CHECK(p < in.bytes.size(), "assign_buckets: parameter index ", p, " out of range");
    Open& b = open[in.key[p]];
    b.params.push_back(p);
    b.bytes += in.bytes[p];
    b.last_pos = pos;
    const size_t cap = b.first ? std::min(in.first_cap_bytes, in.cap_bytes) : in.cap_bytes;
    if (b.bytes >= cap) {
      done.emplace_back(pos, std::move(b.params));
      b.params.clear();
      b.bytes = 0;
      b.first = false;
    }
  }
  for (auto& [key, b] : open)
    if (!b.params.empty()) done.emplace_back(b.last_pos, std::move(b.params));
  std::stable_sort(done.begin(), done.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<std::vector<size_t>> out;
  for (auto& d : done) out.push_back(std::move(d.second));
  return out;
}

}  // namespace rg::dist
