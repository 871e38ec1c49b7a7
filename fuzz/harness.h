// What every fuzz harness shares: the entry point's declaration, the rule that a parser may
// refuse its input only with an rg::Error (anything else it throws is a finding, as a crash is),
// and the allocation budget: at the peak, an input may not hold more than 64 times its size in
// live heap memory, plus kFixedBytes for the fixed tables of a parser.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <string_view>
#include <typeinfo>

#include "kernels/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

// The sanitizer runtime's allocator hooks (<sanitizer/allocator_interface.h> of clang; GCC's
// libasan has them too, without the header).
extern "C" int __sanitizer_install_malloc_and_free_hooks(void (*malloc_hook)(const volatile void*,
                                                                             size_t),
                                                         void (*free_hook)(const volatile void*));
extern "C" size_t __sanitizer_get_allocated_size(const volatile void* p);

namespace rg::fuzz {

// Bytes any input may use besides its 64x: fixed tables (the text vocabulary's bitmap of every
// code point, the store's buffers, the command line's option table).
inline constexpr int64_t kFixedBytes = int64_t(1) << 20;

namespace detail {
inline std::atomic<bool> g_counting{false};
inline std::atomic<int64_t> g_live{0}, g_peak{0};
inline void on_malloc(const volatile void*, size_t n) {
  if (!g_counting.load(std::memory_order_relaxed)) return;
  const int64_t live = g_live.fetch_add(int64_t(n)) + int64_t(n);
  int64_t peak = g_peak.load();
  while (live > peak && !g_peak.compare_exchange_weak(peak, live)) {
  }
}
inline void on_free(const volatile void* p) {
  if (p == nullptr || !g_counting.load(std::memory_order_relaxed)) return;
  g_live.fetch_sub(int64_t(__sanitizer_get_allocated_size(p)));
}
inline const int g_hooks_installed = __sanitizer_install_malloc_and_free_hooks(on_malloc, on_free);
inline int g_depth = 0;
}  // namespace detail

// Counts the heap bytes allocated and freed while it lives; aborts at its end when the peak passed
// 64 x `input_size` + kFixedBytes. Only the outermost one counts.
class AllocationBudget {
 public:
  explicit AllocationBudget(size_t input_size) : input_size_(input_size) {
    if (detail::g_depth++ > 0) return;
    detail::g_live = 0;
    detail::g_peak = 0;
    detail::g_counting = true;
  }
  ~AllocationBudget() {
    if (--detail::g_depth > 0) return;
    detail::g_counting = false;
    const int64_t limit = 64 * int64_t(input_size_) + kFixedBytes;
    if (detail::g_peak > limit) {
      std::fprintf(stderr,
                   "fuzz: out of budget: %lld bytes live at the peak for a %zu-byte input "
                   "(limit %lld)\n",
                   static_cast<long long>(detail::g_peak.load()), input_size_,
                   static_cast<long long>(limit));
      std::abort();
    }
  }
  AllocationBudget(const AllocationBudget&) = delete;
  AllocationBudget& operator=(const AllocationBudget&) = delete;

 private:
  size_t input_size_;
};

inline std::string_view as_text(const uint8_t* data, size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

// Runs `parse` on an input of `input_size` bytes within the AllocationBudget; a clean refusal
// (rg::Error, but not InternalError, which means a bug) is fine, any other exception aborts so
// that libFuzzer and the replay tests report it with the input.
template <class F>
void expect_clean(size_t input_size, F&& parse) {
  AllocationBudget budget(input_size);
  try {
    parse();
  } catch (const InternalError& e) {
    std::fprintf(stderr, "fuzz: internal error (a bug): %s\n", e.what());
    std::abort();
  } catch (const Error& e) {
    // The input was refused with a message: what a parser should do. RG_FUZZ_VERBOSE=1 shows it
    // (to see how deep the seeds get).
    if (std::getenv("RG_FUZZ_VERBOSE") != nullptr) std::fprintf(stderr, "refused: %s\n", e.what());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fuzz: a parser threw %s, not rg::Error: %s\n", typeid(e).name(),
                 e.what());
    std::abort();
  }
}

// A property of accepted inputs that does not hold: a bug.
inline void require(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "fuzz: property violated: %s\n", what);
    std::abort();
  }
}

}  // namespace rg::fuzz
