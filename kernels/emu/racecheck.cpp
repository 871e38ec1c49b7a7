// The stream-race detector's shadow memory and its happens-before checks (kernels/emu/racecheck.h).
#include "kernels/emu/racecheck.h"

#include <algorithm>
#include <cstdio>

#include "kernels/error.h"

namespace rg::emu::detail {
namespace {

// Records kept per allocation; past this the oldest half is dropped (fewer races found, never a
// false one).
constexpr size_t kMaxRecords = 8192;

bool ordered_before(const Actor& earlier, const VectorClock& later) {
  return later.get(earlier.stream) >= earlier.epoch;
}

std::string describe(const Actor& a) { return *a.what + " on " + *a.where; }

}  // namespace

uint64_t VectorClock::tick(size_t i) {
  if (v_.size() <= i) v_.resize(i + 1, 0);
  return ++v_[i];
}

void VectorClock::join(const VectorClock& other) {
  if (v_.size() < other.v_.size()) v_.resize(other.v_.size(), 0);
  for (size_t i = 0; i < other.v_.size(); ++i) v_[i] = std::max(v_[i], other.v_[i]);
}

std::string format_range(uintptr_t begin, uintptr_t end) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "[%#lx+%lu)", static_cast<unsigned long>(begin),
                static_cast<unsigned long>(end - begin));
  return buf;
}

void RaceChecker::add_allocation(const void* base, size_t bytes, std::string owner) {
  allocations_[reinterpret_cast<uintptr_t>(base)] = Allocation{bytes, std::move(owner), {}};
}

void RaceChecker::remove_allocation(const void* base) {
  const auto b = reinterpret_cast<uintptr_t>(base);
  auto it = allocations_.find(b);
  if (it == allocations_.end()) return;
  blocks_.erase(blocks_.lower_bound(b), blocks_.lower_bound(b + it->second.bytes));
  allocations_.erase(it);
}

void RaceChecker::add_block(const void* ptr, size_t bytes) {
  const auto b = reinterpret_cast<uintptr_t>(ptr);
  blocks_[b] = b + bytes;
}

void RaceChecker::remove_block(const void* ptr) { blocks_.erase(reinterpret_cast<uintptr_t>(ptr)); }

RaceChecker::Allocation* RaceChecker::find(uintptr_t p, uintptr_t* base) {
  auto it = allocations_.upper_bound(p);
  if (it == allocations_.begin()) return nullptr;
  --it;
  // An allocation of 0 bytes still owns its address.
  if (p >= it->first + std::max<size_t>(it->second.bytes, 1)) return nullptr;
  *base = it->first;
  return &it->second;
}

uintptr_t RaceChecker::extent_end(uintptr_t p, uintptr_t alloc_end) const {
  auto it = blocks_.upper_bound(p);
  if (it != blocks_.begin()) {
    --it;
    if (p < it->second) return std::min(it->second, alloc_end);
  }
  return alloc_end;
}

std::vector<std::string> RaceChecker::access(const void* ptr, size_t bytes, bool write,
                                             const Actor& who, const VectorClock& clock) {
  std::vector<std::string> reports;
  const auto begin = reinterpret_cast<uintptr_t>(ptr);
  uintptr_t base = 0;
  Allocation* a = find(begin, &base);
  if (a == nullptr || bytes == 0) return reports;
  const uintptr_t alloc_end = base + a->bytes;
  const uintptr_t end =
      bytes == ~size_t(0) ? extent_end(begin, alloc_end) : std::min(alloc_end, begin + bytes);
  if (end <= begin) return reports;

  auto& recs = a->records;
  size_t kept = 0;
  for (size_t i = 0; i < recs.size(); ++i) {
    Record& r = recs[i];
    const bool overlaps = r.begin < end && begin < r.end;
    if (overlaps && r.who.stream != who.stream && (write || r.write) &&
        !ordered_before(r.who, clock)) {
      reports.push_back(::rg::detail::cat(
          "stream race in ", a->owner, ": ", describe(who), (write ? " writes " : " reads "),
          format_range(std::max(begin, r.begin), std::min(end, r.end)), ", which ", describe(r.who),
          (r.write ? " writes" : " reads"),
          " with no ordering between the two (record an event after the first and make the "
          "other stream wait for it, or synchronize)"));
    }
    // A record covered by this access and ordered before it says nothing more: anything that
    // conflicts with it conflicts with this access too. A read supersedes only reads.
    const bool superseded = overlaps && r.begin >= begin && r.end <= end &&
                            (write || !r.write) && ordered_before(r.who, clock) &&
                            reports.empty();
    if (!superseded) recs[kept++] = std::move(r);
  }
  recs.resize(kept);
  if (recs.size() >= kMaxRecords) recs.erase(recs.begin(), recs.begin() + kMaxRecords / 2);
  recs.push_back(Record{begin, end, write, who});
  return reports;
}

std::vector<std::string> RaceChecker::block_handed_out(const void* ptr, size_t bytes,
                                                       const Actor& who,
                                                       const VectorClock& clock) {
  std::vector<std::string> reports;
  const auto begin = reinterpret_cast<uintptr_t>(ptr), end = begin + bytes;
  add_block(ptr, bytes);
  uintptr_t base = 0;
  Allocation* a = find(begin, &base);
  if (a == nullptr) return reports;
  auto& recs = a->records;
  bool reused = false;
  size_t kept = 0;
  for (size_t i = 0; i < recs.size(); ++i) {
    Record& r = recs[i];
    if (!(r.begin < end && begin < r.end)) {
      recs[kept++] = std::move(r);
      continue;
    }
    reused = true;
    if (r.who.stream != who.stream && !ordered_before(r.who, clock)) {
      reports.push_back(::rg::detail::cat(
          "stream race in ", a->owner, ": the allocator handed ",
          format_range(std::max(begin, r.begin), std::min(end, r.end)), " out again to ",
          *who.where, " while ", describe(r.who), " may still ", (r.write ? "write" : "read"),
          " it (freed without record_stream for that stream, or reused before its event was "
          "reached)"));
    }
  }
  recs.resize(kept);
  // Reused memory belongs to its new stream from here: another stream must order itself after
  // the allocation before touching it.
  if (reused) recs.push_back(Record{begin, end, true, who});
  return reports;
}

void RaceChecker::block_released(const void* ptr, size_t bytes) {
  const auto begin = reinterpret_cast<uintptr_t>(ptr), end = begin + bytes;
  uintptr_t base = 0;
  Allocation* a = find(begin, &base);
  if (a == nullptr) return;
  auto& recs = a->records;
  recs.erase(std::remove_if(recs.begin(), recs.end(),
                            [&](const Record& r) { return r.begin >= begin && r.end <= end; }),
             recs.end());
}

std::vector<std::string> RaceChecker::block_freed(const void* ptr, size_t bytes, const Actor& who,
                                                  const VectorClock& clock,
                                                  const std::vector<size_t>& also_used_on) {
  std::vector<std::string> reports;
  const auto begin = reinterpret_cast<uintptr_t>(ptr), end = begin + bytes;
  remove_block(ptr);
  uintptr_t base = 0;
  Allocation* a = find(begin, &base);
  if (a == nullptr) return reports;
  auto& recs = a->records;
  size_t kept = 0;
  for (size_t i = 0; i < recs.size(); ++i) {
    Record& r = recs[i];
    const bool overlaps = r.begin < end && begin < r.end;
    const bool announced = std::find(also_used_on.begin(), also_used_on.end(), r.who.stream) !=
                           also_used_on.end();
    if (overlaps && r.who.stream != who.stream && !announced && !ordered_before(r.who, clock)) {
      reports.push_back(::rg::detail::cat(
          "stream race in ", a->owner, ": ", format_range(begin, end), " was freed by ", *who.where,
          " while ", describe(r.who), " may still ", (r.write ? "write" : "read"),
          " it (call record_stream for that stream before freeing, or synchronize)"));
      continue;  // reported once, not again when the block is reused
    }
    recs[kept++] = std::move(r);
  }
  recs.resize(kept);
  return reports;
}

}  // namespace rg::emu::detail
