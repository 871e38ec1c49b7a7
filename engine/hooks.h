// Hook lists with removable handles, shared by tensor hooks (Tensor::register_hook) and module
// hooks (nn::Module::register_forward_hook, ...), as torch.utils.hooks.RemovableHandle.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>

namespace rg {

// Returned by every register_*hook: remove() unregisters the hook. Removing twice, or after the
// tensor or module that held the hook is gone, does nothing. Dropping the handle keeps the hook.
class RemovableHandle {
 public:
  RemovableHandle() = default;
  explicit RemovableHandle(std::function<void()> remove) : remove_(std::move(remove)) {}
  void remove() {
    if (remove_) std::exchange(remove_, nullptr)();
  }

 private:
  std::function<void()> remove_;
};

// Hooks in registration order. The handles hold the list weakly, so they never keep a tensor or
// module alive.
template <class Fn>
class HookList {
 public:
  RemovableHandle add(Fn fn) {
    const uint64_t id = next_id_++;
    entries_->emplace_back(id, std::move(fn));
    return RemovableHandle([weak = std::weak_ptr<Entries>(entries_), id] {
      if (auto entries = weak.lock()) {
        std::erase_if(*entries, [id](const auto& e) { return e.first == id; });
      }
    });
  }
  bool empty() const { return entries_->empty(); }
  // A copy: a hook may remove itself (or register another) while the list runs.
  std::vector<Fn> snapshot() const {
    std::vector<Fn> out;
    for (const auto& e : *entries_) out.push_back(e.second);
    return out;
  }

 private:
  using Entries = std::vector<std::pair<uint64_t, Fn>>;
  std::shared_ptr<Entries> entries_ = std::make_shared<Entries>();
  uint64_t next_id_ = 0;
};

// Hooks return std::optional<R>: a value replaces what they were given, nullopt keeps it (Python's
// None). This lets a hook that only observes return nothing, as in PyTorch.
template <class R, class... Args, class F>
std::function<std::optional<R>(Args...)> optional_result_hook(F fn) {
  if constexpr (std::is_void_v<std::invoke_result_t<F&, Args...>>) {
    return [fn = std::move(fn)](Args... args) mutable -> std::optional<R> {
      fn(std::forward<Args>(args)...);
      return std::nullopt;
    };
  } else {
    return fn;
  }
}

}  // namespace rg
