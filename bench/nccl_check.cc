// The device collectives (NCCL) on a GPU machine: one rank per GPU (forked
// processes, their host group over loopback), device buffers filled and
// checked through cudaMemcpy, every operation against a reference, then the
// time of all-reduces from 4 B to 256 MiB (p50, algbw, busbw as nccl-tests
// report them). Built only with CUDA; prints why and exits 1 where no GPU
// or NCCL is usable.
//
//   build/bin/nccl_check [--ranks N] [--share-gpu]   (default: every GPU)
#include <cuda_runtime_api.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "capstan/collectives.h"

namespace {

using capstan::Communicator;
using capstan::DType;
using capstan::ReduceOp;
using Clock = std::chrono::steady_clock;

int fail(int rank, const std::string& what) {
  std::fprintf(stderr, "rank %d: %s\n", rank, what.c_str());
  return 1;
}

int rank_main(std::unique_ptr<capstan::CollectiveEndpoint> endpoint, std::vector<std::string> addresses, int rank,
              int device) {
  capstan::CollectiveOptions options;
  options.timeout = std::chrono::seconds(60);
  auto group = Communicator::create(std::move(endpoint), addresses, rank, 1, options);
  if (!group.ok()) return fail(rank, group.status().to_string());
  const int n = static_cast<int>(addresses.size());
  if (cudaError_t e = cudaSetDevice(device); e != cudaSuccess) {
    return fail(rank, std::string("cudaSetDevice: ") + cudaGetErrorString(e));
  }
  const int64_t count = (1 << 20) + 3;
  float* send = nullptr;
  float* recv = nullptr;
  if (cudaMalloc(reinterpret_cast<void**>(&send), count * sizeof(float)) != cudaSuccess || cudaMalloc(reinterpret_cast<void**>(&recv), count * n * sizeof(float)) != cudaSuccess) {
    return fail(rank, "cudaMalloc");
  }
  std::vector<float> host(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) host[static_cast<size_t>(i)] = static_cast<float>(rank + 1) + static_cast<float>(i % 7);
  cudaMemcpy(send, host.data(), count * sizeof(float), cudaMemcpyHostToDevice);
  // all_reduce SUM and MEAN, broadcast, all_gather: checked on the host.
  auto check = [&](const char* what, const std::vector<float>& want, int64_t elements) -> bool {
    std::vector<float> got(static_cast<size_t>(elements));
    cudaMemcpy(got.data(), recv, elements * sizeof(float), cudaMemcpyDeviceToHost);
    for (int64_t i = 0; i < elements; ++i) {
      if (got[static_cast<size_t>(i)] != want[static_cast<size_t>(i)]) {
        std::fprintf(stderr, "rank %d: %s: element %lld is %g, want %g\n", rank, what, static_cast<long long>(i),
                     got[static_cast<size_t>(i)], want[static_cast<size_t>(i)]);
        return false;
      }
    }
    return true;
  };
  std::vector<float> want(static_cast<size_t>(count));
  auto status = (*group)->all_reduce_device(send, recv, count, DType::kFloat32, ReduceOp::kSum, device);
  if (!status.ok()) return fail(rank, "all_reduce_device: " + status.to_string());
  for (int64_t i = 0; i < count; ++i) want[static_cast<size_t>(i)] = static_cast<float>(n * (n + 1) / 2) + static_cast<float>(n * (i % 7));
  if (!check("all_reduce SUM", want, count)) return 1;
  cudaMemcpy(recv, send, count * sizeof(float), cudaMemcpyDeviceToDevice);
  status = (*group)->broadcast_device(recv, count, DType::kFloat32, n - 1, device);
  if (!status.ok()) return fail(rank, "broadcast_device: " + status.to_string());
  for (int64_t i = 0; i < count; ++i) want[static_cast<size_t>(i)] = static_cast<float>(n) + static_cast<float>(i % 7);
  if (!check("broadcast", want, count)) return 1;
  status = (*group)->all_gather_device(send, recv, count, DType::kFloat32, device);
  if (!status.ok()) return fail(rank, "all_gather_device: " + status.to_string());
  std::vector<float> gathered;
  for (int r = 0; r < n; ++r) {
    for (int64_t i = 0; i < count; ++i) gathered.push_back(static_cast<float>(r + 1) + static_cast<float>(i % 7));
  }
  if (!check("all_gather", gathered, count * n)) return 1;
  if (rank == 0) std::printf("nccl_check: %d rank(s): all_reduce, broadcast, all_gather on device buffers: OK\n", n);
  // Timing.
  cudaFree(send);
  cudaFree(recv);
  const int64_t max_bytes = int64_t{256} << 20;
  if (cudaMalloc(reinterpret_cast<void**>(&send), max_bytes) != cudaSuccess || cudaMalloc(reinterpret_cast<void**>(&recv), max_bytes) != cudaSuccess) {
    return fail(rank, "cudaMalloc 256 MiB");
  }
  if (rank == 0) std::printf("%-10s %5s %12s %12s %10s %10s\n", "op", "ranks", "bytes", "p50_us", "algbw_GB/s", "busbw_GB/s");
  for (int64_t bytes = 4; bytes <= max_bytes; bytes *= 4) {
    std::vector<double> seconds;
    for (int i = 0; i < 12; ++i) {
      if (!(*group)->barrier().ok()) return fail(rank, "barrier");
      auto start = Clock::now();
      status = (*group)->all_reduce_device(send, recv, bytes / 4, DType::kFloat32, ReduceOp::kSum, device);
      if (!status.ok()) return fail(rank, status.to_string());
      if (i >= 2) seconds.push_back(std::chrono::duration<double>(Clock::now() - start).count());
    }
    std::sort(seconds.begin(), seconds.end());
    if (rank == 0) {
      double p50 = seconds[seconds.size() / 2], algbw = static_cast<double>(bytes) / p50 / 1e9;
      std::printf("%-10s %5d %12lld %12.1f %10.3f %10.3f\n", "all_reduce", n, static_cast<long long>(bytes), p50 * 1e6,
                  algbw, algbw * 2.0 * (n - 1) / n);
      std::fflush(stdout);
    }
  }
  return 0;
}

// The number of usable GPUs, found in a child process: CUDA cannot be used
// in a child forked after its parent initialized it, so the parent, which
// forks the ranks, never touches CUDA itself. -1 when the device collectives
// cannot run here (the child printed why).
int usable_gpus() {
  std::fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) {
    capstan::Status here = Communicator::device_collectives();
    if (!here.ok()) {
      std::fprintf(stderr, "nccl_check: %s\n", here.to_string().c_str());
      _exit(255);
    }
    int gpus = 0;
    cudaGetDeviceCount(&gpus);
    _exit(std::min(gpus, 254));
  }
  int status = 0;
  waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) == 255) return -1;
  return WEXITSTATUS(status);
}

}  // namespace

int main(int argc, char** argv) {
  int gpus = usable_gpus();
  if (gpus < 1) return 1;
  // --ranks N: N ranks, one per GPU (at most one per GPU); --share-gpu: N
  // ranks round-robin over the GPUs, which NCCL refuses: every rank must get
  // that error, none may hang.
  int ranks = gpus;
  bool share = false;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--ranks" && i + 1 < argc) {
      ranks = std::atoi(argv[++i]);
    } else if (arg == "--share-gpu") {
      share = true;
    } else {
      std::fprintf(stderr, "usage: nccl_check [--ranks N] [--share-gpu]\n");
      return 2;
    }
  }
  if (!share) ranks = std::min(gpus, ranks);
  if (ranks < 1) return 1;
  std::vector<std::unique_ptr<capstan::CollectiveEndpoint>> endpoints;
  std::vector<std::string> addresses;
  for (int r = 0; r < ranks; ++r) {
    endpoints.push_back(capstan::CollectiveEndpoint::listen().value());
    addresses.push_back(endpoints.back()->address());
  }
  std::vector<pid_t> children;
  std::fflush(stdout);
  for (int r = 0; r < ranks; ++r) {
    pid_t pid = fork();
    if (pid == 0) _exit(rank_main(std::move(endpoints[static_cast<size_t>(r)]), addresses, r, r % gpus));
    children.push_back(pid);
  }
  int failed = 0;
  for (pid_t pid : children) {
    int status = 0;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) ++failed;
  }
  return failed == 0 ? 0 : 1;
}
