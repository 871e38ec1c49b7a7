// The ring: 2(n-1) steps in one loop. At step t rank r sends block (r-1-t) to its right and
// receives block (r-2-t) from its left; the first n-1 steps reduce what arrives (reduce-scatter,
// leaving rank r with the full reduction of block r), the last n-1 copy it (all-gather). The
// block received at step t is the block sent at step t+1, so each chunk is forwarded as soon as
// it is ready instead of at the end of the step.
#include "comm/ring_allreduce.h"

#include <algorithm>
#include <vector>

#include "kernels/error.h"

namespace rg::dist {
namespace {

int mod(int a, int n) { return ((a % n) + n) % n; }

struct Block {
  size_t begin, len;
};

class Ring {
 public:
  Ring(PointToPoint& p2p, const RingArgs& args)
      : p2p_(p2p), a_(args), n_(p2p.size()), r_(p2p.rank()) {
    chunk_elems_ = std::max<size_t>(1, args.chunk_bytes / args.element_size);
  }

  // Runs steps [first, last) of the 2(n-1)-step schedule. Chunk c of step t is one exchange:
  // send it to the right, receive the matching chunk from the left. Step t+1's exchange of chunk
  // c is issued as soon as chunk c of step t has been received (and reduced): what it sends is
  // what just arrived, and the scratch it receives into has just been consumed.
  void run(int first, int last) {
    if (n_ == 1 || a_.count == 0) {
      if (n_ == 1 && a_.finalize && first == 0 && a_.count > 0) a_.finalize(a_.data, a_.count);
      return;
    }
    const int right = mod(r_ + 1, n_), left = mod(r_ - 1, n_);
    std::vector<std::unique_ptr<P2POp>> sends;
    auto exchange = [&](int t, size_t c) {
      const Block sb = block(mod(r_ - 1 - t, n_)), rb = block(mod(r_ - 2 - t, n_));
      const size_t send_bytes = c < num_chunks(sb) ? chunk_len(sb, c) * a_.element_size : 0;
      const size_t recv_bytes = c < num_chunks(rb) ? chunk_len(rb, c) * a_.element_size : 0;
      void* dst = recv_bytes ? (t < n_ - 1 ? scratch_at(c) : at(a_.data, rb, c)) : nullptr;
      auto ops = p2p_.exchange(send_bytes ? at(a_.data, sb, c) : nullptr, send_bytes, right, dst,
                               recv_bytes, left, slot(t, c));
      if (ops.first) sends.push_back(std::move(ops.first));
      return std::move(ops.second);
    };
    auto chunks_of_step = [&](int t) {
      return std::max(num_chunks(block(mod(r_ - 1 - t, n_))),
                      num_chunks(block(mod(r_ - 2 - t, n_))));
    };
    std::vector<std::unique_ptr<P2POp>> recvs;
    for (size_t c = 0; c < chunks_of_step(first); ++c) recvs.push_back(exchange(first, c));
    for (int t = first; t < last; ++t) {
      const bool reducing = t < n_ - 1;
      const Block rb = block(mod(r_ - 2 - t, n_));
      const size_t next_chunks = t + 1 < last ? chunks_of_step(t + 1) : 0;
      std::vector<std::unique_ptr<P2POp>> next;
      for (size_t c = 0; c < recvs.size() || c < next_chunks; ++c) {
        if (c < recvs.size() && recvs[c]) {
          recvs[c]->wait(a_.deadline);
          const size_t len = chunk_len(rb, c);
          void* mine = at(a_.data, rb, c);
          if (reducing) {
            a_.reduce(mine, scratch_at(c), len);
            if (t == n_ - 2 && a_.finalize) a_.finalize(mine, len);
          }
        }
        if (c < next_chunks) next.push_back(exchange(t + 1, c));
      }
      recvs = std::move(next);
    }
    for (auto& s : sends) s->wait(a_.deadline);
  }

 private:
  Block block(int b) const {
    const size_t begin = ring_block_begin(a_.count, n_, b);
    return {begin, ring_block_begin(a_.count, n_, b + 1) - begin};
  }
  size_t num_chunks(const Block& b) const { return (b.len + chunk_elems_ - 1) / chunk_elems_; }
  size_t chunk_len(const Block& b, size_t c) const {
    return std::min(chunk_elems_, b.len - c * chunk_elems_);
  }
  void* at(void* base, const Block& b, size_t c) const {
    return static_cast<char*>(base) + (b.begin + c * chunk_elems_) * a_.element_size;
  }
  void* scratch_at(size_t c) const {
    return static_cast<char*>(a_.scratch) + c * chunk_elems_ * a_.element_size;
  }
  uint64_t slot(int step, size_t chunk) const {
    RG_CHECK(chunk < (size_t(1) << 20), "ring: too many chunks in one block (", chunk,
             "); raise ring_chunk_bytes");
    return a_.slot_base + (uint64_t(step) << 20) + chunk;
  }

  PointToPoint& p2p_;
  const RingArgs& a_;
  const int n_, r_;
  size_t chunk_elems_;
};

void check_args(const PointToPoint& p2p, const RingArgs& a, bool needs_reduce) {
  RG_CHECK(a.element_size > 0, "ring: element_size must be positive");
  RG_CHECK(a.count == 0 || a.data != nullptr, "ring: data is null");
  RG_CHECK(!needs_reduce || a.reduce, "ring: no reduce function");
  RG_CHECK(!needs_reduce || p2p.size() == 1 || a.count == 0 || a.scratch != nullptr,
           "ring: no scratch buffer");
  RG_CHECK(p2p.size() <= 2048, "ring: at most 2048 ranks (slot layout)");
}

}  // namespace

uint64_t ring_slot_base(uint64_t seq) {
  // Slot layout: [8-bit prefix 0x52 'R'][24-bit op sequence][12-bit step][20-bit chunk]; gloo's
  // own collectives use prefixes 0x01-0x08, so they never collide with ours.
  return (uint64_t(0x52) << 56) | ((seq & 0xFFFFFF) << 32);
}

size_t ring_block_begin(size_t count, int n, int b) {
  const size_t base = count / size_t(n), extra = count % size_t(n);
  return size_t(b) * base + std::min(size_t(b), extra);
}

size_t ring_scratch_bytes(size_t count, int n, size_t element_size) {
  return (count / size_t(n) + (count % size_t(n) ? 1 : 0)) * element_size;
}

void ring_all_reduce(PointToPoint& p2p, const RingArgs& args) {
  check_args(p2p, args, true);
  Ring(p2p, args).run(0, 2 * (p2p.size() - 1));
}

void ring_reduce_scatter(PointToPoint& p2p, const RingArgs& args) {
  check_args(p2p, args, true);
  Ring(p2p, args).run(0, p2p.size() - 1);
}

void ring_all_gather(PointToPoint& p2p, const RingArgs& args) {
  check_args(p2p, args, false);
  RingArgs a = args;
  a.finalize = nullptr;
  Ring(p2p, a).run(p2p.size() - 1, 2 * (p2p.size() - 1));
}

}  // namespace rg::dist
