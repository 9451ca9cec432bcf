// Checkpoints of synchronous training on real daemons (issue 34 item 4): the
// worker-server that is rank 0 writes its strategy's file itself, with
// Adam's slots and the step, and a restarted cluster's first group reads it
// back itself, so the next step is the one the first cluster would have
// taken, bit for bit. Its own executable: it needs only the coordinator,
// the worker-server and the training module.
#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>

#include "capstan/strategy.h"
#include "capstan/training.h"
#include "checkpoint/checkpoint.h"
#include "tests/harness/process.h"
#include "tests/build_path.h"

namespace capstan::testing {
namespace {

using namespace std::chrono_literals;

struct Replicated {
  explicit Replicated(int num_workers) {
    coordinator = &cluster.start("coordinator", {});
    for (int i = 0; i < num_workers; ++i) {
      cluster.start("worker-server", {"--coordinator", coordinator->address(), "--module", capstan::testing::build_path(CAPSTAN_TRAINING_MODULE),
                                      "--task-index", std::to_string(i)});
    }
    client = ClusterCoordinator::connect(coordinator->address()).value();
    REQUIRE(wait_until([this, num_workers]() { return client->num_workers() == num_workers; }, 15s));
  }
  TestCluster cluster;
  Daemon* coordinator = nullptr;
  std::unique_ptr<ClusterCoordinator> client;
};

std::unique_ptr<MirroredStrategy> create(ClusterCoordinator& client) {
  std::vector<MirroredVariableSpec> model = {
      {"w", Tensor::from_vector<float>({0.5f, -1.0f}, {2}).value(), Optimizer::adam(0.1)},
      {"b", Tensor::zeros(DType::kFloat32, {1}).value(), Optimizer::adam(0.1)}};
  StrategyOptions o;
  o.name = "dense";
  o.min_replicas = 2;
  o.collective.timeout = 20s;
  return MirroredStrategy::create(client, model, o).value();
}

Element step_args(int64_t step) { return Element{{Tensor::scalar<int64_t>(step), Tensor::scalar<int64_t>(16)}, {}}; }

TEST_CASE("sync training saves with the worker writing its Adam slots and step, and restores them exactly",
          "[strategy][checkpoint]") {
  TestCluster scratch;
  const std::string dir = scratch.dir() + "/ckpt";
  std::string path;
  Tensor w_saved, w_next, b_next;
  {
    Replicated r(2);
    auto strategy = create(*r.client);
    for (int s = 0; s < 3; ++s) REQUIRE(strategy->run("linear_step", step_args(s)).ok());
    w_saved = strategy->read_variable("w").value();
    path = strategy->save_checkpoint(dir, 3).value();
    // The step the restored cluster must repeat exactly.
    REQUIRE(strategy->run("linear_step", step_args(3)).ok());
    w_next = strategy->read_variable("w").value();
    b_next = strategy->read_variable("b").value();
  }
  // The worker's file, named for the strategy; no coordinator-written one.
  CHECK(std::filesystem::exists(path + "/mirrored-dense.safetensors"));
  CHECK_FALSE(std::filesystem::exists(path + "/mirrored.safetensors"));
  auto reader = checkpoint::CheckpointReader::open(path).value();  // every CRC32C checked
  const auto* w = reader->manifest().find_variable("w");
  REQUIRE(w != nullptr);
  CHECK(w->shards.at(0).file == "mirrored-dense.safetensors");
  CHECK(w->slots == std::vector<std::string>{"m", "v"});
  CHECK(w->optimizer_step == 3);
  CHECK(reader->read_variable("w").value().equals(w_saved));
  CHECK(reader->read_slot("w", "m").value().flat<float>()[0] != 0.0f);  // trained, not fresh

  {
    Replicated r(2);  // a restarted cluster: fresh coordinator and workers
    auto strategy = create(*r.client);
    CHECK(strategy->restore_checkpoint(path).value() == 3);
    CHECK(strategy->read_variable("w").value().equals(w_saved));
    auto next = strategy->run("linear_step", step_args(3));
    REQUIRE(next.ok());
    for (const auto& v : next->values) CHECK(v.components[3].flat<int64_t>()[0] == 3);  // Adam's step
    REQUIRE(strategy->verify_replicas().ok());
    // Same values, slots and step in: the same update out, bit for bit.
    CHECK(strategy->read_variable("w").value().equals(w_next));
    CHECK(strategy->read_variable("b").value().equals(b_next));
  }
}

}  // namespace
}  // namespace capstan::testing
