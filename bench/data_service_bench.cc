// data_service_bench: elements/s and MB/s that ONE consumer reads through the
// tf.data service, next to the same pipeline run in-process.
//
//   data_service_bench [--small N] [--large M] [--per-request-samples N] [--workers 1,2]
//
// Starts a data-dispatcher and 1 or 2 data-workers (from the directory of
// this binary, on free ports) and stops them at the end. Pipelines (built-ins
// only, so the workers load no module):
//   small  from_tensors(uint8[100]).repeat(N)      100-byte elements
//   large  from_tensors(uint8[1 MiB]).repeat(M)    1 MiB elements
// read in OFF mode (every worker runs the whole pipeline: with 2 workers, 2N
// elements arrive), small ones with max_elements_per_request 64 and 256,
// large ones over TCP ("service", ReadOptions::shared_memory_bytes 0) and
// through shared memory ("service+shm", the default on one host: the worker
// writes each tensor once into a region the reader maps). The
// clock starts at the first element (job creation, task assignment and
// pipeline start-up are not counted) and stops at end of sequence.
//
// "local" runs the same pipeline with make_iterator in this process
// (from_tensors decodes its tensor once per pipeline; every repetition yields
// the same tensor, no copy, as in TF);
// "local+copy" also copies every element into a fresh buffer, the least a
// transfer must add on the receiving side. "raw TCP" is the transport
// ceiling: the same bytes through one loopback TCP connection (1 MiB send()s
// from another thread, recv() into a fresh tensor each). 1 MiB elements go
// 16 to a reply whatever max_elements_per_request says (the reader asks for
// at most 16 MiB per reply).
// --small 0 or --large 0 leaves those cases out; --workers picks the
// service's sizes (1 and/or 2 data workers).
//
// Then a breakdown of where the time goes: the getElements round trip
// (max_elements_per_request 1), and the CPU each process spends per element
// (/proc/<pid>/stat, user + system; 10 ms ticks).
// Besides the tables, one RESULT line per figure (data_service_100b_1w in
// elements/s with max/req 64, data_service_1mib_1w in GB/s over TCP,
// data_service_1mib_1w_shm through shared memory, ...;
// bench/compare reads them). Prints figures; never fails on them.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "bench_util.h"
#include "loopback_tcp.h"
#include "capstan/data/dataset.h"
#include "capstan/data/service.h"
#include "capstan_schemas/data_dispatcher.capnp.h"
#include "rpc/connection.h"
#include "rpc/errors.h"
#include "async/loop_thread.h"

namespace {

using capstan::Element;
using capstan::Tensor;
using capstan::data::Dataset;
namespace bench = capstan::bench;
using bench::Clock;
using bench::fail;
using bench::seconds_since;
namespace service = capstan::data::service;

// How many data workers the dispatcher knows (listWorkers); -1 on error.
int registered_workers(const std::string& dispatcher) {
  capstan::async::LoopThread loop("bench-list");
  capstan::rpc::ConnectOptions connect;
  connect.client_name = "data_service_bench";
  try {
    return loop.run_sync([&]() -> kj::Promise<int> {
      auto conn = kj::heap<capstan::rpc::Connection>(loop.io(), loop.timer(), dispatcher, connect);
      auto deadline = loop.timer().now() + 5 * kj::SECONDS;
      return conn->service<capstan::wire::DataDispatcher>(deadline)
          .then([](capstan::wire::DataDispatcher::Client d) {
            return d.listWorkersRequest().send().then(
                [](auto&& r) { return static_cast<int>(r.getWorkers().size()); });
          })
          .attach(kj::mv(conn));
    });
  } catch (const kj::Exception&) {
    return -1;
  }
}

// A data-dispatcher and `workers` data-workers, registered.
class Service {
 public:
  Service(const std::string& bin_dir, int workers) {
    dispatcher_ = bench::start(bin_dir, "data-dispatcher", {});
    for (int i = 0; i < workers; ++i) {
      bench::start(bin_dir, "data-worker", {"--dispatcher", dispatcher_.address, "--task-index", std::to_string(i)});
    }
    auto deadline = Clock::now() + std::chrono::seconds(30);
    while (registered_workers(dispatcher_.address) < workers) {
      if (Clock::now() > deadline) {
        fail("waiting for data workers", capstan::Status::DeadlineExceeded("they did not register"));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  ~Service() { bench::stop_all(); }

  const std::string& address() const { return dispatcher_.address; }

 private:
  bench::Daemon dispatcher_;
};

// CPU seconds used so far by the client and by each kind of daemon.
std::map<std::string, double> cpu_snapshot() {
  std::map<std::string, double> cpu;
  cpu["client"] = bench::cpu_seconds(0);
  for (const auto& d : bench::daemons()) {
    cpu[d.program] += bench::cpu_seconds(d.pid);
    if (d.program == "data-worker") cpu["data-worker bytes"] += bench::bytes_written(d.pid);
  }
  return cpu;
}

// "client 1.2 | data-worker 3.4 | data-dispatcher 0.0" in us of CPU per
// element, and the bytes the data workers wrote per element.
std::string cpu_per_element(const std::map<std::string, double>& before, const std::map<std::string, double>& after,
                            int64_t n) {
  std::string out;
  double total = 0;
  char text[96];
  for (const char* who : {"client", "data-worker", "data-dispatcher"}) {
    auto a = after.find(who);
    if (a == after.end()) continue;
    auto b = before.find(who);
    double us = (a->second - (b == before.end() ? 0.0 : b->second)) * 1e6 / static_cast<double>(n);
    total += us;
    std::snprintf(text, sizeof(text), "%s%s %.2f", out.empty() ? "" : " | ", who, us);
    out += text;
  }
  std::snprintf(text, sizeof(text), " | total %.2f us", total);
  out += text;
  // What the data workers wrote (sockets and logs) per element: the payload
  // and the framing a reader pays for.
  auto a = after.find("data-worker bytes");
  auto b = before.find("data-worker bytes");
  if (a != after.end() && b != before.end()) {
    std::snprintf(text, sizeof(text), "; data workers wrote %.1f B/element", (a->second - b->second) / static_cast<double>(n));
    out += text;
  }
  return out;
}

struct Run {
  int64_t elements = 0;  // counted after the first
  int64_t bytes = 0;
  double seconds = 0;    // first element to end of sequence
  int64_t total = 0;     // including the first
  std::string cpu;       // per element, during the timed part
  double per_s() const { return seconds > 0 ? static_cast<double>(elements) / seconds : 0; }
  double mb_per_s() const { return seconds > 0 ? static_cast<double>(bytes) / seconds / 1e6 : 0; }
};

// Reads `ds` to the end; times from the first element. `copy` copies every
// element into a fresh buffer (what a transfer has to do at least once).
Run drain(const Dataset& ds, bool copy = false) {
  auto it = ds.make_iterator();
  if (!it.ok()) fail("make_iterator", it.status());
  Run run;
  Clock::time_point start_time;
  std::map<std::string, double> cpu_before;
  while (true) {
    auto next = (*it)->get_next();
    if (!next.ok()) fail("get_next", next.status());
    if (!next->has_value()) break;
    if (copy) {
      for (const Tensor& t : (*next)->components) {
        auto fresh = Tensor::uninitialized(t.dtype(), t.shape());
        if (!fresh.ok()) fail("allocate", fresh.status());
        std::memcpy(fresh->mutable_data(), t.data(), t.byte_size());
        // Keep the compiler from dropping the copy.
        volatile std::byte sink = fresh->data()[t.byte_size() / 2];
        (void)sink;
      }
    }
    if (run.total++ == 0) {
      cpu_before = cpu_snapshot();
      start_time = Clock::now();
      continue;
    }
    ++run.elements;
    run.bytes += static_cast<int64_t>((*next)->byte_size());
  }
  run.seconds = run.total > 0 ? seconds_since(start_time) : 0;
  if (run.elements > 0) run.cpu = cpu_per_element(cpu_before, cpu_snapshot(), run.elements);
  it->reset();  // the reader releases its job client
  return run;
}

Dataset small_pipeline(int64_t n) {
  auto t = Tensor::zeros(capstan::DType::kUInt8, {100});
  if (!t.ok()) fail("tensor", t.status());
  return Dataset::from_tensors(Element{{*t}, {}}).repeat(n);
}

Dataset large_pipeline(int64_t m) {
  auto t = Tensor::zeros(capstan::DType::kUInt8, {1 << 20});
  if (!t.ok()) fail("tensor", t.status());
  return Dataset::from_tensors(Element{{*t}, {}}).repeat(m);
}

// The transport floor: `count` MiB through one loopback TCP connection, each
// read into a fresh 1 MiB tensor (bench::loopback_tcp).
Run loopback_tcp(int64_t count) {
  bench::LoopbackRun tcp = bench::loopback_tcp(count, 1 << 20);
  Run run;
  run.total = run.elements = tcp.messages;
  run.bytes = tcp.bytes;
  run.seconds = tcp.seconds;
  return run;
}

struct Row {
  std::string pipeline;
  std::string where;
  int workers = 0;
  int per_request = 0;
  Run run;
  double local_per_s = 0;       // the local run of the same pipeline
  double local_copy_per_s = 0;  // local+copy (0: not measured)
  double tcp_per_s = 0;         // raw loopback TCP (0: not measured)
};

void print_header() {
  std::printf("%-8s %-11s %-8s %-8s %-10s %-8s %-12s %-9s %-10s %-11s %-8s\n", "elements", "where", "workers",
              "max/req", "count", "seconds", "elements/s", "MB/s", "svc/local", "svc/l+copy", "svc/TCP");
}

void print_row(const Row& r) {
  char workers[16] = "-", per_request[16] = "-", vs_local[16] = "-", vs_copy[16] = "-", vs_tcp[16] = "-";
  if (r.workers > 0) std::snprintf(workers, sizeof(workers), "%d", r.workers);
  if (r.per_request > 0) std::snprintf(per_request, sizeof(per_request), "%d", r.per_request);
  if (r.local_per_s > 0) std::snprintf(vs_local, sizeof(vs_local), "%.1f%%", 100.0 * r.run.per_s() / r.local_per_s);
  if (r.local_copy_per_s > 0) {
    std::snprintf(vs_copy, sizeof(vs_copy), "%.1f%%", 100.0 * r.run.per_s() / r.local_copy_per_s);
  }
  if (r.tcp_per_s > 0) std::snprintf(vs_tcp, sizeof(vs_tcp), "%.1f%%", 100.0 * r.run.per_s() / r.tcp_per_s);
  std::printf("%-8s %-11s %-8s %-8s %-10lld %-8.2f %-12.0f %-9.1f %-10s %-11s %-8s\n", r.pipeline.c_str(),
              r.where.c_str(), workers, per_request, static_cast<long long>(r.run.total), r.run.seconds,
              r.run.per_s(), r.run.mb_per_s(), vs_local, vs_copy, vs_tcp);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  int64_t small = 1000000;   // 100-byte elements per worker
  int64_t large = 2000;      // 1 MiB elements per worker
  int64_t rtt_samples = 20000;
  std::vector<int> worker_counts = {1, 2};
  std::string workers;
  bench::FlagParser args(argc, argv, "[--small N] [--large M] [--per-request-samples N] [--workers 1,2]");
  while (args.next()) {
    if (args.flag("--workers", &workers)) {
      worker_counts = bench::positive_counts(workers);
    } else if (!args.flag("--small", &small) && !args.flag("--large", &large) &&
               !args.flag("--per-request-samples", &rtt_samples)) {
      args.unknown();
    }
  }
  signal(SIGPIPE, SIG_IGN);
  const std::string bin_dir = bench::bin_dir();

  std::printf("data_service_bench: one consumer, OFF mode, loopback (%u cores); %lld x 100 B and %lld x 1 MiB "
              "elements per worker\n\n",
              std::thread::hardware_concurrency(), static_cast<long long>(small), static_cast<long long>(large));

  // Local baselines.
  Run local_small, local_large, local_large_copy, raw_tcp;
  print_header();
  if (small > 0) {
    local_small = drain(small_pipeline(small));
    print_row({"100 B", "local", 0, 0, local_small, 0, 0});
    bench::result("data_local_100b", local_small.per_s(), "elements/s");
  }
  if (large > 0) {
    local_large = drain(large_pipeline(large));
    local_large_copy = drain(large_pipeline(large), /*copy=*/true);
    print_row({"1 MiB", "local", 0, 0, local_large, 0, 0});
    print_row({"1 MiB", "local+copy", 0, 0, local_large_copy, 0, 0});
    raw_tcp = loopback_tcp(large);
    print_row({"1 MiB", "raw TCP", 0, 0, raw_tcp, 0, 0});
    bench::result("data_local_1mib", local_large.mb_per_s() / 1e3, "GB/s");
    bench::result("data_local_copy_1mib", local_large_copy.mb_per_s() / 1e3, "GB/s");
    bench::result("loopback_tcp_1mib", raw_tcp.mb_per_s() / 1e3, "GB/s");
  }

  std::vector<std::string> cpu_lines;
  std::string rtt_line;
  for (int workers : worker_counts) {
    Service svc(bin_dir, workers);
    for (int per_request : {64, 256}) {
      if (small <= 0) break;
      auto small_id = service::register_dataset(svc.address(), small_pipeline(small));
      if (!small_id.ok()) fail("register_dataset", small_id.status());
      service::ReadOptions options;
      options.max_elements_per_request = per_request;
      Row row{"100 B", "service", workers, per_request,
              drain(service::from_dataset_id(svc.address(), *small_id, options)), local_small.per_s(), 0};
      print_row(row);
      bench::result("data_service_100b_" + std::to_string(workers) + "w" +
                        (per_request == 64 ? std::string() : "_req" + std::to_string(per_request)),
                    row.run.per_s(), "elements/s");
      cpu_lines.push_back("100 B, " + std::to_string(workers) + " worker(s), max/req " + std::to_string(per_request) +
                          ": " + row.run.cpu);
      if (row.run.total != small * workers) {
        std::printf("  (expected %lld elements)\n", static_cast<long long>(small * workers));
      }
    }
    if (large > 0) {
      auto large_id = service::register_dataset(svc.address(), large_pipeline(large));
      if (!large_id.ok()) fail("register_dataset", large_id.status());
      // Over TCP (shared memory off), then through the shared-memory
      // regions the workers on this host offer.
      for (bool shm : {false, true}) {
        service::ReadOptions options;
        if (!shm) options.shared_memory_bytes = 0;
        Row row{"1 MiB", shm ? "service+shm" : "service", workers, options.max_elements_per_request,
                drain(service::from_dataset_id(svc.address(), *large_id, options)), local_large.per_s(),
                local_large_copy.per_s(), raw_tcp.per_s()};
        print_row(row);
        bench::result("data_service_1mib_" + std::to_string(workers) + "w" + (shm ? "_shm" : ""),
                      row.run.mb_per_s() / 1e3, "GB/s");
        cpu_lines.push_back("1 MiB, " + std::to_string(workers) + " worker(s)" + (shm ? ", shared memory" : ", TCP") +
                            ": " + row.run.cpu);
        if (row.run.total != large * workers) {
          std::printf("  (expected %lld elements)\n", static_cast<long long>(large * workers));
        }
      }
    }
    if (workers == 1 && rtt_samples > 0) {
      // One element per getElements: the request rate, i.e. the per-request
      // floor (RPC round trip + worker pool hop + reader bookkeeping).
      auto id = service::register_dataset(svc.address(), small_pipeline(rtt_samples));
      if (!id.ok()) fail("register_dataset", id.status());
      service::ReadOptions options;
      options.max_elements_per_request = 1;
      Run r = drain(service::from_dataset_id(svc.address(), *id, options));
      char text[256];
      std::snprintf(text, sizeof(text),
                    "getElements with max_elements_per_request 1, 1 worker: %.0f requests/s (%.1f us per request)",
                    r.per_s(), 1e6 / r.per_s());
      rtt_line = text;
      bench::result("data_service_requests_per_s_1w", r.per_s(), "requests/s");
      cpu_lines.push_back("100 B, 1 worker, max/req 1: " + r.cpu);
    }
  }

  std::printf("\nbreakdown:\n");
  if (!rtt_line.empty()) std::printf("  %s\n", rtt_line.c_str());
  std::printf("  CPU per element during the timed part (us; /proc/<pid>/stat, 10 ms ticks) and bytes written by the "
              "data workers (/proc/<pid>/io wchar):\n");
  for (const auto& line : cpu_lines) std::printf("    %s\n", line.c_str());
  std::printf("\nelements/s and MB/s (1 MB = 1e6 B) from the first element to end of sequence; svc/local = service "
              "elements/s over local elements/s;\nsvc/l+copy: over local with one copy of every element; svc/TCP: over "
              "raw loopback TCP.\nlogs: %s\n",
              bench::run_dir().c_str());
  bench::print_results();
  return 0;
}
