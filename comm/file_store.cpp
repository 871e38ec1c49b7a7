// FileStore (comm/file_store.h): records are [u8 op][u32 key bytes][key][u32 value bytes][value],
// op 0 = set, 1 = delete, appended under an exclusive flock and replayed under a shared one.
#include "comm/file_store.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include "kernels/error.h"

namespace rg::dist {

class FileStore::Lock {
 public:
  Lock(const FileStore& s, bool exclusive) : fd_(s.fd_) {
    while (flock(fd_, exclusive ? LOCK_EX : LOCK_SH) != 0) {
      RG_CHECK(errno == EINTR, "FileStore ", s.path_, ": flock failed: ", std::strerror(errno));
    }
  }
  ~Lock() { flock(fd_, LOCK_UN); }
  Lock(const Lock&) = delete;
  Lock& operator=(const Lock&) = delete;

 private:
  int fd_;
};

FileStore::FileStore(std::string path, int num_workers)
    : path_(std::move(path)), num_workers_(num_workers) {
  fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  RG_CHECK(fd_ >= 0, "FileStore: cannot open ", path_, ": ", std::strerror(errno),
           " (file:// needs a path every rank can create and lock)");
}

FileStore::~FileStore() {
  if (fd_ < 0) return;
  if (num_workers_ > 0) {
    try {
      std::lock_guard g(mu_);
      Lock lock(*this, true);
      refresh();
      const auto it = data_.find("rg.filestore.left");
      const int64_t left = (it == data_.end() ? 0 : parse_store_int(it->second).value_or(0)) + 1;
      append(false, "rg.filestore.left", to_bytes(std::to_string(left)));
      if (left == num_workers_) ::unlink(path_.c_str());  // the last one out
    } catch (const Error&) {
      // A destructor must not throw; the file stays behind.
    }
  }
  ::close(fd_);
}

void FileStore::refresh() {
  const off_t end = ::lseek(fd_, 0, SEEK_END);
  RG_CHECK(end >= 0, "FileStore ", path_, ": lseek failed: ", std::strerror(errno));
  if (end == replayed_) return;
  std::string buf(size_t(end - replayed_), '\0');
  size_t got = 0;
  while (got < buf.size()) {
    const ssize_t n = ::pread(fd_, buf.data() + got, buf.size() - got, replayed_ + off_t(got));
    if (n < 0 && errno == EINTR) continue;
    RG_CHECK(n > 0, "FileStore ", path_, ": read failed: ", n < 0 ? std::strerror(errno) : "EOF");
    got += size_t(n);
  }
  replay(buf, path_, data_);
  replayed_ = end;
}

void FileStore::replay(std::string_view buf, const std::string& path,
                       std::map<std::string, Bytes>& data) {
  size_t p = 0;
  const auto u32 = [&](const char* what) {
    RG_CHECK(p + 4 <= buf.size(), "FileStore ", path, " is corrupt (truncated ", what,
             " length); it must be a fresh file for each job");
    uint32_t v;
    std::memcpy(&v, buf.data() + p, 4);
    p += 4;
    return size_t(v);
  };
  while (p < buf.size()) {
    const uint8_t op = uint8_t(buf[p++]);
    RG_CHECK(op <= 1, "FileStore ", path, " is corrupt (record type ", int(op),
             "); it must be a fresh file for each job");
    const size_t kn = u32("key");
    RG_CHECK(p + kn <= buf.size(), "FileStore ", path, " is corrupt (truncated key)");
    std::string key(buf.data() + p, kn);
    p += kn;
    const size_t vn = u32("value");
    RG_CHECK(p + vn <= buf.size(), "FileStore ", path, " is corrupt (truncated value)");
    if (op == 0) {
      const auto* v = reinterpret_cast<const uint8_t*>(buf.data() + p);
      data[key] = Bytes(v, v + vn);
    } else {
      data.erase(key);
    }
    p += vn;
  }
}

void FileStore::append(bool erase, const std::string& key, const Bytes& value) {
  std::string rec;
  rec.push_back(char(erase ? 1 : 0));
  const auto put32 = [&](size_t v) {
    const uint32_t x = uint32_t(v);
    rec.append(reinterpret_cast<const char*>(&x), 4);
  };
  RG_CHECK(key.size() < (size_t(1) << 31) && value.size() < (size_t(1) << 31),
           "FileStore: key or value too large");
  put32(key.size());
  rec += key;
  put32(value.size());
  rec.append(reinterpret_cast<const char*>(value.data()), value.size());
  size_t done = 0;
  while (done < rec.size()) {  // O_APPEND: each write lands at the end
    const ssize_t n = ::write(fd_, rec.data() + done, rec.size() - done);
    if (n < 0 && errno == EINTR) continue;
    RG_CHECK(n > 0, "FileStore ", path_, ": write failed: ", std::strerror(errno));
    done += size_t(n);
  }
  refresh();  // our own record, and anything appended before it
}

void FileStore::set(const std::string& key, const Bytes& value) {
  std::lock_guard g(mu_);
  Lock lock(*this, true);
  append(false, key, value);
}

Bytes FileStore::get(const std::string& key, Millis timeout) {
  wait({key}, timeout);
  std::lock_guard g(mu_);
  return data_.at(key);  // keys are deleted only by their owners, after everyone read them
}

int64_t FileStore::add(const std::string& key, int64_t delta) {
  std::lock_guard g(mu_);
  Lock lock(*this, true);
  refresh();
  const auto it = data_.find(key);
  const std::optional<int64_t> current = it == data_.end() ? 0 : parse_store_int(it->second);
  RG_CHECK(current, "store add('", key, "'): the key holds a value that is not an integer");
  int64_t v = 0;
  RG_CHECK(!__builtin_add_overflow(*current, delta, &v), "store add('", key,
           "') overflows a 64-bit integer");
  append(false, key, to_bytes(std::to_string(v)));
  return v;
}

Bytes FileStore::compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) {
  std::lock_guard g(mu_);
  Lock lock(*this, true);
  refresh();
  const auto it = data_.find(key);
  if (it == data_.end() ? !expected.empty() : it->second != expected)
    return it == data_.end() ? expected : it->second;
  append(false, key, desired);
  return desired;
}

void FileStore::wait(const std::vector<std::string>& keys, Millis timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    std::string missing;
    {
      std::lock_guard g(mu_);
      Lock lock(*this, false);
      refresh();
      for (const auto& k : keys)
        if (!data_.count(k)) missing += (missing.empty() ? "'" : ", '") + k + "'";
    }
    if (missing.empty()) return;
    RG_CHECK(std::chrono::steady_clock::now() < deadline, "store wait timed out after ",
             timeout.count(), " ms; missing keys: ", missing, " (FileStore ", path_, ")");
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

bool FileStore::check(const std::vector<std::string>& keys) {
  std::lock_guard g(mu_);
  Lock lock(*this, false);
  refresh();
  for (const auto& k : keys)
    if (!data_.count(k)) return false;
  return true;
}

bool FileStore::delete_key(const std::string& key) {
  std::lock_guard g(mu_);
  Lock lock(*this, true);
  refresh();
  if (!data_.count(key)) return false;
  append(true, key, {});
  return true;
}

int64_t FileStore::num_keys() {
  std::lock_guard g(mu_);
  Lock lock(*this, false);
  refresh();
  return int64_t(data_.size());
}

}  // namespace rg::dist
