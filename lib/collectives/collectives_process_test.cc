// Collectives among real processes (forked ranks): one is killed with
// SIGKILL or stopped with SIGSTOP in the middle of 64 MiB all-reduces, and
// the survivors must fail with Unavailable naming it, within the deadline.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>

#include "capstan/collectives.h"

namespace capstan {
namespace {

using namespace std::chrono_literals;

struct Rank {
  pid_t pid = -1;
  int report = -1;  // read end: the child's one-line outcome
};

// Forks `n` ranks that form a group and all-reduce 64 MiB until one fails;
// each writes "CODE message" of the failure to its pipe and exits.
std::vector<Rank> start_ranks(int n, std::chrono::milliseconds timeout) {
  std::vector<std::unique_ptr<CollectiveEndpoint>> endpoints;
  std::vector<std::string> addresses;
  for (int i = 0; i < n; ++i) {
    endpoints.push_back(CollectiveEndpoint::listen().value());
    addresses.push_back(endpoints.back()->address());
  }
  std::vector<Rank> ranks;
  for (int r = 0; r < n; ++r) {
    int fds[2];
    REQUIRE(pipe(fds) == 0);
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      close(fds[0]);
      CollectiveOptions options;
      options.timeout = timeout;
      auto group = Communicator::create(std::move(endpoints[static_cast<size_t>(r)]), addresses, r, 1, options);
      Status status = group.status();
      if (group.ok()) {
        Tensor t = Tensor::zeros(DType::kFloat32, {(64 << 20) / 4}).value();
        while (status.ok()) status = (*group)->all_reduce(t, ReduceOp::kSum).status();
      }
      std::string line = std::to_string(static_cast<int>(status.code())) + " " + status.message() + "\n";
      ssize_t ignored = write(fds[1], line.data(), line.size());
      (void)ignored;
      _exit(0);
    }
    close(fds[1]);
    ranks.push_back({pid, fds[0]});
  }
  return ranks;
}

// The child's report, waiting at most `limit`.
std::string read_report(const Rank& rank, std::chrono::milliseconds limit) {
  auto until = std::chrono::steady_clock::now() + limit;
  std::string out;
  char buffer[512];
  while (std::chrono::steady_clock::now() < until) {
    fd_set set;
    FD_ZERO(&set);
    FD_SET(rank.report, &set);
    timeval tv{0, 50'000};
    if (select(rank.report + 1, &set, nullptr, nullptr, &tv) > 0) {
      ssize_t got = read(rank.report, buffer, sizeof(buffer));
      if (got <= 0) break;
      out.append(buffer, static_cast<size_t>(got));
      if (out.find('\n') != std::string::npos) break;
    }
  }
  return out;
}

void reap(std::vector<Rank>& ranks) {
  for (auto& r : ranks) {
    kill(r.pid, SIGKILL);
    waitpid(r.pid, nullptr, 0);
    close(r.report);
  }
}

void check_survivors_name(std::vector<Rank>& ranks, int culprit, std::chrono::milliseconds timeout) {
  const std::string unavailable = std::to_string(static_cast<int>(StatusCode::kUnavailable)) + " ";
  for (int r = 0; r < static_cast<int>(ranks.size()); ++r) {
    if (r == culprit) continue;
    // The deadline, the grace for the notices, and slack for a loaded machine.
    std::string report = read_report(ranks[static_cast<size_t>(r)], timeout * 3 + 5000ms);
    INFO("rank " << r << " reported: " << report);
    CHECK_THAT(report, Catch::StartsWith(unavailable));
    CHECK_THAT(report, Catch::Contains("rank(s) " + std::to_string(culprit) + " "));
  }
}

TEST_CASE("kill -9 of one of 3 ranks during 64 MiB all-reduces: the others get Unavailable naming it",
          "[collectives][fault]") {
  const auto timeout = 3000ms;
  auto ranks = start_ranks(3, timeout);
  std::this_thread::sleep_for(700ms);  // formed and reducing
  kill(ranks[1].pid, SIGKILL);
  check_survivors_name(ranks, 1, timeout);
  reap(ranks);
}

TEST_CASE("SIGSTOP of one of 3 ranks (alive but stuck): the others get Unavailable naming it",
          "[collectives][fault]") {
  const auto timeout = 2000ms;
  auto ranks = start_ranks(3, timeout);
  std::this_thread::sleep_for(700ms);
  kill(ranks[2].pid, SIGSTOP);
  check_survivors_name(ranks, 2, timeout);
  reap(ranks);
}

}  // namespace
}  // namespace capstan
