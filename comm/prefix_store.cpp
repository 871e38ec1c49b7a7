// PrefixStore forwards every call to its base store with "<prefix>/" prepended to the keys; the
// base store does the blocking and the error reporting (its messages show the full keys).
#include "comm/prefix_store.h"

#include <utility>

#include "kernels/error.h"

namespace rg::dist {

PrefixStore::PrefixStore(std::string prefix, std::shared_ptr<Store> base)
    : prefix_(std::move(prefix)), base_(std::move(base)) {
  RG_CHECK(base_ != nullptr, "PrefixStore('", prefix_, "'): base store is null");
  timeout_ = base_->timeout();
}

void PrefixStore::set(const std::string& k, const Bytes& value) { base_->set(key(k), value); }

Bytes PrefixStore::get(const std::string& k, Millis timeout) { return base_->get(key(k), timeout); }

int64_t PrefixStore::add(const std::string& k, int64_t delta) { return base_->add(key(k), delta); }

Bytes PrefixStore::compare_set(const std::string& k, const Bytes& expected, const Bytes& desired) {
  return base_->compare_set(key(k), expected, desired);
}

void PrefixStore::wait(const std::vector<std::string>& keys, Millis timeout) {
  std::vector<std::string> full;
  full.reserve(keys.size());
  for (const auto& k : keys) full.push_back(key(k));
  base_->wait(full, timeout);
}

bool PrefixStore::check(const std::vector<std::string>& keys) {
  std::vector<std::string> full;
  full.reserve(keys.size());
  for (const auto& k : keys) full.push_back(key(k));
  return base_->check(full);
}

bool PrefixStore::delete_key(const std::string& k) { return base_->delete_key(key(k)); }

int64_t PrefixStore::num_keys() { return base_->num_keys(); }

}  // namespace rg::dist
