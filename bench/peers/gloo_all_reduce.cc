// Gloo's side of collective_bench: all-reduce (SUM, float32) between 2
// processes on this host over Gloo's TCP transport (loopback), with Gloo's
// ring_chunked algorithm, timed like collective_bench: rank 0 takes the
// median of several calls per size, each between barriers; algbw = bytes /
// time, busbw = algbw * 2(n-1)/n.
//
//   .run/peers/gloo_all_reduce [--sizes 4,1048576,16777216,67108864] [--ranks 2]
//
// Built by bench/peers/gloo.sh against Debian's libgloo-dev; never part of
// Capstan's build. Prints collective_bench's table and a RESULT line per
// size (4 B: p50 latency in us; larger: busbw in GB/s) for bench/compare.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <gloo/allreduce_ring_chunked.h>
#include <gloo/barrier_all_to_all.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/tcp/device.h>

namespace {

using Clock = std::chrono::steady_clock;

// The same counts as collective_bench, so both sides average alike.
int iterations_for(long long bytes) {
  if (bytes <= (64 << 10)) return 300;
  if (bytes <= (4 << 20)) return 40;
  if (bytes <= (64 << 20)) return 8;
  return 4;
}

std::string size_name(long long bytes) {
  if (bytes >= (1 << 20) && bytes % (1 << 20) == 0) return std::to_string(bytes >> 20) + "mib";
  if (bytes >= 1024 && bytes % 1024 == 0) return std::to_string(bytes >> 10) + "kib";
  return std::to_string(bytes) + "b";
}

int rank_main(int rank, int ranks, const std::string& store_dir, const std::vector<long long>& sizes) {
  gloo::transport::tcp::attr attr("127.0.0.1");
  auto device = gloo::transport::tcp::CreateDevice(attr);
  gloo::rendezvous::FileStore store(store_dir);
  auto context = std::make_shared<gloo::rendezvous::Context>(rank, ranks);
  context->connectFullMesh(store, device);
  gloo::BarrierAllToAll barrier(context);
  for (long long bytes : sizes) {
    const int count = static_cast<int>(bytes / 4);
    std::vector<float> data(static_cast<size_t>(count), 1.0f);
    gloo::AllreduceRingChunked<float> all_reduce(context, {data.data()}, count);
    std::vector<double> seconds;
    const int iterations = iterations_for(bytes);
    for (int i = 0; i < iterations + 2; ++i) {
      barrier.run();
      auto start = Clock::now();
      all_reduce.run();
      if (i >= 2) seconds.push_back(std::chrono::duration<double>(Clock::now() - start).count());
    }
    if (rank == 0) {
      std::sort(seconds.begin(), seconds.end());
      const double p50 = seconds[seconds.size() / 2];
      const double algbw = static_cast<double>(bytes) / p50 / 1e9;
      const double busbw = algbw * 2.0 * (ranks - 1) / ranks;
      std::printf("%-10s %-5s %5d %12lld %12.1f %10.3f %10.3f\n", "all_reduce", "gloo", ranks, bytes, p50 * 1e6,
                  algbw, busbw);
      const std::string name = "allreduce_" + size_name(bytes) + "_" + std::to_string(ranks) + "r";
      if (bytes < 1024) std::printf("RESULT %s %.1f us\n", name.c_str(), p50 * 1e6);
      else std::printf("RESULT %s %.3f GB/s\n", name.c_str(), busbw);
      std::fflush(stdout);
    }
  }
  return 0;
}

std::vector<long long> parse_sizes(const std::string& text) {
  std::vector<long long> out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) out.push_back(std::atoll(item.c_str()));
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<long long> sizes = {4, 1 << 20, 16 << 20, 64 << 20};
  int ranks = 2;
  for (int i = 1; i < argc; i += 2) {
    const std::string name = argv[i];
    if (i + 1 >= argc) {
      std::fprintf(stderr, "usage: %s [--sizes 4,1048576,...] [--ranks 2]\n", argv[0]);
      return 2;
    }
    if (name == "--sizes") sizes = parse_sizes(argv[i + 1]);
    else if (name == "--ranks") ranks = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "usage: %s [--sizes 4,1048576,...] [--ranks 2]\n", argv[0]);
      return 2;
    }
  }
  for (long long s : sizes) {
    if (s < 4 || s % 4 != 0 || s > (1LL << 31)) {
      std::fprintf(stderr, "gloo_all_reduce: --sizes takes multiples of 4 bytes up to 2 GiB, not %lld\n", s);
      return 2;
    }
  }
  if (ranks < 2 || ranks > 64) {
    std::fprintf(stderr, "gloo_all_reduce: --ranks takes 2 to 64, not %d\n", ranks);
    return 2;
  }
  char store_template[] = "/tmp/gloo_all_reduce.XXXXXX";
  if (mkdtemp(store_template) == nullptr) {
    std::perror("gloo_all_reduce: mkdtemp");
    return 1;
  }
  const std::string store_dir = store_template;
  std::printf("# Gloo ring_chunked over TCP on loopback; %d ranks (processes); times are medians\n", ranks);
  std::printf("%-10s %-5s %5s %12s %12s %10s %10s\n", "op", "via", "ranks", "bytes", "p50_us", "algbw_GB/s",
              "busbw_GB/s");
  std::fflush(stdout);
  std::vector<pid_t> children;
  for (int r = 0; r < ranks; ++r) {
    pid_t pid = fork();
    if (pid == 0) _exit(rank_main(r, ranks, store_dir, sizes));
    children.push_back(pid);
  }
  int failed = 0;
  for (pid_t pid : children) {
    int status = 0;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) ++failed;
  }
  std::error_code ignored;
  std::filesystem::remove_all(store_dir, ignored);
  if (failed > 0) {
    std::fprintf(stderr, "gloo_all_reduce: %d rank(s) failed\n", failed);
    return 1;
  }
  return 0;
}
