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
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "bench_util.h"
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
    // A dtype NCCL lacks goes through the host; an in-place NCCL write is
    // an in-place change to autograd.
    ::torch::Tensor flags = (::torch::arange(10, ::torch::TensorOptions().device(device)) % 2 == rank % 2);
    const ::torch::Tensor root_flags = (::torch::arange(10) % 2 == (n - 1) % 2);
    c.expect_ok(capstan::torch::broadcast(group, flags, n - 1), "broadcast of a CUDA bool tensor");
    c.expect(flags.is_cuda() && ::torch::equal(flags.cpu(), root_flags), "a CUDA bool tensor takes rank n-1's");
    ::torch::Tensor shorts = rank_values(100, rank, device, ::torch::kInt16);
    c.expect_ok(capstan::torch::broadcast(group, shorts, n - 1), "broadcast of a CUDA int16 tensor");
    c.expect(shorts.is_cuda() && ::torch::equal(shorts.cpu(), (::torch::arange(100) % 7 + n).to(::torch::kInt16)),
             "a CUDA int16 tensor takes rank n-1's");
    // The host path reduces no int8 (as no CPU tensor): the same clear refusal.
    ::torch::Tensor small = rank_values(100, rank, device, ::torch::kInt8);
    Status int8 = capstan::torch::all_reduce(group, small, ReduceOp::kSum);
    c.expect(int8.code() == capstan::StatusCode::kInvalidArgument &&
                 int8.message().find("cannot reduce int8") != std::string::npos,
             "a CUDA int8 all-reduce is refused as a CPU one is: " + int8.to_string());
    ::torch::Tensor w = ::torch::ones({4}, ::torch::TensorOptions().device(device).requires_grad(true));
    ::torch::Tensor saved = w * 2;
    ::torch::Tensor loss = (saved * saved).sum();  // saves `saved` for backward
    {
      ::torch::NoGradGuard no_grad;
      c.expect_ok(capstan::torch::all_reduce(group, saved, ReduceOp::kSum), "all_reduce of a saved tensor");
    }
    bool refused = false;
    try {
      loss.backward();
    } catch (const c10::Error& e) {
      refused = std::string(e.what()).find("inplace") != std::string::npos;
    }
    c.expect(refused, "backward through a tensor NCCL changed in place is refused, as after copy_");
    // A module on two devices is refused, naming both.
    {
      ::torch::nn::Linear split(4, 4);
      split->to(device);
      split->register_parameter("extra", ::torch::zeros({2}));
      Status s2 = capstan::torch::MirroredModule::create(group, *split).status();
      c.expect(s2.code() == capstan::StatusCode::kInvalidArgument &&
                   s2.message().find("parameter 'extra' is on cpu and parameter 'weight' on cuda:") !=
                       std::string::npos,
               "a module on two devices is refused naming both: " + s2.to_string());
    }
    ::torch::Tensor after = rank_values(16, rank, device, ::torch::kFloat32);
    c.expect_ok(capstan::torch::all_reduce(group, after, ReduceOp::kSum), "an all-reduce after the refusals");
  }

  // MirroredModule on CUDA: steps of a module with a BatchNorm on the GPU
  // against the same module on the CPU (each rank its own batch): the same
  // parameters and running statistics within float rounding (the two
  // devices' kernels round differently; Adam's normalized steps magnify
  // that for gradients near zero, hence its wider bound), still on the
  // GPU, the replicas holding them.
  for (const auto& [optimizer, bound] : {std::pair{capstan::Optimizer::sgd(0.1), 1e-5},
                                         std::pair{capstan::Optimizer::adam(0.01), 1e-3}}) {
    auto make = [](const ::torch::Device& on) {
      ::torch::manual_seed(5);
      ::torch::nn::Sequential net(::torch::nn::Linear(8, 32), ::torch::nn::BatchNorm1d(32), ::torch::nn::ReLU(),
                                  ::torch::nn::Linear(32, 1));
      net->to(on);
      return net;
    };
    ::torch::nn::Sequential on_gpu = make(device), on_cpu = make(::torch::kCPU);
    auto gpu = capstan::torch::MirroredModule::create(group, *on_gpu,
                                                      {.prefix = "gpu/", .optimizer = optimizer});
    auto cpu = capstan::torch::MirroredModule::create(group, *on_cpu,
                                                      {.prefix = "cpu/", .optimizer = optimizer});
    c.expect_ok(gpu.status(), "MirroredModule::create on " + device.str());
    c.expect_ok(cpu.status(), "MirroredModule::create on the CPU");
    if (gpu.ok() && cpu.ok()) {
      for (int step = 0; step < 5; ++step) {
        ::torch::manual_seed(100 * step + rank);
        ::torch::Tensor x = ::torch::randn({16, 8}), y = ::torch::randn({16, 1});
        auto g = (*gpu)->train_step([&] { return ::torch::mse_loss(on_gpu->forward(x.to(device)), y.to(device)); });
        auto h = (*cpu)->train_step([&] { return ::torch::mse_loss(on_cpu->forward(x), y); });
        c.expect_ok(g.status(), "MirroredModule::train_step on " + device.str());
        c.expect_ok(h.status(), "MirroredModule::train_step on the CPU");
        if (!g.ok() || !h.ok()) break;
      }
      double worst = 0;
      bool on_device = true;
      for (const auto& item : on_gpu->named_parameters()) {
        on_device = on_device && item.value().is_cuda();
        const ::torch::Tensor theirs = on_cpu->named_parameters()[item.key()];
        worst = std::max(worst, (item.value().cpu() - theirs).abs().max().item<double>());
        auto replica = (*gpu)->value(item.key());
        c.expect(replica.ok() && ::torch::equal(capstan::torch::to_torch(*replica).value(), item.value().cpu()),
                 "the replica of " + item.key() + " holds the CUDA parameter's value");
      }
      for (const auto& item : on_gpu->named_buffers()) {
        if (!item.value().is_floating_point()) continue;
        const ::torch::Tensor theirs = on_cpu->named_buffers()[item.key()];
        worst = std::max(worst, (item.value().cpu() - theirs).abs().max().item<double>());
        auto replica = (*gpu)->variables().value("gpu/" + item.key());
        c.expect(replica.ok() && ::torch::equal(capstan::torch::to_torch(*replica).value(), item.value().cpu()),
                 "the replica of buffer " + item.key() + " holds the CUDA buffer's value");
      }
      c.expect(on_device, "the module's parameters stay on " + device.str());
      const std::string compared = "MirroredModule on " + device.str() + " against the CPU after 5 " +
                                   capstan::optimizer_name(optimizer.kind) + " steps: largest difference " +
                                   std::to_string(worst);
      c.expect(worst < bound, compared);
      if (rank == 0) std::printf("torch_cuda_check: %s (bound %g)\n", compared.c_str(), bound);
      c.expect((*gpu)->stats().all_reduces >= 5 && (*gpu)->stats().steps == 5,
               "MirroredModule on CUDA all-reduced every step's buckets");
    }
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
                n, via_torch.size(), capstan::bench::median(via_torch), capstan::bench::median(direct));
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
  std::vector<pid_t> children = capstan::bench::fork_ranks(
      ranks, [&](int r) { return rank_main(std::move(endpoints[static_cast<size_t>(r)]), addresses, r); });
  endpoints.clear();  // the children's now
  return capstan::bench::wait_ranks(children, "torch_cuda_check") == 0 ? 0 : 1;
}
