// recovery_bench: checkpoints of a large model and parameter-server recovery
// over loopback.
//
//   recovery_bench [--mib N] [--runs N] [--dir DIR]
//
// Starts two ps-servers and a coordinator (build/bin) on free ports and
// stops them at the end. Through a ClusterCoordinator it creates a float32
// variable of N MiB (default 1024) in FixedShardsPartitioner(2) shards, one
// on each parameter server, and measures:
//   save      save_checkpoint (each server snapshots its shard and writes
//             its own safetensors file, fsynced; the coordinator commits the
//             manifest)
//   disk      the machine's limit beside it, in the same runs: the same bytes
//             written to a file in the checkpoint directory and fsynced
//   restore   restore_checkpoint of that checkpoint into the same variable
//   recovery  kill -9 of ps:1, its restart on the same port (empty), until
//             the coordinator has restored its shard from the checkpoint and
//             calls stop pausing (done() answers true); also the split: the
//             restart until the server listens, and the coordinator's own
//             figure from its log ("... ms after it was lost")
// Medians of --runs (default 3). Checkpoints go to --dir (default: the run
// directory under $TMPDIR). Prints figures; never fails on them.
//
//   recovery_bench --servers 1,2,4 [--sizes 1024,4096] [--runs N] [--dir DIR]
//
// instead measures how save and restore scale with the parameter servers
// (issue 34: each writes and reads its own shards): for every size and
// server count, a fresh cluster whose float32 variable of that many MiB is
// made by the servers' initializer (fixed_shards(servers), one shard each),
// then save, restore and the raw write+fsync of the same bytes into the same
// directory, alternating, medians of --runs. On one disk the servers share
// its bandwidth; on tmpfs (--dir /dev/shm/...) or one disk per server, save
// time falls as servers are added.
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <cstdio>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

#include "bench_util.h"
#include "capstan/training.h"

namespace {

using capstan::DType;
using capstan::Tensor;
namespace bench = capstan::bench;
using bench::median;
using bench::read_all;

// Seconds to write `bytes` to a new file in `dir` and fsync it (then removed).
double raw_write_seconds(const std::string& dir, size_t bytes) {
  std::string path = dir + "/raw-write.bin";
  std::vector<char> block(size_t{1} << 20, 'x');
  auto start = bench::Clock::now();
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return 0;
  for (size_t done = 0; done < bytes; done += block.size()) {
    std::fwrite(block.data(), 1, std::min(block.size(), bytes - done), f);
  }
  std::fflush(f);
  fsync(fileno(f));
  std::fclose(f);
  double seconds = bench::seconds_since(start);
  std::remove(path.c_str());
  return seconds;
}

// The same through O_DIRECT from an aligned 8 MiB buffer (how the servers
// write a checkpoint's files): the page cache bypassed.
double raw_direct_write_seconds(const std::string& dir, size_t bytes) {
  std::string path = dir + "/raw-direct.bin";
  const size_t block = size_t{8} << 20;
  void* buffer = nullptr;
  if (posix_memalign(&buffer, 4096, block) != 0) return 0;
  std::memset(buffer, 'x', block);
  auto start = bench::Clock::now();
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_DIRECT, 0644);
  if (fd < 0) {
    std::free(buffer);
    return 0;
  }
  for (size_t done = 0; done < bytes; done += block) {
    if (::write(fd, buffer, block) < 0) break;
  }
  if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0 || ::fsync(fd) != 0) std::perror("raw_direct_write_seconds");
  ::close(fd);
  double seconds = bench::seconds_since(start);
  std::free(buffer);
  std::remove(path.c_str());
  return seconds;
}

// The coordinator's figures of its recoveries so far, in order.
std::vector<double> logged_recoveries(const std::string& log) {
  std::vector<double> ms;
  static const std::regex re("; (\\d+) ms after it was lost");
  for (std::sregex_iterator it(log.begin(), log.end(), re), end; it != end; ++it) ms.push_back(std::stod((*it)[1]));
  return ms;
}

}  // namespace

// --servers: save and restore on fresh clusters of each size, side by side
// with the raw write of the same bytes.
int scaling(const std::string& servers_list, const std::string& sizes_list, int runs, const std::string& dir) {
  const std::string bin_dir = bench::bin_dir();
  std::vector<int> servers = bench::positive_counts(servers_list);
  std::vector<int> sizes = bench::positive_counts(sizes_list);
  std::printf("recovery_bench: save and restore by each parameter server of its own shard; checkpoints in %s "
              "(%u cores); medians of %d runs\n\n",
              dir.c_str(), std::thread::hardware_concurrency(), runs);
  std::printf("%8s %8s %10s %10s %12s %12s %10s %10s\n", "MiB", "servers", "save s", "GB/s", "raw write s",
              "raw direct s", "save/raw", "restore s");
  for (int mib : sizes) {
    for (int n : servers) {
      std::string ps_list;
      for (int i = 0; i < n; ++i) {
        auto ps = bench::start(bin_dir, "ps-server", "ps" + std::to_string(i) + "-" + std::to_string(mib) + "-" +
                                                         std::to_string(n),
                               {"--task-index", std::to_string(i)});
        ps_list += (i > 0 ? "," : "") + ps.address;
      }
      auto coordinator = bench::start(bin_dir, "coordinator",
                                      "coordinator-" + std::to_string(mib) + "-" + std::to_string(n),
                                      {"--ps", ps_list});
      auto cluster = capstan::ClusterCoordinator::connect(coordinator.address);
      if (!cluster.ok()) bench::fail("connecting", cluster.status());
      const int64_t columns = 1024;
      capstan::VariableSpec spec;
      spec.name = "model";
      spec.optimizer = capstan::Optimizer::sgd(0.1);
      spec.partitioner = capstan::Partitioner::fixed_shards(n);
      spec.initializer = capstan::Initializer::random_uniform(-1, 1, 5);
      spec.dtype = DType::kFloat32;
      spec.shape = {int64_t{mib} * (1 << 20) / (columns * 4), columns};
      auto created = (*cluster)->create_variable(spec);
      if (!created.ok()) bench::fail("creating the variable", created.status());
      const double bytes = static_cast<double>(mib) * (1 << 20);
      const std::string ckpts = dir + "/scaling-" + std::to_string(mib) + "-" + std::to_string(n);
      std::vector<double> saves, restores, raw, direct;
      for (int run = 0; run < runs; ++run) {
        auto start = bench::Clock::now();
        auto saved = (*cluster)->save_checkpoint(ckpts, run + 1, /*max_to_keep=*/1);
        if (!saved.ok()) bench::fail("save_checkpoint", saved.status());
        saves.push_back(bench::seconds_since(start));
        raw.push_back(raw_write_seconds(ckpts, static_cast<size_t>(bytes)));
        direct.push_back(raw_direct_write_seconds(ckpts, static_cast<size_t>(bytes)));
        start = bench::Clock::now();
        auto restored = (*cluster)->restore_checkpoint(*saved);
        if (!restored.ok()) bench::fail("restore_checkpoint", restored.status());
        restores.push_back(bench::seconds_since(start));
      }
      std::printf("%8d %8d %10.2f %10.2f %12.2f %12.2f %10.2f %10.2f\n", mib, n, median(saves),
                  bytes / median(saves) / 1e9, median(raw), median(direct), median(saves) / median(raw),
                  median(restores));
      std::fflush(stdout);
      cluster->reset();
      bench::stop_all();
      std::filesystem::remove_all(ckpts);
    }
  }
  std::printf("\nsave: the servers snapshot, write and fsync their files in parallel, the coordinator commits the "
              "manifest (files of 4 MiB or more bypass the page cache); raw: one writer, the same bytes, write+fsync "
              "(raw direct: through O_DIRECT); restore: each server reads its rows back.\n"
              "logs: %s\n",
              bench::run_dir().c_str());
  return 0;
}

int main(int argc, char** argv) {
  int64_t mib = 1024;
  int runs = 3;
  std::string dir, servers, sizes = "1024,4096";
  bench::FlagParser args(argc, argv,
                         "[--mib N] [--runs N] [--dir DIR] | --servers 1,2,4 [--sizes 1024,4096] [--runs N] [--dir DIR]");
  while (args.next()) {
    if (args.flag("--mib", &mib) || args.flag("--runs", &runs) || args.flag("--dir", &dir) ||
        args.flag("--servers", &servers) || args.flag("--sizes", &sizes)) {
      continue;
    }
    args.unknown();
  }
  if (!servers.empty()) {
    signal(SIGPIPE, SIG_IGN);
    if (dir.empty()) dir = bench::run_dir() + "/checkpoints";
    return scaling(servers, sizes, std::max(runs, 1), dir);
  }
  if (mib < 1 || runs < 1) {
    std::fprintf(stderr, "recovery_bench: --mib and --runs must be at least 1\n");
    return 2;
  }
  signal(SIGPIPE, SIG_IGN);
  const std::string bin_dir = bench::bin_dir();
  if (dir.empty()) dir = bench::run_dir() + "/checkpoints";

  const int ps1_port = bench::free_port();
  auto ps0 = bench::start(bin_dir, "ps-server", "ps-0", {"--task-index", "0"});
  auto ps1 = bench::start(bin_dir, "ps-server", "ps-1", {"--task-index", "1"}, ps1_port);
  const std::string coordinator_log = bench::run_dir() + "/coordinator.log";
  auto coordinator = bench::start(bin_dir, "coordinator", "coordinator", {"--ps", ps0.address + "," + ps1.address});
  auto cluster = capstan::ClusterCoordinator::connect(coordinator.address);
  if (!cluster.ok()) bench::fail("connecting", cluster.status());

  const int64_t columns = 256;
  const int64_t rows = mib * (1 << 20) / (columns * 4);
  const double bytes = static_cast<double>(rows * columns * 4);
  auto initial = Tensor::zeros(DType::kFloat32, {rows, columns});
  if (!initial.ok()) bench::fail("allocating", initial.status());
  {
    float* p = initial->mutable_flat<float>().data();
    for (int64_t i = 0; i < rows * columns; ++i) p[i] = static_cast<float>(i % 1000);
  }
  auto created = (*cluster)->create_variable(
      {"model", *initial, capstan::Optimizer::sgd(0.1), capstan::Partitioner::fixed_shards(2)});
  if (!created.ok()) bench::fail("creating the variable", created.status());
  initial = Tensor();

  std::printf("recovery_bench: a %lld MiB float32 variable in 2 shards on 2 parameter servers (%u cores); "
              "checkpoints in %s\n",
              static_cast<long long>(mib), std::thread::hardware_concurrency(), dir.c_str());
  std::vector<double> saves, restores, recoveries, restarts, disk;
  std::string path;
  for (int run = 0; run < runs; ++run) {
    auto start = bench::Clock::now();
    auto saved = (*cluster)->save_checkpoint(dir, run + 1, /*max_to_keep=*/2);
    if (!saved.ok()) bench::fail("save_checkpoint", saved.status());
    saves.push_back(bench::seconds_since(start));
    path = *saved;
    start = bench::Clock::now();
    auto restored = (*cluster)->restore_checkpoint(path);
    if (!restored.ok()) bench::fail("restore_checkpoint", restored.status());
    restores.push_back(bench::seconds_since(start));
    disk.push_back(raw_write_seconds(dir, static_cast<size_t>(bytes)));
    std::printf("  run %d: save %.2f s, restore %.2f s, raw write+fsync %.2f s\n", run + 1, saves.back(),
                restores.back(), disk.back());
    std::fflush(stdout);
  }
  for (int run = 0; run < runs; ++run) {
    // kill -9 ps:1 and start it again on its port, empty.
    auto killed = bench::Clock::now();
    bench::kill9(ps1.pid);
    ps1 = bench::start(bin_dir, "ps-server", "ps-1-restart-" + std::to_string(run + 1), {"--task-index", "1"},
                       ps1_port);
    restarts.push_back(bench::seconds_since(killed));
    // Until the coordinator logs that it restored the shard; done() pauses
    // (false) meanwhile, never fails.
    for (;;) {
      auto done = (*cluster)->done();
      if (!done.ok()) bench::fail("done() during recovery", done.status());
      if (logged_recoveries(read_all(coordinator_log)).size() > static_cast<size_t>(run)) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    recoveries.push_back(bench::seconds_since(killed));
    std::printf("  recovery %d: %.2f s (the restarted server listened after %.2f s)\n", run + 1, recoveries.back(),
                restarts.back());
    std::fflush(stdout);
  }
  auto check = (*cluster)->read_variable("model");
  if (!check.ok()) bench::fail("reading the recovered variable", check.status());
  auto flat = check->flat<float>();
  for (int64_t i = 0; i < rows * columns; i += 4099) {
    if (flat[i] != static_cast<float>(i % 1000)) {
      std::fprintf(stderr, "recovery_bench: element %lld is %g after the recovery, expected %lld\n",
                   static_cast<long long>(i), static_cast<double>(flat[i]), static_cast<long long>(i % 1000));
      bench::stop_all();
      return 1;
    }
  }
  auto logged = logged_recoveries(read_all(coordinator_log));

  std::printf("\n%-38s %10s %10s\n", "", "median", "GB/s");
  std::printf("%-38s %9.2fs %10.2f\n", "save_checkpoint", median(saves), bytes / median(saves) / 1e9);
  std::printf("%-38s %9.2fs %10.2f   (save takes %.1fx the machine's limit)\n", "  disk: raw write+fsync, same bytes",
              median(disk), bytes / median(disk) / 1e9, median(saves) / median(disk));
  std::printf("%-38s %9.2fs %10.2f\n", "restore_checkpoint", median(restores), bytes / median(restores) / 1e9);
  std::printf("%-38s %9.2fs %10.2f\n", "kill -9 ps:1 -> calls stop pausing", median(recoveries),
              bytes / 2 / median(recoveries) / 1e9);
  std::printf("%-38s %9.2fs\n", "  of which: restart until listening", median(restarts));
  if (!logged.empty()) {
    std::printf("%-38s %8.0fms\n", "  coordinator: lost -> shard restored", median(logged));
  }
  std::printf("\nsave/restore move the whole variable (%.0f MiB); a recovery restores ps:1's shard (%.0f MiB) from "
              "the last checkpoint.\nlogs: %s\n",
              bytes / (1 << 20), bytes / 2 / (1 << 20), bench::run_dir().c_str());
  bench::stop_all();
  return 0;
}
