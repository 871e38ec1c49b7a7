// The key and the cache of cuDNN's convolution algorithm choices (kernels/cuda/conv2d.cu), kept
// free of cuDNN so that tests can check them without a GPU: one entry per distinct configuration
// (device, pass, geometry, groups, dtype, layout, math and the algorithm policy that chose it),
// shared by every thread.
#pragma once

#include <compare>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>

#include "kernels/conv2d.h"

namespace rg::kernels {

// Everything an algorithm choice depends on. groups is constant today (Conv2d is groups = 1);
// it is in the key so that adding it cannot reuse a choice made for another value. layout is the
// cuDNN tensor format (NCHW, or NHWC for channels last). deterministic and benchmark are the policy (kernels/algorithm_policy.h)
// in force when the choice was made: turning either on or off chooses again.
struct ConvAlgoKey {
  int device = 0;
  int pass = 0;  // the cuDNN pass: forward, backward data, backward weight
  int64_t n = 0, c = 0, h = 0, w = 0, o = 0, kh = 0, kw = 0;
  int64_t sh = 0, sw = 0, ph = 0, pw = 0, dh = 0, dw = 0;
  int64_t groups = 1;
  int dtype = 0;   // cudnnDataType_t
  int layout = 0;  // cudnnTensorFormat_t
  bool allow_tf32 = false;
  bool deterministic = false;
  bool benchmark = false;
  // The graph API's plans: the byte alignment its tensors declare (0 for the legacy API).
  int64_t alignment = 0;
  // The most workspace the choice may take; 0: kMaxConvWorkspaceBytes.
  int64_t workspace_limit = 0;
  auto operator<=>(const ConvAlgoKey&) const = default;
};

inline ConvAlgoKey conv_algo_key(int device, int pass, const Conv2dGeometry& g, int dtype,
                                 int layout, bool allow_tf32, bool deterministic, bool benchmark) {
  return ConvAlgoKey{device, pass, g.n,   g.c,    g.h,        g.w,           g.o,
                     g.kh,   g.kw, g.sh,  g.sw,   g.ph,       g.pw,          g.dh,
                     g.dw,   1,    dtype, layout, allow_tf32, deterministic, benchmark, 0, 0};
}

// A thread-safe map from key to choice. get_or_choose runs `choose` outside the lock (timing the
// candidates takes milliseconds and must not block other configurations); when two threads choose
// the same key at once, the first stored choice wins and both return it, so every caller of a key
// sees one choice for the life of the cache.
template <class Choice>
class ConvAlgoCache {
 public:
  std::optional<Choice> find(const ConvAlgoKey& key) const {
    std::lock_guard<std::mutex> lock(mu_);
    const auto it = map_.find(key);
    if (it == map_.end()) return std::nullopt;
    return it->second;
  }
  template <class Fn>
  Choice get_or_choose(const ConvAlgoKey& key, Fn&& choose) {
    if (auto hit = find(key)) return *hit;
    Choice chosen = choose();
    std::lock_guard<std::mutex> lock(mu_);
    return map_.try_emplace(key, chosen).first->second;
  }
  size_t size() const {
    std::lock_guard<std::mutex> lock(mu_);
    return map_.size();
  }

 private:
  mutable std::mutex mu_;
  std::map<ConvAlgoKey, Choice> map_;
};

}  // namespace rg::kernels
