// Jobs without ringgrad-run: ringgrad-train processes started by hand with the torchrun, Slurm or
// Open MPI variables, or with --init-method tcp:// or file://, meet through the store rank 0
// hosts (or the file) and train together; every way gives the same result as the others. Also
// the errors: a port rank 0 cannot bind, a bad init method.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "comm/file_store.h"
#include "support/errors.h"
#include "support/processes.h"
#include "support/scratch_dir.h"

namespace rg {
namespace {

namespace fs = std::filesystem;

// A port that was free a moment ago (bound to 0 and closed).
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  socklen_t len = sizeof(a);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

using RankRun = testing::ProcessResult;

// One ringgrad-train per entry of `rank_env` (its extra "NAME=value" variables), all at once.
std::vector<RankRun> run_job(const std::vector<std::vector<std::string>>& rank_env,
                             const std::vector<std::string>& extra_args, const fs::path& dir,
                             double timeout_s = 120) {
  std::vector<std::string> args = {RG_TRAIN_BINARY,
                                   "--model",
                                   "mlp",
                                   "--dataset",
                                   "synthetic",
                                   "--max-steps",
                                   "4",
                                   "--batch-size",
                                   "16",
                                   "--workers",
                                   "0",
                                   "--seed",
                                   "3"};
  args.insert(args.end(), extra_args.begin(), extra_args.end());
  std::vector<testing::ProcessSpec> specs;
  for (const auto& env : rank_env) {
    testing::ProcessSpec spec{args, env};
    spec.env.push_back("RG_NUM_THREADS=1");
    specs.push_back(spec);
  }
  return testing::run_processes(specs, dir, timeout_s);
}

// Rank 0's final test loss and accuracy as printed in its final JSON line (equal for every way
// of launching the same job).
std::string final_line(const RankRun& r) {
  const size_t p = r.out.rfind("\"test_loss\"");
  return p == std::string::npos ? "" : r.out.substr(p, r.out.find("\"type\"", p) - p);
}

class Rendezvous : public testing::ScratchDirTest {
 protected:
  // Runs the job and expects every rank to succeed as 2 ranks of DDP; returns rank 0's result.
  std::string expect_trains(const std::vector<std::vector<std::string>>& rank_env,
                            const std::vector<std::string>& args = {}) {
    const std::vector<RankRun> runs = run_job(rank_env, args, dir_);
    for (size_t r = 0; r < runs.size(); ++r)
      EXPECT_EQ(runs[r].exit_code, 0) << "rank " << r << ":\n" << runs[r].out;
    EXPECT_NE(runs[0].out.find("DDP over " + std::to_string(runs.size()) + " ranks"),
              std::string::npos)
        << runs[0].out;
    EXPECT_NE(runs[0].out.find("\"world_size\":" + std::to_string(runs.size())), std::string::npos)
        << runs[0].out;
    return final_line(runs[0]);
  }
};

// The torchrun variables set by hand; the result is the reference for the other ways.
TEST_F(Rendezvous, AllWaysOfStartingAJobMeetAndTrainAlike) {
  const std::string port = std::to_string(free_port());
  const std::string torchrun =
      expect_trains({{"RANK=0", "WORLD_SIZE=2", "MASTER_ADDR=127.0.0.1", "MASTER_PORT=" + port},
                     {"RANK=1", "WORLD_SIZE=2", "MASTER_ADDR=127.0.0.1", "MASTER_PORT=" + port}});
  ASSERT_FALSE(torchrun.empty());
  // srun: SLURM_PROCID/SLURM_NTASKS and the per-node count; MASTER_ADDR is optional on one node.
  const std::string p2 = std::to_string(free_port());
  const std::string slurm = expect_trains({{"SLURM_PROCID=0", "SLURM_NTASKS=2", "SLURM_LOCALID=0",
                                            "SLURM_TASKS_PER_NODE=2", "MASTER_PORT=" + p2},
                                           {"SLURM_PROCID=1", "SLURM_NTASKS=2", "SLURM_LOCALID=1",
                                            "SLURM_TASKS_PER_NODE=2", "MASTER_PORT=" + p2}});
  EXPECT_EQ(slurm, torchrun);
  // mpirun (Open MPI).
  const std::string p3 = std::to_string(free_port());
  const std::string ompi = expect_trains(
      {{"OMPI_COMM_WORLD_RANK=0", "OMPI_COMM_WORLD_SIZE=2", "OMPI_COMM_WORLD_LOCAL_RANK=0",
        "OMPI_COMM_WORLD_LOCAL_SIZE=2", "MASTER_PORT=" + p3},
       {"OMPI_COMM_WORLD_RANK=1", "OMPI_COMM_WORLD_SIZE=2", "OMPI_COMM_WORLD_LOCAL_RANK=1",
        "OMPI_COMM_WORLD_LOCAL_SIZE=2", "MASTER_PORT=" + p3}});
  EXPECT_EQ(ompi, torchrun);
  // tcp://HOST:PORT: the address from the flag, ranks from the environment.
  const std::string tcp = "tcp://127.0.0.1:" + std::to_string(free_port());
  EXPECT_EQ(expect_trains({{"RANK=0", "WORLD_SIZE=2"}, {"RANK=1", "WORLD_SIZE=2"}},
                          {"--init-method", tcp}),
            torchrun);
  // file:///PATH: no network rendezvous at all; the file is gone afterwards.
  const fs::path file = dir_ / "rendezvous";
  EXPECT_EQ(expect_trains({{"RANK=0", "WORLD_SIZE=2"}, {"RANK=1", "WORLD_SIZE=2"}},
                          {"--init-method", "file://" + file.string()}),
            torchrun);
  EXPECT_FALSE(fs::exists(file)) << "rank 0 removes the FileStore once every rank has left";
}

// Three ranks by hand, a token required by the store: the ranks that present it meet.
TEST_F(Rendezvous, ThreeRanksWithAToken) {
  const std::string port = std::to_string(free_port());
  std::vector<std::vector<std::string>> env;
  for (int r = 0; r < 3; ++r)
    env.push_back({"RANK=" + std::to_string(r), "WORLD_SIZE=3", "MASTER_PORT=" + port,
                   "RG_STORE_TOKEN=s3cret"});
  expect_trains(env);
}

// Rank 0 cannot host the store on a port that is taken: a clear error that says what to do.
TEST_F(Rendezvous, APortThatIsTakenIsAClearError) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  ASSERT_EQ(::listen(fd, 1), 0);
  socklen_t len = sizeof(a);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  const std::string port = std::to_string(ntohs(a.sin_port));
  const std::vector<RankRun> runs =
      run_job({{"RANK=0", "WORLD_SIZE=2", "MASTER_PORT=" + port}}, {}, dir_, 60);
  ::close(fd);
  EXPECT_EQ(runs[0].exit_code, 1) << runs[0].out;
  EXPECT_NE(runs[0].out.find("rank 0 hosts the job's store (no launcher does) but cannot"),
            std::string::npos)
      << runs[0].out;
  EXPECT_NE(runs[0].out.find("Choose a free MASTER_PORT"), std::string::npos) << runs[0].out;
}

TEST_F(Rendezvous, ABadInitMethodIsAClearError) {
  const std::vector<RankRun> runs =
      run_job({{"RANK=0", "WORLD_SIZE=2"}}, {"--init-method", "udp://x:1"}, dir_, 30);
  EXPECT_EQ(runs[0].exit_code, 1);
  EXPECT_NE(runs[0].out.find("unknown init_method 'udp://x:1' (expected env://, tcp://HOST:PORT "
                             "or file:///PATH)"),
            std::string::npos)
      << runs[0].out;
}

// The FileStore itself: two instances on one file (as two processes) see each other's writes;
// add is atomic across them; blocking reads time out naming the keys.
TEST_F(Rendezvous, FileStoreInstancesShareOneFile) {
  const std::string path = (dir_ / "store").string();
  dist::FileStore a(path), b(path);
  a.set("k", std::string_view("v1"));
  EXPECT_EQ(b.get_string("k"), "v1");
  b.set("k", std::string_view("v2"));
  EXPECT_EQ(a.get_string("k"), "v2");
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      dist::FileStore& s = t % 2 ? a : b;
      for (int i = 0; i < 50; ++i) s.add("n", 1);
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(a.add("n", 0), 200);
  EXPECT_EQ(dist::to_string(b.compare_set("c", {}, dist::to_bytes("x"))), "x");
  EXPECT_EQ(dist::to_string(a.compare_set("c", dist::to_bytes("y"), dist::to_bytes("z"))), "x");
  EXPECT_TRUE(a.check({"k", "n", "c"}));
  EXPECT_EQ(b.num_keys(), 3);
  EXPECT_TRUE(b.delete_key("c"));
  EXPECT_FALSE(a.check({"c"}));
  EXPECT_FALSE(a.delete_key("c"));
  testing::expect_error([&] { a.get("missing", std::chrono::milliseconds(50)); },
                        "store wait timed out after 50 ms; missing keys: 'missing'");
  std::thread late([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    b.set("late", std::string_view("here"));
  });
  EXPECT_EQ(a.get_string("late"), "here");
  late.join();
}

}  // namespace
}  // namespace rg
