// TcpStore: the wire format, the server's single-threaded poll() loop (blocking get/wait are
// parked waiters with deadlines, so one slow client never holds up another) and the client.
#include "comm/tcp_store.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <climits>
#include <deque>
#include <optional>
#include <unordered_map>
#include <utility>
#include <vector>

#include "comm/socket.h"
#include "kernels/error.h"

namespace rg::dist {
namespace {

using net::Clock;
using net::Deadline;

// Wire format; every integer is little-endian.
//   frame     = u32 payload_size, payload          (payload_size <= max_message_bytes)
//   string    = u32 size, bytes
//   handshake = u32 kMagic, u32 kVersion, string token     (a client's first frame)
//   request   = u8 Command, arguments                      (see Command)
//   reply     = u8 Status, body: kOk: the command's result; kError and kClosing: string
//               message; kTimeout: u32 count, then the missing keys as strings
constexpr uint32_t kMagic = 0x54534752;  // "RGST"
constexpr uint32_t kVersion = 1;
// Before its handshake a peer is a stranger: it may not make us buffer much.
constexpr size_t kMaxHandshakeBytes = size_t(64) << 10;

enum Command : uint8_t {
  kSet = 1,         // string key, string value -> (nothing)
  kGet = 2,         // string key, u64 timeout_ms -> string value
  kAdd = 3,         // string key, i64 delta -> i64 new value
  kCompareSet = 4,  // string key, string expected, string desired -> string value
  kWait = 5,        // u32 count, strings keys, u64 timeout_ms -> (nothing)
  kCheck = 6,       // u32 count, strings keys -> u8 all exist
  kDelete = 7,      // string key -> u8 existed
  kNumKeys = 8,     // -> i64 count
};

enum Status : uint8_t {
  kOk = 0,
  kError = 1,    // the request failed; the connection stays usable
  kTimeout = 2,  // a get/wait deadline passed
  kClosing = 3,  // a protocol error; the server closes the connection after this reply
};

// Waits longer than this are "forever"; it keeps timeout + slack arithmetic from overflowing.
constexpr Millis kForever = std::chrono::hours(24 * 365 * 100);
// The client's own guard on a reply: the server's timeout plus this much, so that a dead server
// cannot hang a client while a live one always answers first.
constexpr Millis kReplySlack = std::chrono::seconds(5);
// How long the server keeps reading (and discarding) from a client it is closing, so that its
// final error reply is not destroyed by a TCP reset before the client reads it.
constexpr Millis kLinger = std::chrono::seconds(1);
constexpr size_t kReadChunk = size_t(64) << 10;
constexpr size_t kMaxReadPerRound = size_t(1) << 20;  // fairness between clients

Millis clamp_wait(Millis t) { return std::clamp(t, Millis(0), kForever); }

uint32_t le32(const uint8_t* p) {
  return uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24;
}

// Builds one frame; the length prefix is patched in by finish().
class Writer {
 public:
  Writer() : buf_(4, 0) {}
  Writer& u8(uint8_t v) {
    buf_.push_back(v);
    return *this;
  }
  Writer& u32(uint32_t v) {
    for (int i = 0; i < 4; ++i) buf_.push_back(uint8_t(v >> (8 * i)));
    return *this;
  }
  Writer& u64(uint64_t v) {
    for (int i = 0; i < 8; ++i) buf_.push_back(uint8_t(v >> (8 * i)));
    return *this;
  }
  Writer& i64(int64_t v) { return u64(uint64_t(v)); }
  Writer& str(std::string_view s) {
    RG_CHECK(s.size() <= UINT32_MAX, "store: a string of ", s.size(), " bytes is too long");
    u32(uint32_t(s.size()));
    buf_.insert(buf_.end(), s.begin(), s.end());
    return *this;
  }
  Writer& bytes(const Bytes& b) {
    return str(std::string_view(reinterpret_cast<const char*>(b.data()), b.size()));
  }
  size_t payload_size() const { return buf_.size() - 4; }
  Bytes finish() && {
    RG_CHECK(payload_size() <= UINT32_MAX, "store: a message of ", payload_size(),
             " bytes is too long");
    const auto n = uint32_t(payload_size());
    for (int i = 0; i < 4; ++i) buf_[size_t(i)] = uint8_t(n >> (8 * i));
    return std::move(buf_);
  }

 private:
  Bytes buf_;
};

// Reads one payload with bounds checks; anything short or left over is an rg::Error.
class Reader {
 public:
  Reader(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  explicit Reader(const Bytes& b) : Reader(b.data(), b.size()) {}

  uint8_t u8() { return *take(1); }
  uint32_t u32() { return le32(take(4)); }
  uint64_t u64() {
    const uint8_t* p = take(8);
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= uint64_t(p[i]) << (8 * i);
    return v;
  }
  int64_t i64() { return int64_t(u64()); }
  std::string str() {
    const uint32_t n = u32();
    const uint8_t* p = take(n);
    return std::string(reinterpret_cast<const char*>(p), n);
  }
  Bytes bytes() {
    const uint32_t n = u32();
    const uint8_t* p = take(n);
    return Bytes(p, p + n);
  }
  std::vector<std::string> strs() {
    const uint32_t n = u32();
    // Each string takes at least its 4-byte size: a larger count is a lie, not a reason to
    // reserve gigabytes.
    RG_CHECK(n <= (size_ - pos_) / 4, "message truncated (", n, " strings announced)");
    std::vector<std::string> out;
    out.reserve(n);
    for (uint32_t i = 0; i < n; ++i) out.push_back(str());
    return out;
  }
  void end() const {
    RG_CHECK(pos_ == size_, "message has ", size_ - pos_, " unexpected trailing bytes");
  }

 private:
  const uint8_t* take(size_t n) {
    RG_CHECK(size_ - pos_ >= n, "message truncated");
    const uint8_t* p = data_ + pos_;
    pos_ += n;
    return p;
  }
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

std::string quote(const std::string& key) { return "'" + key + "'"; }

// 'a', 'b', ... naming at most `max` keys: a wait on a thousand ranks' keys must stay readable.
std::string quote_keys(const std::vector<std::string>& keys, size_t max = 10) {
  std::string out;
  for (size_t i = 0; i < keys.size() && i < max; ++i) out += (i ? ", " : "") + quote(keys[i]);
  if (keys.size() > max) out += ", ... (" + std::to_string(keys.size() - max) + " more)";
  return out;
}

bool equal_constant_time(std::string_view a, std::string_view b) {
  // Compare in time independent of where the first difference is, so that a stranger cannot
  // guess the token byte by byte.
  uint8_t diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i) diff |= uint8_t(a[i] ^ (i < b.size() ? b[i] : 0));
  return diff == 0;
}

// The client's reading of replies, one function per kind of result: what TcpStore's calls do with
// a reply payload, and what store_wire::decode_reply feeds them. `what` names the call, `peer`
// the server.

// Opens the reply; sets *timed_out for kTimeout when the command can time out.
Reader open_reply(const Bytes& reply, const std::string& what, const std::string& peer,
                  bool* timed_out = nullptr) {
  Reader r(reply);
  const uint8_t status = r.u8();
  if (status == kOk) {
    if (timed_out != nullptr) *timed_out = false;
    return r;
  }
  if (status == kTimeout && timed_out != nullptr) {
    *timed_out = true;
    return r;
  }
  if (status == kError || status == kClosing) RG_FAIL(what, " failed: ", r.str());
  RG_FAIL(what, ": unexpected reply status ", int(status), " from ", peer);
}

// A frame's announced size; `handshake`: the reply to our handshake, which is tiny; a big one
// means that whatever listens at host:port speaks another protocol.
void check_reply_size(uint32_t size, bool handshake, size_t max_message_bytes,
                      const std::string& peer) {
  if (handshake) {
    RG_CHECK(size <= kMaxHandshakeBytes, "the handshake reply from ", peer, " is ", size,
             " bytes: is a ringgrad store listening there?");
  }
  RG_CHECK(size <= max_message_bytes, "the reply from ", peer, " is ", size,
           " bytes, more than max_message_bytes (", max_message_bytes, ")");
}

void read_handshake_reply(const Bytes& reply, const std::string& peer) {
  RG_CHECK(!reply.empty(), "empty reply from ", peer);
  Reader r(reply);
  const uint8_t status = r.u8();
  if (status != kOk) {
    const std::string why =
        status == kError || status == kClosing ? r.str() : "unexpected handshake reply";
    RG_FAIL(peer, " refused the connection: ", why);
  }
}

void read_empty_reply(const Bytes& reply, const std::string& what, const std::string& peer) {
  open_reply(reply, what, peer);
}

Bytes read_value_reply(const Bytes& reply, const std::string& what, const std::string& peer,
                       Millis timeout) {
  bool timed_out = false;
  Reader r = open_reply(reply, what, peer, &timed_out);
  RG_CHECK(!timed_out, what, " timed out after ", timeout.count(), " ms");
  return r.bytes();
}

Bytes read_bytes_reply(const Bytes& reply, const std::string& what, const std::string& peer) {
  return open_reply(reply, what, peer).bytes();
}

int64_t read_int_reply(const Bytes& reply, const std::string& what, const std::string& peer) {
  return open_reply(reply, what, peer).i64();
}

bool read_flag_reply(const Bytes& reply, const std::string& what, const std::string& peer) {
  return open_reply(reply, what, peer).u8() != 0;
}

void read_wait_reply(const Bytes& reply, const std::string& what, const std::string& peer,
                     Millis timeout) {
  bool timed_out = false;
  Reader r = open_reply(reply, what, peer, &timed_out);
  if (timed_out) {
    RG_FAIL(what, " timed out after ", timeout.count(), " ms; missing: ", quote_keys(r.strs()));
  }
}

// A blocked get/wait: answered when its keys all exist or its deadline passes.
struct Waiter {
  bool is_get = false;
  std::vector<std::string> keys;
  Deadline deadline;
  std::string registered;  // the missing key under which the client is listed in waiting_on_
};

struct Client {
  net::Socket socket;
  bool handshaken = false;
  // Sent a kClosing reply: input is discarded, and the client is dropped at EOF or
  // linger_deadline, whichever comes first.
  bool closing = false;
  bool write_shut = false;
  bool dead = false;  // removed at the end of the loop iteration
  Deadline linger_deadline{};
  Bytes in;
  size_t in_pos = 0;
  Bytes out;
  size_t out_pos = 0;
  std::optional<Waiter> waiter;  // while set, further requests of this client wait their turn

  bool out_pending() const { return out_pos < out.size(); }
};

}  // namespace

// ---------------------------------------------------------------------------------------------
// Server

struct TcpStoreServer::Impl {
  explicit Impl(TcpStoreServerOptions options);
  void stop();
  uint16_t port() const { return port_; }
  int num_connections() const { return connections_.load(); }

 private:
  void loop();
  void poll_once();
  void accept_clients();
  void read_input(Client& c);
  void flush(Client& c);
  void process(uint64_t id, Client& c);
  void handle_handshake(Client& c, Reader& r);
  void handle_request(uint64_t id, Client& c, Reader& r);
  void start_wait(uint64_t id, Client& c, bool is_get, std::vector<std::string> keys,
                  uint64_t timeout_ms);
  bool try_finish_wait(uint64_t id, Client& c);
  void key_created(const std::string& key);
  void unregister(uint64_t id, Client& c);
  void expire(Deadline now);
  void remove_dead();
  void reply(Client& c, Writer&& w);

 public:
  struct Detached {};
  // No socket and no thread: store_wire::serve drives one client's bytes through process().
  Impl(TcpStoreServerOptions options, Detached);
  Bytes serve_detached(std::span<const uint8_t> input);

 private:
  void close_with_error(Client& c, std::string_view message);
  size_t frame_limit(const Client& c) const {
    return c.handshaken ? max_message_ : std::min(max_message_, kMaxHandshakeBytes);
  }

  TcpStoreServerOptions options_;
  size_t max_message_;
  net::Socket listener_;
  net::Socket wake_;  // eventfd that stop() writes to interrupt poll()
  uint16_t port_ = 0;
  std::atomic<bool> stopping_{false};
  std::atomic<int> connections_{0};
  std::mutex stop_mu_;
  std::thread thread_;

  // Everything below belongs to the loop thread.
  std::unordered_map<uint64_t, Client> clients_;
  uint64_t next_id_ = 1;
  std::unordered_map<std::string, Bytes> data_;
  std::unordered_map<std::string, std::vector<uint64_t>> waiting_on_;
  std::deque<uint64_t> runnable_;  // clients whose wait ended: their next request may be parsed
  Deadline accept_paused_until_{};
  std::vector<pollfd> pollfds_;
  std::vector<uint64_t> poll_ids_;
  Bytes scratch_;
};

TcpStoreServer::Impl::Impl(TcpStoreServerOptions options) : options_(std::move(options)) {
  RG_CHECK(options_.max_message_bytes > 0, "TcpStoreServer: max_message_bytes must be positive");
  max_message_ = std::min<size_t>(options_.max_message_bytes, UINT32_MAX);
  listener_ = net::listen_tcp(options_.host, options_.port);
  net::set_nonblocking(listener_.fd(), true);
  port_ = net::local_port(listener_);
  wake_ = net::Socket(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  RG_CHECK(wake_.valid(), "TcpStoreServer: eventfd: ", net::errno_string(errno));
  scratch_.resize(kReadChunk);
  thread_ = std::thread([this] { loop(); });
}

TcpStoreServer::Impl::Impl(TcpStoreServerOptions options, Detached) : options_(std::move(options)) {
  RG_CHECK(options_.max_message_bytes > 0, "TcpStoreServer: max_message_bytes must be positive");
  max_message_ = std::min<size_t>(options_.max_message_bytes, UINT32_MAX);
}

Bytes TcpStoreServer::Impl::serve_detached(std::span<const uint8_t> input) {
  Bytes sent;
  Client& c = clients_[next_id_];
  const uint64_t id = next_id_++;
  c.in.assign(input.begin(), input.end());
  const auto take_replies = [&] {
    const bool any = c.out_pending();
    sent.insert(sent.end(), c.out.begin() + std::ptrdiff_t(c.out_pos), c.out.end());
    c.out.clear();
    c.out_pos = 0;
    return any;
  };
  // process() handles one request per call here (its reply stays pending: there is no socket).
  for (;;) {
    process(id, c);
    bool replied = take_replies();
    if (c.dead || c.closing) break;
    if (c.waiter) {
      expire(Deadline::max());  // as if every deadline had passed
      runnable_.clear();
      replied = take_replies() || replied;
    }
    if (!replied) break;  // the input ends (or ends inside a frame)
  }
  unregister(id, c);
  return sent;
}

void TcpStoreServer::Impl::stop() {
  std::lock_guard<std::mutex> lock(stop_mu_);
  if (!thread_.joinable()) return;
  stopping_ = true;
  const uint64_t one = 1;
  [[maybe_unused]] const ssize_t n = ::write(wake_.fd(), &one, sizeof(one));
  thread_.join();
  listener_.close();
}

void TcpStoreServer::Impl::loop() {
  try {
    while (!stopping_.load()) poll_once();
  } catch (const std::exception&) {
    // Only poll() itself failing gets here; closing every connection below is how the clients
    // learn that the store is gone.
  }
  clients_.clear();
  waiting_on_.clear();
  connections_ = 0;
}

void TcpStoreServer::Impl::poll_once() {
  pollfds_.clear();
  poll_ids_.clear();
  pollfds_.push_back({wake_.fd(), POLLIN, 0});
  Deadline next = Deadline::max();
  const bool accepting = Clock::now() >= accept_paused_until_;
  if (accepting) {
    pollfds_.push_back({listener_.fd(), POLLIN, 0});
  } else {
    next = accept_paused_until_;
  }
  const size_t first_client = pollfds_.size();
  for (auto& [id, c] : clients_) {
    pollfds_.push_back({c.socket.fd(), short(POLLIN | (c.out_pending() ? POLLOUT : 0)), 0});
    poll_ids_.push_back(id);
    if (c.waiter) next = std::min(next, c.waiter->deadline);
    if (c.closing) next = std::min(next, c.linger_deadline);
  }
  const int rc = ::poll(pollfds_.data(), pollfds_.size(), net::poll_timeout_ms(next));
  if (rc < 0) {
    RG_CHECK(errno == EINTR, "TcpStoreServer: poll: ", net::errno_string(errno));
    return;
  }
  if (pollfds_[0].revents != 0) {
    uint64_t value;
    [[maybe_unused]] const ssize_t n = ::read(wake_.fd(), &value, sizeof(value));
    if (stopping_.load()) return;
  }
  if (accepting && pollfds_[1].revents != 0) accept_clients();
  for (size_t i = first_client; i < pollfds_.size(); ++i) {
    const short revents = pollfds_[i].revents;
    if (revents == 0) continue;
    const uint64_t id = poll_ids_[i - first_client];
    auto it = clients_.find(id);
    if (it == clients_.end()) continue;
    Client& c = it->second;
    if (c.dead) continue;
    if (revents & POLLNVAL) {
      c.dead = true;
      continue;
    }
    if (revents & (POLLIN | POLLHUP | POLLERR)) read_input(c);
    if (!c.dead && (revents & POLLOUT)) flush(c);
    if (!c.dead) process(id, c);
  }
  expire(Clock::now());
  while (!runnable_.empty()) {
    const uint64_t id = runnable_.front();
    runnable_.pop_front();
    auto it = clients_.find(id);
    if (it != clients_.end() && !it->second.dead) process(id, it->second);
  }
  remove_dead();
}

void TcpStoreServer::Impl::accept_clients() {
  for (;;) {
    net::Socket s;
    try {
      s = net::accept_tcp(listener_);
    } catch (const Error&) {
      // Out of descriptors (or similar): the listener stays readable, so stop polling it for a
      // moment instead of spinning; dropped clients will free descriptors.
      accept_paused_until_ = net::deadline_after(Millis(100));
      return;
    }
    if (!s.valid()) return;
    Client c;
    c.socket = std::move(s);
    clients_.emplace(next_id_++, std::move(c));
    ++connections_;
  }
}

void TcpStoreServer::Impl::read_input(Client& c) {
  for (size_t total = 0; total < kMaxReadPerRound;) {
    const ssize_t n = ::recv(c.socket.fd(), scratch_.data(), scratch_.size(), MSG_DONTWAIT);
    if (n > 0) {
      if (!c.closing) c.in.insert(c.in.end(), scratch_.begin(), scratch_.begin() + n);
      total += size_t(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    // EOF or an error: a client that vanishes (even mid-message) only ends its own connection.
    c.dead = true;
    return;
  }
  // Requests are parsed one at a time (the next only once the previous reply is out); a client
  // that piles up more than a full frame meanwhile is flooding us.
  if (c.in.size() - c.in_pos > frame_limit(c) + 4 + kMaxReadPerRound) c.dead = true;
}

void TcpStoreServer::Impl::flush(Client& c) {
  if (!c.socket.valid()) return;  // detached (serve_detached takes c.out)
  while (c.out_pending()) {
    const ssize_t n = ::send(c.socket.fd(), c.out.data() + c.out_pos, c.out.size() - c.out_pos,
                             MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      c.out_pos += size_t(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;  // POLLOUT resumes it
    c.dead = true;
    return;
  }
  c.out.clear();
  c.out_pos = 0;
  if (c.closing && !c.write_shut) {
    ::shutdown(c.socket.fd(), SHUT_WR);
    c.write_shut = true;
  }
}

void TcpStoreServer::Impl::reply(Client& c, Writer&& w) {
  Bytes frame = std::move(w).finish();
  if (!c.out_pending()) {
    c.out = std::move(frame);
    c.out_pos = 0;
  } else {
    c.out.insert(c.out.end(), frame.begin(), frame.end());
  }
  flush(c);
}

void TcpStoreServer::Impl::close_with_error(Client& c, std::string_view message) {
  c.closing = true;
  c.linger_deadline = net::deadline_after(kLinger);
  c.in.clear();
  c.in_pos = 0;
  Writer w;
  w.u8(kClosing).str(message);
  reply(c, std::move(w));
}

void TcpStoreServer::Impl::process(uint64_t id, Client& c) {
  while (!c.dead && !c.closing && !c.waiter && !c.out_pending()) {
    const size_t pending = c.in.size() - c.in_pos;
    if (pending < 4) break;
    const uint32_t size = le32(c.in.data() + c.in_pos);
    const size_t limit = frame_limit(c);
    if (size > limit) {
      close_with_error(c, detail::cat("message of ", size, " bytes exceeds the store's limit of ",
                                      limit, " bytes", c.handshaken ? "" : " before a handshake"));
      break;
    }
    if (pending < 4 + size_t(size)) break;
    Reader r(c.in.data() + c.in_pos + 4, size);
    c.in_pos += 4 + size_t(size);
    try {
      if (c.handshaken) {
        handle_request(id, c, r);
      } else {
        handle_handshake(c, r);
      }
    } catch (const std::exception& e) {
      close_with_error(c, std::string("malformed request: ") + e.what());
    }
  }
  if (c.in_pos == c.in.size()) {
    c.in.clear();
    c.in_pos = 0;
  } else if (c.in_pos > kMaxReadPerRound && c.in_pos * 2 > c.in.size()) {
    c.in.erase(c.in.begin(), c.in.begin() + std::ptrdiff_t(c.in_pos));
    c.in_pos = 0;
  }
}

void TcpStoreServer::Impl::handle_handshake(Client& c, Reader& r) {
  if (r.u32() != kMagic) {
    return close_with_error(c, "wrong protocol magic (not a ringgrad store client?)");
  }
  const uint32_t version = r.u32();
  if (version != kVersion) {
    return close_with_error(c, detail::cat("unsupported protocol version ", version,
                                           " (this server speaks version ", kVersion, ")"));
  }
  const std::string token = r.str();
  r.end();
  if (!equal_constant_time(token, options_.token)) {
    return close_with_error(c, "wrong job token (the client's token differs from the server's)");
  }
  c.handshaken = true;
  Writer w;
  w.u8(kOk);
  reply(c, std::move(w));
}

void TcpStoreServer::Impl::handle_request(uint64_t id, Client& c, Reader& r) {
  const uint8_t command = r.u8();
  Writer w;
  switch (command) {
    case kSet: {
      std::string key = r.str();
      Bytes value = r.bytes();
      r.end();
      const bool created = data_.insert_or_assign(key, std::move(value)).second;
      reply(c, std::move(w.u8(kOk)));
      if (created) key_created(key);
      return;
    }
    case kGet: {
      std::string key = r.str();
      const uint64_t timeout_ms = r.u64();
      r.end();
      return start_wait(id, c, /*is_get=*/true, {std::move(key)}, timeout_ms);
    }
    case kWait: {
      std::vector<std::string> keys = r.strs();
      const uint64_t timeout_ms = r.u64();
      r.end();
      return start_wait(id, c, /*is_get=*/false, std::move(keys), timeout_ms);
    }
    case kAdd: {
      const std::string key = r.str();
      const int64_t delta = r.i64();
      r.end();
      auto it = data_.find(key);
      const bool existed = it != data_.end();
      int64_t value = 0;
      if (existed) {
        const std::optional<int64_t> current = parse_store_int(it->second);
        if (!current) {
          w.u8(kError).str("the value of " + quote(key) + " is not an integer: '" +
                           to_string(it->second).substr(0, 64) + "'");
          return reply(c, std::move(w));
        }
        value = *current;
      }
      if (__builtin_add_overflow(value, delta, &value)) {
        w.u8(kError).str("adding to " + quote(key) + " overflows a 64-bit integer");
        return reply(c, std::move(w));
      }
      data_[key] = to_bytes(std::to_string(value));
      reply(c, std::move(w.u8(kOk).i64(value)));
      if (!existed) key_created(key);
      return;
    }
    case kCompareSet: {
      const std::string key = r.str();
      Bytes expected = r.bytes();
      Bytes desired = r.bytes();
      r.end();
      auto it = data_.find(key);
      if (it == data_.end()) {
        if (!expected.empty()) return reply(c, std::move(w.u8(kOk).bytes(expected)));
        data_.emplace(key, desired);
        reply(c, std::move(w.u8(kOk).bytes(desired)));
        return key_created(key);
      }
      if (it->second == expected) it->second = std::move(desired);
      return reply(c, std::move(w.u8(kOk).bytes(it->second)));
    }
    case kCheck: {
      const std::vector<std::string> keys = r.strs();
      r.end();
      const bool all = std::all_of(keys.begin(), keys.end(),
                                   [&](const std::string& k) { return data_.count(k) > 0; });
      return reply(c, std::move(w.u8(kOk).u8(all ? 1 : 0)));
    }
    case kDelete: {
      const std::string key = r.str();
      r.end();
      return reply(c, std::move(w.u8(kOk).u8(data_.erase(key) > 0 ? 1 : 0)));
    }
    case kNumKeys: {
      r.end();
      return reply(c, std::move(w.u8(kOk).i64(int64_t(data_.size()))));
    }
    default:
      return close_with_error(c, detail::cat("unknown command ", int(command)));
  }
}

void TcpStoreServer::Impl::start_wait(uint64_t id, Client& c, bool is_get,
                                      std::vector<std::string> keys, uint64_t timeout_ms) {
  Waiter w;
  w.is_get = is_get;
  w.keys = std::move(keys);
  w.deadline =
      net::deadline_after(Millis(int64_t(std::min<uint64_t>(timeout_ms, kForever.count()))));
  c.waiter = std::move(w);
  // A zero timeout on a missing key is answered by expire() later in this same iteration.
  try_finish_wait(id, c);
}

bool TcpStoreServer::Impl::try_finish_wait(uint64_t id, Client& c) {
  Waiter& w = *c.waiter;
  for (const std::string& k : w.keys) {
    if (data_.count(k) == 0) {
      // Listed under one missing key only: when that key appears we look again.
      w.registered = k;
      waiting_on_[k].push_back(id);
      return false;
    }
  }
  Writer out;
  out.u8(kOk);
  if (w.is_get) out.bytes(data_.at(w.keys[0]));
  c.waiter.reset();
  reply(c, std::move(out));
  runnable_.push_back(id);
  return true;
}

void TcpStoreServer::Impl::key_created(const std::string& key) {
  auto it = waiting_on_.find(key);
  if (it == waiting_on_.end()) return;
  const std::vector<uint64_t> ids = std::move(it->second);
  waiting_on_.erase(it);
  for (const uint64_t id : ids) {
    auto ct = clients_.find(id);
    if (ct == clients_.end()) continue;
    Client& c = ct->second;
    if (c.dead || !c.waiter || c.waiter->registered != key) continue;
    c.waiter->registered.clear();
    try_finish_wait(id, c);
  }
}

void TcpStoreServer::Impl::unregister(uint64_t id, Client& c) {
  if (!c.waiter) return;
  auto it = waiting_on_.find(c.waiter->registered);
  if (it != waiting_on_.end()) {
    auto& ids = it->second;
    ids.erase(std::remove(ids.begin(), ids.end(), id), ids.end());
    if (ids.empty()) waiting_on_.erase(it);
  }
  c.waiter.reset();
}

void TcpStoreServer::Impl::expire(Deadline now) {
  for (auto& [id, c] : clients_) {
    if (c.dead) continue;
    if (c.closing && now >= c.linger_deadline) {
      c.dead = true;
      continue;
    }
    if (!c.waiter || now < c.waiter->deadline) continue;
    std::vector<std::string> missing;
    for (const std::string& k : c.waiter->keys) {
      if (data_.count(k) == 0) missing.push_back(k);
    }
    unregister(id, c);
    Writer w;
    w.u8(kTimeout).u32(uint32_t(missing.size()));
    for (const std::string& k : missing) w.str(k);
    reply(c, std::move(w));
    runnable_.push_back(id);
  }
}

void TcpStoreServer::Impl::remove_dead() {
  for (auto it = clients_.begin(); it != clients_.end();) {
    if (it->second.dead) {
      unregister(it->first, it->second);
      it = clients_.erase(it);
      --connections_;
    } else {
      ++it;
    }
  }
}

TcpStoreServer::TcpStoreServer(TcpStoreServerOptions options)
    : impl_(std::make_unique<Impl>(std::move(options))) {}

TcpStoreServer::~TcpStoreServer() { impl_->stop(); }

uint16_t TcpStoreServer::port() const { return impl_->port(); }

void TcpStoreServer::stop() { impl_->stop(); }

int TcpStoreServer::num_connections() const { return impl_->num_connections(); }

// ---------------------------------------------------------------------------------------------
// Client

struct TcpStore::Impl {
  explicit Impl(TcpStoreOptions options)
      : options_(std::move(options)),
        peer_("the store at " + net::host_port(options_.host, options_.port)) {}

  void connect() {
    std::lock_guard<std::mutex> lock(mu_);
    connect_locked();
  }

  // Sends one request and returns the reply's payload; `server_wait` is how long the server may
  // legitimately hold the reply (a blocking get/wait's timeout).
  Bytes call(const std::string& what, Writer&& request, Millis server_wait) {
    RG_CHECK(request.payload_size() <= options_.max_message_bytes, what, ": the request is ",
             request.payload_size(), " bytes, more than max_message_bytes (",
             options_.max_message_bytes, ")");
    const Bytes frame = std::move(request).finish();
    std::lock_guard<std::mutex> lock(mu_);
    try {
      if (!socket_.valid()) connect_locked();
      const Deadline deadline = net::deadline_after(clamp_wait(server_wait) + kReplySlack);
      net::send_all(socket_.fd(), frame.data(), frame.size(), deadline, peer_);
      Bytes reply = read_frame(socket_, deadline);
      if (!reply.empty() && reply[0] == kClosing) socket_.close();
      return reply;
    } catch (const Error& e) {
      // Whatever was half sent or half read, this stream is out of step (a late reply must not
      // be taken for the next request's): the next request connects afresh.
      socket_.close();
      RG_FAIL(what, ": ", e.what());
    }
  }

  const std::string& peer() const { return peer_; }

 private:
  void connect_locked() {
    net::Socket s = net::connect_tcp(options_.host, options_.port, options_.connect_timeout);
    Writer hello;
    hello.u32(kMagic).u32(kVersion).str(options_.token);
    const Bytes frame = std::move(hello).finish();
    const Deadline deadline =
        net::deadline_after(clamp_wait(options_.connect_timeout) + kReplySlack);
    net::send_all(s.fd(), frame.data(), frame.size(), deadline, peer_);
    read_handshake_reply(read_frame(s, deadline, /*handshake=*/true), peer_);
    socket_ = std::move(s);
  }

  Bytes read_frame(const net::Socket& s, Deadline deadline, bool handshake = false) const {
    uint8_t header[4];
    net::recv_all(s.fd(), header, sizeof(header), deadline, peer_);
    const uint32_t size = le32(header);
    check_reply_size(size, handshake, options_.max_message_bytes, peer_);
    Bytes payload(size);
    net::recv_all(s.fd(), payload.data(), size, deadline, peer_);
    RG_CHECK(size > 0, "empty reply from ", peer_);
    return payload;
  }

  TcpStoreOptions options_;
  std::string peer_;
  std::mutex mu_;
  net::Socket socket_;  // invalid until connected, and again after a failed request
};

TcpStore::TcpStore(TcpStoreOptions options) {
  timeout_ = options.timeout;
  impl_ = std::make_unique<Impl>(std::move(options));
  impl_->connect();
}

TcpStore::~TcpStore() = default;

void TcpStore::set(const std::string& key, const Bytes& value) {
  const std::string what = "store set(" + quote(key) + ")";
  Writer w;
  w.u8(kSet).str(key).bytes(value);
  read_empty_reply(impl_->call(what, std::move(w), timeout_), what, impl_->peer());
}

Bytes TcpStore::get(const std::string& key, Millis timeout) {
  const std::string what = "store get(" + quote(key) + ")";
  timeout = clamp_wait(timeout);
  Writer w;
  w.u8(kGet).str(key).u64(uint64_t(timeout.count()));
  return read_value_reply(impl_->call(what, std::move(w), timeout), what, impl_->peer(), timeout);
}

int64_t TcpStore::add(const std::string& key, int64_t delta) {
  const std::string what = detail::cat("store add(", quote(key), ", ", delta, ")");
  Writer w;
  w.u8(kAdd).str(key).i64(delta);
  return read_int_reply(impl_->call(what, std::move(w), timeout_), what, impl_->peer());
}

Bytes TcpStore::compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) {
  const std::string what = "store compare_set(" + quote(key) + ")";
  Writer w;
  w.u8(kCompareSet).str(key).bytes(expected).bytes(desired);
  return read_bytes_reply(impl_->call(what, std::move(w), timeout_), what, impl_->peer());
}

void TcpStore::wait(const std::vector<std::string>& keys, Millis timeout) {
  const std::string what = "store wait(" + quote_keys(keys) + ")";
  timeout = clamp_wait(timeout);
  RG_CHECK(keys.size() <= UINT32_MAX, what, ": too many keys");
  Writer w;
  w.u8(kWait).u32(uint32_t(keys.size()));
  for (const std::string& k : keys) w.str(k);
  w.u64(uint64_t(timeout.count()));
  read_wait_reply(impl_->call(what, std::move(w), timeout), what, impl_->peer(), timeout);
}

bool TcpStore::check(const std::vector<std::string>& keys) {
  const std::string what = "store check(" + quote_keys(keys) + ")";
  RG_CHECK(keys.size() <= UINT32_MAX, what, ": too many keys");
  Writer w;
  w.u8(kCheck).u32(uint32_t(keys.size()));
  for (const std::string& k : keys) w.str(k);
  return read_flag_reply(impl_->call(what, std::move(w), timeout_), what, impl_->peer());
}

bool TcpStore::delete_key(const std::string& key) {
  const std::string what = "store delete_key(" + quote(key) + ")";
  Writer w;
  w.u8(kDelete).str(key);
  return read_flag_reply(impl_->call(what, std::move(w), timeout_), what, impl_->peer());
}

int64_t TcpStore::num_keys() {
  const std::string what = "store num_keys()";
  Writer w;
  w.u8(kNumKeys);
  return read_int_reply(impl_->call(what, std::move(w), timeout_), what, impl_->peer());
}

// ---------------------------------------------------------------------------------------------
// The protocol without sockets (fuzz/)

namespace store_wire {

Bytes serve(std::span<const uint8_t> input, const std::string& token, size_t max_message_bytes) {
  TcpStoreServerOptions options;
  options.token = token;
  options.max_message_bytes = max_message_bytes;
  TcpStoreServer::Impl server(std::move(options), TcpStoreServer::Impl::Detached{});
  return server.serve_detached(input);
}

void decode_reply(uint8_t command, std::span<const uint8_t> frame, size_t max_message_bytes) {
  const std::string peer = "the store at fuzz:0";
  RG_CHECK(frame.size() >= 4, "a reply frame from ", peer, " ends inside its size");
  const uint32_t size = le32(frame.data());
  check_reply_size(size, command == 0, max_message_bytes, peer);
  RG_CHECK(frame.size() - 4 >= size, "the reply from ", peer, " ends early");
  const Bytes reply(frame.begin() + 4, frame.begin() + 4 + std::ptrdiff_t(size));
  const Millis timeout(1000);
  const std::string what = "store call";
  switch (command) {
    case 0:
      return read_handshake_reply(reply, peer);
    case kSet:
      return read_empty_reply(reply, what, peer);
    case kGet:
      read_value_reply(reply, what, peer, timeout);
      return;
    case kAdd:
    case kNumKeys:
      read_int_reply(reply, what, peer);
      return;
    case kCompareSet:
      read_bytes_reply(reply, what, peer);
      return;
    case kWait:
      return read_wait_reply(reply, what, peer, timeout);
    case kCheck:
    case kDelete:
      read_flag_reply(reply, what, peer);
      return;
    default:
      RG_FAIL("store_wire::decode_reply: no command ", int(command));
  }
}

}  // namespace store_wire

}  // namespace rg::dist
