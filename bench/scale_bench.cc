// scale_bench: what the cluster's fixed costs are per unit (docs/scaling.md):
// the memory and idle CPU of one connection to each daemon, what one
// registered worker costs the coordinator, what one data worker and one
// split cost the dispatcher.
//
//   scale_bench [--connections N] [--workers N] [--data-workers N]
//               [--heartbeats N] [--splits N] [--idle-seconds S]
//               [--only connections,workers,dispatcher] [--quick]
//
// Starts its daemons (build/bin) on free ports and stops them at the end.
//
//   connections   A ps-server, a coordinator, a worker-server, a
//                 data-dispatcher and a data-worker. --connections (500)
//                 links to each (opened and logged in 50 at a time, then
//                 left idle: what a large cluster's workers hold open to
//                 every ps-server and the coordinator). Per connection: the
//                 daemon's resident memory (VmRSS after - before, over N)
//                 and its CPU while they sit idle for --idle-seconds (10; the
//                 link watchdog's probes), against the same time before they
//                 were opened.
//   workers       A coordinator pinging every 250 ms (default 2,000) and
//                 --workers (200) fake workers, each on its own link,
//                 registered through registerWorker (the bench answers the
//                 pings). Per worker: coordinator VmRSS beyond its link's;
//                 per ping: coordinator CPU / pings answered.
//   dispatcher    --data-workers (200) fake data workers heartbeating a
//                 data-dispatcher (one link, as a state cost: the links are
//                 the connections figure), one DYNAMIC job over range() so
//                 each worker holds a task. Per worker: VmRSS; per
//                 heartbeat: dispatcher CPU over --heartbeats (20,000) sent
//                 one at a time round-robin, and as many consumer
//                 heartbeats, each reply listing every task (one per data
//                 worker) and then with the list's fingerprint known
//                 (replies say "unchanged"), against as many Node.info
//                 calls (any RPC's floor). Then --splits (20,000) getSplit
//                 calls of one task: dispatcher CPU and VmRSS per split, in
//                 memory and with --work-dir (each lease journaled, fsync'd,
//                 before the reply).
//
// CPU from /proc/<pid>/stat (10 ms ticks; the runs are long enough for
// hundreds of them); memory from /proc/<pid>/status. One RESULT line per
// figure. Prints figures; never fails on them.
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "async/loop_thread.h"
#include "bench_util.h"
#include "capstan/data/dataset.h"
#include "capstan_schemas/coordinator.capnp.h"
#include "capstan_schemas/data_dispatcher.capnp.h"
#include "capstan_schemas/worker.capnp.h"
#include "rpc/connection.h"

namespace {

namespace bench = capstan::bench;
namespace wire = capstan::wire;
using bench::Clock;
using bench::seconds_since;

struct Config {
  int connections = 500;
  int workers = 200;
  int data_workers = 200;
  int heartbeats = 20000;
  int splits = 20000;
  double idle_seconds = 10;
};

void settle(double seconds) { std::this_thread::sleep_for(std::chrono::duration<double>(seconds)); }

kj::TimePoint deadline_in(kj::Timer& timer, int seconds) { return timer.now() + seconds * kj::SECONDS; }

// Links from this process to one daemon, on a loop thread of their own.
class Links {
 public:
  explicit Links(std::string name) : loop_(std::move(name)) {}
  ~Links() { close(); }
  Links(const Links&) = delete;
  Links& operator=(const Links&) = delete;

  capstan::async::LoopThread& loop() { return loop_; }

  // Opens `n` more links to `address` and logs each in (`batch` at a time:
  // the daemons close connections not logged in past a per-host cap).
  void open(const std::string& address, int n, int batch = 50) {
    capstan::rpc::ConnectOptions options;
    options.client_name = "scale_bench";
    for (int first = 0; first < n; first += batch) {
      int count = std::min(batch, n - first);
      loop_.run_sync([&]() {
        auto promises = kj::heapArrayBuilder<kj::Promise<void>>(static_cast<size_t>(count));
        for (int i = 0; i < count; ++i) {
          links_.push_back(kj::heap<capstan::rpc::Connection>(loop_.io(), loop_.timer(), address, options));
          promises.add(links_.back()->node(deadline_in(loop_.timer(), 60)).ignoreResult());
        }
        return kj::joinPromises(promises.finish());
      });
    }
  }
  capstan::rpc::Connection& link(size_t i) { return *links_[i]; }
  size_t size() const { return links_.size(); }

  void close() {
    loop_.run_sync([this]() { links_.clear(); });
  }

 private:
  capstan::async::LoopThread loop_;
  std::vector<kj::Own<capstan::rpc::Connection>> links_;  // loop thread only
};

// A worker as the coordinator sees it: it answers pings (Node.info) and
// nothing else (no closure is scheduled in this bench).
class FakeWorker final : public wire::Worker::Server {
 public:
  explicit FakeWorker(std::atomic<int64_t>* pings) : pings_(pings) {}

 protected:
  kj::Promise<void> info(InfoContext context) override {
    pings_->fetch_add(1, std::memory_order_relaxed);
    auto info = context.getResults().initInfo();
    info.setRole(wire::Role::WORKER);
    info.setTaskIndex(-1);
    info.setPid(::getpid());
    info.setReady(true);
    return kj::READY_NOW;
  }

 private:
  std::atomic<int64_t>* pings_;
};

// Calls `call(i)` for i = 0 .. n-1, each once the previous one's reply has
// come (what a sender heartbeating on its own does, one call at a time).
template <typename Call>
kj::Promise<void> one_at_a_time(int n, Call call) {
  kj::Promise<void> chain = kj::READY_NOW;
  for (int i = 0; i < n; ++i) chain = chain.then([call, i]() mutable { return call(i); });
  return chain;
}

double kib_per(int64_t before_kib, int64_t after_kib, int64_t n) {
  return n > 0 ? static_cast<double>(after_kib - before_kib) / static_cast<double>(n) : 0;
}

// ---- connections -------------------------------------------------------------------------------

void idle_connections(const std::string& bin_dir, const Config& cfg) {
  std::printf("\n== idle connections: %d to each daemon, logged in, then idle %.0f s ==\n", cfg.connections,
              cfg.idle_seconds);
  auto ps = bench::start(bin_dir, "ps-server", {"--task-index", "0"});
  auto coordinator = bench::start(bin_dir, "coordinator", {"--ps", ps.address});
  auto worker = bench::start(bin_dir, "worker-server", {"--coordinator", coordinator.address, "--task-index", "0"});
  auto dispatcher = bench::start(bin_dir, "data-dispatcher", {});
  auto data_worker = bench::start(bin_dir, "data-worker", {"--dispatcher", dispatcher.address, "--task-index", "0"});
  std::vector<bench::Daemon> targets = {ps, coordinator, worker, dispatcher, data_worker};
  settle(2);  // the worker registers, the data worker heartbeats

  std::map<pid_t, double> cpu0;
  for (const auto& d : targets) cpu0[d.pid] = bench::cpu_seconds(d.pid);
  settle(cfg.idle_seconds);
  std::map<pid_t, double> idle_before;  // CPU seconds per second, no extra links
  std::map<pid_t, int64_t> rss0;
  for (const auto& d : targets) {
    idle_before[d.pid] = (bench::cpu_seconds(d.pid) - cpu0[d.pid]) / cfg.idle_seconds;
    rss0[d.pid] = bench::proc_status_kib(d.pid, "VmRSS");
  }

  std::vector<std::unique_ptr<Links>> links;
  auto opened = Clock::now();
  for (const auto& d : targets) {
    links.push_back(std::make_unique<Links>("links-" + d.program));
    links.back()->open(d.address, cfg.connections);
  }
  std::printf("opened and logged in %d links in %.2f s\n", cfg.connections * static_cast<int>(targets.size()),
              seconds_since(opened));
  settle(1);
  for (const auto& d : targets) cpu0[d.pid] = bench::cpu_seconds(d.pid);
  settle(cfg.idle_seconds);

  std::printf("%-16s %12s %12s %14s %18s\n", "daemon", "RSS before", "RSS after", "KiB per link",
              "idle CPU us/s/link");
  for (const auto& d : targets) {
    const int64_t rss1 = bench::proc_status_kib(d.pid, "VmRSS");
    const double idle_after = (bench::cpu_seconds(d.pid) - cpu0[d.pid]) / cfg.idle_seconds;
    const double per_link_kib = kib_per(rss0[d.pid], rss1, cfg.connections);
    const double cpu_us = (idle_after - idle_before[d.pid]) * 1e6 / cfg.connections;
    std::printf("%-16s %9.1f MB %9.1f MB %14.1f %18.2f\n", d.program.c_str(), rss0[d.pid] / 1024.0, rss1 / 1024.0,
                per_link_kib, cpu_us);
    bench::result("kib_per_idle_link_" + d.program, per_link_kib, "KiB");
    bench::result("idle_cpu_us_per_s_per_link_" + d.program, cpu_us, "us");
  }
  for (auto& l : links) l->close();
  links.clear();
  bench::stop_all();
}

// ---- registered workers ------------------------------------------------------------------------

void registered_workers(const std::string& bin_dir, const Config& cfg) {
  const int ping_ms = 250;
  std::printf("\n== registered workers: %d fake workers, the coordinator pinging each every %d ms ==\n",
              cfg.workers, ping_ms);
  auto ps = bench::start(bin_dir, "ps-server", {"--task-index", "0"});
  auto coordinator = bench::start(
      bin_dir, "coordinator", {"--ps", ps.address, "--worker-ping-interval-ms", std::to_string(ping_ms)});
  settle(1);
  const int64_t rss0 = bench::proc_status_kib(coordinator.pid, "VmRSS");

  // Links first (their cost is the connections figure), then registration.
  Links links("fake-workers");
  links.open(coordinator.address, cfg.workers);
  settle(1);
  const int64_t rss_links = bench::proc_status_kib(coordinator.pid, "VmRSS");
  std::atomic<int64_t> pings{0};
  links.loop().run_sync([&]() {
    auto promises = kj::heapArrayBuilder<kj::Promise<void>>(links.size());
    for (size_t i = 0; i < links.size(); ++i) {
      promises.add(links.link(i)
                       .service<wire::Coordinator>(deadline_in(links.loop().timer(), 60))
                       .then([&pings](wire::Coordinator::Client coordinator) {
                         auto request = coordinator.registerWorkerRequest();
                         request.setWorker(kj::heap<FakeWorker>(&pings));
                         request.setTaskIndex(-1);
                         request.initFunctions(0);
                         return request.send().ignoreResult();
                       }));
    }
    return kj::joinPromises(promises.finish());
  });
  settle(2);
  const int64_t rss_registered = bench::proc_status_kib(coordinator.pid, "VmRSS");

  const double cpu0 = bench::cpu_seconds(coordinator.pid);
  const int64_t pings0 = pings.load();
  settle(cfg.idle_seconds);
  const double cpu = bench::cpu_seconds(coordinator.pid) - cpu0;
  const int64_t answered = pings.load() - pings0;

  const double per_worker = kib_per(rss_links, rss_registered, cfg.workers);
  const double per_ping_us = answered > 0 ? cpu * 1e6 / static_cast<double>(answered) : 0;
  std::printf("coordinator RSS %.1f MB, %.1f MB with the links, %.1f MB registered: %.1f KiB per worker beyond "
              "its link (%.1f KiB with it)\n",
              rss0 / 1024.0, rss_links / 1024.0, rss_registered / 1024.0, per_worker,
              kib_per(rss0, rss_registered, cfg.workers));
  std::printf("%lld pings answered in %.0f s (%.0f/s), coordinator CPU %.2f s: %.1f us per ping (links idle "
              "included)\n",
              static_cast<long long>(answered), cfg.idle_seconds, answered / cfg.idle_seconds, cpu, per_ping_us);
  bench::result("coordinator_kib_per_registered_worker", per_worker, "KiB");
  bench::result("coordinator_cpu_us_per_worker_ping", per_ping_us, "us");
  links.close();
  bench::stop_all();
}

// ---- dispatcher --------------------------------------------------------------------------------

// One dispatcher, `cfg.data_workers` fake data workers heartbeating it,
// one DYNAMIC job; then splits. `work_dir`: fault-tolerant mode.
void dispatcher_costs(const std::string& bin_dir, const Config& cfg, const std::string& work_dir) {
  const bool durable = !work_dir.empty();
  std::printf("\n== dispatcher%s: %d fake data workers, %d heartbeats, %d splits ==\n",
              durable ? " with --work-dir (journaled)" : " (in memory)", cfg.data_workers, cfg.heartbeats,
              cfg.splits);
  std::vector<std::string> flags = {"--worker-timeout-ms", "600000"};
  if (durable) flags.insert(flags.end(), {"--work-dir", work_dir});
  auto dispatcher = bench::start(bin_dir, "data-dispatcher", flags);
  const std::string tag = durable ? "_journaled" : "";
  Links links("dispatcher-link");
  links.open(dispatcher.address, 1);
  auto& loop = links.loop();
  auto service = [&]() { return links.link(0).service<wire::DataDispatcher>(deadline_in(loop.timer(), 60)); };
  settle(1);
  const int64_t rss0 = bench::proc_status_kib(dispatcher.pid, "VmRSS");

  // A job whose source has more splits than the bench asks for.
  const std::string definition = capstan::data::Dataset::range(int64_t{1} << 40).serialize();
  const std::pair<int64_t, int64_t> job_ids = loop.run_sync([&]() {
    return service().then([&](wire::DataDispatcher::Client d) {
      auto reg = d.registerDatasetRequest();
      reg.setDefinition(kj::arrayPtr(reinterpret_cast<const kj::byte*>(definition.data()), definition.size()));
      return reg.send().then([d](auto&& registered) mutable {
        auto job = d.getOrCreateJobRequest();
        auto params = job.initParams();
        params.setDatasetId(registered.getDatasetId());
        params.setJobName("scale_bench");
        params.setProcessingMode(wire::ProcessingMode::DYNAMIC);
        return job.send().then([](auto&& created) {
          return std::make_pair(created.getJobId(), created.getJobClientId());
        });
      });
    });
  });
  const int64_t job_id = job_ids.first;
  const int64_t job_client_id = job_ids.second;

  // Each fake worker heartbeats once: it registers and is given its task.
  std::vector<std::string> addresses;
  for (int i = 0; i < cfg.data_workers; ++i) addresses.push_back("10.255." + std::to_string(i / 250) + "." +
                                                                  std::to_string(i % 250 + 1) + ":7070");
  std::vector<std::vector<int64_t>> tasks(addresses.size());
  uint32_t asked_ms = 0;  // the interval the last heartbeat reply asked for
  auto heartbeat = [&](size_t w) {
    return service().then([&, w](wire::DataDispatcher::Client d) {
      auto request = d.workerHeartbeatRequest();
      request.setWorkerAddress(addresses[w]);
      auto current = request.initCurrentTasks(static_cast<unsigned>(tasks[w].size()));
      for (unsigned t = 0; t < tasks[w].size(); ++t) current.set(t, tasks[w][t]);
      return request.send().then([&, w](auto&& reply) {
        for (auto task : reply.getNewTasks()) tasks[w].push_back(task.getTaskId());
        asked_ms = reply.getIntervalMs();
      });
    });
  };
  for (size_t w = 0; w < addresses.size(); ++w) loop.run_sync([&]() { return heartbeat(w); });
  settle(1);
  const int64_t rss_workers = bench::proc_status_kib(dispatcher.pid, "VmRSS");
  const double per_worker = kib_per(rss0, rss_workers, cfg.data_workers);
  std::printf("dispatcher RSS %.1f MB, %.1f MB with %d workers (one task each: %zu): %.1f KiB per data worker\n",
              rss0 / 1024.0, rss_workers / 1024.0, cfg.data_workers, tasks[0].size(), per_worker);
  bench::result("dispatcher_kib_per_data_worker" + tag, per_worker, "KiB");

  // The floor: the same number of Node.info calls (no dispatcher state).
  double cpu0 = bench::cpu_seconds(dispatcher.pid);
  auto start = Clock::now();
  loop.run_sync([&]() {
    return service().then([&](wire::DataDispatcher::Client d) {
      return one_at_a_time(cfg.heartbeats, [d](int) mutable { return d.infoRequest().send().ignoreResult(); });
    });
  });
  double wall = seconds_since(start);
  const double per_info = (bench::cpu_seconds(dispatcher.pid) - cpu0) * 1e6 / cfg.heartbeats;
  std::printf("%d Node.info calls in %.2f s (%.0f/s): dispatcher CPU %.1f us per call (any RPC's floor)\n",
              cfg.heartbeats, wall, cfg.heartbeats / wall, per_info);
  bench::result("dispatcher_cpu_us_per_info_rpc" + tag, per_info, "us");

  // Heartbeats, one at a time, round-robin, each reporting its task.
  cpu0 = bench::cpu_seconds(dispatcher.pid);
  start = Clock::now();
  loop.run_sync([&]() {
    return one_at_a_time(cfg.heartbeats,
                         [&](int i) { return heartbeat(static_cast<size_t>(i) % addresses.size()); });
  });
  wall = seconds_since(start);
  double per_heartbeat = (bench::cpu_seconds(dispatcher.pid) - cpu0) * 1e6 / cfg.heartbeats;
  std::printf("%d heartbeats in %.2f s (%.0f/s): dispatcher CPU %.1f us per heartbeat; the replies ask each of "
              "the %d workers and 1 consumer to heartbeat every %u ms at most (--max-heartbeats-per-s 4000)\n",
              cfg.heartbeats, wall, cfg.heartbeats / wall, per_heartbeat, cfg.data_workers, asked_ms);
  bench::result("dispatcher_cpu_us_per_heartbeat" + tag, per_heartbeat, "us");

  // A consumer's heartbeats: with knownTasks 0 each reply lists every task of
  // the job (one per data worker: what a consumer whose list changed, or an
  // older one, gets); with the list's fingerprint, the reply says
  // "unchanged" (what a consumer gets while the job's tasks stay put).
  for (bool known : {false, true}) {
    uint64_t fingerprint = 0;
    if (known) {
      fingerprint = loop.run_sync([&]() {
        return service().then([job_client_id](wire::DataDispatcher::Client d) {
          auto request = d.clientHeartbeatRequest();
          request.setJobClientId(job_client_id);
          return request.send().then([](auto&& reply) { return reply.getTasksFingerprint(); });
        });
      });
    }
    cpu0 = bench::cpu_seconds(dispatcher.pid);
    start = Clock::now();
    loop.run_sync([&]() {
      return service().then([&, fingerprint](wire::DataDispatcher::Client d) {
        return one_at_a_time(cfg.heartbeats, [d, job_client_id, fingerprint](int) mutable {
          auto request = d.clientHeartbeatRequest();
          request.setJobClientId(job_client_id);
          request.setKnownTasks(fingerprint);
          return request.send().ignoreResult();
        });
      });
    });
    wall = seconds_since(start);
    const double per_client_heartbeat = (bench::cpu_seconds(dispatcher.pid) - cpu0) * 1e6 / cfg.heartbeats;
    std::printf("%d consumer heartbeats in %.2f s (%.0f/s), %d tasks, %s: dispatcher CPU %.1f us per heartbeat\n",
                cfg.heartbeats, wall, cfg.heartbeats / wall, cfg.data_workers,
                known ? "list unchanged (known fingerprint)" : "each reply listing them", per_client_heartbeat);
    bench::result("dispatcher_cpu_us_per_client_heartbeat_" + std::string(known ? "unchanged_" : "") +
                      std::to_string(cfg.data_workers) + "_tasks" + tag,
                  per_client_heartbeat, "us");
  }

  // Splits of worker 0's task, in order.
  const int64_t task_id = tasks[0].empty() ? -1 : tasks[0][0];
  const int64_t rss_before_splits = bench::proc_status_kib(dispatcher.pid, "VmRSS");
  cpu0 = bench::cpu_seconds(dispatcher.pid);
  start = Clock::now();
  loop.run_sync([&]() {
    return service().then([&](wire::DataDispatcher::Client d) {
      return one_at_a_time(cfg.splits, [&, d](int i) mutable {
        auto request = d.getSplitRequest();
        request.setJobId(job_id);
        request.setTaskId(task_id);
        request.setSequence(i);
        return request.send().ignoreResult();
      });
    });
  });
  wall = seconds_since(start);
  const double per_split = (bench::cpu_seconds(dispatcher.pid) - cpu0) * 1e6 / cfg.splits;
  const double split_bytes =
      kib_per(rss_before_splits, bench::proc_status_kib(dispatcher.pid, "VmRSS"), cfg.splits) * 1024;
  std::printf("%d splits in %.2f s (%.0f/s): dispatcher CPU %.1f us per split; RSS +%.0f bytes per leased split\n",
              cfg.splits, wall, cfg.splits / wall, per_split, split_bytes);
  bench::result("dispatcher_cpu_us_per_split" + tag, per_split, "us");
  bench::result("dispatcher_bytes_per_split" + tag, split_bytes, "bytes");
  if (durable) {
    uintmax_t journal = 0;
    for (const auto& entry : std::filesystem::recursive_directory_iterator(work_dir)) {
      if (entry.is_regular_file()) journal += entry.file_size();
    }
    std::printf("work dir: %.1f KB after all of it\n", journal / 1e3);
  }
  links.close();
  bench::stop_all();
}

}  // namespace

int main(int argc, char** argv) {
  Config cfg;
  bool quick = false;
  std::string only = "connections,workers,dispatcher";
  bench::FlagParser args(argc, argv,
                         "[--connections N] [--workers N] [--data-workers N] [--heartbeats N] [--splits N] "
                         "[--idle-seconds S] [--only connections,workers,dispatcher] [--quick]");
  while (args.next()) {
    if (!args.flag("--connections", &cfg.connections) && !args.flag("--workers", &cfg.workers) &&
        !args.flag("--data-workers", &cfg.data_workers) && !args.flag("--heartbeats", &cfg.heartbeats) &&
        !args.flag("--splits", &cfg.splits) && !args.flag("--idle-seconds", &cfg.idle_seconds) &&
        !args.flag("--only", &only) && !args.flag("--quick", &quick)) {
      args.unknown();
    }
  }
  if (quick) {
    cfg.connections = std::min(cfg.connections, 50);
    cfg.workers = std::min(cfg.workers, 20);
    cfg.data_workers = std::min(cfg.data_workers, 20);
    cfg.heartbeats = std::min(cfg.heartbeats, 500);
    cfg.splits = std::min(cfg.splits, 500);
    cfg.idle_seconds = std::min(cfg.idle_seconds, 1.0);
  }
  for (size_t pos = 0; pos <= only.size();) {
    size_t comma = std::min(only.find(',', pos), only.size());
    const std::string section = only.substr(pos, comma - pos);
    if (section != "connections" && section != "workers" && section != "dispatcher") {
      args.usage("--only takes connections, workers and dispatcher, comma-separated; got '" + section + "'");
    }
    pos = comma + 1;
  }
  if (cfg.connections < 1 || cfg.workers < 1 || cfg.data_workers < 1 || cfg.heartbeats < 1 || cfg.splits < 1 ||
      cfg.idle_seconds <= 0) {
    std::fprintf(stderr, "scale_bench: every count must be >= 1 and --idle-seconds > 0\n");
    return 2;
  }
  // Every link is a descriptor here and in the daemon (which inherits this).
  rlimit files{};
  if (getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur < files.rlim_max) {
    files.rlim_cur = files.rlim_max;
    setrlimit(RLIMIT_NOFILE, &files);
  }
  signal(SIGPIPE, SIG_IGN);
  std::printf("scale_bench: fixed costs per connection, worker, heartbeat and split (%u cores)\n",
              std::thread::hardware_concurrency());
  const std::string bin_dir = bench::bin_dir();
  auto wanted = [&only](const std::string& section) { return ("," + only + ",").find("," + section + ",") != std::string::npos; };
  if (wanted("connections")) idle_connections(bin_dir, cfg);
  if (wanted("workers")) registered_workers(bin_dir, cfg);
  if (wanted("dispatcher")) {
    dispatcher_costs(bin_dir, cfg, "");
    dispatcher_costs(bin_dir, cfg, bench::run_dir() + "/dispatcher_journal");
  }
  std::printf("\nlogs: %s\n", bench::run_dir().c_str());
  bench::print_results();
  return 0;
}
