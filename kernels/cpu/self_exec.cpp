// Re-executing the program under its own name; see self_exec.h for why this way.
#include "kernels/cpu/self_exec.h"

#include <fcntl.h>
#include <limits.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>

namespace rg::kernels::cpu {
namespace {

constexpr const char* kSelf = "/proc/self/exe";

// readlink of /proc/self/exe into buf (NUL-terminated); false when it cannot be read or does not
// fit.
bool read_self_path(char (&buf)[PATH_MAX]) {
  const ssize_t n = ::readlink(kSelf, buf, sizeof(buf) - 1);
  if (n <= 0 || size_t(n) >= sizeof(buf) - 1) return false;
  buf[n] = '\0';
  return true;
}

}  // namespace

void exec_self(char* const argv[], char* const envp[]) {
  char path[PATH_MAX];
  struct stat self {};
  struct stat named {};
  // stat() follows the magic link to the running file itself, deleted or not.
  if (read_self_path(path) && ::stat(kSelf, &self) == 0 && ::stat(path, &named) == 0 &&
      self.st_dev == named.st_dev && self.st_ino == named.st_ino) {
    ::execve(path, argv, envp);
    // Failed (the file went away or lost its execute permission just now): the fallback below.
  }
  ::execve(kSelf, argv, envp);
}

void restore_program_name() {
  // /proc/self/comm is the thread group leader's name (what ps shows), from any thread.
  const char* kComm = "/proc/self/comm";
  char comm[32] = {};
  const int in = ::open(kComm, O_RDONLY | O_CLOEXEC);
  if (in < 0) return;
  const ssize_t n = ::read(in, comm, sizeof(comm) - 1);
  ::close(in);
  char path[PATH_MAX];
  if (n <= 0 || std::strcmp(comm, "exe\n") != 0 || !read_self_path(path)) return;
  // A deleted file reads as "<path> (deleted)".
  const char* kDeleted = " (deleted)";
  const size_t len = std::strlen(path), dl = std::strlen(kDeleted);
  if (len > dl && std::strcmp(path + len - dl, kDeleted) == 0) path[len - dl] = '\0';
  const char* slash = std::strrchr(path, '/');
  const char* base = slash != nullptr ? slash + 1 : path;
  if (*base == '\0' || std::strcmp(base, "exe") == 0) return;
  // A fresh descriptor: the file takes one write from its start (no pwrite). The kernel cuts the
  // name to 15 characters, as execve does.
  const int out = ::open(kComm, O_WRONLY | O_CLOEXEC);
  if (out < 0) return;
  [[maybe_unused]] const ssize_t w = ::write(out, base, std::strlen(base));
  ::close(out);
}

}  // namespace rg::kernels::cpu
