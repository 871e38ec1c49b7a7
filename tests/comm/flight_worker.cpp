// A worker for the launcher's flight recorder test (tests/comm/launcher_test.cpp): it installs the
// recorder's SIGUSR1 dump and the heartbeats as init_process_group does, records 12 completed
// all-reduces, and then rank 1 fails while the others stay in a 13th that never ends.
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "comm/flight_recorder.h"
#include "comm/heartbeat.h"

int main() {
  using rg::dist::FlightRecorder;
  const char* rank_env = std::getenv("RANK");
  const char* world_env = std::getenv("WORLD_SIZE");
  if (rank_env == nullptr || world_env == nullptr) return 2;
  const int rank = std::stoi(rank_env);
  FlightRecorder::install_signal_dump(rank, std::stoi(world_env));
  rg::dist::start_heartbeat_from_env();
  FlightRecorder& recorder = FlightRecorder::global();
  rg::dist::CollectiveCall call;
  call.op = "all_reduce";
  call.reduce_op = "sum";
  call.dtype = "f32";
  call.shapes = {{1000}};
  call.device = "cpu";
  for (call.seq = 1; call.seq <= 12; ++call.seq) {
    const uint64_t id = recorder.enqueued(call);
    recorder.started(id, rg::dist::unix_seconds());
    recorder.ended(id, rg::dist::unix_seconds());
  }
  if (rank == 1) {
    for (int i = 0; i < 10; ++i) ::usleep(100000);  // the others' heartbeats have gone out
    return 3;
  }
  call.seq = 13;
  recorder.started(recorder.enqueued(call), rg::dist::unix_seconds());
  while (true) ::pause();  // until the launcher stops it; SIGUSR1 would end a sleep() early
}
