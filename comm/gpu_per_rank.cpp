// The store exchange of every rank's GPU and the message for ranks that share one
// (comm/gpu_per_rank.h); plain C++, so that the message is tested without a CUDA build.
#include "comm/gpu_per_rank.h"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <map>
#include <set>
#include <sstream>

#include "kernels/error.h"

namespace rg::dist {
namespace {

std::string key_of(const std::string& prefix, int rank) {
  return prefix + "/" + std::to_string(rank);
}

std::string encode(const RankGpu& g) {
  return detail::cat(g.uuid, "\n", g.device, "\n", g.device_count, "\n", g.host);
}

RankGpu decode(const std::string& text, int rank) {
  std::istringstream in(text);
  RankGpu g;
  std::string device, count;
  const bool ok = std::getline(in, g.uuid) && std::getline(in, device) && std::getline(in, count) &&
                  std::getline(in, g.host);
  RG_CHECK(ok && !g.uuid.empty() && !device.empty() && !count.empty(), "nccl: rank ", rank,
           "'s GPU entry in the store is malformed");
  const auto number = [&](const std::string& t, int* out) {
    const auto [end, ec] = std::from_chars(t.data(), t.data() + t.size(), *out);
    RG_CHECK(ec == std::errc() && end == t.data() + t.size(), "nccl: rank ", rank,
             "'s GPU entry in the store is malformed");
  };
  number(device, &g.device);
  number(count, &g.device_count);
  return g;
}

// "0 and 1", "0, 1 and 2".
std::string and_list(const std::vector<int>& ranks) {
  std::string s;
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (i > 0) s += i + 1 == ranks.size() ? " and " : ", ";
    s += std::to_string(ranks[i]);
  }
  return s;
}

}  // namespace

std::string format_gpu_uuid(const char* bytes16) {
  std::string s = "GPU-";
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) s += '-';
    char hex[3];
    std::snprintf(hex, sizeof(hex), "%02x", unsigned(static_cast<unsigned char>(bytes16[i])));
    s += hex;
  }
  return s;
}

std::vector<RankGpu> exchange_rank_gpus(Store& store, const std::string& key_prefix, int rank,
                                        int size, const RankGpu& mine, Millis timeout) {
  store.set(key_of(key_prefix, rank), encode(mine));
  std::vector<std::string> keys;
  for (int r = 0; r < size; ++r) keys.push_back(key_of(key_prefix, r));
  try {
    store.wait(keys, timeout);
  } catch (const Error& e) {
    std::vector<int> missing;
    for (int r = 0; r < size; ++r)
      if (!store.check({keys[size_t(r)]})) missing.push_back(r);
    if (missing.empty()) throw;
    RG_FAIL("nccl: rank ", rank, " waited ", timeout.count(), " ms for the GPU of rank(s) ",
            and_list(missing), ", which never published it (did they start?): ", e.what());
  }
  std::vector<RankGpu> all;
  for (int r = 0; r < size; ++r)
    all.push_back(decode(to_string(store.get(keys[size_t(r)], timeout)), r));
  return all;
}

void check_one_gpu_per_rank(Store& store, const std::string& key_prefix, int rank, int size,
                            const RankGpu& mine, Millis timeout) {
  const std::string shared =
      shared_gpu_error(exchange_rank_gpus(store, key_prefix, rank, size, mine, timeout));
  if (shared.empty()) return;
  const std::string all_read = key_prefix + "/all_refused";
  if (store.add(key_prefix + "/refused", 1) == size) store.set(all_read, "1");
  if (rank == 0) {
    try {
      store.wait({all_read}, timeout);
    } catch (const Error&) {
      // A rank that died meanwhile must not keep this one from reporting.
    }
  }
  RG_FAIL(shared);
}

std::string shared_gpu_error(const std::vector<RankGpu>& gpus) {
  std::map<std::string, std::vector<int>> ranks_of;  // by UUID
  std::set<std::string> hosts;
  for (size_t r = 0; r < gpus.size(); ++r) {
    ranks_of[gpus[r].uuid].push_back(int(r));
    hosts.insert(gpus[r].host);
  }
  std::vector<std::vector<int>> shared;
  for (auto& [uuid, ranks] : ranks_of)
    if (ranks.size() > 1) shared.push_back(ranks);
  if (shared.empty()) return "";
  std::sort(shared.begin(), shared.end());  // by first rank
  std::string msg;
  int per_node = -1;  // the fewest GPUs a rank on a shared GPU sees
  for (const std::vector<int>& ranks : shared) {
    const RankGpu& first = gpus[size_t(ranks[0])];
    const bool same_index = std::all_of(
        ranks.begin(), ranks.end(), [&](int r) { return gpus[size_t(r)].device == first.device; });
    std::string gpu = same_index ? detail::cat("GPU ", first.device) : "one GPU";
    if (hosts.size() > 1) gpu += " of " + first.host;
    std::string where = first.uuid;
    if (!same_index) {
      where += ":";
      for (size_t i = 0; i < ranks.size(); ++i)
        where += detail::cat(i ? ", " : " ", "cuda:", gpus[size_t(ranks[i])].device, " on rank ",
                             ranks[i]);
    }
    if (!msg.empty()) msg += "; ";
    msg += detail::cat("ranks ", and_list(ranks), ranks.size() == 2 ? " both" : " all", " use ",
                       gpu, " (", where, ")");
    for (int r : ranks) {
      const int n = gpus[size_t(r)].device_count;
      if (per_node < 0 || n < per_node) per_node = n;
    }
  }
  per_node = std::max(per_node, 1);
  return detail::cat(msg, ": NCCL needs one GPU per rank; start at most ", per_node,
                     per_node == 1 ? " rank" : " ranks",
                     " per node (--nproc-per-node) or use --backend gloo");
}

}  // namespace rg::dist
