// A worker's replicas without any RPC: several Replicas (as several
// workers would hold) in one process, formed into groups on loopback as the
// coordinator would drive them.
#include "daemons/worker_server/replicas.h"

#include <catch2/catch.hpp>
#include <chrono>
#include <functional>
#include <optional>
#include <thread>

#include "collectives/test_group.h"

namespace capstan::worker_server {
namespace {

using capstan::testing::on_all;

std::vector<training::MirroredSpec> specs() {
  return {{"w", DType::kFloat32, {2}, Optimizer::adam(0.1)}};
}

training::MirroredState seed_state() {
  training::MirroredState state;
  state.step = 3;
  state.variables.push_back({"w", Tensor::from_vector<float>({1, 2}, {2}).value(), {}});
  return state;
}

// Prepares every member for `epoch`, then forms them at once.
std::vector<Result<training::ReplicaReport>> form(std::vector<Replicas*> members, int64_t epoch, int source,
                                                  std::optional<training::MirroredState> seed) {
  std::vector<std::string> addresses;
  for (Replicas* r : members) addresses.push_back(r->prepare("s", epoch).value());
  const int n = static_cast<int>(members.size());
  return on_all<Result<training::ReplicaReport>>(n, [&](int rank) {
    training::ReplicaForm f;
    f.strategy = "s";
    f.epoch = epoch;
    f.rank = rank;
    f.addresses = addresses;
    f.source = source;
    f.specs = specs();
    if (rank == source) f.seed = seed;
    f.settings.timeout = std::chrono::milliseconds(10000);
    return members[static_cast<size_t>(rank)]->form(f);
  });
}

Status step(Replicas& r, int64_t epoch, float gradient) {
  CAPSTAN_ASSIGN_OR_RETURN(auto lease, r.acquire("s", epoch));
  return lease.variables().apply_gradients({Tensor::from_vector<float>({gradient, -gradient}, {2}).value()});
}

TEST_CASE("replicas form from a seed, step together, and a new member takes the survivors' state",
          "[replicas]") {
  Replicas a("127.0.0.1"), b("127.0.0.1"), c("127.0.0.1");
  CHECK_FALSE(a.status("s").holds);
  auto formed = form({&a, &b}, 1, 0, seed_state());
  for (auto& r : formed) REQUIRE(r.ok());
  CHECK(formed[0]->checksum == formed[1]->checksum);
  CHECK(formed[1]->step == 3);
  CHECK(formed[0]->transports == std::vector<std::string>{"self", "shm"});
  auto read = b.read("s").value();
  CHECK(read.step == 3);
  CHECK(read.variables.at(0).value.equals(Tensor::from_vector<float>({1, 2}, {2}).value()));
  CHECK(read.variables.at(0).slots.count("m") == 1);  // Adam's slots, fresh

  // Two steps, each replica with its own gradient: the mean is applied.
  for (int i = 0; i < 2; ++i) {
    auto stepped = on_all<Status>(2, [&](int rank) { return step(rank == 0 ? a : b, 1, rank == 0 ? 1.0f : 3.0f); });
    for (const auto& s : stepped) REQUIRE(s.ok());
  }
  CHECK(a.status("s").checksum == b.status("s").checksum);
  CHECK(a.status("s").step == 5);
  // A step for another epoch is refused.
  CHECK(a.acquire("s", 7).status().code() == StatusCode::kFailedPrecondition);

  // c joins (holding nothing) with b as the source; a keeps its values.
  auto three = form({&a, &b, &c}, 2, 1, std::nullopt);
  for (auto& r : three) REQUIRE(r.ok());
  CHECK(c.status("s").holds);
  CHECK(c.status("s").checksum == a.status("s").checksum);
  CHECK(c.status("s").step == 5);
  auto stepped = on_all<Status>(3, [&](int rank) {
    Replicas* members[] = {&a, &b, &c};
    return step(*members[rank], 2, 0.5f);
  });
  for (const auto& s : stepped) REQUIRE(s.ok());
  CHECK(c.status("s").checksum == b.status("s").checksum);
}

TEST_CASE("abort() of the epoch fails a step waiting for a missing member at once", "[replicas]") {
  Replicas a("127.0.0.1"), b("127.0.0.1");
  for (auto& r : form({&a, &b}, 1, 0, seed_state())) REQUIRE(r.ok());
  auto started = std::chrono::steady_clock::now();
  std::thread supervisor([&]() {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    a.abort("s", 2, Status::Unavailable("not this epoch"));  // another epoch: ignored
    a.abort("s", 1, Status::Unavailable("worker of replica 1 was lost"));
  });
  Status lonely = step(a, 1, 1.0f);  // b never steps
  supervisor.join();
  CHECK_FALSE(lonely.ok());
  CHECK_THAT(lonely.message(), Catch::Contains("was lost"));
  CHECK(std::chrono::steady_clock::now() - started < std::chrono::seconds(5));
}

TEST_CASE("forming refuses a source that holds nothing, an unprepared epoch and bad arguments", "[replicas]") {
  Replicas a("127.0.0.1"), b("127.0.0.1");
  auto empty = form({&a, &b}, 1, 0, std::nullopt);
  for (auto& r : empty) {
    CHECK(r.status().code() == StatusCode::kFailedPrecondition);
    CHECK_THAT(r.status().message(), Catch::Contains("holds no replica"));
  }
  CHECK_FALSE(a.status("s").holds);
  training::ReplicaForm f;
  f.strategy = "s";
  f.epoch = 9;
  f.addresses = {"127.0.0.1:1"};
  f.specs = specs();
  CHECK(a.form(f).status().code() == StatusCode::kFailedPrecondition);  // not prepared for epoch 9
  f.rank = 3;
  CHECK(a.form(f).status().code() == StatusCode::kInvalidArgument);
  CHECK(a.prepare("", 1).status().code() == StatusCode::kInvalidArgument);
  CHECK(a.read("nothing").status().code() == StatusCode::kNotFound);
  CHECK(a.acquire("nothing", 1).status().code() == StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace capstan::worker_server
