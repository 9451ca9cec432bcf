// rpc_bench: small-call latency and tensor transfer throughput between a
// client and a real ps-server over loopback.
//
//   rpc_bench [--address HOST:PORT] [--calls N]
//
// Without --address it starts the ps-server that sits next to it (build/bin)
// on free ports and stops it at the end. Prints figures; never fails on them.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "bench_util.h"
#include "capstan/client.h"

namespace {

namespace bench = capstan::bench;
using bench::Clock;
using bench::seconds_since;

capstan::Element filled(size_t bytes) {
  auto tensor = *capstan::Tensor::uninitialized(capstan::DType::kFloat32,
                                                {static_cast<int64_t>(bytes / 4)});
  std::memset(tensor.mutable_data(), 0x5a, tensor.byte_size());
  capstan::Element element;
  element.components.push_back(std::move(tensor));
  return element;
}

}  // namespace

int main(int argc, char** argv) {
  std::string address;
  int calls = 5000;
  bench::FlagParser args(argc, argv, "[--address HOST:PORT] [--calls N]");
  while (args.next()) {
    if (args.flag("--address", &address) || args.flag("--calls", &calls)) continue;
    args.unknown();
  }
  if (address.empty()) {
    address = bench::start(bench::bin_dir(), "ps-server", "ps", {}).address;
  }
  capstan::ClientOptions options;
  options.max_message_bytes = 64ull << 20;
  auto client = capstan::NodeClient::connect(address, options);
  if (!client.ok()) {
    std::fprintf(stderr, "%s\n", client.status().to_string().c_str());
    return 1;
  }
  std::printf("rpc_bench against ps-server at %s (loopback)\n\n", address.c_str());

  // Small calls: info() round trips, one at a time.
  for (int i = 0; i < 200; ++i) (void)(*client)->info();
  std::vector<double> latencies;
  latencies.reserve(calls);
  for (int i = 0; i < calls; ++i) {
    auto start = Clock::now();
    auto info = (*client)->info();
    latencies.push_back(seconds_since(start) * 1e6);
    if (!info.ok()) {
      std::fprintf(stderr, "%s\n", info.status().to_string().c_str());
      return 1;
    }
  }
  std::sort(latencies.begin(), latencies.end());
  std::printf("small call (Node.info), %d calls: p50 %.1f us  p99 %.1f us  (%.0f calls/s)\n\n", calls,
              latencies[latencies.size() / 2], latencies[latencies.size() * 99 / 100],
              1e6 / latencies[latencies.size() / 2]);

  std::printf("%-8s %-6s %-22s %-22s\n", "tensor", "reps", "upload (discard)", "round trip (echo)");
  struct Case {
    size_t mib;
    int reps;
  };
  for (Case c : {Case{1, 100}, Case{16, 20}, Case{64, 8}, Case{256, 3}}) {
    size_t bytes = c.mib << 20;
    auto element = filled(bytes);
    (void)(*client)->discard(element);  // warm up
    auto start = Clock::now();
    for (int r = 0; r < c.reps; ++r) {
      auto n = (*client)->discard(element);
      if (!n.ok() || *n != bytes) {
        std::fprintf(stderr, "discard failed: %s\n", n.status().to_string().c_str());
        return 1;
      }
    }
    double upload = seconds_since(start) / c.reps;
    start = Clock::now();
    for (int r = 0; r < c.reps; ++r) {
      auto back = (*client)->echo(element);
      if (!back.ok() || back->byte_size() != bytes) {
        std::fprintf(stderr, "echo failed: %s\n", back.status().to_string().c_str());
        return 1;
      }
    }
    double echo = seconds_since(start) / c.reps;
    char up_text[64], echo_text[64];
    std::snprintf(up_text, sizeof(up_text), "%.2f GB/s (%.1f ms)", bytes / upload / 1e9, upload * 1e3);
    std::snprintf(echo_text, sizeof(echo_text), "%.2f GB/s (%.1f ms)", 2.0 * bytes / echo / 1e9,
                  echo * 1e3);
    std::printf("%4zu MiB %-6d %-22s %-22s\n", c.mib, c.reps, up_text, echo_text);
  }
  std::printf("\nupload: client -> daemon bytes per second; round trip: bytes moved both ways per second\n");
  client->reset();
  bench::stop_all();
  return 0;
}
