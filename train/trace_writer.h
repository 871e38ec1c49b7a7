// The trace file of a run: every rank's trace events gathered on rank 0, which writes one Chrome
// trace (a process per rank).
#pragma once

#include <string>

namespace rg::dist {
class ProcessGroup;
}

namespace rg::train {

// Collective under a group (every rank calls it); rank 0 writes `path`.
void write_trace(const std::string& path, dist::ProcessGroup* pg);

}  // namespace rg::train
