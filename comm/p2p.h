// The point-to-point transport our ring all-reduce is written against: asynchronous sends and
// receives of raw bytes between two ranks, matched by slot. Gloo implements it with unbound
// buffers (waits block the host); NCCL with grouped ncclSend/ncclRecv on its stream (waits are
// no-ops: everything that follows is queued on the same stream).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>

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

  // A send to `to` and a receive from `from` on one slot, issued as a pair: NCCL must see a send
  // and a receive that wait on each other in one group, or two ranks that both send first would
  // wait forever. An empty side (0 bytes) is skipped and its op is null. By default: isend, then
  // irecv.
  using OpPair = std::pair<std::unique_ptr<P2POp>, std::unique_ptr<P2POp>>;
  virtual OpPair exchange(const void* send, size_t send_bytes, int to, void* recv,
                          size_t recv_bytes, int from, uint64_t slot) {
    OpPair ops;
    if (send_bytes) ops.first = isend(send, send_bytes, to, slot);
    if (recv_bytes) ops.second = irecv(recv, recv_bytes, from, slot);
    return ops;
  }
};

}  // namespace rg::dist
