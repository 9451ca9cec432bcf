// The cluster most training tests start: parameter servers, a coordinator
// and workers running a module, with a connected client (real processes on
// loopback).
#ifndef CAPSTAN_TESTS_INTEGRATION_TRAINING_CLUSTER_H_
#define CAPSTAN_TESTS_INTEGRATION_TRAINING_CLUSTER_H_

#include <catch2/catch.hpp>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "capstan/training.h"
#include "tests/harness/process.h"
#include "tests/build_path.h"

namespace capstan::testing {

struct Training {
  // `indexed`: workers start with --task-index; else the coordinator
  // assigns their indices.
  explicit Training(int num_ps = 2, int num_workers = 2, std::vector<std::string> coordinator_flags = {},
                    bool indexed = true, std::string module = capstan::testing::build_path(CAPSTAN_TRAINING_MODULE))
      : module(std::move(module)) {
    std::string ps_list;
    for (int i = 0; i < num_ps; ++i) {
      ps.push_back(&cluster.start("ps-server", {"--task-index", std::to_string(i)}));
      ps_list += (i > 0 ? "," : "") + ps.back()->address();
    }
    std::vector<std::string> flags = {"--ps", ps_list};
    flags.insert(flags.end(), coordinator_flags.begin(), coordinator_flags.end());
    coordinator = &cluster.start("coordinator", flags);
    for (int i = 0; i < num_workers; ++i) add_worker(indexed ? i : -1);
    client = ClusterCoordinator::connect(coordinator->address()).value();
    REQUIRE(wait_until([this, num_workers]() { return client->num_workers() == num_workers; }, std::chrono::seconds(15)));
  }
  // index -1: no --task-index.
  Daemon& add_worker(int index) {
    std::vector<std::string> flags = {"--coordinator", coordinator->address(), "--module", module};
    if (index >= 0) flags.insert(flags.end(), {"--task-index", std::to_string(index)});
    workers.push_back(&cluster.start("worker-server", flags));
    return *workers.back();
  }

  std::string module;
  TestCluster cluster;
  std::vector<Daemon*> ps;
  Daemon* coordinator = nullptr;
  std::vector<Daemon*> workers;
  std::unique_ptr<ClusterCoordinator> client;
};

// kill -9 the PS task `task` of `t` and start it again on its port, empty.
inline void restart_ps(Training& t, int task) {
  uint16_t port = t.ps[static_cast<size_t>(task)]->rpc_port();
  t.ps[static_cast<size_t>(task)]->kill_now();
  t.ps[static_cast<size_t>(task)] = &t.cluster.restart_on_port(
      "ps-server", {"--task-index", std::to_string(task), "--port", std::to_string(port)});
}

// Runs the CTR example against `t` (`args` after --coordinator) and, once the
// coordinator's checkpoint policy has saved twice (mid-training), kill -9s
// parameter server 1 and starts it again empty; the program's result.
inline RunResult run_ctr_with_a_ps_restart(Training& t, const std::vector<std::string>& args) {
  RunResult ctr;
  std::vector<std::string> all = {"--coordinator", t.coordinator->address()};
  all.insert(all.end(), args.begin(), args.end());
  std::thread program([&]() { ctr = t.cluster.run("ctr", all, {}, std::chrono::seconds(300)); });
  bool saved = wait_until([&]() {
    std::string log = t.coordinator->log();
    size_t first = log.find("saved checkpoint");
    return first != std::string::npos && log.find("saved checkpoint", first + 1) != std::string::npos;
  }, std::chrono::seconds(200));
  if (saved) restart_ps(t, 1);
  program.join();
  REQUIRE(saved);
  return ctr;
}

}  // namespace capstan::testing

#endif  // CAPSTAN_TESTS_INTEGRATION_TRAINING_CLUSTER_H_
