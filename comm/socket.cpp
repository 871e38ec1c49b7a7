// POSIX TCP helpers. Every wait goes through poll() with a deadline and every call is retried on
// EINTR, so that a dead or silent peer ends in an rg::Error instead of a hang.
#include "comm/socket.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <thread>

#include "kernels/error.h"

namespace rg::dist::net {
namespace {

using std::chrono::milliseconds;

struct AddrInfoList {
  addrinfo* head = nullptr;
  ~AddrInfoList() {
    if (head != nullptr) freeaddrinfo(head);
  }
};

// Resolves host:port; returns getaddrinfo's error code (0 on success).
int resolve(const std::string& host, uint16_t port, bool passive, AddrInfoList* out) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0);
  const std::string service = std::to_string(port);
  return getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &out->head);
}

bool same_address(const sockaddr_storage& a, const sockaddr_storage& b) {
  if (a.ss_family != b.ss_family) return false;
  if (a.ss_family == AF_INET) {
    const auto& x = reinterpret_cast<const sockaddr_in&>(a);
    const auto& y = reinterpret_cast<const sockaddr_in&>(b);
    return x.sin_port == y.sin_port && x.sin_addr.s_addr == y.sin_addr.s_addr;
  }
  if (a.ss_family == AF_INET6) {
    const auto& x = reinterpret_cast<const sockaddr_in6&>(a);
    const auto& y = reinterpret_cast<const sockaddr_in6&>(b);
    return x.sin6_port == y.sin6_port &&
           std::memcmp(&x.sin6_addr, &y.sin6_addr, sizeof(x.sin6_addr)) == 0;
  }
  return false;
}

// One non-blocking connect attempt bounded by `deadline`; on failure returns an invalid Socket
// and sets *error.
Socket try_connect(const addrinfo& ai, Deadline deadline, std::string* error) {
  Socket s(::socket(ai.ai_family, ai.ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai.ai_protocol));
  if (!s.valid()) {
    *error = "socket: " + errno_string(errno);
    return {};
  }
  int rc;
  do {
    rc = ::connect(s.fd(), ai.ai_addr, ai.ai_addrlen);
  } while (rc != 0 && errno == EINTR);
  if (rc != 0 && errno != EINPROGRESS) {
    *error = errno_string(errno);
    return {};
  }
  if (rc != 0) {
    if (!wait_fd(s.fd(), POLLOUT, deadline)) {
      *error = "connect timed out";
      return {};
    }
    int err = 0;
    socklen_t len = sizeof(err);
    if (getsockopt(s.fd(), SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
    if (err != 0) {
      *error = errno_string(err);
      return {};
    }
  }
  // Retrying a loopback connect to a port nobody listens on can end in a TCP "simultaneous
  // open" with ourselves; such a socket would look connected but talk to no one.
  sockaddr_storage local{}, remote{};
  socklen_t local_len = sizeof(local), remote_len = sizeof(remote);
  if (getsockname(s.fd(), reinterpret_cast<sockaddr*>(&local), &local_len) == 0 &&
      getpeername(s.fd(), reinterpret_cast<sockaddr*>(&remote), &remote_len) == 0 &&
      same_address(local, remote)) {
    *error = "connected to itself (nobody listening)";
    return {};
  }
  return s;
}

}  // namespace

Deadline deadline_after(milliseconds d) {
  const Deadline now = Clock::now();
  if (d.count() <= 0) return now;
  // Anything beyond ~100 years means "no deadline"; this also keeps now + d from overflowing.
  if (d > milliseconds(int64_t(100) * 365 * 24 * 3600 * 1000)) return Deadline::max();
  return now + d;
}

int poll_timeout_ms(Deadline d) {
  if (d == Deadline::max()) return -1;
  const auto left = d - Clock::now();
  if (left <= Clock::duration::zero()) return 0;
  const auto ms = std::chrono::ceil<milliseconds>(left).count();
  return int(std::min<int64_t>(ms, INT_MAX));
}

std::string host_port(std::string_view host, uint16_t port) {
  std::string h(host);
  if (h.find(':') != std::string::npos) h = "[" + h + "]";
  return h + ":" + std::to_string(port);
}

std::string errno_string(int err) {
  char buf[256];
  // GNU strerror_r returns a pointer that may or may not point into buf.
  return strerror_r(err, buf, sizeof(buf));
}

Socket& Socket::operator=(Socket&& other) noexcept {
  if (this != &other) {
    close();
    fd_ = other.release();
  }
  return *this;
}

int Socket::release() {
  const int fd = fd_;
  fd_ = -1;
  return fd;
}

void Socket::close() {
  // A close interrupted by a signal has still released the descriptor on Linux: never retry.
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

Socket listen_tcp(const std::string& host, uint16_t port, int backlog) {
  const std::string where = host_port(host, port);
  AddrInfoList addrs;
  const int rc = resolve(host, port, /*passive=*/true, &addrs);
  RG_CHECK(rc == 0, "cannot listen on ", where, ": cannot resolve host: ", gai_strerror(rc));
  std::string error = "no address";
  for (const addrinfo* ai = addrs.head; ai != nullptr; ai = ai->ai_next) {
    Socket s(::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol));
    if (!s.valid()) {
      error = "socket: " + errno_string(errno);
      continue;
    }
    const int one = 1;
    if (setsockopt(s.fd(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0) {
      error = "setsockopt(SO_REUSEADDR): " + errno_string(errno);
      continue;
    }
    if (::bind(s.fd(), ai->ai_addr, ai->ai_addrlen) != 0) {
      error = "bind: " + errno_string(errno);
      continue;
    }
    if (::listen(s.fd(), backlog) != 0) {
      error = "listen: " + errno_string(errno);
      continue;
    }
    return s;
  }
  RG_FAIL("cannot listen on ", where, ": ", error);
}

uint16_t free_loopback_port() { return local_port(listen_tcp("127.0.0.1", 0)); }

uint16_t local_port(const Socket& socket) {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  RG_CHECK(getsockname(socket.fd(), reinterpret_cast<sockaddr*>(&addr), &len) == 0,
           "getsockname: ", errno_string(errno));
  if (addr.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6&>(addr).sin6_port);
  return ntohs(reinterpret_cast<sockaddr_in&>(addr).sin_port);
}

Socket connect_tcp(const std::string& host, uint16_t port, milliseconds timeout) {
  const std::string where = host_port(host, port);
  const Deadline deadline = deadline_after(timeout);
  milliseconds backoff(10);
  std::string error;
  for (;;) {
    AddrInfoList addrs;
    const int rc = resolve(host, port, /*passive=*/false, &addrs);
    if (rc != 0) {
      error = std::string("cannot resolve host: ") + gai_strerror(rc);
    } else {
      for (const addrinfo* ai = addrs.head; ai != nullptr; ai = ai->ai_next) {
        Socket s = try_connect(*ai, deadline, &error);
        if (!s.valid()) continue;
        set_nonblocking(s.fd(), false);
        set_nodelay(s.fd());
        return s;
      }
    }
    const auto left = deadline - Clock::now();
    if (left <= Clock::duration::zero()) {
      RG_FAIL("could not connect to ", where, " within ", timeout.count(), " ms: ", error);
    }
    std::this_thread::sleep_for(std::min<Clock::duration>(backoff, left));
    backoff = std::min(backoff * 2, milliseconds(100));
  }
}

Socket accept_tcp(const Socket& listener) {
  for (;;) {
    Socket s(::accept4(listener.fd(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
    if (s.valid()) {
      set_nodelay(s.fd());
      return s;
    }
    // A connection reset before we got to it is the client's problem, not the listener's.
    if (errno == EINTR || errno == ECONNABORTED) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return {};
    RG_FAIL("accept: ", errno_string(errno));
  }
}

void set_nonblocking(int fd, bool on) {
  const int flags = fcntl(fd, F_GETFL, 0);
  RG_CHECK(flags >= 0, "fcntl(F_GETFL): ", errno_string(errno));
  const int wanted = on ? (flags | O_NONBLOCK) : (flags & ~O_NONBLOCK);
  RG_CHECK(wanted == flags || fcntl(fd, F_SETFL, wanted) == 0,
           "fcntl(F_SETFL): ", errno_string(errno));
}

void set_nodelay(int fd) {
  // Requests and replies are small and latency-bound: do not let Nagle hold them back.
  const int one = 1;
  RG_CHECK(setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) == 0,
           "setsockopt(TCP_NODELAY): ", errno_string(errno));
}

bool wait_fd(int fd, short events, Deadline deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int rc = ::poll(&p, 1, poll_timeout_ms(deadline));
    if (rc > 0) return true;
    if (rc == 0) {
      if (Clock::now() >= deadline) return false;
      continue;  // poll's clock may round differently from ours
    }
    RG_CHECK(errno == EINTR, "poll: ", errno_string(errno));
  }
}

void send_all(int fd, const void* data, size_t size, Deadline deadline, std::string_view peer) {
  const auto* p = static_cast<const uint8_t*>(data);
  size_t done = 0;
  while (done < size) {
    const ssize_t n = ::send(fd, p + done, size - done, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      done += size_t(n);
      continue;
    }
    const int err = n < 0 ? errno : EAGAIN;
    if (err == EINTR) continue;
    if (err == EAGAIN || err == EWOULDBLOCK) {
      RG_CHECK(wait_fd(fd, POLLOUT, deadline), "timed out sending to ", peer, " (", done, " of ",
               size, " bytes sent)");
      continue;
    }
    RG_CHECK(err != EPIPE && err != ECONNRESET, peer, " closed the connection");
    RG_FAIL("sending to ", peer, " failed: ", errno_string(err));
  }
}

void recv_all(int fd, void* data, size_t size, Deadline deadline, std::string_view peer) {
  auto* p = static_cast<uint8_t*>(data);
  size_t done = 0;
  while (done < size) {
    const ssize_t n = ::recv(fd, p + done, size - done, MSG_DONTWAIT);
    if (n > 0) {
      done += size_t(n);
      continue;
    }
    RG_CHECK(n != 0, peer, " closed the connection");
    const int err = errno;
    if (err == EINTR) continue;
    if (err == EAGAIN || err == EWOULDBLOCK) {
      RG_CHECK(wait_fd(fd, POLLIN, deadline), "timed out waiting for data from ", peer);
      continue;
    }
    RG_CHECK(err != ECONNRESET, peer, " closed the connection (connection reset)");
    RG_FAIL("receiving from ", peer, " failed: ", errno_string(err));
  }
}

}  // namespace rg::dist::net
