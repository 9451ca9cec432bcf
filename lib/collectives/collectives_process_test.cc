// Collectives among real processes (forked ranks): one is killed with
// SIGKILL or stopped with SIGSTOP in the middle of 64 MiB all-reduces, and
// the survivors must fail with Unavailable naming it, within the deadline,
// over TCP and over shared memory.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <functional>
#include <string>
#include <thread>

#include "capstan/collectives.h"
#include "capstan/mirrored.h"

namespace capstan {
namespace {

using namespace std::chrono_literals;

struct Rank {
  pid_t pid = -1;
  int report = -1;  // read end: the child's one-line outcome
};

// Forks a process that runs `child` and writes what it returns, one line,
// to the pipe the parent reads (Rank::report), then exits.
Rank fork_rank(const std::function<std::string()>& child) {
  int fds[2];
  REQUIRE(pipe(fds) == 0);
  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    close(fds[0]);
    std::string line = child() + "\n";
    ssize_t ignored = write(fds[1], line.data(), line.size());
    (void)ignored;
    _exit(0);
  }
  close(fds[1]);
  return {pid, fds[0]};
}

// Endpoints (listening before any rank forks) and addresses of a group.
struct Generation {
  explicit Generation(int n) {
    for (int i = 0; i < n; ++i) {
      endpoints.push_back(CollectiveEndpoint::listen().value());
      addresses.push_back(endpoints.back()->address());
    }
  }
  Result<std::unique_ptr<Communicator>> join(
      int rank, int64_t generation, std::chrono::milliseconds timeout = 5000ms,
      CollectiveOptions::Transport transport = CollectiveOptions::Transport::kAuto) {
    CollectiveOptions options;
    options.timeout = timeout;
    options.transport = transport;
    return Communicator::create(std::move(endpoints[static_cast<size_t>(rank)]), addresses, rank, generation, options);
  }
  std::vector<std::unique_ptr<CollectiveEndpoint>> endpoints;
  std::vector<std::string> addresses;
};

// Forks `n` ranks that form a group and all-reduce 64 MiB until one fails;
// each reports "CODE message" of the failure.
std::vector<Rank> start_ranks(int n, std::chrono::milliseconds timeout, CollectiveOptions::Transport transport) {
  Generation group_of(n);
  std::vector<Rank> ranks;
  for (int r = 0; r < n; ++r) {
    ranks.push_back(fork_rank([&, r]() {
      auto group = group_of.join(r, 1, timeout, transport);
      Status status = group.status();
      if (group.ok()) {
        Tensor t = Tensor::zeros(DType::kFloat32, {(64 << 20) / 4}).value();
        while (status.ok()) status = (*group)->all_reduce(t, ReduceOp::kSum).status();
      }
      return std::to_string(static_cast<int>(status.code())) + " " + status.message();
    }));
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

// Starts 3 ranks (collective deadline `timeout`), sends `signal` to rank
// `culprit` once they have formed and are reducing, and checks that the
// others report Unavailable naming it.
void fault_one_of_three(CollectiveOptions::Transport transport, std::chrono::milliseconds timeout, int signal,
                        int culprit) {
  INFO("transport " << collective_transport_name(transport));
  auto ranks = start_ranks(3, timeout, transport);
  std::this_thread::sleep_for(700ms);  // formed and reducing
  kill(ranks[static_cast<size_t>(culprit)].pid, signal);
  const std::string unavailable = std::to_string(static_cast<int>(StatusCode::kUnavailable)) + " ";
  for (int r = 0; r < static_cast<int>(ranks.size()); ++r) {
    if (r == culprit) continue;
    // The deadline, the grace for the notices, and slack for a loaded machine.
    std::string report = read_report(ranks[static_cast<size_t>(r)], timeout * 3 + 5000ms);
    INFO("rank " << r << " reported: " << report);
    CHECK_THAT(report, Catch::StartsWith(unavailable));
    CHECK_THAT(report, Catch::Contains("rank(s) " + std::to_string(culprit) + " "));
  }
  reap(ranks);
}

TEST_CASE("kill -9 of one of 3 ranks during 64 MiB all-reduces: the others get Unavailable naming it",
          "[collectives][fault]") {
  const auto transport = GENERATE(CollectiveOptions::Transport::kTcp, CollectiveOptions::Transport::kSharedMemory);
  fault_one_of_three(transport, 3000ms, SIGKILL, 1);
}

TEST_CASE("SIGSTOP of one of 3 ranks (alive but stuck): the others get Unavailable naming it",
          "[collectives][fault]") {
  const auto transport = GENERATE(CollectiveOptions::Transport::kTcp, CollectiveOptions::Transport::kSharedMemory);
  fault_one_of_three(transport, 2000ms, SIGSTOP, 2);
}

std::vector<MirroredVariableSpec> specs() {
  return {{"w", Tensor::zeros(DType::kFloat32, {64}).value(), Optimizer::adam(0.01)}};
}

// One synchronous step with a gradient that depends on the rank and step.
Status step(MirroredVariables& vars, int rank) {
  std::vector<float> g(64);
  for (size_t i = 0; i < g.size(); ++i) g[i] = static_cast<float>((vars.step() % 7) + rank) * 0.01f * static_cast<float>(i % 5);
  return vars.apply_gradients({Tensor::from_vector<float>(g, {64}).value()});
}

Status train(MirroredVariables& vars, int rank, int steps) {
  for (int s = 0; s < steps; ++s) CAPSTAN_RETURN_IF_ERROR(step(vars, rank));
  return Status::Ok();
}

// "step checksum | what the rank saw", or "ERROR ..." when `status` failed.
std::string outcome(const MirroredVariables* vars, const Status& status, const std::string& seen) {
  std::string line = !status.ok() ? "ERROR " + status.to_string()
                                  : std::to_string(vars->step()) + " " + std::to_string(vars->checksum());
  return line + " | " + seen;
}

TEST_CASE("mirrored training goes on after kill -9 of a rank, and the returning rank gets the variables",
          "[collectives][mirrored][fault]") {
  Generation first(3), survivors(2), rejoined(3);
  std::vector<Rank> ranks;
  for (int r = 0; r < 3; ++r) {
    ranks.push_back(fork_rank([&, r]() {
      auto group = first.join(r, 1);
      if (!group.ok()) return outcome(nullptr, group.status(), "");
      auto vars = MirroredVariables::create(**group, specs());
      if (!vars.ok()) return outcome(nullptr, vars.status(), "");
      // Train until rank 2 is killed under us.
      Status lost;
      for (int s = 0; s < 200000 && lost.ok(); ++s) lost = step(**vars, r);
      // The survivors go on as a group of two (generation 2)...
      auto two = survivors.join(r, 2);
      Status status = two.status();
      if (status.ok()) status = (*vars)->set_group(**two, 0);
      if (status.ok()) status = train(**vars, r, 5);
      // ... and take the returning rank in (generation 3).
      auto three = status.ok() ? rejoined.join(r, 3) : Result<std::unique_ptr<Communicator>>(status);
      status = three.status();
      if (status.ok()) status = (*vars)->set_group(**three, 0);
      if (status.ok()) status = train(**vars, r, 5);
      if (status.ok()) status = (*vars)->verify_replicas();
      return outcome(vars->get(), status, lost.to_string());
    }));
  }
  std::this_thread::sleep_for(800ms);
  kill(ranks[2].pid, SIGKILL);
  waitpid(ranks[2].pid, nullptr, 0);
  close(ranks[2].report);
  // Rank 2 comes back: a new process with nothing but the specs.
  ranks[2] = fork_rank([&]() {
    auto group = rejoined.join(2, 3);
    if (!group.ok()) return outcome(nullptr, group.status(), "");
    auto vars = MirroredVariables::join(**group, specs(), 0);
    Status status = vars.status();
    if (status.ok()) status = train(**vars, 2, 5);
    if (status.ok()) status = (*vars)->verify_replicas();
    return outcome(vars.ok() ? vars->get() : nullptr, status, "");
  });

  std::vector<std::string> reports;
  for (const Rank& r : ranks) reports.push_back(read_report(r, 30000ms));
  for (int r = 0; r < 3; ++r) INFO("rank " << r << ": " << reports[static_cast<size_t>(r)]);
  for (const auto& report : reports) REQUIRE_THAT(report, !Catch::StartsWith("ERROR") && Catch::Contains(" | "));
  // Same step counter and checksum on all three, after 10 steps past the loss.
  auto head = [](const std::string& report) { return report.substr(0, report.find(" | ")); };
  CHECK(head(reports[0]) == head(reports[1]));
  CHECK(head(reports[0]) == head(reports[2]));
  CHECK(std::stoll(head(reports[0])) >= 10);
  // The survivors saw rank 2 named.
  for (int r = 0; r < 2; ++r) CHECK_THAT(reports[static_cast<size_t>(r)], Catch::Contains("rank(s) 2 "));
  reap(ranks);
}

}  // namespace
}  // namespace capstan
