// Heartbeats to the launcher: when RG_HEARTBEAT_FD names a descriptor (ringgrad-run sets it), a
// thread writes one byte to it every 0.5 s for the life of the process. ringgrad-run treats a
// worker that has beaten and then stays silent past --heartbeat-timeout-s as stopped (SIGSTOP)
// or hung, kills it and restarts the job like after a crash. init_process_group starts it.
#pragma once

namespace rg::dist {

// Starts the heartbeat thread once per process if RG_HEARTBEAT_FD is set; otherwise nothing.
void start_heartbeat_from_env();

}  // namespace rg::dist
