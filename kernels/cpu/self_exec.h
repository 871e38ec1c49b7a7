// Executing this program again in place, keeping its name: ensure_runtime_env
// (kernels/cpu/runtime_env.h) re-executes every program once to fix its environment, and
// dist::spawn (comm/spawn.h) starts each rank that way.
//
// The kernel names a process after the file name given to execve (/proc/PID/comm, what ps, top
// and pgrep -x show), so executing "/proc/self/exe" names every such process "exe". exec_self
// executes the program's real path, readlink("/proc/self/exe"), while that path still holds this
// very file (same device and inode); the process then keeps its name from the start. Otherwise it
// executes /proc/self/exe, which reaches the running file even when it was deleted or replaced
// since it started (a rebuild, a reinstall): the path then leads nowhere ("... (deleted)") or to
// another build, and the ranks of one job must run one binary. After that fallback the new process
// is named "exe" until it calls restore_program_name() (ensure_runtime_env and spawn() do).
// Left open: the file replaced in the microseconds between the check and the execve runs the new
// file, as if the program had been started a moment later.
#pragma once

namespace rg::kernels::cpu {

// execve of this program's file with argv and envp (argv[0] is the caller's to choose; the
// programs pass their own). Returns only when both ways fail (errno set). Async-signal-safe: no
// allocation, so it may run between fork() and exec in a process with threads.
void exec_self(char* const argv[], char* const envp[]);

// Names the process after its program file when it is named "exe" (started through
// /proc/self/exe, exec_self's fallback); does nothing otherwise.
void restore_program_name();

}  // namespace rg::kernels::cpu
