// The point-to-point transport our ring all-reduce is written against: asynchronous sends and
// receives of raw bytes between two ranks, matched by slot. Gloo implements it with unbound
// buffers, NCCL with ncclSend/ncclRecv.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>

namespace rg::dist {

class P2POp {
 public:
  virtual ~P2POp() = default;
  // Blocks until the transfer finished; throws rg::Error or the transport's error at the
  // deadline or when the peer is lost.
  virtual void wait(std::chrono::steady_clock::time_point deadline) = 0;
};

class PointToPoint {
 public:
  virtual ~PointToPoint() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // The buffer must stay valid until the returned op has been waited for. A send and a recv
  // match when they name each other and the same slot; several on one slot match in order.
  virtual std::unique_ptr<P2POp> isend(const void* data, size_t bytes, int peer, uint64_t slot) = 0;
  virtual std::unique_ptr<P2POp> irecv(void* data, size_t bytes, int peer, uint64_t slot) = 0;
};

}  // namespace rg::dist
