// ps_bench: parameter-server variable throughput over loopback.
//
//   ps_bench [--rows N] [--batches N] [--quick] [--rounds N] [--ps 1,2] [--mib 1,16,64]
//
// Starts the ps-server(s) and the coordinator that sit next to it (build/bin)
// on free ports and stops them at the end. Through a ClusterCoordinator it
// creates float32 variables of 1, 16 and 64 MiB and measures, with one
// parameter server and with two (the variable in FixedShardsPartitioner(2)
// shards, one on each):
//   pull   read_variable (the whole variable, shards read in parallel)
//   push   assign_variable (the whole value sent to the shards)
//   apply  a dense SGD gradient (VariableRouter::apply_dense, what a
//          worker's ClosureContext::apply_gradients does)
// beside the transport floor: the same bytes through one raw loopback TCP
// connection (bench::loopback_tcp), and pull and push as a fraction of it.
// Each size runs --rounds rounds (default 3, 1 with --quick) of raw TCP,
// pull, push and apply back to back; every figure is the median over the
// rounds, each fraction the median of the rounds' own fractions.
// and, on two parameter servers, the sparse gather of an embedding table of
// 64-float rows (default 1M rows = 256 MB) in batches of 10k random ids
// (VariableRouter::gather, what ClosureContext::gather does).
// --ps picks the clusters (1 and/or 2 parameter servers), --mib the dense
// sizes (0: none), --rows 0 leaves the gather out. Besides the tables, one
// RESULT line per figure (ps_pull_64mib_1ps, ps_push_64mib_1ps and
// loopback_tcp_64mib in GB/s, ps_pull_64mib_1ps_of_tcp as a fraction,
// ps_gather_10k_2ps in rows/s, ...; bench/compare reads them).
// Prints figures; never fails on them.
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "bench_router.h"
#include "bench_util.h"
#include "loopback_tcp.h"
#include "capstan/training.h"
#include "capstan_schemas/coordinator.capnp.h"
#include "rpc/connection.h"
#include "async/loop_thread.h"
#include "rpc/tensor_codec.h"
#include "training/variable_router.h"

namespace {

using capstan::DType;
using capstan::Tensor;
namespace bench = capstan::bench;
using bench::Clock;
using bench::fail;
using bench::seconds_since;

Tensor filled(int64_t rows, int64_t cols, float value) {
  auto tensor = *Tensor::uninitialized(DType::kFloat32, {rows, cols});
  for (float& v : tensor.mutable_flat<float>()) v = value;
  return tensor;
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

std::string rate_text(double bytes, double seconds) {
  char text[64];
  std::snprintf(text, sizeof(text), "%.2f GB/s (%.1f ms)", bytes / seconds / 1e9, seconds * 1e3);
  return text;
}

struct DenseCase {
  size_t mib;
  int reps;
};

// Dense pull/assign/apply of 1, 16, 64 MiB variables on a cluster of `num_ps`.
// `report_loopback`: print the RESULT line of the raw TCP figure (once per
// run; each cluster's fractions use the figure measured beside them).
void dense(const std::string& bin_dir, int num_ps, const std::vector<DenseCase>& cases, bool with_gather,
           int64_t emb_rows, int batches, int rounds, bool report_loopback) {
  bench::PsCluster cluster(bin_dir, num_ps, std::to_string(num_ps), "ps_bench");
  capstan::ClusterCoordinator& client = *cluster.client;
  bench::Router& router = *cluster.router;

  std::printf("\n%d parameter server%s (%s), coordinator %s\n", num_ps, num_ps > 1 ? "s" : "",
              cluster.ps_list.c_str(), cluster.coordinator.c_str());
  std::printf("%-8s %-6s %-7s %-22s %-29s %-29s %-22s\n", "variable", "reps", "shards", "raw loopback TCP",
              "pull (read_variable)", "push (assign)", "apply (sgd gradient)");
  const int64_t cols = 256;  // 1 KiB rows
  for (const auto& c : cases) {
    int64_t rows = static_cast<int64_t>((c.mib << 20) / 4 / cols);
    std::string name = "dense_" + std::to_string(c.mib) + "mib";
    capstan::VariableSpec spec{name, filled(rows, cols, 1.0f), capstan::Optimizer::sgd(0.001),
                               num_ps > 1 ? capstan::Partitioner::fixed_shards(num_ps)
                                          : capstan::Partitioner::none()};
    auto info = client.create_variable(spec);
    if (!info.ok()) fail("create_variable " + name, info.status());
    std::string placed;
    for (const auto& s : info->shards) placed += (placed.empty() ? "" : "+") + std::string("ps") + std::to_string(s.ps_task);
    size_t bytes = c.mib << 20;
    Tensor value = filled(rows, cols, 2.0f);
    Tensor gradient = filled(rows, cols, 0.5f);

    // Warm up each path once (connections, buffer caches).
    if (auto r = client.read_variable(name); !r.ok()) fail("read_variable", r.status());
    if (auto s = client.assign_variable(name, value); !s.ok()) fail("assign_variable", s);
    if (auto s = router->apply_dense(name, gradient); !s.ok()) fail("apply_dense", s);

    // `rounds` rounds, each timing raw TCP, pull, push and apply back to back
    // (c.reps calls each); every figure is the median over the rounds, and
    // each fraction of TCP the median of the rounds' own fractions, so a
    // burst of noise spoils one round, not the figure.
    std::vector<double> floors, pulls, assigns, applies, pull_of_tcp, push_of_tcp;
    for (int round = 0; round < rounds; ++round) {
      bench::LoopbackRun tcp = bench::loopback_tcp(c.reps, bytes);
      if (tcp.messages != c.reps) fail("loopback TCP", capstan::Status::Internal("the connection broke"));
      floors.push_back(static_cast<double>(bytes) / tcp.gb_per_s() / 1e9);  // seconds per variable
      auto start_time = Clock::now();
      for (int r = 0; r < c.reps; ++r) {
        auto read = client.read_variable(name);
        if (!read.ok() || read->byte_size() != bytes) fail("read_variable", read.status());
      }
      pulls.push_back(seconds_since(start_time) / c.reps);
      start_time = Clock::now();
      for (int r = 0; r < c.reps; ++r) {
        if (auto s = client.assign_variable(name, value); !s.ok()) fail("assign_variable", s);
      }
      assigns.push_back(seconds_since(start_time) / c.reps);
      start_time = Clock::now();
      for (int r = 0; r < c.reps; ++r) {
        if (auto s = router->apply_dense(name, gradient); !s.ok()) fail("apply_dense", s);
      }
      applies.push_back(seconds_since(start_time) / c.reps);
      pull_of_tcp.push_back(floors.back() / pulls.back());
      push_of_tcp.push_back(floors.back() / assigns.back());
    }
    const double floor = median(floors), pull = median(pulls), assign = median(assigns), apply = median(applies);
    auto of_tcp = [](double fraction) {
      char text[16];
      std::snprintf(text, sizeof(text), " %3.0f%%", fraction * 100);
      return std::string(text);
    };
    std::printf("%4zu MiB %-6d %-7s %-22s %-29s %-29s %-22s\n", c.mib, c.reps, placed.c_str(),
                rate_text(bytes, floor).c_str(), (rate_text(bytes, pull) + of_tcp(median(pull_of_tcp))).c_str(),
                (rate_text(bytes, assign) + of_tcp(median(push_of_tcp))).c_str(), rate_text(bytes, apply).c_str());
    std::fflush(stdout);
    const std::string tag = std::to_string(c.mib) + "mib_" + std::to_string(num_ps) + "ps";
    if (report_loopback) bench::result("loopback_tcp_" + std::to_string(c.mib) + "mib", bytes / floor / 1e9, "GB/s");
    bench::result("ps_pull_" + tag, bytes / pull / 1e9, "GB/s");
    bench::result("ps_push_" + tag, bytes / assign / 1e9, "GB/s");
    bench::result("ps_apply_" + tag, bytes / apply / 1e9, "GB/s");
    bench::result("ps_pull_" + tag + "_of_tcp", median(pull_of_tcp), "x");
    bench::result("ps_push_" + tag + "_of_tcp", median(push_of_tcp), "x");
  }

  if (with_gather) {
    const int64_t dim = 64;
    const int64_t batch = 10000;
    std::string name = "embedding";
    auto create_start = Clock::now();
    capstan::VariableSpec spec{name, filled(emb_rows, dim, 0.25f), capstan::Optimizer::sgd(0.01),
                               capstan::Partitioner::fixed_shards(num_ps)};
    auto info = client.create_variable(spec);
    if (!info.ok()) fail("create_variable " + name, info.status());
    double create = seconds_since(create_start);
    std::string placed;
    for (const auto& s : info->shards) {
      placed += (placed.empty() ? "" : ", ") + s.name + " on ps" + std::to_string(s.ps_task) + " (" +
                std::to_string(s.rows) + " rows)";
    }
    std::mt19937_64 rng(42);
    std::uniform_int_distribution<int64_t> pick(0, emb_rows - 1);
    std::vector<Tensor> id_batches;
    for (int b = 0; b < std::min(batches, 16); ++b) {
      auto ids = *Tensor::uninitialized(DType::kInt64, {batch});
      for (int64_t& id : ids.mutable_flat<int64_t>()) id = pick(rng);
      id_batches.push_back(std::move(ids));
    }
    for (int w = 0; w < 3; ++w) {
      if (auto g = router->gather(name, id_batches[0]); !g.ok()) fail("gather", g.status());
    }
    std::vector<double> latencies;
    auto start_time = Clock::now();
    for (int b = 0; b < batches; ++b) {
      auto t0 = Clock::now();
      auto rows = router->gather(name, id_batches[static_cast<size_t>(b) % id_batches.size()]);
      latencies.push_back(seconds_since(t0) * 1e3);
      if (!rows.ok()) fail("gather", rows.status());
      if (rows->shape() != capstan::Shape{batch, dim}) {
        fail("gather", capstan::Status::Internal("gathered " + capstan::shape_string(rows->shape())));
      }
    }
    double total = seconds_since(start_time);
    std::sort(latencies.begin(), latencies.end());
    std::printf("\nsparse gather: embedding float32[%lld, %lld] (%.0f MB, created in %.2f s): %s\n",
                static_cast<long long>(emb_rows), static_cast<long long>(dim),
                emb_rows * dim * 4.0 / 1e6, create, placed.c_str());
    std::printf("  %d batches of %lld random ids: %.0f rows/s (%.2f GB/s of rows), batch p50 %.2f ms  p99 %.2f ms\n",
                batches, static_cast<long long>(batch), batches * batch / total,
                batches * batch * dim * 4.0 / total / 1e9, latencies[latencies.size() / 2],
                latencies[std::min(latencies.size() - 1, latencies.size() * 99 / 100)]);
    const std::string tag = "ps_gather_10k_" + std::to_string(num_ps) + "ps";
    bench::result(tag, batches * batch / total, "rows/s");
    bench::result(tag + "_p50", latencies[latencies.size() / 2], "ms");
  }
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  int64_t emb_rows = 1000000;
  int batches = 200;
  bool quick = false;
  int rounds = 0;  // 0: 3, or 1 with --quick
  std::vector<int> ps_counts = {1, 2};
  std::vector<int> sizes = {1, 16, 64};
  std::string list;
  bench::FlagParser args(argc, argv, "[--rows N] [--batches N] [--quick] [--rounds N] [--ps 1,2] [--mib 1,16,64]");
  while (args.next()) {
    if (args.flag("--rows", &emb_rows) || args.flag("--batches", &batches) || args.flag("--quick", &quick)) continue;
    if (args.flag("--rounds", &rounds)) {
      rounds = std::max(1, rounds);
    } else if (args.flag("--ps", &list)) {
      ps_counts = bench::positive_counts(list);
    } else if (args.flag("--mib", &list)) {
      sizes = bench::positive_counts(list);
    } else {
      args.unknown();
    }
  }
  if (rounds == 0) rounds = quick ? 1 : 3;
  signal(SIGPIPE, SIG_IGN);
  const std::string bin_dir = bench::bin_dir();
  std::vector<DenseCase> cases;
  for (size_t mib : sizes) {
    int reps = mib <= 1 ? 100 : mib <= 16 ? 20 : 8;
    if (quick) reps = mib <= 1 ? 10 : mib <= 16 ? 3 : 2;
    cases.push_back({mib, reps});
  }
  std::printf("ps_bench: dense float32 variables and sparse gather over loopback (%u cores)\n",
              std::thread::hardware_concurrency());
  for (int num_ps : ps_counts) {
    // The gather runs on the cluster of 2 (or more) parameter servers.
    dense(bin_dir, num_ps, cases, /*with_gather=*/num_ps > 1 && emb_rows > 0, emb_rows, batches, rounds,
          /*report_loopback=*/num_ps == ps_counts.front());
  }
  std::printf("\nGB/s = variable bytes / time per call; pull includes concatenating the shards; "
              "apply = SGD on the parameter servers; %% = share of the raw loopback TCP rate.\nlogs: %s\n",
              bench::run_dir().c_str());
  bench::print_results();
  return 0;
}
