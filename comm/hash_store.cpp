// HashStore: a map under a mutex; blocking reads wait on a condition variable.
#include "comm/hash_store.h"

#include "kernels/error.h"

namespace rg::dist {

void HashStore::set(const std::string& key, const Bytes& value) {
  {
    std::lock_guard lock(mu_);
    data_[key] = value;
  }
  cv_.notify_all();
}

Bytes HashStore::get(const std::string& key, Millis timeout) {
  std::unique_lock lock(mu_);
  RG_CHECK(cv_.wait_for(lock, timeout, [&] { return data_.count(key) > 0; }), "store get('", key,
           "') timed out after ", timeout.count(), " ms");
  return data_.at(key);
}

int64_t HashStore::add(const std::string& key, int64_t delta) {
  int64_t v;
  {
    std::lock_guard lock(mu_);
    Bytes& value = data_[key];
    const std::optional<int64_t> current = value.empty() ? 0 : parse_store_int(value);
    RG_CHECK(current, "store add('", key, "'): the key holds a value that is not an integer");
    RG_CHECK(!__builtin_add_overflow(*current, delta, &v), "store add('", key,
             "') overflows a 64-bit integer");
    value = to_bytes(std::to_string(v));
  }
  cv_.notify_all();
  return v;
}

Bytes HashStore::compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) {
  Bytes result;
  {
    std::lock_guard lock(mu_);
    auto it = data_.find(key);
    if (it == data_.end()) {
      if (!expected.empty()) return expected;
      data_[key] = desired;
      result = desired;
    } else if (it->second == expected) {
      it->second = desired;
      result = desired;
    } else {
      return it->second;
    }
  }
  cv_.notify_all();
  return result;
}

void HashStore::wait(const std::vector<std::string>& keys, Millis timeout) {
  std::unique_lock lock(mu_);
  auto all = [&] {
    for (const auto& k : keys)
      if (!data_.count(k)) return false;
    return true;
  };
  if (cv_.wait_for(lock, timeout, all)) return;
  std::string missing;
  for (const auto& k : keys)
    if (!data_.count(k)) missing += (missing.empty() ? "'" : ", '") + k + "'";
  RG_FAIL("store wait timed out after ", timeout.count(), " ms; missing keys: ", missing);
}

bool HashStore::check(const std::vector<std::string>& keys) {
  std::lock_guard lock(mu_);
  for (const auto& k : keys)
    if (!data_.count(k)) return false;
  return true;
}

bool HashStore::delete_key(const std::string& key) {
  std::lock_guard lock(mu_);
  return data_.erase(key) > 0;
}

int64_t HashStore::num_keys() {
  std::lock_guard lock(mu_);
  return int64_t(data_.size());
}

}  // namespace rg::dist
