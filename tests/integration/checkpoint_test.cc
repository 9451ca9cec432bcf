// Checkpoints written by the parameter servers themselves (issue 34), with
// real processes: a save that a kill -9 interrupts anywhere leaves no
// checkpoint that restores to a mixed state, and the previous one restores.
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <functional>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "capstan/training.h"
#include "tests/harness/process.h"
#include "tests/integration/training_cluster.h"

namespace capstan::testing {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

float counter(ClusterCoordinator& client) { return client.read_variable("counter").value().flat<float>()[0]; }

// The checkpoint directories in `dir` (committed ones and .tmp ones), sorted.
std::vector<std::string> entries(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

// A cluster whose "w" (2 x 32 MiB, one shard on each parameter server) and
// "counter" were saved as ckpt-1 with counter 3; then counter went on to 7.
struct Saved {
  Training t{2, 1};
  std::string dir = t.cluster.dir() + "/ckpts";
  Tensor w;
  Saved() {
    w = *random_normal_initializer(DType::kFloat32, {2 * 1024, 8 * 1024}, 0, 1, 11);
    REQUIRE(t.client->create_variable({"w", w, Optimizer::adam(0.01), Partitioner::fixed_shards(2)}).ok());
    REQUIRE(t.client->create_variable({"counter", Tensor::scalar<float>(0), Optimizer::sgd(0.1)}).ok());
    for (int i = 0; i < 3; ++i) REQUIRE(t.client->schedule("add_one").ok());
    REQUIRE(t.client->join().ok());
    REQUIRE(t.client->save_checkpoint(dir, 1, 5).ok());
    for (int i = 0; i < 4; ++i) REQUIRE(t.client->schedule("add_one").ok());
    REQUIRE(t.client->join().ok());
    REQUIRE(counter(*t.client) == 7.0f);
  }
  // Starts saving ckpt-2 on a thread and calls `kill` once its .tmp
  // directory exists (the parameter servers are then snapshotting or
  // writing); the save's result.
  Status save_and_kill(const std::function<void()>& kill) {
    Status result;
    std::atomic<bool> done{false};
    std::thread saving([&]() {
      result = t.client->save_checkpoint(dir, 2, 5).status();
      done = true;
    });
    bool seen = wait_until([&]() { return done.load() || fs::exists(dir + "/ckpt-2.tmp"); }, 20s);
    kill();
    saving.join();
    CHECK(seen);
    return result;
  }
};

TEST_CASE("kill -9 a parameter server mid-save: no ckpt-2 appears, and ckpt-1 restores whole",
          "[checkpoint][fault]") {
  Saved s;
  Status saved = s.save_and_kill([&]() { s.t.ps[1]->kill_now(); });
  if (saved.ok()) {
    // The kill came after the commit: then ckpt-2 is whole (counter 7).
    WARN("the save finished before the kill: checking that ckpt-2 is complete instead");
  }
  // A new ps:1, empty; the coordinator restores its shards from the latest
  // committed checkpoint by itself.
  uint16_t port = s.t.ps[1]->rpc_port();
  s.t.ps[1] = &s.t.cluster.restart_on_port("ps-server", {"--task-index", "1", "--port", std::to_string(port)});
  auto names = entries(s.dir);
  CHECK(std::count(names.begin(), names.end(), "ckpt-2") == (saved.ok() ? 1 : 0));
  CHECK(std::count(names.begin(), names.end(), "ckpt-1") == 1);
  // join waits while the coordinator restores ps:1's shards from the latest.
  REQUIRE(s.t.client->join().ok());
  // Restored by hand, the whole of the latest: the values it was saved with.
  auto step = s.t.client->restore_checkpoint(s.dir);
  INFO(step.status().to_string());
  REQUIRE(step.ok());
  CHECK(*step == (saved.ok() ? 2 : 1));
  CHECK(counter(*s.t.client) == (saved.ok() ? 7.0f : 3.0f));
  CHECK(s.t.client->read_variable("w").value().equals(s.w));
  // The next save cleans the crashed one up.
  REQUIRE(s.t.client->save_checkpoint(s.dir, 3, 5).ok());
  for (const auto& name : entries(s.dir)) CHECK_FALSE(name.ends_with(".tmp"));
}

TEST_CASE("kill -9 the coordinator mid-save: no ckpt-2 appears, and ckpt-1 still opens whole",
          "[checkpoint][fault]") {
  Saved s;
  Status saved = s.save_and_kill([&]() { s.t.coordinator->kill_now(); });
  CHECK_FALSE(saved.ok());
  // The parameter servers finish their files into the .tmp directory; no
  // manifest commits them.
  std::this_thread::sleep_for(500ms);
  auto names = entries(s.dir);
  CHECK(std::count(names.begin(), names.end(), "ckpt-2") == 0);
  auto inspect = s.t.cluster.run("capstanctl", {"checkpoint", "inspect", s.dir});
  CHECK(inspect.exit_code == 0);
  CHECK_THAT(inspect.output, Catch::Contains("ckpt-1"));
  CHECK_THAT(inspect.output, !Catch::Contains("ckpt-2"));
}

}  // namespace
}  // namespace capstan::testing
