// Samplers and DataLoader: reproducible shuffles, epochs, drop_last, order independent of the
// number of workers, bounded prefetch, worker errors surfacing in order.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <set>

#include "data/dataloader.h"
#include "data/sampler.h"
#include "data/synthetic.h"
#include "kernels/error.h"
#include "support/errors.h"

namespace rg::data {
namespace {

// A dataset whose input is the sample index, that counts concurrent in-flight batches and can
// be told to fail on one index.
class IndexDataset final : public Dataset {
 public:
  explicit IndexDataset(int64_t n, int64_t fail_at = -1) : n_(n), fail_at_(fail_at) {}
  int64_t size() const override { return n_; }
  Shape sample_shape() const override { return {1}; }
  int64_t num_classes() const override { return 2; }
  Batch get_batch(std::span<const int64_t> idx, int64_t epoch) const override {
    ++calls;
    Batch b{Tensor::empty({int64_t(idx.size()), 1}),
            Tensor::empty({int64_t(idx.size())}, DType::i64),
            {}};
    for (size_t i = 0; i < idx.size(); ++i) {
      RG_CHECK(idx[i] != fail_at_, "IndexDataset: sample ", idx[i], " is broken");
      b.inputs.data<float>()[i] = float(idx[i]);
      b.targets.data<int64_t>()[i] = epoch;
    }
    return b;
  }
  mutable std::atomic<int> calls{0};

 private:
  int64_t n_, fail_at_;
};

std::vector<float> drain(DataLoader& loader, int64_t epoch, std::vector<int64_t>* sizes = nullptr) {
  loader.start_epoch(epoch);
  std::vector<float> all;
  while (auto b = loader.next()) {
    if (sizes) sizes->push_back(b->inputs.size(0));
    auto v = b->inputs.to_vector<float>();
    all.insert(all.end(), v.begin(), v.end());
  }
  return all;
}

TEST(Sampler, RandomIsAPermutationReproducibleAndChangesPerEpoch) {
  RandomSampler a(1000, 5), b(1000, 5);
  auto pa = a.indices();
  EXPECT_EQ(pa, b.indices());
  std::vector<int64_t> sorted = pa;
  std::sort(sorted.begin(), sorted.end());
  for (int64_t i = 0; i < 1000; ++i) ASSERT_EQ(sorted[size_t(i)], i);
  a.set_epoch(1);
  EXPECT_NE(pa, a.indices());
  EXPECT_NE(pa, RandomSampler(1000, 6).indices());
  EXPECT_EQ(SequentialSampler(3).indices(), (std::vector<int64_t>{0, 1, 2}));
}

TEST(DataLoader, OrderDoesNotDependOnWorkers) {
  auto ds = std::make_shared<IndexDataset>(103);
  std::vector<float> reference;
  for (int workers : {0, 1, 3, 8}) {
    DataLoader loader(ds, std::make_shared<RandomSampler>(103, 9),
                      DataLoaderOptions{.batch_size = 10, .workers = workers, .prefetch = 2});
    auto got = drain(loader, 4);
    if (reference.empty()) reference = got;
    EXPECT_EQ(got, reference) << workers << " workers";
  }
  EXPECT_EQ(reference.size(), 103u);
}

TEST(DataLoader, DropLastAndBatchSizes) {
  auto ds = std::make_shared<IndexDataset>(25);
  std::vector<int64_t> sizes;
  DataLoader keep(ds, std::make_shared<SequentialSampler>(25), {.batch_size = 10, .workers = 2});
  EXPECT_EQ(keep.num_batches(), 3);
  drain(keep, 0, &sizes);
  EXPECT_EQ(sizes, (std::vector<int64_t>{10, 10, 5}));
  sizes.clear();
  DataLoader drop(ds, std::make_shared<SequentialSampler>(25),
                  {.batch_size = 10, .drop_last = true, .workers = 2});
  EXPECT_EQ(drop.num_batches(), 2);
  drain(drop, 0, &sizes);
  EXPECT_EQ(sizes, (std::vector<int64_t>{10, 10}));
}

TEST(DataLoader, EpochsReshuffleAndRestart) {
  auto ds = std::make_shared<IndexDataset>(50);
  DataLoader loader(ds, std::make_shared<RandomSampler>(50, 1), {.batch_size = 7, .workers = 2});
  auto e0 = drain(loader, 0), e1 = drain(loader, 1), e0_again = drain(loader, 0);
  EXPECT_NE(e0, e1);
  EXPECT_EQ(e0, e0_again);
  // Abandoning an epoch halfway and starting another is fine.
  loader.start_epoch(2);
  ASSERT_TRUE(loader.next().has_value());
  EXPECT_EQ(drain(loader, 1), e1);
}

// Given batches of unequal sizes (a re-split epoch), from a first batch on, with any workers;
// every batch names its samples.
TEST(DataLoader, GivenBatchesOfUnequalSizes) {
  auto ds = std::make_shared<IndexDataset>(20);
  for (int workers : {0, 2}) {
    DataLoader loader(ds, std::make_shared<SequentialSampler>(20),
                      {.batch_size = 4, .workers = workers});
    RankBatches given;
    given.indices = {7, 3, 19, 4, 5, 0};
    given.bounds = {0, 2, 5, 6};
    loader.start_epoch(1, given, 1);
    EXPECT_EQ(loader.epoch_batches(), 3);
    auto b1 = loader.next(), b2 = loader.next();
    ASSERT_TRUE(b1 && b2);
    EXPECT_EQ(b1->indices, (std::vector<int64_t>{19, 4, 5}));
    EXPECT_EQ(b2->indices, (std::vector<int64_t>{0}));
    EXPECT_EQ(b1->inputs.data<float>()[0], 19.0f);
    EXPECT_FALSE(loader.next().has_value());
    // The sampler's epochs are back with the next plain start_epoch.
    loader.start_epoch(0);
    EXPECT_EQ(loader.epoch_batches(), 5);
    EXPECT_EQ(loader.next()->indices, (std::vector<int64_t>{0, 1, 2, 3}));
  }
  DataLoader loader(ds, std::make_shared<SequentialSampler>(20), {.batch_size = 4});
  RankBatches bad;
  bad.indices = {1, 2};
  bad.bounds = {0, 3};
  rg::testing::expect_error([&] { loader.start_epoch(0, bad); }, "do not partition");
}

TEST(DataLoader, PrefetchIsBounded) {
  auto ds = std::make_shared<IndexDataset>(1000);
  DataLoader loader(ds, std::make_shared<SequentialSampler>(1000),
                    {.batch_size = 10, .workers = 4, .prefetch = 3});
  loader.start_epoch(0);
  ASSERT_TRUE(loader.next().has_value());
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  // One consumed + at most `prefetch` ahead.
  EXPECT_LE(ds->calls.load(), 1 + 3);
}

TEST(DataLoader, WorkerErrorSurfacesAtItsBatch) {
  auto ds = std::make_shared<IndexDataset>(40, /*fail_at=*/25);
  DataLoader loader(ds, std::make_shared<SequentialSampler>(40), {.batch_size = 10, .workers = 3});
  loader.start_epoch(0);
  EXPECT_TRUE(loader.next().has_value());
  EXPECT_TRUE(loader.next().has_value());
  try {
    loader.next();
    FAIL() << "expected the broken sample's error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("sample 25 is broken"), std::string::npos);
  }
}

TEST(DataLoader, BadOptions) {
  auto ds = std::make_shared<IndexDataset>(4);
  auto s = std::make_shared<SequentialSampler>(4);
  EXPECT_THROW(DataLoader(ds, s, {.batch_size = 0}), Error);
  EXPECT_THROW(DataLoader(ds, s, {.workers = -1}), Error);
  EXPECT_THROW(DataLoader(ds, s, {.prefetch = 0}), Error);
}

TEST(SyntheticDataset, SamplesAreFunctionsOfTheirIndex) {
  SyntheticDataset ds(100, {3, 4, 4}, 10, 7);
  const std::vector<int64_t> a = {5, 17}, b = {17};
  Batch ba = ds.get_batch(a, 0), bb = ds.get_batch(b, 3);
  auto va = ba.inputs.to_vector<float>(), vb = bb.inputs.to_vector<float>();
  EXPECT_EQ(std::vector<float>(va.begin() + 48, va.end()), vb);
  EXPECT_EQ(ba.targets.to_vector<int64_t>()[1], bb.targets.to_vector<int64_t>()[0]);
  std::set<int64_t> labels;
  std::vector<int64_t> all(100);
  for (int i = 0; i < 100; ++i) all[size_t(i)] = i;
  for (int64_t y : ds.get_batch(all, 0).targets.to_vector<int64_t>()) {
    ASSERT_GE(y, 0);
    ASSERT_LT(y, 10);
    labels.insert(y);
  }
  EXPECT_GT(labels.size(), 5u);
}

}  // namespace
}  // namespace rg::data
