// LibTorch's CUDA tensors on Capstan's collectives, for a GPU machine:
// capstan::torch::all_reduce, broadcast and all_gather take a CUDA tensor
// through NCCL on its device (Communicator::*_device), ordered after the
// kernels torch queued before them. One rank per GPU, forked processes
// whose host group runs over loopback; every result checked against the
// reference on the host; then the time of a 64 MiB all-reduce through
// capstan::torch::all_reduce beside Communicator::all_reduce_device on the
// same buffer (what the torch layer adds), p50 of 20.
// Where no GPU or NCCL is usable it says why and exits 1 (a CPU build of
// LibTorch, as Debian's, has no CUDA).
//
//   build/bin/torch_cuda_check [--ranks N]   (default 1; at most one per GPU)
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "capstan/torch.h"
#include "capstan/torch/mirrored_module.h"

namespace {

using capstan::Communicator;
using capstan::ReduceOp;
using capstan::Status;
using Clock = std::chrono::steady_clock;

struct Checker {
  int rank = 0;
  int passed = 0;
  int failed = 0;
  void expect(bool ok, const std::string& what) {
    if (ok) {
      ++passed;
    } else {
      ++failed;
      std::fprintf(stderr, "rank %d: FAILED: %s\n", rank, what.c_str());
    }
  }
  void expect_ok(const Status& s, const std::string& what) { expect(s.ok(), what + ": " + s.to_string()); }
};

// Rank r's values: i % 7 + r + 1, made on the GPU.
::torch::Tensor rank_values(int64_t count, int rank, ::torch::Device device, c10::ScalarType type) {
  return (::torch::arange(count, ::torch::TensorOptions().dtype(::torch::kInt64).device(device)) % 7 + rank + 1)
      .to(type);
}

double p50_ms(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int rank_main(std::unique_ptr<capstan::CollectiveEndpoint> endpoint, std::vector<std::string> addresses, int rank) {
  const int n = static_cast<int>(addresses.size());
  Checker c{rank};
  if (!::torch::cuda::is_available() || static_cast<int>(::torch::cuda::device_count()) <= rank) {
    std::fprintf(stderr, "rank %d: no CUDA device %d for it (this LibTorch sees %d; a CPU build sees none)\n", rank,
                 rank, static_cast<int>(::torch::cuda::device_count()));
    return 1;
  }
  if (Status s = Communicator::device_collectives(); !s.ok()) {
    std::fprintf(stderr, "rank %d: Capstan's device collectives cannot run here: %s\n", rank, s.to_string().c_str());
    return 1;
  }
  capstan::CollectiveOptions options;
  options.timeout = std::chrono::seconds(60);
  auto made = Communicator::create(std::move(endpoint), addresses, rank, 1, options);
  if (!made.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", rank, made.status().to_string().c_str());
    return 1;
  }
  Communicator& group = **made;
  const ::torch::Device device(::torch::kCUDA, static_cast<c10::DeviceIndex>(rank));
  const int64_t count = (1 << 20) + 3;
  const ::torch::Tensor pattern = ::torch::arange(count, ::torch::kInt64) % 7;  // on the host

  for (c10::ScalarType type : {::torch::kFloat32, ::torch::kFloat64, ::torch::kFloat16, ::torch::kBFloat16,
                               ::torch::kInt64, ::torch::kInt32}) {
    const std::string name = c10::toString(type);
    ::torch::Tensor x = rank_values(count, rank, device, type);
    c.expect_ok(capstan::torch::all_reduce(group, x, ReduceOp::kSum), "all_reduce SUM " + name);
    ::torch::Tensor want = (pattern * n + n * (n + 1) / 2).to(type);
    c.expect(x.is_cuda() && ::torch::equal(x.cpu(), want), "all_reduce SUM " + name + ": the values");
    if (::torch::isFloatingType(type)) {
      ::torch::Tensor m = rank_values(count, rank, device, type);
      c.expect_ok(capstan::torch::all_reduce(group, m, ReduceOp::kMean), "all_reduce MEAN " + name);
      c.expect(::torch::allclose(m.cpu().to(::torch::kFloat64), pattern.to(::torch::kFloat64) + (n + 1) / 2.0),
               "all_reduce MEAN " + name + ": the values");
    }
    ::torch::Tensor b = rank_values(count, rank, device, type);
    c.expect_ok(capstan::torch::broadcast(group, b, n - 1), "broadcast " + name);
    c.expect(::torch::equal(b.cpu(), (pattern + n).to(type)), "broadcast " + name + ": rank n-1's values");
    auto gathered = capstan::torch::all_gather(group, rank_values(count, rank, device, type).view({-1, 1}));
    c.expect_ok(gathered.status(), "all_gather " + name);
    if (gathered.ok()) {
      std::vector<::torch::Tensor> rows;
      for (int r = 0; r < n; ++r) rows.push_back((pattern + r + 1).to(type).view({-1, 1}));
      c.expect(gathered->is_cuda() && gathered->sizes() == ::torch::IntArrayRef({count * n, 1}) &&
                   ::torch::equal(gathered->cpu(), ::torch::cat(rows)),
               "all_gather " + name + ": every rank's rows in rank order");
    }
  }

  // Ordering: a product still running on torch's (default) stream when the
  // all-reduce is called; NCCL must reduce its result, not what was there.
  {
    ::torch::manual_seed(rank);
    ::torch::Tensor a = ::torch::randn({4096, 4096}, ::torch::TensorOptions().device(device));
    ::torch::Tensor product = ::torch::matmul(a, a);
    ::torch::Tensor copy = product.clone();
    c.expect_ok(capstan::torch::all_reduce(group, product, ReduceOp::kMax), "all_reduce MAX after a matmul");
    // One rank: the max of one is itself, so the values must be the product.
    if (n == 1) c.expect(::torch::equal(product, copy), "all_reduce right after a matmul reduces its result");
  }

  // Refusals on CUDA tensors name the tensor and the fix, and the group goes on.
  {
    ::torch::Tensor strided = ::torch::ones({64, 32}, ::torch::TensorOptions().device(device)).t();
    Status s = capstan::torch::all_reduce(group, strided, ReduceOp::kSum);
    c.expect(s.code() == capstan::StatusCode::kInvalidArgument &&
                 s.message().find("not contiguous") != std::string::npos,
             "a non-contiguous CUDA tensor is refused: " + s.to_string());
    ::torch::nn::Linear linear(4, 4);
    linear->to(device);
    auto mirrored = capstan::torch::MirroredModule::create(group, *linear);
    c.expect(mirrored.status().code() == capstan::StatusCode::kInvalidArgument &&
                 mirrored.status().message().find("is on cuda:" + std::to_string(rank)) != std::string::npos,
             "MirroredModule refuses a CUDA module, naming its device: " + mirrored.status().to_string());
    ::torch::Tensor after = rank_values(16, rank, device, ::torch::kFloat32);
    c.expect_ok(capstan::torch::all_reduce(group, after, ReduceOp::kSum), "an all-reduce after the refusals");
  }

  // What the torch layer adds: capstan::torch::all_reduce beside
  // Communicator::all_reduce_device on the same 64 MiB.
  ::torch::Tensor big = ::torch::ones({16 << 20}, ::torch::TensorOptions().device(device));
  std::vector<double> via_torch, direct;
  for (int i = 0; i < 21; ++i) {
    auto t0 = Clock::now();
    Status s = capstan::torch::all_reduce(group, big, ReduceOp::kMean);
    auto t1 = Clock::now();
    Status d = group.all_reduce_device(big.data_ptr(), big.data_ptr(), big.numel(), capstan::DType::kFloat32,
                                       ReduceOp::kMean, rank);
    auto t2 = Clock::now();
    if (!s.ok() || !d.ok()) {
      c.expect(false, "timed all-reduces: " + s.to_string() + " / " + d.to_string());
      break;
    }
    if (i == 0) continue;  // warm-up
    via_torch.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    direct.push_back(std::chrono::duration<double, std::milli>(t2 - t1).count());
  }
  if (!via_torch.empty() && rank == 0) {
    std::printf("torch_cuda_check: 64 MiB float32 all-reduce (MEAN) over %d rank(s), p50 of %zu: "
                "capstan::torch::all_reduce %.3f ms, Communicator::all_reduce_device %.3f ms\n",
                n, via_torch.size(), p50_ms(via_torch), p50_ms(direct));
  }
  std::printf("torch_cuda_check: rank %d: %d checks passed, %d failed\n", rank, c.passed, c.failed);
  std::fflush(stdout);
  return c.failed == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  int ranks = 1;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--ranks" && i + 1 < argc) {
      ranks = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: torch_cuda_check [--ranks N]\n");
      return 2;
    }
  }
  if (ranks < 1) {
    std::fprintf(stderr, "torch_cuda_check: --ranks %d: give 1 or more (one per GPU)\n", ranks);
    return 2;
  }
  // The parent forks the ranks before anything touches CUDA (a child of a
  // parent that initialized CUDA cannot use it).
  std::vector<std::unique_ptr<capstan::CollectiveEndpoint>> endpoints;
  std::vector<std::string> addresses;
  for (int r = 0; r < ranks; ++r) {
    endpoints.push_back(capstan::CollectiveEndpoint::listen().value());
    addresses.push_back(endpoints.back()->address());
  }
  std::fflush(stdout);
  std::vector<pid_t> children;
  for (int r = 0; r < ranks; ++r) {
    pid_t pid = fork();
    if (pid == 0) _exit(rank_main(std::move(endpoints[static_cast<size_t>(r)]), addresses, r));
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
