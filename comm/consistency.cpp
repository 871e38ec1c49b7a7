// Cross-rank consistency checks: the tensor hash, the one all_gather and the error that names the
// first differing tensor and the ranks grouped by the hash they hold.
#include "comm/consistency.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstring>

#include "kernels/error.h"

namespace rg::dist {
namespace {

constexpr uint64_t kP1 = 0x9E3779B185EBCA87ULL, kP2 = 0xC2B2AE3D27D4EB4FULL,
                   kP3 = 0x165667B19E3779F9ULL, kP4 = 0x85EBCA77C2B2AE63ULL,
                   kP5 = 0x27D4EB2F165667C5ULL;

uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
uint64_t round(uint64_t acc, uint64_t word) { return rotl(acc + word * kP2, 31) * kP1; }
uint64_t merge(uint64_t acc, uint64_t lane) { return (acc ^ round(0, lane)) * kP1 + kP4; }
uint64_t word_at(const unsigned char* p) {
  uint64_t w;
  std::memcpy(&w, p, 8);
  return w;
}

// xxHash64's structure: four independent lanes over 32-byte blocks (so the multiplies pipeline),
// merged, then the tail and a final avalanche.
uint64_t hash_bytes(const void* data, size_t n, uint64_t seed) {
  const auto* p = static_cast<const unsigned char*>(data);
  const unsigned char* const end = p + n;
  uint64_t h;
  if (n >= 32) {
    uint64_t v1 = seed + kP1 + kP2, v2 = seed + kP2, v3 = seed, v4 = seed - kP1;
    for (; p + 32 <= end; p += 32) {
      v1 = round(v1, word_at(p));
      v2 = round(v2, word_at(p + 8));
      v3 = round(v3, word_at(p + 16));
      v4 = round(v4, word_at(p + 24));
    }
    h = rotl(v1, 1) + rotl(v2, 7) + rotl(v3, 12) + rotl(v4, 18);
    for (uint64_t v : {v1, v2, v3, v4}) h = merge(h, v);
  } else {
    h = seed + kP5;
  }
  h += uint64_t(n);
  for (; p + 8 <= end; p += 8) h = rotl(h ^ round(0, word_at(p)), 27) * kP1 + kP4;
  for (; p < end; ++p) h = rotl(h ^ (uint64_t(*p) * kP5), 11) * kP1;
  h ^= h >> 33;
  h *= kP2;
  h ^= h >> 29;
  h *= kP3;
  return h ^ (h >> 32);
}

std::string hex(uint64_t h) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%016" PRIx64, h);
  return buf;
}

// "rank 1" / "ranks 0, 2"
std::string ranks_text(const std::vector<int>& ranks) {
  std::string out = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) out += (i ? ", " : "") + std::to_string(ranks[i]);
  return out;
}

// The ranks grouped by the value they hold at `column`, in order of each group's first rank.
std::vector<std::pair<uint64_t, std::vector<int>>> holders(const std::vector<int64_t>& all,
                                                           size_t width, size_t column) {
  std::vector<std::pair<uint64_t, std::vector<int>>> groups;
  for (size_t r = 0; r * width < all.size(); ++r) {
    const auto v = uint64_t(all[r * width + column]);
    auto it =
        std::find_if(groups.begin(), groups.end(), [v](const auto& g) { return g.first == v; });
    if (it == groups.end()) it = groups.insert(groups.end(), {v, {}});
    it->second.push_back(int(r));
  }
  return groups;
}

std::string describe(const std::vector<std::pair<uint64_t, std::vector<int>>>& groups) {
  std::string out;
  for (const auto& [h, ranks] : groups)
    out += (out.empty() ? "" : "; ") + ranks_text(ranks) +
           (ranks.size() == 1 ? " has " : " have ") + hex(h);
  return out;
}

}  // namespace

uint64_t tensor_hash(const Tensor& t) {
  if (!t.defined()) return hash_bytes(nullptr, 0, 0);
  const Tensor host = t.device().is_cuda() ? t.to(Device::cpu()) : t;
  // dtype and shape seed the hash: equal bytes of another shape are another tensor.
  std::vector<int64_t> meta{int64_t(t.dtype())};
  for (int64_t d : t.shape()) meta.push_back(d);
  const uint64_t seed = hash_bytes(meta.data(), meta.size() * sizeof(int64_t), 0);
  return hash_bytes(host.raw_data(), host.nbytes(), seed);
}

void ConsistencyCheck::add(const NamedTensors& tensors) {
  for (const auto& [name, t] : tensors) {
    names_.push_back(name);
    hashes_.push_back(tensor_hash(t));
  }
}

void ConsistencyCheck::add_gradients(const NamedTensors& params) {
  for (const auto& [name, t] : params) {
    names_.push_back(name + ".grad");
    hashes_.push_back(tensor_hash(t.grad()));
  }
}

void ConsistencyCheck::run(ProcessGroup& pg, int64_t step) {
  // Column 0 hashes the names, so ranks that compare different lists say so instead of
  // reporting the tensors of two models as different values.
  std::string joined;
  for (const auto& n : names_) joined += n + '\n';
  const size_t width = hashes_.size() + 1;
  Tensor mine = Tensor::empty({int64_t(width)}, DType::i64);
  int64_t* m = mine.data<int64_t>();
  m[0] = int64_t(hash_bytes(joined.data(), joined.size(), uint64_t(width)));
  for (size_t i = 0; i < hashes_.size(); ++i) m[i + 1] = int64_t(hashes_[i]);
  Tensor all = Tensor::empty({int64_t(width) * pg.size()}, DType::i64, pg.tensor_device());
  pg.all_gather(all, on_group_device(pg, mine))->wait();
  const std::vector<int64_t> table = all.to(Device::cpu()).to_vector<int64_t>();
  const std::vector<std::string> names = std::move(names_);
  names_.clear();
  hashes_.clear();
  const auto lists = holders(table, width, 0);
  RG_CHECK(lists.size() == 1, "consistency check at step ", step,
           ": the ranks hash different lists of tensors (", describe(lists),
           " as the hash of the names); every rank must check the same model");
  size_t first = 0, differing = 0;
  for (size_t i = 1; i < width; ++i)
    if (holders(table, width, i).size() > 1 && differing++ == 0) first = i;
  RG_CHECK(differing == 0, "consistency check at step ", step, ": ", names[first - 1],
           " differs between ranks: ", describe(holders(table, width, first)), " (the first of ",
           differing, " differing among the ", names.size(),
           " tensors checked); the ranks' models have diverged");
}

}  // namespace rg::dist
