// TCP store tests: every command and its edge cases, blocking and timeouts, many clients,
// PrefixStore, and bad input (oversized, garbage, truncated, strangers) that drops only its sender.
#include "comm/store.h"

#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <future>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "comm/prefix_store.h"
#include "comm/socket.h"
#include "comm/tcp_store.h"
#include "support/errors.h"

namespace rg::dist {
namespace {

using namespace std::chrono_literals;
using rg::testing::error_of;
using rg::testing::expect_error;
using Clock = std::chrono::steady_clock;

constexpr char kToken[] = "job-42";
constexpr size_t kServerLimit = size_t(1) << 20;

TcpStoreServerOptions server_options(uint16_t port = 0) {
  TcpStoreServerOptions o;
  o.host = "127.0.0.1";
  o.port = port;
  o.token = kToken;
  o.max_message_bytes = kServerLimit;
  return o;
}

TcpStoreOptions client_options(uint16_t port, std::string token = kToken) {
  TcpStoreOptions o;
  o.host = "127.0.0.1";
  o.port = port;
  o.token = std::move(token);
  o.timeout = 2s;
  o.connect_timeout = 2s;
  o.max_message_bytes = kServerLimit;
  return o;
}

// Polls `pred` until it holds or 3 s pass; state changes on the server thread are not instant.
bool eventually(const std::function<bool()>& pred) {
  const auto deadline = Clock::now() + 3s;
  while (!pred()) {
    if (Clock::now() > deadline) return false;
    std::this_thread::sleep_for(2ms);
  }
  return true;
}

// A port nobody listens on (it was free a moment ago).
uint16_t unused_port() { return TcpStoreServer(server_options()).port(); }

// The wire format of comm/tcp_store.cpp, spelled out again for the tests that play a
// misbehaving client on a raw socket.
constexpr uint32_t kMagic = 0x54534752;
constexpr uint32_t kVersion = 1;

// (Built by resize and copy: GCC 12 warns falsely about inserting into a vector just grown by
// push_back.)
void append(Bytes& b, const uint8_t* data, size_t size) {
  const size_t at = b.size();
  b.resize(at + size);
  if (size > 0) std::memcpy(b.data() + at, data, size);
}

void put32(Bytes& b, uint32_t v) {
  const uint8_t le[4] = {uint8_t(v), uint8_t(v >> 8), uint8_t(v >> 16), uint8_t(v >> 24)};
  append(b, le, 4);
}

void put_string(Bytes& b, std::string_view s) {
  put32(b, uint32_t(s.size()));
  append(b, reinterpret_cast<const uint8_t*>(s.data()), s.size());
}

Bytes frame(const Bytes& payload) {
  Bytes b;
  put32(b, uint32_t(payload.size()));
  append(b, payload.data(), payload.size());
  return b;
}

Bytes handshake(const std::string& token, uint32_t magic = kMagic, uint32_t version = kVersion) {
  Bytes p;
  put32(p, magic);
  put32(p, version);
  put_string(p, token);
  return frame(p);
}

class RawClient {
 public:
  explicit RawClient(uint16_t port) : socket_(net::connect_tcp("127.0.0.1", port, 2s)) {}

  void send(const Bytes& b) {
    net::send_all(socket_.fd(), b.data(), b.size(), net::deadline_after(2s), "the test server");
  }
  void send(std::string_view s) { send(to_bytes(s)); }
  // Handshakes with the right token and checks the server's OK (frame {1, 0, 0, 0, kOk}).
  void handshake_ok() {
    send(handshake(kToken));
    uint8_t reply[5];
    net::recv_all(socket_.fd(), reply, sizeof(reply), net::deadline_after(2s), "the test server");
    EXPECT_EQ(Bytes(reply, reply + 5), (Bytes{1, 0, 0, 0, 0}));
  }
  // Everything the server sends until it closes the connection; fails the test if it does not
  // close within 3 s.
  std::string read_until_closed() {
    std::string got;
    const auto deadline = net::deadline_after(3s);
    for (;;) {
      if (!net::wait_fd(socket_.fd(), POLLIN, deadline)) {
        ADD_FAILURE() << "the server did not close the connection; got '" << got << "'";
        return got;
      }
      char buf[4096];
      const ssize_t n = ::recv(socket_.fd(), buf, sizeof(buf), 0);
      if (n <= 0) return got;
      got.append(buf, size_t(n));
    }
  }
  void close() { socket_.close(); }

 private:
  net::Socket socket_;
};

class TcpStoreTest : public ::testing::Test {
 protected:
  void SetUp() override { server_ = std::make_unique<TcpStoreServer>(server_options()); }

  std::unique_ptr<TcpStore> client(std::string token = kToken) {
    return std::make_unique<TcpStore>(client_options(server_->port(), std::move(token)));
  }

  // The server still serves a client connected before the trouble, and a new one.
  void expect_serving(TcpStore& old) {
    old.set("alive", "yes");
    EXPECT_EQ(old.get_string("alive"), "yes");
    auto fresh = client();
    EXPECT_EQ(fresh->get_string("alive"), "yes");
    const int64_t count = old.add("alive-count", 0);
    EXPECT_EQ(fresh->add("alive-count", 1), count + 1);
  }

  // After a misbehaving raw client: it is dropped and everybody else is still served.
  void expect_dropped_and_serving(TcpStore& old, int connections_before) {
    EXPECT_TRUE(eventually([&] { return server_->num_connections() == connections_before; }))
        << server_->num_connections() << " connections, expected " << connections_before;
    expect_serving(old);
  }

  std::unique_ptr<TcpStoreServer> server_;
};

TEST(StoreBytesTest, RoundTripsStringsWithZeros) {
  const std::string s("a\0b", 3);
  EXPECT_EQ(to_bytes(s), (Bytes{'a', 0, 'b'}));
  EXPECT_EQ(to_string(to_bytes(s)), s);
  EXPECT_TRUE(to_bytes("").empty());
}

TEST_F(TcpStoreTest, PortZeroPicksAFreePort) {
  EXPECT_NE(server_->port(), 0);
  TcpStoreServer other(server_options());
  EXPECT_NE(other.port(), 0);
  EXPECT_NE(other.port(), server_->port());
}

TEST_F(TcpStoreTest, BindFailureNamesHostAndPort) {
  const uint16_t port = server_->port();
  expect_error([&] { TcpStoreServer again(server_options(port)); },
               "127.0.0.1:" + std::to_string(port));
}

TEST_F(TcpStoreTest, SetGetOverwriteAndBinaryValues) {
  auto c = client();
  c->set("k", "v1");
  EXPECT_EQ(c->get_string("k"), "v1");
  c->set("k", "v2");
  EXPECT_EQ(c->get_string("k"), "v2");
  const Bytes binary{0, 1, 2, 255, 0};
  c->set("bin", binary);
  EXPECT_EQ(c->get("bin"), binary);
  c->set("empty", Bytes{});
  EXPECT_TRUE(c->get("empty").empty());
  EXPECT_TRUE(c->check({"empty"}));
  // Keys are bytes too.
  const std::string odd_key("a\0/b", 4);
  c->set(odd_key, "x");
  EXPECT_EQ(c->get_string(odd_key), "x");
}

TEST_F(TcpStoreTest, GetWithZeroTimeoutAnswersAtOnce) {
  auto c = client();
  c->set("here", "1");
  EXPECT_EQ(to_string(c->get("here", 0ms)), "1");
  expect_error([&] { c->get("absent", 0ms); }, "store get('absent') timed out after 0 ms");
}

TEST_F(TcpStoreTest, GetBlocksUntilAnotherClientSets) {
  auto waiter = client();
  auto setter = client();
  auto result = std::async(std::launch::async, [&] { return waiter->get_string("late"); });
  EXPECT_EQ(result.wait_for(50ms), std::future_status::timeout);  // still blocked
  setter->set("late", "value");
  ASSERT_EQ(result.wait_for(2s), std::future_status::ready);
  EXPECT_EQ(result.get(), "value");
}

TEST_F(TcpStoreTest, GetTimesOutNamingKeyAndTimeout) {
  auto c = client();
  const auto start = Clock::now();
  expect_error([&] { c->get("foo", 200ms); }, "store get('foo') timed out after 200 ms");
  const auto took = Clock::now() - start;
  EXPECT_GE(took, 200ms);
  EXPECT_LT(took, 2s);
  // The server's timeout reply keeps the connection in step.
  c->set("foo", "bar");
  EXPECT_EQ(c->get_string("foo"), "bar");
}

TEST_F(TcpStoreTest, DefaultTimeoutComesFromOptions) {
  auto o = client_options(server_->port());
  o.timeout = 150ms;
  TcpStore c(o);
  EXPECT_EQ(c.timeout(), 150ms);
  expect_error([&] { c.get("never"); }, "timed out after 150 ms");
  c.set_timeout(100ms);
  expect_error([&] { c.wait({"never"}); }, "timed out after 100 ms");
}

TEST_F(TcpStoreTest, WaitBlocksUntilEveryKeyExists) {
  auto waiter = client();
  auto setter = client();
  waiter->wait({});  // nothing to wait for
  auto done = std::async(std::launch::async, [&] { waiter->wait({"a", "b", "c"}, 2s); });
  setter->set("b", "1");
  setter->add("a", 1);
  EXPECT_EQ(done.wait_for(50ms), std::future_status::timeout);  // "c" is still missing
  // A key that appears and goes again before the others does not count.
  setter->delete_key("a");
  setter->set("c", "1");
  EXPECT_EQ(done.wait_for(50ms), std::future_status::timeout);
  setter->set("a", "again");
  ASSERT_EQ(done.wait_for(2s), std::future_status::ready);
  done.get();
}

TEST_F(TcpStoreTest, WaitTimesOutNamingMissingKeys) {
  auto c = client();
  c->set("a", "1");
  const std::string msg = error_of([&] { c->wait({"a", "b", "c"}, 200ms); });
  EXPECT_NE(msg.find("store wait('a', 'b', 'c') timed out after 200 ms"), std::string::npos) << msg;
  EXPECT_NE(msg.find("missing: 'b', 'c'"), std::string::npos) << msg;
}

TEST_F(TcpStoreTest, AddCountsInDecimalText) {
  auto c = client();
  EXPECT_EQ(c->add("n", 5), 5);  // created as 0
  EXPECT_EQ(c->add("n", -7), -2);
  EXPECT_EQ(c->add("n", 0), -2);
  EXPECT_EQ(c->get_string("n"), "-2");
  c->set("m", "40");
  EXPECT_EQ(c->add("m", 2), 42);
  c->set("big", std::to_string(INT64_MAX));
  expect_error([&] { c->add("big", 1); }, "overflow");
  EXPECT_EQ(c->get_string("big"), std::to_string(INT64_MAX));
}

TEST_F(TcpStoreTest, AddToANonIntegerIsAnErrorAndTheConnectionStays) {
  auto c = client();
  c->set("text", "abc");
  expect_error([&] { c->add("text", 1); }, "store add('text', 1) failed");
  expect_error([&] { c->add("text", 1); }, "not an integer");
  c->set("partial", "12x");
  expect_error([&] { c->add("partial", 1); }, "not an integer");
  EXPECT_EQ(c->get_string("text"), "abc");
  EXPECT_EQ(c->add("fine", 3), 3);
}

TEST_F(TcpStoreTest, CompareSetFollowsPyTorchSemantics) {
  auto c = client();
  const Bytes none;
  const Bytes a = to_bytes("a"), b = to_bytes("b"), x = to_bytes("x");
  // Absent key, empty expected: stores and returns desired.
  EXPECT_EQ(c->compare_set("k1", none, a), a);
  EXPECT_EQ(c->get("k1"), a);
  // Absent key, non-empty expected: returns expected, stores nothing.
  EXPECT_EQ(c->compare_set("k2", x, a), x);
  EXPECT_FALSE(c->check({"k2"}));
  // Present and matching: stores and returns desired.
  EXPECT_EQ(c->compare_set("k1", a, b), b);
  EXPECT_EQ(c->get("k1"), b);
  // Present and not matching: returns the current value, unchanged.
  EXPECT_EQ(c->compare_set("k1", x, a), b);
  EXPECT_EQ(c->get("k1"), b);
  // Present with an empty value: an empty expected matches it.
  c->set("k3", none);
  EXPECT_EQ(c->compare_set("k3", none, a), a);
  // Present, empty expected, non-empty value: no match.
  EXPECT_EQ(c->compare_set("k1", none, x), b);
}

TEST_F(TcpStoreTest, CompareSetCreatingAKeyWakesAGet) {
  auto waiter = client();
  auto setter = client();
  auto result = std::async(std::launch::async, [&] { return waiter->get_string("cas"); });
  EXPECT_EQ(result.wait_for(20ms), std::future_status::timeout);
  setter->compare_set("cas", {}, to_bytes("won"));
  ASSERT_EQ(result.wait_for(2s), std::future_status::ready);
  EXPECT_EQ(result.get(), "won");
}

TEST_F(TcpStoreTest, CheckDeleteAndNumKeys) {
  auto c = client();
  EXPECT_EQ(c->num_keys(), 0);
  EXPECT_TRUE(c->check({}));
  EXPECT_FALSE(c->check({"a"}));
  c->set("a", "1");
  c->add("b", 1);
  EXPECT_TRUE(c->check({"a", "b"}));
  EXPECT_FALSE(c->check({"a", "b", "c"}));
  EXPECT_EQ(c->num_keys(), 2);
  EXPECT_TRUE(c->delete_key("a"));
  EXPECT_FALSE(c->delete_key("a"));
  EXPECT_FALSE(c->check({"a"}));
  EXPECT_EQ(c->num_keys(), 1);
  expect_error([&] { c->get("a", 50ms); }, "timed out");
}

TEST_F(TcpStoreTest, ManyClientsAddConcurrently) {
  constexpr int kClients = 8, kAdds = 200, kSharedThreads = 4;
  std::vector<std::unique_ptr<TcpStore>> clients;
  for (int i = 0; i < kClients; ++i) clients.push_back(client());
  auto shared = client();  // also one client used by several threads at once
  std::vector<std::vector<int64_t>> seen(kClients + kSharedThreads);
  std::vector<std::thread> threads;
  for (int i = 0; i < kClients + kSharedThreads; ++i) {
    TcpStore* store = i < kClients ? clients[size_t(i)].get() : shared.get();
    threads.emplace_back([store, &out = seen[size_t(i)]] {
      for (int j = 0; j < kAdds; ++j) out.push_back(store->add("counter", 1));
    });
  }
  for (auto& t : threads) t.join();
  const int64_t total = int64_t(kClients + kSharedThreads) * kAdds;
  EXPECT_EQ(shared->add("counter", 0), total);
  // Every add saw a distinct value: none was lost or applied twice.
  std::set<int64_t> all;
  for (const auto& v : seen) all.insert(v.begin(), v.end());
  EXPECT_EQ(int64_t(all.size()), total);
  EXPECT_EQ(*all.begin(), 1);
  EXPECT_EQ(*all.rbegin(), total);
}

TEST_F(TcpStoreTest, ClientWaitsForALateServer) {
  const uint16_t port = unused_port();
  std::unique_ptr<TcpStoreServer> late;
  std::thread starter([&] {
    std::this_thread::sleep_for(150ms);
    late = std::make_unique<TcpStoreServer>(server_options(port));
  });
  auto o = client_options(port);
  o.connect_timeout = 3s;
  std::unique_ptr<TcpStore> c;
  const std::string msg = error_of([&] { c = std::make_unique<TcpStore>(o); });
  starter.join();
  ASSERT_EQ(msg, "");
  c->set("k", "v");
  EXPECT_EQ(c->get_string("k"), "v");
}

TEST_F(TcpStoreTest, ConnectTimeoutNamesHostAndPort) {
  const uint16_t port = unused_port();
  auto o = client_options(port);
  o.connect_timeout = 200ms;
  const auto start = Clock::now();
  const std::string msg = error_of([&] { TcpStore c(o); });
  EXPECT_LT(Clock::now() - start, 2s);
  EXPECT_NE(msg.find("127.0.0.1:" + std::to_string(port)), std::string::npos) << msg;
  EXPECT_NE(msg.find("within 200 ms"), std::string::npos) << msg;
  EXPECT_NE(msg.find("refused"), std::string::npos) << msg;
}

TEST(TcpStoreClientTest, RefusesAPeerThatIsNotAStore) {
  // Something else listens at host:port and answers in its own protocol.
  net::Socket listener = net::listen_tcp("127.0.0.1", 0);
  std::thread http([&] {
    net::Socket conn(::accept(listener.fd(), nullptr, nullptr));
    const std::string answer = "HTTP/1.1 400 Bad Request\r\n\r\n";
    net::send_all(conn.fd(), answer.data(), answer.size(), net::deadline_after(2s), "client");
    // Wait for the client to hang up, so that it reads the whole answer first.
    char buf[256];
    while (::recv(conn.fd(), buf, sizeof(buf), 0) > 0) {
    }
  });
  const std::string msg = error_of([&] { TcpStore c(client_options(net::local_port(listener))); });
  http.join();
  EXPECT_NE(msg.find("is a ringgrad store listening there?"), std::string::npos) << msg;
}

TEST_F(TcpStoreTest, ServerStopWhileClientWaitsGivesAnError) {
  auto c = client();
  auto result =
      std::async(std::launch::async, [&] { return error_of([&] { c->get("never", 10s); }); });
  EXPECT_EQ(result.wait_for(50ms), std::future_status::timeout);
  server_->stop();
  ASSERT_EQ(result.wait_for(3s), std::future_status::ready) << "the client hangs";
  const std::string msg = result.get();
  EXPECT_NE(msg.find("store get('never')"), std::string::npos) << msg;
  EXPECT_NE(msg.find("the store at 127.0.0.1:" + std::to_string(server_->port()) +
                     " closed the connection"),
            std::string::npos)
      << msg;
  server_->stop();  // idempotent
  EXPECT_EQ(server_->num_connections(), 0);
}

TEST_F(TcpStoreTest, ClientReconnectsAfterServerRestart) {
  auto c = client();
  c->set("k", "v");
  const uint16_t port = server_->port();
  server_.reset();
  expect_error([&] { c->set("k", "v"); }, "closed the connection");
  server_ = std::make_unique<TcpStoreServer>(server_options(port));
  c->set("k2", "v2");  // reconnects
  EXPECT_EQ(c->get_string("k2"), "v2");
  EXPECT_EQ(c->num_keys(), 1);  // a fresh server
}

TEST_F(TcpStoreTest, WrongTokenIsRefused) {
  auto good = client();
  const int before = server_->num_connections();
  const std::string msg = error_of([&] { client("not-the-token"); });
  EXPECT_NE(msg.find("wrong job token"), std::string::npos) << msg;
  EXPECT_NE(msg.find("127.0.0.1:" + std::to_string(server_->port())), std::string::npos) << msg;
  expect_dropped_and_serving(*good, before);
}

TEST_F(TcpStoreTest, WrongMagicOrVersionIsRefused) {
  auto good = client();
  const int before = server_->num_connections();
  {
    RawClient raw(server_->port());
    raw.send(handshake(kToken, /*magic=*/0x12345678));
    EXPECT_NE(raw.read_until_closed().find("wrong protocol magic"), std::string::npos);
  }
  {
    RawClient raw(server_->port());
    raw.send(handshake(kToken, kMagic, /*version=*/99));
    EXPECT_NE(raw.read_until_closed().find("unsupported protocol version 99"), std::string::npos);
  }
  expect_dropped_and_serving(*good, before);
}

TEST_F(TcpStoreTest, OversizedFrameIsRefused) {
  auto good = client();
  const int before = server_->num_connections();
  {
    // Before the handshake: a stranger announcing a huge message.
    RawClient raw(server_->port());
    Bytes header;
    put32(header, 1u << 30);
    raw.send(header);
    raw.send("some of it");
    EXPECT_NE(raw.read_until_closed().find("exceeds the store's limit"), std::string::npos);
  }
  {
    // After the handshake: just over max_message_bytes.
    RawClient raw(server_->port());
    raw.handshake_ok();
    Bytes header;
    put32(header, uint32_t(kServerLimit + 1));
    raw.send(header);
    raw.send(Bytes(1000, 7));
    const std::string reply = raw.read_until_closed();
    EXPECT_NE(reply.find("message of " + std::to_string(kServerLimit + 1) +
                         " bytes exceeds the store's limit of " + std::to_string(kServerLimit)),
              std::string::npos)
        << reply;
  }
  expect_dropped_and_serving(*good, before);
}

TEST_F(TcpStoreTest, OversizedRequestIsRefusedByTheClient) {
  auto c = client();
  const std::string msg = error_of([&] { c->set("big", Bytes(kServerLimit + 1)); });
  EXPECT_NE(msg.find("store set('big')"), std::string::npos) << msg;
  EXPECT_NE(msg.find("more than max_message_bytes"), std::string::npos) << msg;
  EXPECT_EQ(c->add("after", 1), 1);  // the connection was never touched
}

TEST_F(TcpStoreTest, OversizedRequestIsRefusedByTheServer) {
  auto good = client();
  const int before = server_->num_connections();
  auto o = client_options(server_->port());
  o.max_message_bytes = 4 * kServerLimit;  // a client that allows more than the server
  TcpStore big(o);
  expect_error([&] { big.set("big", Bytes(2 * kServerLimit)); }, "exceeds the store's limit");
  EXPECT_TRUE(eventually([&] { return server_->num_connections() == before; }));
  // The refused client reconnects for its next (small) request.
  big.set("small", "ok");
  EXPECT_EQ(good->get_string("small"), "ok");
  // A value just under the limit goes through.
  const Bytes near_limit(kServerLimit - 64, 3);
  big.set("near", near_limit);
  EXPECT_EQ(good->get("near"), near_limit);
  expect_serving(*good);
}

TEST_F(TcpStoreTest, GarbageBytesDropOnlyThatClient) {
  auto good = client();
  const int before = server_->num_connections();
  {
    RawClient raw(server_->port());  // someone speaking HTTP to the store
    raw.send("GET / HTTP/1.1\r\nHost: store\r\n\r\n");
    EXPECT_NE(raw.read_until_closed().find("exceeds"), std::string::npos);
  }
  {
    RawClient raw(server_->port());  // a small frame that is no handshake
    raw.send(frame(to_bytes("hello")));
    EXPECT_NE(raw.read_until_closed().find("wrong protocol magic"), std::string::npos);
  }
  {
    RawClient raw(server_->port());  // a request whose string runs past the frame
    raw.handshake_ok();
    raw.send(frame(Bytes{1, 0xff, 0xff, 0, 0, 'k'}));
    EXPECT_NE(raw.read_until_closed().find("malformed request: message truncated"),
              std::string::npos);
  }
  {
    RawClient raw(server_->port());  // trailing bytes after a well-formed request
    raw.handshake_ok();
    raw.send(frame(Bytes{8, 1, 2, 3}));
    EXPECT_NE(raw.read_until_closed().find("trailing bytes"), std::string::npos);
  }
  expect_dropped_and_serving(*good, before);
}

TEST_F(TcpStoreTest, UnknownCommandDropsOnlyThatClient) {
  auto good = client();
  const int before = server_->num_connections();
  RawClient raw(server_->port());
  raw.handshake_ok();
  raw.send(frame(Bytes{200, 1, 2, 3}));
  EXPECT_NE(raw.read_until_closed().find("unknown command 200"), std::string::npos);
  raw.close();
  expect_dropped_and_serving(*good, before);
}

TEST_F(TcpStoreTest, ClientVanishingMidMessageDropsOnlyThatClient) {
  auto good = client();
  const int before = server_->num_connections();
  {
    RawClient raw(server_->port());  // half a handshake
    Bytes half = handshake(kToken);
    half.resize(half.size() / 2);
    raw.send(half);
    EXPECT_TRUE(eventually([&] { return server_->num_connections() == before + 1; }));
  }
  {
    RawClient raw(server_->port());  // half a request, after a good handshake
    raw.handshake_ok();
    Bytes header;
    put32(header, 100);
    raw.send(header);
    raw.send(Bytes{1, 0, 0});
  }
  expect_dropped_and_serving(*good, before);
}

TEST_F(TcpStoreTest, SilentClientDoesNotHoldUpOthers) {
  auto waiter = client();
  auto setter = client();
  const int before = server_->num_connections();
  RawClient silent(server_->port());
  RawClient silent_after_handshake(server_->port());
  silent_after_handshake.handshake_ok();
  EXPECT_TRUE(eventually([&] { return server_->num_connections() == before + 2; }));
  auto result = std::async(std::launch::async, [&] { return waiter->get_string("go"); });
  setter->set("go", "now");
  ASSERT_EQ(result.wait_for(2s), std::future_status::ready);
  EXPECT_EQ(result.get(), "now");
  expect_serving(*setter);
  silent.close();
  silent_after_handshake.close();
  EXPECT_TRUE(eventually([&] { return server_->num_connections() == before; }));
}

TEST_F(TcpStoreTest, ClientLeavingWhileBlockedIsForgotten) {
  auto setter = client();
  const int before = server_->num_connections();
  {
    RawClient raw(server_->port());
    raw.handshake_ok();
    // get('gone') with a long timeout, then leave without waiting for the answer.
    Bytes get{2};
    put_string(get, "gone");
    put32(get, 10000);  // u64 timeout_ms, low half
    put32(get, 0);
    raw.send(frame(get));
    EXPECT_TRUE(eventually([&] { return server_->num_connections() == before + 1; }));
  }
  EXPECT_TRUE(eventually([&] { return server_->num_connections() == before; }));
  setter->set("gone", "x");  // wakes nobody, harms nobody
  expect_serving(*setter);
}

TEST(PrefixStoreTest, KeysAreIsolatedByPrefix) {
  TcpStoreServer server(server_options());
  auto base = std::make_shared<TcpStore>(client_options(server.port()));
  PrefixStore a("a", base), b("b", base);
  a.set("k", "from a");
  b.set("k", "from b");
  EXPECT_EQ(a.get_string("k"), "from a");
  EXPECT_EQ(b.get_string("k"), "from b");
  EXPECT_EQ(base->get_string("a/k"), "from a");
  EXPECT_EQ(a.add("n", 2), 2);
  EXPECT_EQ(b.add("n", 5), 5);
  EXPECT_TRUE(a.check({"k", "n"}));
  EXPECT_FALSE(a.check({"only-b"}));
  b.set("only-b", "1");
  EXPECT_FALSE(a.check({"only-b"}));
  EXPECT_EQ(a.compare_set("k", to_bytes("from a"), to_bytes("new")), to_bytes("new"));
  EXPECT_EQ(b.get_string("k"), "from b");
  EXPECT_TRUE(a.delete_key("k"));
  EXPECT_FALSE(a.delete_key("k"));
  EXPECT_TRUE(b.check({"k"}));
  // num_keys counts the whole underlying store: a/n, b/k, b/n, b/only-b.
  EXPECT_EQ(a.num_keys(), 4);
  EXPECT_EQ(b.num_keys(), 4);
  EXPECT_EQ(a.base(), base);
  // Nested prefixes compose.
  auto inner = std::make_shared<PrefixStore>("outer", base);
  PrefixStore nested("inner", inner);
  nested.set("x", "1");
  EXPECT_EQ(base->get_string("outer/inner/x"), "1");
}

TEST(PrefixStoreTest, BlockingCallsGoThroughThePrefix) {
  TcpStoreServer server(server_options());
  auto waiter_base = std::make_shared<TcpStore>(client_options(server.port()));
  auto setter_base = std::make_shared<TcpStore>(client_options(server.port()));
  PrefixStore waiter("group0", waiter_base), setter("group0", setter_base);
  PrefixStore other("group1", setter_base);
  EXPECT_EQ(waiter.timeout(), waiter_base->timeout());
  auto result = std::async(std::launch::async, [&] {
    waiter.wait({"x", "y"}, 2s);
    return waiter.get_string("x");
  });
  other.set("x", "wrong group");
  other.set("y", "wrong group");
  EXPECT_EQ(result.wait_for(50ms), std::future_status::timeout);
  setter.set("x", "1");
  setter.set("y", "2");
  ASSERT_EQ(result.wait_for(2s), std::future_status::ready);
  EXPECT_EQ(result.get(), "1");
  // Timeouts name the full key, prefix included.
  expect_error([&] { waiter.get("missing", 100ms); }, "store get('group0/missing') timed out");
}

TEST(PrefixStoreTest, NullBaseIsAnError) {
  expect_error([] { PrefixStore p("p", nullptr); }, "base store is null");
}

}  // namespace
}  // namespace rg::dist
