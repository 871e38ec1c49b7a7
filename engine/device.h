// Where a tensor's memory lives: the CPU or one CUDA device.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace rg {

enum class DeviceType : uint8_t { cpu, cuda };

struct Device {
  DeviceType type = DeviceType::cpu;
  int index = 0;

  static constexpr Device cpu() { return Device{DeviceType::cpu, 0}; }
  static constexpr Device cuda(int i = 0) { return Device{DeviceType::cuda, i}; }
  constexpr bool is_cpu() const { return type == DeviceType::cpu; }
  constexpr bool is_cuda() const { return type == DeviceType::cuda; }
  constexpr bool operator==(const Device&) const = default;
  std::string str() const;  // "cpu" or "cuda:0"
};

// "cpu", "cuda" (cuda:0) or "cuda:N"; anything else is an rg::Error.
Device parse_device(std::string_view name);

}  // namespace rg
