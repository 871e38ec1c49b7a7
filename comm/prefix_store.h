// PrefixStore: a view of another Store whose keys all carry "<prefix>/", so that process groups
// and restarts of the same job share one server without their keys colliding.
#pragma once

#include <memory>
#include <string>

#include "comm/store.h"

namespace rg::dist {

class PrefixStore : public Store {
 public:
  PrefixStore(std::string prefix, std::shared_ptr<Store> base);

  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key, Millis timeout) override;
  int64_t add(const std::string& key, int64_t delta) override;
  Bytes compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) override;
  void wait(const std::vector<std::string>& keys, Millis timeout) override;
  bool check(const std::vector<std::string>& keys) override;
  bool delete_key(const std::string& key) override;
  // Counts every key of the underlying store (as PyTorch's PrefixStore does).
  int64_t num_keys() override;
  using Store::get;
  using Store::set;
  using Store::wait;

  const std::shared_ptr<Store>& base() const { return base_; }

 private:
  std::string key(const std::string& k) const { return prefix_ + "/" + k; }
  std::string prefix_;
  std::shared_ptr<Store> base_;
};

}  // namespace rg::dist
