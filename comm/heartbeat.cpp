// The heartbeat thread (comm/heartbeat.h): one byte every 0.5 s to RG_HEARTBEAT_FD. SIGPIPE is
// blocked in it, so a launcher that is gone makes write() fail instead of killing the process.
#include "comm/heartbeat.h"

#include <pthread.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <mutex>
#include <string_view>
#include <thread>

namespace rg::dist {

void start_heartbeat_from_env() {
  static std::once_flag once;
  std::call_once(once, [] {
    const char* v = std::getenv("RG_HEARTBEAT_FD");
    if (v == nullptr) return;
    const std::string_view text = v;
    int fd = -1;
    auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), fd);
    if (ec != std::errc() || p != text.data() + text.size() || fd < 0) return;
    std::thread([fd] {
      sigset_t pipe;
      sigemptyset(&pipe);
      sigaddset(&pipe, SIGPIPE);
      pthread_sigmask(SIG_BLOCK, &pipe, nullptr);
      while (true) {
        const char beat = 'h';
        if (::write(fd, &beat, 1) < 0 && errno != EINTR && errno != EAGAIN) return;
        std::this_thread::sleep_for(std::chrono::milliseconds(500));
      }
    }).detach();
  });
}

}  // namespace rg::dist
