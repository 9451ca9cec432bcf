// Synchronous training through failures (issue 35's failure bench): the
// census Wide & Deep model (examples/census, LibTorch when built) in
// strategy mode on --workers worker-servers with the exactly-once step
// input, once without failures and once with a worker killed with kill -9
// every --kill-every seconds and restarted --restart-after seconds later
// (and, with --kill-coordinator-at S, the coordinator killed -9 once S
// seconds in and restarted on its address with its work_dir), the same
// epochs and seed.
//
// Prints for the run with failures: steps committed / steps run (step
// efficiency), examples/s against the failure-free run's (time
// efficiency), the time from each kill to the next committed step (p50 and
// max), whether each epoch trained on every example exactly once (the
// census program counts the example ids the replicas return), and the final
// test accuracy against the failure-free run's. Aim (the issue's): step
// efficiency >= 1 - (recovery time / kill interval) - 1%.
//
// Usage: sync_failure_bench [--workers 3] [--epochs 40] [--kill-every 30] [--restart-after 2]
//                           [--kill-coordinator-at S] [--batch 256] [--seed 1] [--data-dir DIR]
#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench_util.h"
#include "tests/build_path.h"

namespace {

namespace bench = capstan::bench;

using bench::Clock;

struct Options {
  int workers = 3;
  int epochs = 40;
  double kill_every = 30;
  double restart_after = 2;
  double kill_coordinator_at = -1;
  int batch = 256;
  int seed = 1;
  std::string data_dir;
};

struct Run {
  bool finished = false;     // the program exited 0
  double seconds = 0;        // training program's wall time
  int64_t attempted = 0;     // steps run
  int64_t committed = 0;     // steps that committed
  int64_t examples = 0;      // committed examples (input position at the end)
  std::vector<double> recovery_s;  // kill -> next committed step
  int kills = 0;
  int exact_epochs = 0;      // epochs the program found exactly once
  double accuracy = -1;      // final test accuracy, %
  std::string output;        // the program's stdout file
};

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

bool exited(pid_t pid, int* status) { return waitpid(pid, status, WNOHANG) == pid; }

Run one_run(const std::string& bin_dir, const std::string& lib_dir, const Options& o, bool failures) {
  Run run;
  const std::string tag = failures ? "failures" : "clean";
  const std::string work_dir = bench::run_dir() + "/" + tag + "-coordinator";
  std::filesystem::create_directories(work_dir);
  const int coordinator_port = bench::free_port();
  auto start_coordinator = [&]() {
    return bench::start(bin_dir, "coordinator", tag + "-coordinator",
                        {"--work-dir", work_dir},
                        coordinator_port);
  };
  bench::Daemon coordinator = start_coordinator();
  std::vector<std::string> modules = {"--module", lib_dir + "/libcensus_module.so"};
  if (std::filesystem::exists(lib_dir + "/libcensus_torch_module.so")) {
    modules.insert(modules.end(), {"--module", lib_dir + "/libcensus_torch_module.so"});
  }
  auto start_worker = [&](int index, int incarnation) {
    std::vector<std::string> args = {"--coordinator", coordinator.address, "--task-index", std::to_string(index)};
    args.insert(args.end(), modules.begin(), modules.end());
    return bench::start(bin_dir, "worker-server",
                        tag + "-worker" + std::to_string(index) + "." + std::to_string(incarnation), args);
  };
  std::vector<bench::Daemon> workers;
  for (int i = 0; i < o.workers; ++i) workers.push_back(start_worker(i, 0));

  const std::string step_log = bench::run_dir() + "/" + tag + "-steps.log";
  run.output = bench::run_dir() + "/" + tag + "-census.out";
  const auto started = Clock::now();
  pid_t program = bench::spawn({bin_dir + "/census", "--coordinator", coordinator.address, "--mode", "strategy",
                                "--min-workers", "2", "--batch-size", std::to_string(o.batch), "--epochs",
                                std::to_string(o.epochs), "--seed", std::to_string(o.seed), "--data-dir", o.data_dir,
                                "--step-log", step_log, "--log-every", "1000000", "--target-accuracy", "0",
                                "--target-auc", "0"},
                               run.output);
  std::vector<int64_t> kills_ms;
  int status = 0;
  int next_victim = o.workers - 1;
  double next_kill = o.kill_every;
  bool coordinator_killed = false;
  while (!exited(program, &status)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    const double t = bench::seconds_since(started);
    if (failures && o.kill_coordinator_at >= 0 && !coordinator_killed && t >= o.kill_coordinator_at) {
      coordinator_killed = true;
      kills_ms.push_back(now_ms());
      bench::kill9(coordinator.pid);
      std::this_thread::sleep_for(std::chrono::milliseconds(static_cast<int64_t>(o.restart_after * 1000)));
      coordinator = start_coordinator();
      std::printf("    %.1f s: coordinator killed -9, restarted\n", t);
      std::fflush(stdout);
      continue;
    }
    if (!failures || t < next_kill) continue;
    next_kill += o.kill_every;
    const int victim = next_victim;
    next_victim = (next_victim + o.workers - 1) % o.workers;
    kills_ms.push_back(now_ms());
    bench::kill9(workers[static_cast<size_t>(victim)].pid);
    std::this_thread::sleep_for(std::chrono::milliseconds(static_cast<int64_t>(o.restart_after * 1000)));
    workers[static_cast<size_t>(victim)] = start_worker(victim, ++run.kills);
    std::printf("    %.1f s: worker %d killed -9, restarted %.0f s later\n", t, victim, o.restart_after);
    std::fflush(stdout);
  }
  run.seconds = bench::seconds_since(started);
  run.finished = WIFEXITED(status) && WEXITSTATUS(status) == 0;
  bench::stop_all();

  // The steps: "<unix ms> ok|failed <input position> <replicas>".
  std::vector<int64_t> committed_ms;
  std::istringstream steps(bench::read_all(step_log));
  std::string line;
  while (std::getline(steps, line)) {
    std::istringstream fields(line);
    int64_t ms = 0, position = 0;
    std::string outcome;
    if (!(fields >> ms >> outcome >> position)) continue;
    ++run.attempted;
    if (outcome == "ok") {
      ++run.committed;
      committed_ms.push_back(ms);
      run.examples = position;
    }
  }
  for (int64_t kill : kills_ms) {
    auto next = std::upper_bound(committed_ms.begin(), committed_ms.end(), kill);
    if (next != committed_ms.end()) run.recovery_s.push_back(static_cast<double>(*next - kill) / 1000);
  }
  std::istringstream out(bench::read_all(run.output));
  while (std::getline(out, line)) {
    if (line.find("trained on every example exactly once") != std::string::npos) ++run.exact_epochs;
    float accuracy = 0;
    if (std::sscanf(line.c_str(), "  accuracy %f%%", &accuracy) == 1) run.accuracy = accuracy;
  }
  return run;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  o.data_dir = capstan::testing::build_path(CAPSTAN_SOURCE_DIR) + "/examples/census/data";
  bench::FlagParser args(argc, argv,
                         "[--workers N] [--epochs N] [--kill-every S] [--restart-after S] [--kill-coordinator-at S] "
                         "[--batch N] [--seed N] [--data-dir DIR]");
  while (args.next()) {
    if (args.flag("--workers", &o.workers) || args.flag("--epochs", &o.epochs) ||
        args.flag("--kill-every", &o.kill_every) || args.flag("--restart-after", &o.restart_after) ||
        args.flag("--kill-coordinator-at", &o.kill_coordinator_at) || args.flag("--batch", &o.batch) ||
        args.flag("--seed", &o.seed) || args.flag("--data-dir", &o.data_dir)) {
      continue;
    }
    args.unknown();
  }
  if (o.workers < 2 || o.epochs < 1 || o.kill_every <= o.restart_after || o.restart_after < 0 || o.batch < o.workers) {
    std::fprintf(stderr, "sync_failure_bench: --workers at least 2, --epochs at least 1, --kill-every above "
                         "--restart-after (>= 0), --batch at least --workers\n");
    return 2;
  }
  signal(SIGPIPE, SIG_IGN);
  const std::string bin_dir = bench::bin_dir();
  const std::string lib_dir = std::filesystem::path(bin_dir).parent_path().string() + "/lib";
  std::printf("sync_failure_bench: census (strategy mode, exactly-once step input, global batch %d) on %d "
              "worker-servers, %d epochs, seed %d; then the same with a worker killed -9 every %.0f s and restarted "
              "%.0f s later%s (%u cores)\n",
              o.batch, o.workers, o.epochs, o.seed, o.kill_every, o.restart_after,
              o.kill_coordinator_at >= 0 ? (", the coordinator killed -9 at " +
                                            std::to_string(static_cast<int>(o.kill_coordinator_at)) + " s")
                                               .c_str()
                                         : "",
              std::thread::hardware_concurrency());
  std::fflush(stdout);
  Run clean = one_run(bin_dir, lib_dir, o, false);
  std::printf("  failure-free: %.1f s, %lld steps, %.0f examples/s, test accuracy %.2f%%, %d/%d epochs exactly "
              "once%s\n",
              clean.seconds, static_cast<long long>(clean.committed), clean.examples / clean.seconds, clean.accuracy,
              clean.exact_epochs, o.epochs, clean.finished ? "" : " (the program FAILED: see its output)");
  std::fflush(stdout);
  Run failed = one_run(bin_dir, lib_dir, o, true);
  const double step_efficiency =
      failed.attempted > 0 ? static_cast<double>(failed.committed) / static_cast<double>(failed.attempted) : 0;
  const double time_efficiency = (failed.examples / failed.seconds) / (clean.examples / clean.seconds);
  const double recovery_p50 = bench::median(failed.recovery_s);
  const double recovery_max =
      failed.recovery_s.empty() ? 0 : *std::max_element(failed.recovery_s.begin(), failed.recovery_s.end());
  const double aim = 1 - recovery_p50 / o.kill_every - 0.01;
  std::printf("  with failures: %.1f s, %d kill(s), %lld of %lld steps committed\n", failed.seconds, failed.kills,
              static_cast<long long>(failed.committed), static_cast<long long>(failed.attempted));
  std::printf("\n%-48s %s\n", "step efficiency (committed / run)",
              (std::to_string(step_efficiency * 100).substr(0, 6) + "% (aim >= " +
               std::to_string(aim * 100).substr(0, 5) + "%)")
                  .c_str());
  std::printf("%-48s %.1f%%\n", "time efficiency (examples/s vs failure-free)", time_efficiency * 100);
  std::printf("%-48s p50 %.2f s, max %.2f s (%zu kills)\n", "kill -9 -> next committed step", recovery_p50,
              recovery_max, failed.recovery_s.size());
  std::printf("%-48s %d/%d (failure-free %d/%d)\n", "epochs with every example exactly once", failed.exact_epochs,
              o.epochs, clean.exact_epochs, o.epochs);
  std::printf("%-48s %.2f%% vs %.2f%% failure-free (%+.2f points)\n", "final test accuracy", failed.accuracy,
              clean.accuracy, failed.accuracy - clean.accuracy);
  if (!failed.finished) std::printf("the run with failures FAILED: see %s\n", failed.output.c_str());
  std::printf("\nlogs: %s\n", bench::run_dir().c_str());
  bench::result("sync_failure_step_efficiency", step_efficiency, "ratio");
  bench::result("sync_failure_recovery_p50", recovery_p50, "s");
  bench::print_results();
  return clean.finished && failed.finished && failed.exact_epochs == o.epochs ? 0 : 1;
}
