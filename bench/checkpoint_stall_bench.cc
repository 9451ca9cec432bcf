// checkpoint_stall_bench: what checkpoints cost a training job (issue 34's
// stall): the CTR example trains on 2 workers while a model of --mib MiB
// more (a float32 variable made by the parameter servers' initializer) sits
// on the 2 parameter servers, with and without the coordinator saving a
// checkpoint every --every seconds. With --table the --mib MiB are the rows
// of a dynamic embedding table instead (64 float32 per row, SGD: no slots),
// inserted by lookups before training.
//
//   checkpoint_stall_bench [--mib 1024] [--table] [--every 10] [--steps 40000] [--runs 3] [--dir DIR]
//
// Each run starts a fresh cluster (2 ps-servers, a coordinator, 2
// worker-servers with the CTR module; build/bin) and runs build/bin/ctr;
// runs alternate between the two settings. Per setting: the median of the
// runs' examples/s (ctr's own figure); with checkpoints, every save's
// dispatch pause (the coordinator's log: "dispatch paused X ms") as p50 and
// max over all runs, and the saves' count. CTR reads a per-worker dataset, so
// the coordinator pauses dispatch for each save (the iterators' positions and
// the variables must agree); the pause is the snapshot, the files are
// written while training goes on. Prints figures; never fails on them.
#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
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
  double examples_per_second = 0;
  std::vector<double> pauses_ms;  // one per save
  std::vector<double> saves_ms;
};

Run one_run(const std::string& bin_dir, const std::string& lib_dir, int64_t mib, bool table, int every,
            int64_t steps, const std::string& dir, int index) {
  const std::string tag = std::to_string(index) + (every > 0 ? "-ckpt" : "-none");
  auto ps0 = bench::start(bin_dir, "ps-server", "ps0-" + tag, {"--task-index", "0"});
  auto ps1 = bench::start(bin_dir, "ps-server", "ps1-" + tag, {"--task-index", "1"});
  std::vector<std::string> flags = {"--ps", ps0.address + "," + ps1.address};
  const std::string ckpt_dir = dir + "/run-" + tag;
  if (every > 0) {
    flags.insert(flags.end(), {"--checkpoint-dir", ckpt_dir, "--checkpoint-every-seconds", std::to_string(every),
                               "--checkpoint-max-to-keep", "2"});
  }
  const std::string coordinator_label = "coordinator-" + tag;
  auto coordinator = bench::start(bin_dir, "coordinator", coordinator_label, flags);
  for (int w = 0; w < 2; ++w) {
    bench::start(bin_dir, "worker-server", "worker" + std::to_string(w) + "-" + tag,
                 {"--coordinator", coordinator.address, "--task-index", std::to_string(w), "--module",
                  lib_dir + "/libctr_module.so"});
  }
  auto cluster = capstan::ClusterCoordinator::connect(coordinator.address);
  if (!cluster.ok()) bench::fail("connecting", cluster.status());
  const int64_t columns = 1024;
  capstan::VariableSpec ballast;
  ballast.name = "ballast";
  ballast.optimizer = capstan::Optimizer::sgd(0.1);
  ballast.partitioner = capstan::Partitioner::fixed_shards(2);
  ballast.initializer = capstan::Initializer::random_uniform(-1, 1, 7);
  ballast.dtype = capstan::DType::kFloat32;
  ballast.shape = {mib * (1 << 20) / (columns * 4), columns};
  if (table) {
    // The same bytes as rows of a dynamic table (values only: SGD has no
    // slots), inserted by lookups from here.
    capstan::EmbeddingTableSpec spec;
    spec.name = "ballast_table";
    spec.dim = 64;
    spec.optimizer = capstan::Optimizer::sgd(0.1);
    auto made = (*cluster)->create_embedding_table(spec);
    if (!made.ok()) bench::fail("creating the ballast table", made.status());
    const int64_t rows = mib * (1 << 20) / (spec.dim * 4);
    const int64_t batch = 1 << 16;
    for (int64_t first = 0; first < rows; first += batch) {
      std::vector<int64_t> keys(static_cast<size_t>(std::min(batch, rows - first)));
      for (size_t k = 0; k < keys.size(); ++k) keys[k] = first + static_cast<int64_t>(k);
      auto ids = capstan::Tensor::from_vector<int64_t>(keys, {static_cast<int64_t>(keys.size())});
      auto looked = (*cluster)->lookup(spec.name, *ids);
      if (!looked.ok()) bench::fail("filling the ballast table", looked.status());
    }
  } else {
    auto created = (*cluster)->create_variable(ballast);
    if (!created.ok()) bench::fail("creating the ballast variable", created.status());
  }
  cluster->reset();

  const std::string out = bench::run_dir() + "/ctr-" + tag + ".out";
  int code = bench::run_program({bin_dir + "/ctr", "--coordinator", coordinator.address, "--steps",
                                 std::to_string(steps), "--min-workers", "2", "--log-every", "1000000", "--max-gap",
                                 "100"},
                                out);
  if (code != 0) {
    std::fprintf(stderr, "checkpoint_stall_bench: ctr exited %d; see %s\n", code, out.c_str());
    bench::stop_all();
    std::exit(1);
  }
  Run run;
  static const std::regex trained("trained (\\d+) steps \\((\\d+) examples\\) in ([0-9.]+) s");
  std::smatch m;
  std::string text = read_all(out);
  if (std::regex_search(text, m, trained)) run.examples_per_second = std::stod(m[2]) / std::stod(m[3]);
  bench::stop_all();
  static const std::regex saved("saved checkpoint \\S+ in ([0-9.]+) ms \\(dispatch paused ([0-9.]+) ms");
  std::string log = read_all(bench::run_dir() + "/" + coordinator_label + ".log");
  for (std::sregex_iterator it(log.begin(), log.end(), saved), end; it != end; ++it) {
    run.saves_ms.push_back(std::stod((*it)[1]));
    run.pauses_ms.push_back(std::stod((*it)[2]));
  }
  std::filesystem::remove_all(ckpt_dir);
  return run;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t mib = 1024, steps = 40000;
  int every = 10, runs = 3;
  std::string dir;
  bool table = false;
  bench::FlagParser args(argc, argv, "[--mib N] [--table] [--every SECONDS] [--steps N] [--runs N] [--dir DIR]");
  while (args.next()) {
    if (args.flag("--table", &table) || args.flag("--mib", &mib) || args.flag("--every", &every) || args.flag("--steps", &steps) ||
        args.flag("--runs", &runs) || args.flag("--dir", &dir)) {
      continue;
    }
    args.unknown();
  }
  if (mib < 1 || every < 1 || steps < 1 || runs < 1) {
    std::fprintf(stderr, "checkpoint_stall_bench: --mib, --every, --steps and --runs must be at least 1\n");
    return 2;
  }
  signal(SIGPIPE, SIG_IGN);
  const std::string bin_dir = bench::bin_dir();
  const std::string lib_dir = std::filesystem::path(bin_dir).parent_path().string() + "/lib";
  if (dir.empty()) dir = bench::run_dir() + "/checkpoints";
  std::filesystem::create_directories(dir);
  std::printf("checkpoint_stall_bench: CTR on 2 workers, 2 parameter servers, + a %lld MiB %s; checkpoints "
              "every %d s into %s; %lld steps per run (%u cores)\n",
              static_cast<long long>(mib), table ? "table (64-wide rows)" : "variable", every, dir.c_str(), static_cast<long long>(steps),
              std::thread::hardware_concurrency());
  std::fflush(stdout);  // the daemons are forked: no copy of the buffer in them
  std::vector<double> with, without, pauses, saves;
  for (int run = 0; run < runs; ++run) {
    Run none = one_run(bin_dir, lib_dir, mib, table, 0, steps, dir, run + 1);
    Run ckpt = one_run(bin_dir, lib_dir, mib, table, every, steps, dir, run + 1);
    without.push_back(none.examples_per_second);
    with.push_back(ckpt.examples_per_second);
    pauses.insert(pauses.end(), ckpt.pauses_ms.begin(), ckpt.pauses_ms.end());
    saves.insert(saves.end(), ckpt.saves_ms.begin(), ckpt.saves_ms.end());
    std::printf("  run %d: %.0f examples/s without checkpoints, %.0f with (%zu saves)\n", run + 1,
                none.examples_per_second, ckpt.examples_per_second, ckpt.pauses_ms.size());
    std::fflush(stdout);
  }
  std::sort(pauses.begin(), pauses.end());
  std::printf("\nexamples/s, median of %d runs: %.0f without, %.0f with checkpoints every %d s (%.1f%% lost)\n", runs,
              median(without), median(with), every, 100.0 * (1 - median(with) / median(without)));
  if (!pauses.empty()) {
    std::printf("dispatch pause per save over %zu saves: p50 %.1f ms, max %.1f ms; a save took %.0f ms (median)\n",
                pauses.size(), median(pauses), pauses.back(), median(saves));
  }
  std::printf("logs: %s\n", bench::run_dir().c_str());
  return 0;
}
