// Small POSIX TCP helpers shared by the store and the process groups: an owned descriptor,
// listen/connect (with retries while the peer starts), and whole-buffer send/recv with deadlines.
#pragma once

#include <sys/socket.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace rg::dist::net {

using Clock = std::chrono::steady_clock;
using Deadline = Clock::time_point;

// now + d, saturating: a huge d gives Deadline::max() (wait forever), a negative one gives now.
Deadline deadline_after(std::chrono::milliseconds d);
// Milliseconds until `d` for poll(), rounded up so that a wait never ends before the deadline;
// -1 (infinite) for Deadline::max().
int poll_timeout_ms(Deadline d);

// "host:port", with brackets around an IPv6 literal; every error message names peers this way.
std::string host_port(std::string_view host, uint16_t port);
// strerror(err) without the thread-safety problems of strerror.
std::string errno_string(int err);

// Owns a file descriptor (a socket, an eventfd) and closes it on destruction.
class Socket {
 public:
  Socket() = default;
  explicit Socket(int fd) : fd_(fd) {}
  ~Socket() { close(); }
  Socket(Socket&& other) noexcept : fd_(other.release()) {}
  Socket& operator=(Socket&& other) noexcept;
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;

  int fd() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release();
  void close();

 private:
  int fd_ = -1;
};

// A listening socket bound to host:port (port 0: any free port; see local_port), with
// SO_REUSEADDR so that a restarted server can rebind at once. Throws rg::Error naming host:port.
Socket listen_tcp(const std::string& host, uint16_t port, int backlog = SOMAXCONN);
// The port a socket is bound to.
uint16_t local_port(const Socket& socket);
// A loopback port that was free a moment ago (bound to port 0 and closed again): for a job whose
// ranks are started with an explicit MASTER_PORT (dist::spawn, tests). Another process may take
// it before it is used.
uint16_t free_loopback_port();
// Connects to host:port, retrying (backoff up to 100 ms) while the connection is refused or the
// host does not resolve yet, so that a client may start before its server. Returns a blocking
// socket with TCP_NODELAY; throws rg::Error naming host:port and the last cause after `timeout`.
Socket connect_tcp(const std::string& host, uint16_t port, std::chrono::milliseconds timeout);
// Accepts one pending connection of a non-blocking listener, or returns an invalid Socket when
// none is pending. The new socket is non-blocking with TCP_NODELAY. Throws rg::Error on other
// failures (e.g. out of file descriptors).
Socket accept_tcp(const Socket& listener);

void set_nonblocking(int fd, bool on);
void set_nodelay(int fd);
// Waits until `fd` reports any of `events` (or an error/hangup); false when `deadline` passed.
bool wait_fd(int fd, short events, Deadline deadline);

// Sends or receives exactly `size` bytes, whatever the descriptor's blocking mode, retrying on
// EINTR and never raising SIGPIPE. Throws rg::Error naming `peer` (e.g. "the store at h:p") when
// the peer closes the connection ("<peer> closed the connection"), on an error, or when
// `deadline` passes first.
void send_all(int fd, const void* data, size_t size, Deadline deadline, std::string_view peer);
void recv_all(int fd, void* data, size_t size, Deadline deadline, std::string_view peer);

}  // namespace rg::dist::net
