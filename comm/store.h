// Store: the small key-value service every rank of a job shares for rendezvous (process-group
// setup, NCCL ids, progress markers). Values are bytes; blocking reads take a timeout.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace rg::dist {

using Bytes = std::vector<uint8_t>;
using Millis = std::chrono::milliseconds;

Bytes to_bytes(std::string_view s);
std::string to_string(const Bytes& b);
// The integer add() keeps as decimal text; nullopt when `b` is not exactly one.
std::optional<int64_t> parse_store_int(const Bytes& b);

class Store {
 public:
  virtual ~Store() = default;

  // Default timeout of get() and wait() without an explicit one.
  Millis timeout() const { return timeout_; }
  void set_timeout(Millis t) { timeout_ = t; }

  virtual void set(const std::string& key, const Bytes& value) = 0;
  // Blocks until `key` exists, then returns its value; throws rg::Error naming the key after
  // `timeout`.
  virtual Bytes get(const std::string& key, Millis timeout) = 0;
  Bytes get(const std::string& key) { return get(key, timeout_); }
  // Atomically adds `delta` to the integer stored at `key` (created as 0; stored as decimal
  // text) and returns the new value.
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
  // PyTorch's semantics: if the key holds `expected` (or is absent and `expected` is empty),
  // stores `desired` and returns it; otherwise returns the current value (or `expected` when
  // the key is absent).
  virtual Bytes compare_set(const std::string& key, const Bytes& expected,
                            const Bytes& desired) = 0;
  // Blocks until every key exists; throws rg::Error naming the missing keys after `timeout`.
  virtual void wait(const std::vector<std::string>& keys, Millis timeout) = 0;
  void wait(const std::vector<std::string>& keys) { wait(keys, timeout_); }
  // True when every key exists (does not block).
  virtual bool check(const std::vector<std::string>& keys) = 0;
  // Returns whether the key existed.
  virtual bool delete_key(const std::string& key) = 0;
  virtual int64_t num_keys() = 0;

  void set(const std::string& key, std::string_view value) { set(key, to_bytes(value)); }
  std::string get_string(const std::string& key) { return to_string(get(key)); }

 protected:
  Millis timeout_ = std::chrono::seconds(300);
};

}  // namespace rg::dist
