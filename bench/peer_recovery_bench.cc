// peer_recovery_bench: a parameter server killed -9 during CTR training,
// recovered from its buddy's memory (peer snapshots, issue 34 item 5)
// against from the disk checkpoint, side by side in one run.
//
//   peer_recovery_bench [--steps 60000] [--peer-every 1] [--checkpoint-every 10] [--kill-after 5]
//                       [--mib 0] [--runs 1] [--dir DIR]
//
// Each run starts, per mode, a fresh cluster (build/bin): 2 ps-servers (ps1
// on a fixed port), a coordinator saving a checkpoint every
// --checkpoint-every seconds into --dir (both modes) and, in the peer mode,
// --peer-snapshot-every-seconds --peer-every; 2 worker-servers with the CTR
// module; then build/bin/ctr --count-updates (each step adds 1 to
// "ctr_updates", one element on each server) in the background, with --mib
// MiB more of model on the servers (a float32 variable by initializer, half
// on each). --kill-after seconds after the first checkpoint is saved
// (mid-interval: a disk recovery then loses about that much), ps1 is killed
// -9 and started again empty on its port. Measures:
//   resume   kill -9 -> the coordinator's log says ps1's shards are back and
//            dispatch resumes (polled; includes the restart), and the
//            coordinator's own figure ("N ms after it was lost")
//   lost     the updates ps1 lost: steps - its element of ctr_updates (the
//            lower of the two)
// Medians of --runs. Prints figures; never fails on them.
#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

#include "bench_util.h"
#include "capstan/training.h"

namespace {

namespace bench = capstan::bench;
using bench::median;
using bench::read_all;

struct Run {
  double resume_s = 0;      // kill -9 -> the recovery in the coordinator's log
  double logged_ms = 0;     // the coordinator's "N ms after it was lost"
  double lost = 0;          // updates ps1 lost
  double steps_per_s = 0;   // ctr's own figure
  bool from_peer = false;   // the log says the in-memory copy
};

Run one_run(const std::string& bin_dir, const std::string& lib_dir, bool peer, int peer_every, int checkpoint_every,
            int kill_after, int64_t steps, int64_t mib, const std::string& dir, int index) {
  const std::string tag = std::to_string(index) + (peer ? "-peer" : "-disk");
  const int ps1_port = bench::free_port();
  auto ps0 = bench::start(bin_dir, "ps-server", "ps0-" + tag, {"--task-index", "0"});
  auto ps1 = bench::start(bin_dir, "ps-server", "ps1-" + tag, {"--task-index", "1"}, ps1_port);
  const std::string ckpt_dir = dir + "/run-" + tag;
  std::vector<std::string> flags = {"--ps", ps0.address + "," + ps1.address, "--checkpoint-dir", ckpt_dir,
                                    "--checkpoint-every-seconds", std::to_string(checkpoint_every),
                                    "--checkpoint-max-to-keep", "2"};
  if (peer) flags.insert(flags.end(), {"--peer-snapshot-every-seconds", std::to_string(peer_every)});
  const std::string coordinator_label = "coordinator-" + tag;
  const std::string coordinator_log = bench::run_dir() + "/" + coordinator_label + ".log";
  auto coordinator = bench::start(bin_dir, "coordinator", coordinator_label, flags);
  for (int w = 0; w < 2; ++w) {
    bench::start(bin_dir, "worker-server", "worker" + std::to_string(w) + "-" + tag,
                 {"--coordinator", coordinator.address, "--task-index", std::to_string(w), "--module",
                  lib_dir + "/libctr_module.so"});
  }
  auto cluster = capstan::ClusterCoordinator::connect(coordinator.address);
  if (!cluster.ok()) bench::fail("connecting", cluster.status());
  if (mib > 0) {
    const int64_t columns = 1024;
    capstan::VariableSpec ballast;
    ballast.name = "ballast";
    ballast.optimizer = capstan::Optimizer::sgd(0.1);
    ballast.partitioner = capstan::Partitioner::fixed_shards(2);
    ballast.initializer = capstan::Initializer::random_uniform(-1, 1, 7);
    ballast.dtype = capstan::DType::kFloat32;
    ballast.shape = {mib * (1 << 20) / (columns * 4), columns};
    auto created = (*cluster)->create_variable(ballast);
    if (!created.ok()) bench::fail("creating the ballast variable", created.status());
  }

  const std::string out = bench::run_dir() + "/ctr-" + tag + ".out";
  pid_t ctr = bench::spawn({bin_dir + "/ctr", "--coordinator", coordinator.address, "--steps", std::to_string(steps),
                            "--min-workers", "2", "--log-every", "1000000", "--max-gap", "100", "--count-updates"},
                           out);
  // The first checkpoint, then kill_after seconds.
  while (read_all(coordinator_log).find("saved checkpoint") == std::string::npos) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    if (waitpid(ctr, nullptr, WNOHANG) == ctr) {
      std::fprintf(stderr, "peer_recovery_bench: ctr ended before the first checkpoint; use more --steps\n");
      bench::stop_all();
      std::exit(1);
    }
  }
  std::this_thread::sleep_for(std::chrono::seconds(kill_after));

  auto killed = bench::Clock::now();
  bench::kill9(ps1.pid);
  ps1 = bench::start(bin_dir, "ps-server", "ps1-restart-" + tag, {"--task-index", "1"}, ps1_port);
  static const std::regex recovered(R"(restored \d+ shard\(s\) from (the in-memory copy|checkpoint)[^\n]* (\d+) ms after it was lost)");
  Run run;
  std::smatch m;
  for (;;) {
    std::string log = read_all(coordinator_log);
    if (std::regex_search(log, m, recovered)) {
      run.resume_s = bench::seconds_since(killed);
      run.logged_ms = std::stod(m[2]);
      run.from_peer = m[1] == "the in-memory copy";
      break;
    }
    if (bench::seconds_since(killed) > 120) {
      std::fprintf(stderr, "peer_recovery_bench: no recovery in the coordinator's log after 120 s; see %s\n",
                   coordinator_log.c_str());
      bench::stop_all();
      std::exit(1);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  int status = 0;
  waitpid(ctr, &status, 0);
  std::string text = read_all(out);
  static const std::regex counted(R"(updates counted: ([0-9.]+) and ([0-9.]+))");
  static const std::regex trained(R"(trained (\d+) steps \((\d+) examples\) in ([0-9.]+) s)");
  if (!std::regex_search(text, m, counted)) {
    std::fprintf(stderr, "peer_recovery_bench: ctr did not finish (exit status %d); see %s\n", status, out.c_str());
    bench::stop_all();
    std::exit(1);
  }
  // One element on each server: the killed one's is the lower (the other
  // may count a re-run step twice).
  run.lost = static_cast<double>(steps) - std::min(std::stod(m[1]), std::stod(m[2]));
  if (std::regex_search(text, m, trained)) run.steps_per_s = std::stod(m[1]) / std::stod(m[3]);
  bench::stop_all();
  std::filesystem::remove_all(ckpt_dir);
  return run;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t steps = 60000, mib = 0;
  int peer_every = 1, checkpoint_every = 10, kill_after = 5, runs = 1;
  std::string dir;
  bench::FlagParser args(argc, argv,
                         "[--steps N] [--peer-every S] [--checkpoint-every S] [--kill-after S] [--mib N] [--runs N] "
                         "[--dir DIR]");
  while (args.next()) {
    if (args.flag("--steps", &steps) || args.flag("--peer-every", &peer_every) ||
        args.flag("--checkpoint-every", &checkpoint_every) || args.flag("--kill-after", &kill_after) ||
        args.flag("--mib", &mib) || args.flag("--runs", &runs) || args.flag("--dir", &dir)) {
      continue;
    }
    args.unknown();
  }
  if (steps < 1 || peer_every < 1 || checkpoint_every < 1 || kill_after < 0 || mib < 0 || runs < 1) {
    std::fprintf(stderr, "peer_recovery_bench: --steps, --peer-every, --checkpoint-every and --runs must be at "
                         "least 1, --kill-after and --mib at least 0\n");
    return 2;
  }
  signal(SIGPIPE, SIG_IGN);
  const std::string bin_dir = bench::bin_dir();
  const std::string lib_dir = std::filesystem::path(bin_dir).parent_path().string() + "/lib";
  if (dir.empty()) dir = bench::run_dir() + "/checkpoints";
  std::filesystem::create_directories(dir);
  std::printf("peer_recovery_bench: CTR, %lld steps on 2 workers, 2 parameter servers (+%lld MiB of model), a "
              "checkpoint every %d s; ps1 killed -9 %d s after the first checkpoint and restarted empty; peer "
              "snapshots every %d s in the peer mode (%u cores)\n",
              static_cast<long long>(steps), static_cast<long long>(mib), checkpoint_every, kill_after, peer_every,
              std::thread::hardware_concurrency());
  std::vector<Run> disk, peer;
  for (int run = 0; run < runs; ++run) {
    for (bool use_peer : {false, true}) {
      Run r = one_run(bin_dir, lib_dir, use_peer, peer_every, checkpoint_every, kill_after, steps, mib, dir, run + 1);
      std::printf("  run %d %-4s: resume %.2f s (coordinator: %.0f ms after it was lost, from %s), %.0f updates lost, "
                  "%.0f steps/s\n",
                  run + 1, use_peer ? "peer" : "disk", r.resume_s, r.logged_ms,
                  r.from_peer ? "the buddy's memory" : "the checkpoint", r.lost, r.steps_per_s);
      std::fflush(stdout);
      (use_peer ? peer : disk).push_back(r);
    }
  }
  auto med = [](const std::vector<Run>& runs, double Run::*field) {
    std::vector<double> v;
    for (const Run& r : runs) v.push_back(r.*field);
    return median(v);
  };
  std::printf("\n%-40s %12s %12s\n", "median", "disk", "peer");
  std::printf("%-40s %11.2fs %11.2fs\n", "kill -9 ps1 -> shards back (log seen)", med(disk, &Run::resume_s),
              med(peer, &Run::resume_s));
  std::printf("%-40s %10.0fms %10.0fms\n", "  coordinator: lost -> shards restored", med(disk, &Run::logged_ms),
              med(peer, &Run::logged_ms));
  std::printf("%-40s %12.0f %12.0f\n", "updates lost on ps1", med(disk, &Run::lost), med(peer, &Run::lost));
  std::printf("%-40s %12.0f %12.0f\n", "steps/s (whole run)", med(disk, &Run::steps_per_s),
              med(peer, &Run::steps_per_s));
  std::printf("\nlogs: %s\n", bench::run_dir().c_str());
  return 0;
}
