// FileStore: a Store in a file on a file system every rank can see (init_method file:///path, as
// PyTorch's FileStore): an append-only log of set/delete records that every operation replays up
// to its end under flock(2) (shared to read, exclusive to write), so ranks on several processes
// (or hosts sharing an NFS mount with working locks) agree. Blocking reads poll every 10 ms.
// The file must not exist or be empty when the job starts. With num_workers > 0 (the job's world
// size) the last of that many instances to be destroyed removes it, as PyTorch's FileStore.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <string_view>

#include "comm/store.h"

namespace rg::dist {

class FileStore : public Store {
 public:
  // Opens (creating) `path`; throws rg::Error naming it when it cannot.
  explicit FileStore(std::string path, int num_workers = 0);
  ~FileStore() override;
  FileStore(const FileStore&) = delete;
  FileStore& operator=(const FileStore&) = delete;

  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key, Millis timeout) override;
  int64_t add(const std::string& key, int64_t delta) override;
  Bytes compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) override;
  void wait(const std::vector<std::string>& keys, Millis timeout) override;
  bool check(const std::vector<std::string>& keys) override;
  bool delete_key(const std::string& key) override;
  int64_t num_keys() override;
  using Store::get;
  using Store::set;
  using Store::wait;

  const std::string& path() const { return path_; }

  // Applies the records of `log` (a part of the file that ends at a record's end) to `data`;
  // `path` names the file in messages. A record that is cut short or of an unknown type is an
  // rg::Error (the records before it stay applied). What every operation does with the bytes
  // appended since its last look, and what the fuzzer feeds.
  static void replay(std::string_view log, const std::string& path,
                     std::map<std::string, Bytes>& data);

 private:
  class Lock;
  void refresh();  // replays the records appended since the last call (lock held)
  void append(bool erase, const std::string& key, const Bytes& value);  // exclusive lock held

  std::string path_;
  int num_workers_ = 0;
  int fd_ = -1;
  std::mutex mu_;  // one operation at a time per instance
  int64_t replayed_ = 0;
  std::map<std::string, Bytes> data_;
};

}  // namespace rg::dist
