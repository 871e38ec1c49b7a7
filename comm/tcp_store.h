// TCPStore: a Store served over TCP. The server (one thread, poll-based) lives in the launcher
// or in rank 0; every rank holds a client. Messages are length-prefixed with a size limit, and a
// per-job token in the handshake refuses strangers; a bad client is dropped without disturbing
// the others.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>

#include "comm/store.h"

namespace rg::dist {

struct TcpStoreServerOptions {
  std::string host = "0.0.0.0";  // address to bind
  uint16_t port = 0;             // 0: pick a free port (see TcpStoreServer::port())
  std::string token;             // clients must present the same token
  size_t max_message_bytes = size_t(64) << 20;
};

namespace store_wire {
Bytes serve(std::span<const uint8_t>, const std::string&, size_t);
}

class TcpStoreServer {
 public:
  // Binds and starts serving on a background thread; throws rg::Error when the address cannot
  // be bound (the message names host:port).
  explicit TcpStoreServer(TcpStoreServerOptions options);
  ~TcpStoreServer();  // stops the thread and closes every connection
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;

  uint16_t port() const;
  void stop();
  // Connections currently open (handshaken or not); for tests and diagnostics.
  int num_connections() const;

 private:
  friend Bytes store_wire::serve(std::span<const uint8_t>, const std::string&, size_t);
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

struct TcpStoreOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 0;
  std::string token;
  Millis timeout = std::chrono::seconds(300);         // default get/wait timeout
  Millis connect_timeout = std::chrono::seconds(60);  // retries while the server starts
  size_t max_message_bytes = size_t(64) << 20;
};

// A client; thread-safe (one request at a time over one connection).
class TcpStore : public Store {
 public:
  explicit TcpStore(TcpStoreOptions options);
  ~TcpStore() override;

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

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The wire protocol without sockets, for the fuzzer (fuzz/tcp_store_server.cpp,
// fuzz/tcp_store_client.cpp) and tests: the very functions the server and the client run.
namespace store_wire {

// Runs `input`, the bytes one client sends (frames: handshake, then requests), through the
// server's decoding and handling, as TcpStoreServer does for each connection (its keys live for
// this call only; a blocked get or wait times out at once), and returns the bytes it sends back.
Bytes serve(std::span<const uint8_t> input, const std::string& token,
            size_t max_message_bytes = size_t(64) << 20);

// Reads `frame` (u32 size, payload) as TcpStore reads the reply to `command` (0: the handshake,
// else the Command byte of tcp_store.cpp: 1 set .. 8 num_keys); anything malformed is an
// rg::Error.
void decode_reply(uint8_t command, std::span<const uint8_t> frame,
                  size_t max_message_bytes = size_t(64) << 20);

}  // namespace store_wire

}  // namespace rg::dist
