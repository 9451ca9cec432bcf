// Collective throughput and latency between processes on this machine, as
// nccl-tests reports them: for each size, the median time of an all-reduce,
// its algorithm bandwidth (bytes / time) and bus bandwidth (algbw x
// 2(n-1)/n, what each link carried).
//
//   build/bin/collective_bench [--ranks 2,4] [--min-bytes 4] [--max-bytes 268435456]
//                              [--transports tcp,shm] [--tcp-streams 1] [--segment-bytes N]
//                              [--op all_reduce|broadcast|all_gather] [--direct-max-bytes N]
//                              [--trace on|off] [--trace-events N] [--sizes 4,1048576,...]
//                              [--ring auto|phased|pipelined]
//
// Ranks are forked processes on this host, over loopback TCP or shared
// memory; rank 0 times each operation between barriers and prints one line
// per size (4 B to --max-bytes, powers of 4; or the --sizes given) and, for
// bench/compare, a RESULT line: `allreduce_<size>_<n>r_<tcp|shm>` (or
// broadcast_, allgather_), the p50
// in us below 1 KiB, else the bus bandwidth in GB/s (the names Gloo's and
// PyTorch's peers in bench/peers print, without the transport). With 2 ranks it first prints
// the machine's limits for the same traffic, measured in the same run:
// plain sockets (no Capstan) and memcpy. --trace on: every rank records a
// trace (capstan/trace.h) while it measures (what tracing costs), keeping
// at most --trace-events (default 500000).
#include <sys/wait.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench_util.h"
#include "capstan/collectives.h"
#include "capstan/trace.h"

namespace {

using Clock = std::chrono::steady_clock;
using capstan::Communicator;
using capstan::Tensor;

std::vector<int> parse_list(const std::string& text) {
  std::vector<int> out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) out.push_back(std::atoi(item.c_str()));
  return out;
}

int iterations_for(int64_t bytes) {
  if (bytes <= (64 << 10)) return 300;
  if (bytes <= (4 << 20)) return 40;
  if (bytes <= (64 << 20)) return 8;
  return 4;
}

capstan::Status run_op(Communicator& c, const std::string& op, const Tensor& t) {
  if (op == "broadcast") return c.broadcast(t, 0).status();
  if (op == "all_gather") return c.all_gather(t).status();
  return c.all_reduce(t, capstan::ReduceOp::kSum).status();
}

bool g_trace = false;  // --trace on
size_t g_trace_events = capstan::trace::Recorder::kMaxTraceEvents;  // --trace-events N
// --ring: which ring all-reduce (auto: over TCP phased below 64 MiB, pipelined from
// 64 MiB; pipelined over shared memory).
capstan::CollectiveOptions::Ring g_ring = capstan::CollectiveOptions::Ring::kAuto;

int rank_main(std::unique_ptr<capstan::CollectiveEndpoint> endpoint, const std::vector<std::string>& addresses,
              int rank, const std::vector<int64_t>& sizes, const std::string& op, int64_t direct_max,
              capstan::CollectiveOptions::Transport transport, int tcp_streams, int64_t segment_bytes) {
  capstan::CollectiveOptions options;
  options.timeout = std::chrono::seconds(120);
  options.transport = transport;
  options.tcp_streams = tcp_streams;
  if (segment_bytes > 0) options.segment_bytes = segment_bytes;
  options.ring = g_ring;
  if (direct_max >= 0) options.direct_max_bytes = direct_max;
  auto group = Communicator::create(std::move(endpoint), addresses, rank, 1, options);
  if (!group.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", rank, group.status().to_string().c_str());
    return 1;
  }
  // --trace on: this rank records a trace (capstan/trace.h) throughout.
  if (g_trace) (void)capstan::trace::Recorder::get().start_trace(g_trace_events);
  struct Traced {
    int rank;
    ~Traced() {
      if (!g_trace) return;
      capstan::trace::TraceCapture capture = capstan::trace::Recorder::get().stop_trace();
      if (rank == 0) {
        std::printf("# (rank 0 traced %zu events, %llu dropped past the bound)\n", capture.events.size(),
                    static_cast<unsigned long long>(capture.dropped));
      }
    }
  } traced{rank};
  const int n = static_cast<int>(addresses.size());
  for (int64_t bytes : sizes) {
    int64_t rows = bytes / 4;
    if (op == "all_gather") rows = std::max<int64_t>(1, rows / n);  // the output is `bytes`
    Tensor t = Tensor::zeros(capstan::DType::kFloat32, {rows}).value();
    std::vector<double> seconds;
    const int iterations = iterations_for(bytes);
    for (int i = 0; i < iterations + 2; ++i) {
      if (!(*group)->barrier().ok()) return 1;
      auto start = Clock::now();
      auto status = run_op(**group, op, t);
      if (!status.ok()) {
        std::fprintf(stderr, "rank %d: %s\n", rank, status.to_string().c_str());
        return 1;
      }
      if (i >= 2) seconds.push_back(std::chrono::duration<double>(Clock::now() - start).count());
    }
    if (rank == 0) {
      std::sort(seconds.begin(), seconds.end());
      double p50 = seconds[seconds.size() / 2];
      double algbw = static_cast<double>(bytes) / p50 / 1e9;
      double factor = op == "all_reduce" ? 2.0 * (n - 1) / n : op == "all_gather" ? (n - 1.0) / n : 1.0;
      std::printf("%-10s %-4s %5d %12lld %12.1f %10.3f %10.3f\n", op.c_str(),
                  std::string(capstan::collective_transport_name(transport)).c_str(), n, static_cast<long long>(bytes),
                  p50 * 1e6, algbw, algbw * factor);
      std::string name = op;
      name.erase(std::remove(name.begin(), name.end(), '_'), name.end());  // all_reduce -> allreduce
      name += "_" + capstan::bench::size_name(bytes) + "_" + std::to_string(n) + "r_" +
                               std::string(capstan::collective_transport_name(transport));
      if (bytes < 1024) std::printf("RESULT %s %.1f us\n", name.c_str(), p50 * 1e6);
      else std::printf("RESULT %s %.3f GB/s\n", name.c_str(), algbw * factor);
      std::fflush(stdout);
    }
  }
  return 0;
}

// The machine's limit for the same traffic, without Capstan: two processes
// over one loopback TCP connection (plain sockets), each sending `bytes`
// while receiving `bytes` from the other: what each rank of a 2-rank
// all-reduce moves (the ring sends half the tensor twice). Prints one line
// per size from the parent; returns false when the pair could not run.
void send_all(int fd, const char* data, size_t size) {
  while (size > 0) {
    ssize_t n = ::send(fd, data, size, 0);
    if (n <= 0) _exit(3);
    data += n;
    size -= static_cast<size_t>(n);
  }
}

void recv_all(int fd, char* data, size_t size) {
  while (size > 0) {
    ssize_t n = ::recv(fd, data, size, 0);
    if (n <= 0) _exit(3);
    data += n;
    size -= static_cast<size_t>(n);
  }
}

// One timed exchange per iteration; rank 0's medians go to `report`.
void exchange_side(int fd, int64_t min_bytes, int64_t max_bytes, FILE* report) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  for (int64_t bytes = min_bytes; bytes <= max_bytes; bytes *= 4) {
    std::vector<char> out(static_cast<size_t>(bytes), 1), in(static_cast<size_t>(bytes));
    std::vector<double> seconds;
    for (int i = 0; i < iterations_for(bytes) + 2; ++i) {
      char token = 0;
      send_all(fd, &token, 1);  // both ready
      recv_all(fd, &token, 1);
      auto start = Clock::now();
      std::thread sender([&]() { send_all(fd, out.data(), out.size()); });
      recv_all(fd, in.data(), in.size());
      sender.join();
      if (i >= 2) seconds.push_back(std::chrono::duration<double>(Clock::now() - start).count());
    }
    std::sort(seconds.begin(), seconds.end());
    if (report != nullptr) {
      double p50 = seconds[seconds.size() / 2];
      std::fprintf(report, "%-12s %5d %12lld %12.1f %10.3f\n", "tcp_exchange", 2, static_cast<long long>(bytes),
                   p50 * 1e6, static_cast<double>(bytes) / p50 / 1e9);
      std::fflush(report);
    }
  }
}

bool tcp_baseline(int64_t min_bytes, int64_t max_bytes) {
  int listener = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in at{};
  at.sin_family = AF_INET;
  at.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(at);
  if (::bind(listener, reinterpret_cast<sockaddr*>(&at), sizeof(at)) != 0 || ::listen(listener, 1) != 0 ||
      ::getsockname(listener, reinterpret_cast<sockaddr*>(&at), &length) != 0) {
    return false;
  }
  std::fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&at), sizeof(at)) != 0) _exit(2);
    exchange_side(fd, min_bytes, max_bytes, nullptr);
    _exit(0);
  }
  int fd = ::accept(listener, nullptr, nullptr);
  ::close(listener);
  if (fd < 0) return false;
  exchange_side(fd, min_bytes, max_bytes, stdout);
  ::close(fd);
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

// memcpy of `bytes` between two buffers of one process: what a shared-memory
// transfer costs at least (each byte is copied in and out of the ring).
void memcpy_baseline(int64_t min_bytes, int64_t max_bytes) {
  for (int64_t bytes = min_bytes; bytes <= max_bytes; bytes *= 4) {
    std::vector<char> from(static_cast<size_t>(bytes), 1), to(static_cast<size_t>(bytes), 2);
    std::vector<double> seconds;
    for (int i = 0; i < iterations_for(bytes) + 2; ++i) {
      auto start = Clock::now();
      std::memcpy(to.data(), from.data(), from.size());
      asm volatile("" : : "r"(to.data()) : "memory");
      if (i >= 2) seconds.push_back(std::chrono::duration<double>(Clock::now() - start).count());
    }
    std::sort(seconds.begin(), seconds.end());
    double p50 = seconds[seconds.size() / 2];
    std::printf("%-12s %5d %12lld %12.1f %10.3f\n", "memcpy", 1, static_cast<long long>(bytes), p50 * 1e6,
                static_cast<double>(bytes) / p50 / 1e9);
  }
  std::fflush(stdout);
}

std::vector<std::string> split(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) out.push_back(item);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> rank_counts = {2, 4};
  int64_t min_bytes = 4, max_bytes = int64_t{256} << 20;
  std::string op = "all_reduce";
  int64_t direct_max = -1;  // CollectiveOptions' default
  std::vector<std::string> transports = {"tcp", "shm"};
  int tcp_streams = capstan::CollectiveOptions{}.tcp_streams;
  int64_t segment_bytes = 0;  // CollectiveOptions' default
  std::vector<int64_t> sizes;  // --sizes; else powers of 4 from --min-bytes to --max-bytes
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string name = argv[i], value = argv[i + 1];
    if (name == "--ranks") rank_counts = parse_list(value);
    else if (name == "--max-bytes") max_bytes = std::atoll(value.c_str());
    else if (name == "--min-bytes") min_bytes = std::max<int64_t>(4, std::atoll(value.c_str()));
    else if (name == "--op") op = value;
    else if (name == "--direct-max-bytes") direct_max = std::atoll(value.c_str());
    else if (name == "--transports") transports = split(value);
    else if (name == "--tcp-streams") tcp_streams = std::atoi(value.c_str());
    else if (name == "--segment-bytes") segment_bytes = std::atoll(value.c_str());
    else if (name == "--trace") g_trace = value == "on";
    else if (name == "--ring") {
      using Ring = capstan::CollectiveOptions::Ring;
      if (value != "auto" && value != "phased" && value != "pipelined") {
        std::fprintf(stderr, "--ring takes auto, phased or pipelined, not '%s'\n", value.c_str());
        return 2;
      }
      g_ring = value == "phased" ? Ring::kPhased : value == "pipelined" ? Ring::kPipelined : Ring::kAuto;
    }
    else if (name == "--sizes") {
      sizes.clear();
      for (const auto& item : split(value)) sizes.push_back(std::atoll(item.c_str()));
    } else if (name == "--trace-events") g_trace_events = static_cast<size_t>(std::atoll(value.c_str()));
    else {
      std::fprintf(stderr, "usage: %s [--ranks 2,4] [--min-bytes N] [--max-bytes N] [--transports tcp,shm] "
                   "[--tcp-streams N] [--segment-bytes N] [--op all_reduce|broadcast|all_gather] [--direct-max-bytes N] "
                   "[--trace on|off] [--trace-events N] [--sizes N,...]\n", argv[0]);
      return 2;
    }
  }
  if (sizes.empty()) {
    for (int64_t bytes = min_bytes; bytes <= max_bytes; bytes *= 4) sizes.push_back(bytes);
  }
  for (int64_t bytes : sizes) {
    if (bytes < 4 || bytes % 4 != 0) {
      std::fprintf(stderr, "collective_bench: sizes are multiples of 4 bytes (float32), not %lld\n",
                   static_cast<long long>(bytes));
      return 2;
    }
  }
  min_bytes = *std::min_element(sizes.begin(), sizes.end());
  max_bytes = *std::max_element(sizes.begin(), sizes.end());
  for (const auto& t : transports) {
    if (!capstan::collective_transport_from_name(t).ok() || t == "auto") {
      std::fprintf(stderr, "collective_bench: --transports takes tcp and shm, not '%s'\n", t.c_str());
      return 2;
    }
  }
  if (op == "all_reduce" && std::find(rank_counts.begin(), rank_counts.end(), 2) != rank_counts.end()) {
    std::printf("# the machine's limit: plain sockets, 2 processes each sending and receiving BYTES at once\n");
    std::printf("%-12s %5s %12s %12s %10s\n", "baseline", "procs", "bytes", "p50_us", "GB/s");
    if (!tcp_baseline(min_bytes, std::min<int64_t>(max_bytes, int64_t{64} << 20))) {
      std::fprintf(stderr, "collective_bench: the plain-socket baseline failed\n");
      return 1;
    }
    memcpy_baseline(std::max<int64_t>(min_bytes, 1024), std::min<int64_t>(max_bytes, int64_t{64} << 20));
  }
  std::printf("# ranks are processes on this host (TCP on loopback, or shared memory); times are medians; "
              "%d TCP stream(s) per pair\n", tcp_streams);
  std::printf("%-10s %-4s %5s %12s %12s %10s %10s\n", "op", "via", "ranks", "bytes", "p50_us", "algbw_GB/s",
              "busbw_GB/s");
  for (int n : rank_counts) for (const auto& transport_name : transports) {
    const auto transport = *capstan::collective_transport_from_name(transport_name);
    std::vector<std::unique_ptr<capstan::CollectiveEndpoint>> endpoints;
    std::vector<std::string> addresses;
    for (int r = 0; r < n; ++r) {
      endpoints.push_back(capstan::CollectiveEndpoint::listen().value());
      addresses.push_back(endpoints.back()->address());
    }
    std::vector<pid_t> children = capstan::bench::fork_ranks(n, [&](int r) {
      return rank_main(std::move(endpoints[static_cast<size_t>(r)]), addresses, r, sizes, op,
                       direct_max, transport, tcp_streams, segment_bytes);
    });
    endpoints.clear();
    const int failed = capstan::bench::wait_ranks(children, "collective_bench");
    if (failed > 0) {
      std::fprintf(stderr, "collective_bench: %d rank(s) failed with %d ranks\n", failed, n);
      return 1;
    }
  }
  return 0;
}
