// The deterministic-algorithms switch, like torch.use_deterministic_algorithms(True) together with
// torch.backends.cudnn.deterministic: under it only algorithms that give the same bits run to run
// (same inputs, software and hardware) are used, and an op that has none on the device in use is
// an rg::Error naming the op. docs/architecture.md ("Determinism") lists every op and what the
// switch changes for it.
#pragma once

namespace rg {

// Off by default; process-wide, read when an op runs.
void set_deterministic_algorithms(bool on);
bool deterministic_algorithms();

}  // namespace rg
