// The cuDNN switch of engine/ops/cudnn.h: one process-wide flag, read when an op runs.
#include "engine/ops/cudnn.h"

#include <atomic>

namespace rg {
namespace {
std::atomic<bool> enabled{true};
}  // namespace

void set_cudnn_enabled(bool on) { enabled.store(on); }
bool cudnn_enabled() { return enabled.load(); }

}  // namespace rg
