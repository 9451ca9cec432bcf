// closure_bench: how many trivial closures a coordinator runs per second, and
// the latency of one closure from schedule() to fetch().
//
//   closure_bench [--closures N] [--latency-samples N] [--module PATH]
//                 [--configs 2x1,2x4,2x1d] [--no-breakdown]
//
// Starts a ps-server, a coordinator and 1 or 2 worker-servers (from the
// directory of this binary, on free ports; the workers load the training test
// module, ../lib/libcapstan_training_module.so) and stops them at the end.
// For 1 and 2 workers, with the coordinator's --closures-per-worker 1 and 4,
// and 2 x 1 again with a durable coordinator (--work-dir: every closure
// journaled, group-committed):
//   throughput  schedule N "noop" closures back to back, then join()
//   latency     schedule one "noop", fetch() it; one at a time; p50/p99
// and the CPU each process spent per closure in the throughput runs and per
// schedule()+fetch() pair in the latency runs (/proc/<pid>/stat, user +
// system, and the share in the kernel), and the
// coordinator's resident memory (/proc/<pid>/status VmRSS) after the warm-up
// and after the throughput run, with its peak (VmHWM): the throughput run
// drops each RemoteValue as it schedules, so the coordinator should hold
// only what is in flight however large N is. Then a
// breakdown of where the time goes:
//   Node.info round trip to the coordinator (the RPC floor),
//   schedule() alone (no workers registered: nothing is dispatched),
//   schedule() from 4 client threads at once (no workers; and with 2
//   workers x 4, end to end),
//   dispatch alone: N closures (at most 40000) queued before the workers register, timed
//   from the first closure's value to join() (with 2 workers the first to
//   register starts alone).
// --configs runs only the listed rows (WORKERSxCLOSURES_PER_WORKER, "d" for
// the durable one), --no-breakdown leaves the breakdown out. Besides the
// tables, one RESULT line per figure (closures_per_s_2x1, schedule_fetch_p50_2x1,
// ... in us; bench/compare reads them). Prints figures; never fails on them.
// --trace-seconds S: every process of the cluster (and the bench) records
// a trace (capstan/cluster_trace.h) for S seconds from just before each
// throughput run: what tracing costs (S should cover the throughput and
// latency runs).
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "bench_util.h"
#include "capstan/client.h"
#include "capstan/cluster_trace.h"
#include "capstan/training.h"

namespace {

namespace bench = capstan::bench;
using bench::Clock;
using bench::fail;
using bench::seconds_since;

// CPU seconds used so far by the client and by each kind of daemon.
std::map<std::string, double> cpu_snapshot() {
  std::map<std::string, double> cpu;
  cpu["client"] = bench::cpu_seconds(0);
  cpu["kernel"] = bench::cpu_seconds(0, true);
  for (const auto& d : bench::daemons()) {
    cpu[d.program] += bench::cpu_seconds(d.pid);
    cpu["kernel"] += bench::cpu_seconds(d.pid, true);
  }
  return cpu;
}

// "client 12.3 | coordinator 20.1 | ..." in microseconds of CPU per closure.
std::string cpu_per_closure(const std::map<std::string, double>& before, const std::map<std::string, double>& after,
                            int n, double wall_s) {
  std::string out;
  double total = 0;
  char text[96];
  for (const char* who : {"client", "coordinator", "worker-server", "ps-server"}) {
    auto a = after.find(who);
    if (a == after.end()) continue;
    auto b = before.find(who);
    double us = (a->second - (b == before.end() ? 0.0 : b->second)) * 1e6 / n;
    total += us;
    std::snprintf(text, sizeof(text), "%s%s %.1f", out.empty() ? "" : " | ", who, us);
    out += text;
  }
  double kernel = (after.at("kernel") - before.at("kernel")) * 1e6 / n;
  std::snprintf(text, sizeof(text), " | total %.1f us CPU (%.0f%% in the kernel); wall %.1f us", total,
                total > 0 ? 100.0 * kernel / total : 0.0, wall_s * 1e6 / n);
  return out + text;
}

struct Setup {
  std::string bin_dir;
  std::string module;
};

// A ps-server, a coordinator, `workers` workers; the client connected.
class Cluster {
 public:
  Cluster(const Setup& setup, int workers, int closures_per_worker, bool durable = false) : setup_(setup) {
    ps_ = bench::start(setup.bin_dir, "ps-server", {"--task-index", "0"});
    std::vector<std::string> flags = {"--ps", ps_.address, "--closures-per-worker", std::to_string(closures_per_worker)};
    if (durable) {
      work_dir_ = (std::filesystem::temp_directory_path() / ("closure_bench_journal." + std::to_string(::getpid()))).string();
      std::filesystem::remove_all(work_dir_);
      flags.insert(flags.end(), {"--work-dir", work_dir_});
    }
    coordinator_ = bench::start(setup.bin_dir, "coordinator", flags);
    capstan::ClientOptions options;
    options.client_name = "closure_bench";
    options.call_timeout = std::chrono::milliseconds(120000);
    auto client = capstan::ClusterCoordinator::connect(coordinator_.address, options);
    if (!client.ok()) fail("connect to the coordinator", client.status());
    client_ = std::move(*client);
    add_workers(workers);
  }
  ~Cluster() {
    client_.reset();
    bench::stop_all();
    if (!work_dir_.empty()) std::filesystem::remove_all(work_dir_);
  }

  // Starts workers until there are `total`; returns without waiting for
  // them to register when `wait` is false.
  void add_workers(int total, bool wait = true) {
    while (workers_ < total) {
      bench::start(setup_.bin_dir, "worker-server",
                   {"--coordinator", coordinator_.address, "--module", setup_.module, "--task-index",
                    std::to_string(workers_)});
      ++workers_;
    }
    if (!wait) return;
    auto deadline = Clock::now() + std::chrono::seconds(30);
    while (client_->num_workers() < total) {
      if (Clock::now() > deadline) fail("waiting for workers", capstan::Status::DeadlineExceeded("workers did not register"));
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }

  capstan::ClusterCoordinator& client() { return *client_; }
  const std::string& coordinator_address() const { return coordinator_.address; }
  pid_t coordinator_pid() const { return coordinator_.pid; }

 private:
  const Setup& setup_;
  bench::Daemon ps_, coordinator_;
  std::string work_dir_;  // durable: the coordinator's journal, removed at the end
  int workers_ = 0;
  std::unique_ptr<capstan::ClusterCoordinator> client_;
};

std::vector<capstan::RemoteValue> schedule_noops(capstan::ClusterCoordinator& client, int n) {
  std::vector<capstan::RemoteValue> values;
  values.reserve(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    auto v = client.schedule("noop");
    if (!v.ok()) fail("schedule", v.status());
    values.push_back(*v);
  }
  return values;
}

struct Throughput {
  double schedule_s = 0;  // the N schedule() calls
  double join_s = 0;      // join() after them
};

Throughput throughput(capstan::ClusterCoordinator& client, int n) {
  Throughput t;
  auto start_time = Clock::now();
  for (int i = 0; i < n; ++i) {
    // Dropped at once, as a training loop that never fetches does: the
    // coordinator releases each value.
    auto v = client.schedule("noop");
    if (!v.ok()) fail("schedule", v.status());
  }
  t.schedule_s = seconds_since(start_time);
  auto join_start = Clock::now();
  if (auto s = client.join(); !s.ok()) fail("join", s);
  t.join_s = seconds_since(join_start);
  return t;
}

struct Latency {
  double p50_us = 0, p99_us = 0;
};

Latency latency(capstan::ClusterCoordinator& client, int samples) {
  std::vector<double> us;
  us.reserve(static_cast<size_t>(samples));
  for (int i = 0; i < samples + 50; ++i) {
    auto start_time = Clock::now();
    auto v = client.schedule("noop");
    if (!v.ok()) fail("schedule", v.status());
    auto value = client.fetch(*v);
    if (!value.ok()) fail("fetch", value.status());
    if (i >= 50) us.push_back(seconds_since(start_time) * 1e6);  // the first 50 warm up
  }
  std::sort(us.begin(), us.end());
  return {us[us.size() / 2], us[std::min(us.size() - 1, us.size() * 99 / 100)]};
}

}  // namespace

int main(int argc, char** argv) {
  int closures = 20000;
  int samples = 2000;
  std::string module;
  std::string only_configs;  // empty: every row
  bool no_breakdown = false;
  double trace_seconds = 0;  // > 0: every process records a trace meanwhile
  bench::FlagParser args(argc, argv,
                        "[--closures N] [--latency-samples N] [--module PATH] [--configs 2x1,2x4,2x1d] "
                        "[--no-breakdown] [--trace-seconds S]");
  while (args.next()) {
    if (args.flag("--closures", &closures) || args.flag("--latency-samples", &samples) ||
        args.flag("--module", &module) || args.flag("--configs", &only_configs) ||
        args.flag("--no-breakdown", &no_breakdown) || args.flag("--trace-seconds", &trace_seconds)) {
      continue;
    }
    args.unknown();
  }
  signal(SIGPIPE, SIG_IGN);
  Setup setup;
  setup.bin_dir = bench::bin_dir();
  setup.module = module.empty() ? setup.bin_dir + "/../lib/libcapstan_training_module.so" : module;
  if (!std::filesystem::exists(setup.module)) {
    std::fprintf(stderr, "no training module at %s (build capstan_training_module, or pass --module)\n",
                 setup.module.c_str());
    return 1;
  }
  setup.module = std::filesystem::canonical(setup.module).string();

  std::printf("closure_bench: trivial (\"noop\") closures, 1 ps-server, loopback (%u cores)\n\n",
              std::thread::hardware_concurrency());
  std::printf("%-8s %-12s %-15s %-26s %-10s %-16s %-16s\n", "workers", "closures/wk", "closures/s",
              "(schedule N | join after)", "N", "latency p50", "latency p99");
  struct Config {
    int workers;
    int per_worker;
    bool durable = false;
  };
  std::vector<std::string> cpu_lines;
  std::vector<std::string> rss_lines;
  std::vector<std::string> latency_cpu_lines;
  for (Config c : {Config{1, 1}, Config{1, 4}, Config{2, 1}, Config{2, 4}, Config{2, 1, true}}) {
    const std::string config =
        std::to_string(c.workers) + "x" + std::to_string(c.per_worker) + (c.durable ? "d" : "");
    if (!only_configs.empty() && ("," + only_configs + ",").find("," + config + ",") == std::string::npos) continue;
    Cluster cluster(setup, c.workers, c.per_worker, c.durable);
    // Warm up the paths (placements, worker pools).
    throughput(cluster.client(), 200);
    // --trace-seconds: the cluster and this program record a trace while
    // the throughput and latency runs go (what tracing costs).
    std::thread tracing;
    if (trace_seconds > 0) {
      tracing = std::thread([&cluster, trace_seconds]() {
        capstan::ClusterTraceOptions options;
        options.seconds = trace_seconds;
        options.max_events = capstan::trace::Recorder::kMaxTraceEvents;
        options.this_process = true;
        auto trace = capstan::record_cluster_trace(cluster.coordinator_address(), options);
        if (!trace.ok()) fail("tracing", trace.status());
        std::printf("  (traced: %zu events from %d processes, %llu dropped past the bound)\n", trace->events,
                    trace->processes, static_cast<unsigned long long>(trace->dropped));
      });
      std::this_thread::sleep_for(std::chrono::milliseconds(500));  // every process recording
    }
    const int64_t rss_start_kib = bench::proc_status_kib(cluster.coordinator_pid(), "VmRSS");
    auto cpu_before = cpu_snapshot();
    Throughput t = throughput(cluster.client(), closures);
    const int64_t rss_end_kib = bench::proc_status_kib(cluster.coordinator_pid(), "VmRSS");
    const int64_t rss_peak_kib = bench::proc_status_kib(cluster.coordinator_pid(), "VmHWM");
    char rss[192];
    std::snprintf(rss, sizeof(rss), "%s: coordinator RSS %.1f MB at start, %.1f MB after %d closures (peak %.1f MB)",
                  config.c_str(), rss_start_kib / 1024.0, rss_end_kib / 1024.0, closures, rss_peak_kib / 1024.0);
    rss_lines.push_back(rss);
    bench::result("coordinator_rss_growth_mb_" + config, (rss_end_kib - rss_start_kib) / 1024.0, "MB");
    cpu_lines.push_back(std::to_string(c.workers) + " worker(s) x " + std::to_string(c.per_worker) + ": " +
                        cpu_per_closure(cpu_before, cpu_snapshot(), closures, t.schedule_s + t.join_s));
    auto latency_cpu_before = cpu_snapshot();
    auto latency_start = Clock::now();
    Latency l = latency(cluster.client(), samples);
    latency_cpu_lines.push_back(config + ": " + cpu_per_closure(latency_cpu_before, cpu_snapshot(), samples + 50,
                                                                seconds_since(latency_start)));
    if (tracing.joinable()) tracing.join();
    char split[64], rate[32], p50[32], p99[32];
    std::snprintf(split, sizeof(split), "%.0f ms | %.0f ms", t.schedule_s * 1e3, t.join_s * 1e3);
    std::snprintf(rate, sizeof(rate), "%.0f", closures / (t.schedule_s + t.join_s));
    std::snprintf(p50, sizeof(p50), "%.0f us", l.p50_us);
    std::snprintf(p99, sizeof(p99), "%.0f us", l.p99_us);
    std::printf("%-8d %-12s %-15s %-26s %-10d %-16s %-16s\n", c.workers,
                (std::to_string(c.per_worker) + (c.durable ? " durable" : "")).c_str(), rate, split, closures, p50, p99);
    std::fflush(stdout);
    bench::result("closures_per_s_" + config, closures / (t.schedule_s + t.join_s), "closures/s");
    bench::result("schedule_fetch_p50_" + config, l.p50_us, "us");
    bench::result("schedule_fetch_p99_" + config, l.p99_us, "us");
  }

  std::printf("\nCPU per closure during the throughput runs (us, from /proc/<pid>/stat; 10 ms ticks):\n");
  for (const auto& line : cpu_lines) std::printf("  %s\n", line.c_str());
  std::printf("\nCPU per schedule() + fetch() of one closure at a time (the latency runs; us):\n");
  for (const auto& line : latency_cpu_lines) std::printf("  %s\n", line.c_str());
  std::printf("\nThe coordinator's memory (/proc/<pid>/status VmRSS; each RemoteValue dropped at schedule):\n");
  for (const auto& line : rss_lines) std::printf("  %s\n", line.c_str());

  if (no_breakdown) {
    bench::print_results();
    return 0;
  }
  std::printf("\nbreakdown (where the time of one closure goes):\n");
  {
    Cluster cluster(setup, 0, 1);
    // The RPC floor: a Node.info round trip to the coordinator.
    capstan::ClientOptions options;
    auto node = capstan::NodeClient::connect(cluster.coordinator_address(), options);
    if (!node.ok()) fail("connect", node.status());
    std::vector<double> us;
    for (int i = 0; i < 2200; ++i) {
      auto start_time = Clock::now();
      auto info = (*node)->info();
      if (!info.ok()) fail("info", info.status());
      if (i >= 200) us.push_back(seconds_since(start_time) * 1e6);
    }
    std::sort(us.begin(), us.end());
    std::printf("  Node.info round trip to the coordinator:        p50 %.0f us  p99 %.0f us  (%.0f calls/s)\n",
                us[us.size() / 2], us[us.size() * 99 / 100], 1e6 / us[us.size() / 2]);
    node->reset();

    // schedule() alone: no workers, so nothing is dispatched. Both runs
    // together stay under what the coordinator queues before schedule()
    // blocks (max_queued_closures, 32768, plus the client's 16384).
    const int alone_n = std::min(closures, 20000);
    schedule_noops(cluster.client(), 200);
    auto cpu_before = cpu_snapshot();
    auto start_time = Clock::now();
    schedule_noops(cluster.client(), alone_n);
    double alone = seconds_since(start_time);
    std::printf("  schedule() alone, 1 client thread, no workers:  %.0f closures/s (%.1f us each)\n",
                alone_n / alone, alone * 1e6 / alone_n);
    std::printf("    CPU: %s\n", cpu_per_closure(cpu_before, cpu_snapshot(), alone_n, alone).c_str());

    // schedule() from 4 threads at once on one ClusterCoordinator.
    const int threads = 4;
    std::vector<std::thread> pool;
    start_time = Clock::now();
    for (int k = 0; k < threads; ++k) {
      pool.emplace_back([&cluster, alone_n, threads]() { schedule_noops(cluster.client(), alone_n / threads); });
    }
    for (auto& th : pool) th.join();
    double parallel = seconds_since(start_time);
    std::printf("  schedule() alone, %d client threads, no workers: %.0f closures/s\n", threads,
                (alone_n / threads) * threads / parallel);
  }
  {
    // End to end with schedule() calls overlapped: 4 client threads.
    Cluster cluster(setup, 2, 4);
    throughput(cluster.client(), 200);
    const int threads = 4;
    auto cpu_before = cpu_snapshot();
    auto start_time = Clock::now();
    std::vector<std::thread> pool;
    for (int k = 0; k < threads; ++k) {
      pool.emplace_back([&cluster, closures, threads]() { schedule_noops(cluster.client(), closures / threads); });
    }
    for (auto& th : pool) th.join();
    if (auto s = cluster.client().join(); !s.ok()) fail("join", s);
    double wall = seconds_since(start_time);
    int n = (closures / threads) * threads;
    std::printf("  schedule() from %d client threads + join, 2 workers x 4: %.0f closures/s\n", threads, n / wall);
    std::printf("    CPU: %s\n", cpu_per_closure(cpu_before, cpu_snapshot(), n, wall).c_str());
  }
  for (Config c : {Config{1, 1}, Config{1, 4}, Config{2, 4}}) {
    // Dispatch alone: the queue is full before the workers register. No
    // more than the coordinator queues before schedule() blocks (its
    // max_queued_closures, 32768, plus the client's 16384 unanswered).
    const int queued = std::min(closures, 40000);
    Cluster cluster(setup, 0, c.per_worker);
    auto values = schedule_noops(cluster.client(), queued);
    cluster.add_workers(c.workers, /*wait=*/false);
    auto first = cluster.client().fetch(values.front());
    if (!first.ok()) fail("fetch", first.status());
    auto cpu_before = cpu_snapshot();
    auto start_time = Clock::now();
    if (auto s = cluster.client().join(); !s.ok()) fail("join", s);
    double drain = seconds_since(start_time);
    std::printf("  dispatch alone, %d worker(s) x %d closure(s):    %.0f closures/s (%d queued closures)\n",
                c.workers, c.per_worker, (queued - 1) / drain, queued);
    std::printf("    CPU: %s\n", cpu_per_closure(cpu_before, cpu_snapshot(), queued - 1, drain).c_str());
  }
  std::printf("\nclosures/s = N / (time of N schedule() calls + join()); latency = schedule() + fetch() of one "
              "closure at a time.\nlogs: %s\n", bench::run_dir().c_str());
  bench::print_results();
  return 0;
}
