// Collective groups formed through a real coordinator daemon: ranks are
// clients of the coordinator (the multi-client mode: any process may join),
// here threads with their own connections.
#include <catch2/catch.hpp>
#include <functional>
#include <optional>
#include <set>
#include <thread>

#include "capstan/collectives.h"
#include "capstan/training.h"
#include "lib/collectives/test_group.h"
#include "tests/harness/process.h"

namespace capstan::testing {
namespace {

using namespace std::chrono_literals;

struct Coordinated {
  Coordinated() {
    Daemon& ps = cluster.start("ps-server", {"--task-index", "0"});
    coordinator = &cluster.start("coordinator", {"--ps", ps.address()});
  }
  std::unique_ptr<ClusterCoordinator> client() { return ClusterCoordinator::connect(coordinator->address()).value(); }
  TestCluster cluster;
  Daemon* coordinator = nullptr;
};

TEST_CASE("ranks join a group through the coordinator and all-reduce", "[collectives][cluster]") {
  Coordinated c;
  std::vector<std::unique_ptr<ClusterCoordinator>> clients;
  for (int i = 0; i < 3; ++i) clients.push_back(c.client());
  CollectiveOptions options;
  options.timeout = 20s;
  auto groups = on_all<Result<std::unique_ptr<Communicator>>>(3, [&](int i) {
    return clients[static_cast<size_t>(i)]->join_group("dense", 3, -1, "127.0.0.1", options);
  });
  std::set<int> ranks;
  for (auto& g : groups) {
    REQUIRE(g.ok());
    ranks.insert((*g)->rank());
    CHECK((*g)->size() == 3);
    CHECK((*g)->generation() == 1);
  }
  CHECK(ranks == std::set<int>{0, 1, 2});
  auto sums = on_all<Result<Tensor>>(3, [&](int i) {
    Communicator& g = *groups[static_cast<size_t>(i)].value();
    return g.all_reduce(Tensor::from_vector<float>({1.0f * static_cast<float>(g.rank()), 1.0f}, {2}).value(),
                        ReduceOp::kSum);
  });
  for (auto& s : sums) {
    REQUIRE(s.ok());
    CHECK(s->flat<float>()[0] == 3.0f);
    CHECK(s->flat<float>()[1] == 3.0f);
  }
}

TEST_CASE("a rank is lost: the survivors get Unavailable naming it and re-form the next generation",
          "[collectives][cluster][fault]") {
  Coordinated c;
  std::vector<std::unique_ptr<ClusterCoordinator>> clients;
  for (int i = 0; i < 3; ++i) clients.push_back(c.client());
  CollectiveOptions options;
  options.timeout = 3s;
  auto groups = on_all<Result<std::unique_ptr<Communicator>>>(3, [&](int i) {
    return clients[static_cast<size_t>(i)]->join_group("mirrored", 3, i, "127.0.0.1", options);
  });
  for (auto& g : groups) REQUIRE(g.ok());
  // Rank 2 goes away (its process would die the same way: its sockets close).
  groups[2] = Status::Cancelled("gone");
  auto failed = on_all<Status>(2, [&](int i) {
    return groups[static_cast<size_t>(i)].value()->all_reduce(Tensor::scalar<float>(1.0f), ReduceOp::kSum).status();
  });
  for (const Status& s : failed) {
    CHECK(s.code() == StatusCode::kUnavailable);
    CHECK_THAT(s.message(), Catch::Contains("rank(s) 2 "));
  }
  // The survivors form the group again, without restarting anything.
  auto again = on_all<Result<std::unique_ptr<Communicator>>>(2, [&](int i) {
    return clients[static_cast<size_t>(i)]->join_group("mirrored", 2, i, "127.0.0.1", options);
  });
  auto sums = on_all<Result<Tensor>>(2, [&](int i) -> Result<Tensor> {
    CAPSTAN_RETURN_IF_ERROR(again[static_cast<size_t>(i)].status());
    CHECK(again[static_cast<size_t>(i)].value()->generation() == 2);
    return again[static_cast<size_t>(i)].value()->all_reduce(Tensor::scalar<float>(2.0f), ReduceOp::kSum);
  });
  for (auto& s : sums) {
    REQUIRE(s.ok());
    CHECK(s->flat<float>()[0] == 4.0f);
  }
}

TEST_CASE("a group that never completes fails naming the missing ranks", "[collectives][cluster]") {
  Coordinated c;
  auto client = c.client();
  CollectiveOptions options;
  options.timeout = 1s;
  auto lonely = client->join_group("half", 2, 0, "127.0.0.1", options);
  CHECK(lonely.status().code() == StatusCode::kUnavailable);
  CHECK_THAT(lonely.status().message(), Catch::Contains("rank(s) 1 never joined"));
  auto bad = client->join_group("bad", 0, 0, "127.0.0.1", options);
  CHECK(bad.status().code() == StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace capstan::testing
