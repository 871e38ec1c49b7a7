// The cuDNN convolution algorithm cache (kernels/conv_algo_cache.h) without cuDNN: the same
// configuration hits, a configuration that differs in any one field misses, and many threads
// choosing at once all get one choice per key, chosen no more often than there are racing threads.
#include "kernels/conv_algo_cache.h"

#include <gtest/gtest.h>

#include <atomic>
#include <functional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace rg::kernels {
namespace {

Conv2dGeometry geometry() {
  // n c h w, o kh kw, sh sw ph pw dh dw, ho wo
  return Conv2dGeometry{8, 3, 32, 32, 16, 3, 3, 1, 1, 1, 1, 1, 1, 32, 32};
}

ConvAlgoKey base_key() {
  return conv_algo_key(/*device=*/0, /*pass=*/1, geometry(), /*dtype=*/0, /*layout=*/0,
                       /*allow_tf32=*/true, /*deterministic=*/false, /*benchmark=*/true);
}

TEST(ConvAlgoCache, TheSameConfigurationHitsWithoutChoosingAgain) {
  ConvAlgoCache<int> cache;
  int chosen = 0;
  EXPECT_EQ(cache.get_or_choose(base_key(), [&] { return ++chosen, 7; }), 7);
  EXPECT_EQ(cache.get_or_choose(base_key(), [&] { return ++chosen, 8; }), 7);
  EXPECT_EQ(conv_algo_key(0, 1, geometry(), 0, 0, true, false, true), base_key());
  EXPECT_EQ(cache.get_or_choose(conv_algo_key(0, 1, geometry(), 0, 0, true, false, true),
                                [&] { return ++chosen, 9; }),
            7);
  EXPECT_EQ(chosen, 1);
  EXPECT_EQ(cache.size(), 1u);
  ASSERT_TRUE(cache.find(base_key()).has_value());
  EXPECT_EQ(*cache.find(base_key()), 7);
}

TEST(ConvAlgoCache, ADifferenceInAnyFieldMisses) {
  // One mutation per field of the key; each must be a new entry.
  const std::vector<std::pair<std::string, std::function<void(ConvAlgoKey&)>>> mutations = {
      {"device", [](ConvAlgoKey& k) { k.device = 1; }},
      {"pass", [](ConvAlgoKey& k) { k.pass = 2; }},
      {"n", [](ConvAlgoKey& k) { k.n = 9; }},
      {"c", [](ConvAlgoKey& k) { k.c = 4; }},
      {"h", [](ConvAlgoKey& k) { k.h = 31; }},
      {"w", [](ConvAlgoKey& k) { k.w = 31; }},
      {"o", [](ConvAlgoKey& k) { k.o = 17; }},
      {"kh", [](ConvAlgoKey& k) { k.kh = 5; }},
      {"kw", [](ConvAlgoKey& k) { k.kw = 5; }},
      {"sh", [](ConvAlgoKey& k) { k.sh = 2; }},
      {"sw", [](ConvAlgoKey& k) { k.sw = 2; }},
      {"ph", [](ConvAlgoKey& k) { k.ph = 0; }},
      {"pw", [](ConvAlgoKey& k) { k.pw = 0; }},
      {"dh", [](ConvAlgoKey& k) { k.dh = 2; }},
      {"dw", [](ConvAlgoKey& k) { k.dw = 2; }},
      {"groups", [](ConvAlgoKey& k) { k.groups = 2; }},
      {"dtype", [](ConvAlgoKey& k) { k.dtype = 2; }},
      {"layout", [](ConvAlgoKey& k) { k.layout = 1; }},
      {"allow_tf32", [](ConvAlgoKey& k) { k.allow_tf32 = false; }},
      {"deterministic", [](ConvAlgoKey& k) { k.deterministic = true; }},
      {"benchmark", [](ConvAlgoKey& k) { k.benchmark = false; }},
  };
  // Every field of ConvAlgoKey is mutated once: a field added there belongs here too.
  ConvAlgoCache<int> cache;
  cache.get_or_choose(base_key(), [] { return 0; });
  int value = 0;
  for (const auto& [field, mutate] : mutations) {
    ConvAlgoKey k = base_key();
    mutate(k);
    EXPECT_NE(k, base_key()) << field;
    EXPECT_FALSE(cache.find(k).has_value()) << field << ": a differing key hit";
    bool chose = false;
    ++value;
    EXPECT_EQ(cache.get_or_choose(k, [&] { return chose = true, value; }), value) << field;
    EXPECT_TRUE(chose) << field;
  }
  EXPECT_EQ(cache.size(), mutations.size() + 1);
  // The geometry's output size follows from the rest; the key is built from the geometry fields.
  Conv2dGeometry g = geometry();
  g.sh = 2;
  EXPECT_NE(conv_algo_key(0, 1, g, 0, 0, true, false, true), base_key());
}

TEST(ConvAlgoCache, ThreadsChoosingAtOnceAllGetOneChoicePerKey) {
  constexpr int kThreads = 8, kKeys = 16, kRounds = 200;
  ConvAlgoCache<int> cache;
  std::atomic<int> choices{0};
  std::vector<std::vector<int>> seen(kThreads, std::vector<int>(kKeys, -1));
  std::atomic<bool> mismatch{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int r = 0; r < kRounds; ++r) {
        const int k = (r * 7 + t) % kKeys;
        Conv2dGeometry g = geometry();
        g.n = 1 + k;
        // Each thread would choose a value of its own: only one may be stored per key.
        const int v = cache.get_or_choose(conv_algo_key(0, 0, g, 0, 0, false, false, true), [&] {
          ++choices;
          return t * 1000 + k;
        });
        if (v % 1000 != k) mismatch = true;
        if (seen[t][k] == -1) seen[t][k] = v;
        if (seen[t][k] != v) mismatch = true;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_FALSE(mismatch) << "a key returned different choices";
  EXPECT_EQ(cache.size(), size_t(kKeys));
  for (int k = 0; k < kKeys; ++k) {
    std::set<int> values;
    for (int t = 0; t < kThreads; ++t) values.insert(seen[t][k]);
    EXPECT_EQ(values.size(), 1u) << "key " << k;
  }
  EXPECT_GE(choices.load(), kKeys);
  EXPECT_LE(choices.load(), kKeys * kThreads);
}

}  // namespace
}  // namespace rg::kernels
