// Collective groups formed through a real coordinator daemon: ranks are
// clients of the coordinator (the multi-client mode: any process may join),
// here threads with their own connections.
#include <catch2/catch.hpp>
#include <functional>
#include <optional>
#include <set>
#include <thread>

#include "capstan/collectives.h"
#include "capstan/mirrored.h"
#include "capstan/training.h"
#include "lib/collectives/test_group.h"
#include "lib/data/test_util.h"
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
  // `n` clients, one a rank.
  std::vector<std::unique_ptr<ClusterCoordinator>> clients(int n) {
    std::vector<std::unique_ptr<ClusterCoordinator>> out;
    for (int i = 0; i < n; ++i) out.push_back(client());
    return out;
  }
  TestCluster cluster;
  Daemon* coordinator = nullptr;
};

TEST_CASE("ranks join a group through the coordinator and all-reduce", "[collectives][cluster]") {
  Coordinated c;
  auto clients = c.clients(3);
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
    CHECK((*g)->addresses().size() == 3);
    CHECK_THAT((*g)->addresses()[static_cast<size_t>((*g)->rank())], Catch::StartsWith("127.0.0.1:"));
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
  auto clients = c.clients(3);
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
  // (Catch's assertions are not thread-safe: checked here, not in the threads.)
  for (auto& g : again) {
    REQUIRE(g.ok());
    CHECK(g.value()->generation() == 2);
  }
  auto sums = on_all<Result<Tensor>>(2, [&](int i) -> Result<Tensor> {
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

TEST_CASE("a parameter-server checkpoint restores into mirrored training, and back", "[collectives][cluster][checkpoint]") {
  Coordinated c;
  auto ps_client = c.client();
  data::testing::TempDir dir;
  // Parameter-server training wrote "w" and saved it.
  Tensor trained = Tensor::from_vector<float>({1.5f, -2.0f, 0.25f, 8.0f}, {2, 2}).value();
  REQUIRE(ps_client->create_variable({"w", trained, Optimizer::adam(0.1)}).ok());
  REQUIRE(ps_client->assign_variable("w", trained).ok());
  REQUIRE(ps_client->save_checkpoint(dir.file("ps"), 10).ok());

  auto clients = c.clients(2);
  auto restored = on_all<Result<std::pair<Tensor, int64_t>>>(2, [&](int r) -> Result<std::pair<Tensor, int64_t>> {
    ClusterCoordinator& client = *clients[static_cast<size_t>(r)];
    CAPSTAN_ASSIGN_OR_RETURN(auto group, client.join_group("ckpt", 2, r));
    CAPSTAN_ASSIGN_OR_RETURN(auto vars, MirroredVariables::create(
                                            *group, {{"w", Tensor::zeros(DType::kFloat32, {2, 2}).value(), Optimizer::sgd(0.5)}}));
    CAPSTAN_ASSIGN_OR_RETURN(int64_t step, vars->restore_checkpoint(client, dir.file("ps")));
    CAPSTAN_ASSIGN_OR_RETURN(Tensor w, vars->value("w"));
    Tensor before = Tensor::from_vector<float>(std::vector<float>(w.flat<float>().begin(), w.flat<float>().end()), {2, 2}).value();
    // One synchronous step (gradient 1 everywhere, SGD 0.5), then save.
    CAPSTAN_RETURN_IF_ERROR(vars->apply_gradients({Tensor::from_vector<float>({1, 1, 1, 1}, {2, 2}).value()}));
    CAPSTAN_RETURN_IF_ERROR(vars->save_checkpoint(client, dir.file("mirrored"), vars->step()).status());
    return std::make_pair(before, step);
  });
  for (auto& r : restored) {
    REQUIRE(r.ok());
    CHECK(r->first.equals(trained));
    CHECK(r->second == 10);
  }
  // Back on the parameter servers: the mirrored model's values.
  REQUIRE(ps_client->restore_checkpoint(dir.file("mirrored")).value() == 11);
  auto w = ps_client->read_variable("w").value();
  CHECK(w.equals(Tensor::from_vector<float>({1.0f, -2.5f, -0.25f, 7.5f}, {2, 2}).value()));
}

}  // namespace
}  // namespace capstan::testing
