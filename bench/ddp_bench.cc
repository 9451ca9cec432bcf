// Data-parallel training throughput of a LibTorch module on Capstan's
// collectives (capstan::torch::MirroredModule), beside PyTorch's
// DistributedDataParallel on gloo (bench/peers/ddp.py, the same model and
// batch; bench/ddp_bench.sh runs both).
//
//   build/bin/ddp_bench [--ranks 2] [--steps 30] [--warmup 3] [--layers 4] [--width 1024] [--batch 64]
//                       [--threads 1] [--transport auto|tcp|shm]
//
// The model: --layers Linear(width, width), ReLU between them, mean squared
// error against a fixed target; float32, SGD. Ranks are forked processes on
// this host, each with --threads intra-op threads and its own batch of
// --batch examples. Rank 0 times --steps steps between barriers (after
// --warmup untimed ones) and prints
//
//   RESULT ddp_mlp <steps/s> steps/s
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "bench_util.h"
#include "capstan/collectives.h"
#include "capstan/torch.h"
#include "capstan/torch/mirrored_module.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Flags {
  int ranks = 2;
  int steps = 30;
  int warmup = 3;
  int layers = 4;
  int64_t width = 1024;
  int64_t batch = 64;
  int threads = 1;
  std::string transport = "auto";
};

::torch::nn::Sequential make_model(const Flags& flags) {
  ::torch::nn::Sequential model;
  for (int i = 0; i < flags.layers; ++i) {
    if (i > 0) model->push_back(::torch::nn::ReLU());
    model->push_back(::torch::nn::Linear(flags.width, flags.width));
  }
  return model;
}

int rank_main(std::unique_ptr<capstan::CollectiveEndpoint> endpoint, const std::vector<std::string>& addresses,
              int rank, const Flags& flags) {
  ::torch::set_num_threads(flags.threads);
  capstan::CollectiveOptions options;
  options.transport = capstan::collective_transport_from_name(flags.transport).value();
  auto group = capstan::Communicator::create(std::move(endpoint), addresses, rank, 1, options);
  if (!group.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", rank, group.status().to_string().c_str());
    return 1;
  }
  ::torch::manual_seed(rank);  // rank 0's initial values win
  auto model = make_model(flags);
  auto ddp = capstan::torch::MirroredModule::create(**group, *model, {.optimizer = capstan::Optimizer::sgd(0.01)});
  if (!ddp.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", rank, ddp.status().to_string().c_str());
    return 1;
  }
  ::torch::manual_seed(100 + rank);
  const ::torch::Tensor x = ::torch::randn({flags.batch, flags.width});
  const ::torch::Tensor y = ::torch::randn({flags.batch, flags.width});
  auto step = [&]() -> capstan::Status {
    return (*ddp)->train_step([&] { return ::torch::mse_loss(model->forward(x), y); }).status();
  };
  for (int i = 0; i < flags.warmup; ++i) {
    if (auto s = step(); !s.ok()) {
      std::fprintf(stderr, "rank %d: %s\n", rank, s.to_string().c_str());
      return 1;
    }
  }
  if (!(*group)->barrier().ok()) return 1;
  const auto start = Clock::now();
  for (int i = 0; i < flags.steps; ++i) {
    if (auto s = step(); !s.ok()) {
      std::fprintf(stderr, "rank %d: %s\n", rank, s.to_string().c_str());
      return 1;
    }
  }
  if (!(*group)->barrier().ok()) return 1;
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  if (!(*ddp)->verify_replicas().ok()) {
    std::fprintf(stderr, "rank %d: the replicas diverged\n", rank);
    return 1;
  }
  if (rank == 0) {
    const auto& stats = (*ddp)->stats();
    std::printf("ddp_bench: %d ranks, %d x Linear(%ld, %ld), batch %ld per rank, %d thread(s) each, %s; "
                "%ld buckets, %ld of them launched before backward returned\n",
                flags.ranks, flags.layers, static_cast<long>(flags.width), static_cast<long>(flags.width),
                static_cast<long>(flags.batch), flags.threads, (*group)->describe().c_str(),
                static_cast<long>(stats.buckets), static_cast<long>(stats.launched_in_backward));
    std::printf("RESULT ddp_mlp %.6g steps/s\n", flags.steps / seconds);
    std::fflush(stdout);  // the child leaves with _exit, which flushes nothing
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Flags flags;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string name = argv[i], value = argv[i + 1];
    if (name == "--ranks") flags.ranks = std::atoi(value.c_str());
    else if (name == "--steps") flags.steps = std::atoi(value.c_str());
    else if (name == "--warmup") flags.warmup = std::atoi(value.c_str());
    else if (name == "--layers") flags.layers = std::atoi(value.c_str());
    else if (name == "--width") flags.width = std::atoll(value.c_str());
    else if (name == "--batch") flags.batch = std::atoll(value.c_str());
    else if (name == "--threads") flags.threads = std::atoi(value.c_str());
    else if (name == "--transport") flags.transport = value;
    else {
      std::fprintf(stderr,
                   "usage: %s [--ranks 2] [--steps 30] [--warmup 3] [--layers 4] [--width 1024] [--batch 64] "
                   "[--threads 1] [--transport auto|tcp|shm]\n",
                   argv[0]);
      return 2;
    }
  }
  // Endpoints first, then fork: the children share the address list. No
  // torch work happens before the fork (its thread pools start later).
  std::vector<std::unique_ptr<capstan::CollectiveEndpoint>> endpoints;
  std::vector<std::string> addresses;
  for (int r = 0; r < flags.ranks; ++r) {
    endpoints.push_back(capstan::CollectiveEndpoint::listen().value());
    addresses.push_back(endpoints.back()->address());
  }
  std::vector<pid_t> children = capstan::bench::fork_ranks(flags.ranks, [&](int r) {
    return rank_main(std::move(endpoints[static_cast<size_t>(r)]), addresses, r, flags);
  });
  endpoints.clear();
  const int failed = capstan::bench::wait_ranks(children, "ddp_bench");
  if (failed > 0) std::fprintf(stderr, "ddp_bench: %d rank(s) failed\n", failed);
  return failed > 0 ? 1 : 0;
}
