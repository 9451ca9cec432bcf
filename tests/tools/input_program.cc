// A training program for the integration tests, as a process of its own (so
// a test can kill -9 it and start it again): it creates the per-worker
// dataset `--name` (range(60) sharded by worker), then reads it in rounds of
// 4 closures ("next_element" of the training test module), printing
// "id <value> worker <index>" as each value is fetched, until both workers'
// iterators have ended.
//
//   input_program --coordinator HOST:PORT [--name NAME] [--pause-ms N] [--crash-after N]
//
// --pause-ms: a pause after each round, so that a test can kill it midway.
// --crash-after: once N ids are printed, the next round is scheduled, the
//   coordinator has it (done() answered after the schedules), and the
//   program kills itself (SIGKILL) before fetching it: a crash with exactly
//   one round in flight.
//
// --http-port and --port-file (added by the test harness) are ignored.
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <set>
#include <string>
#include <vector>

#include "capstan/data/dataset.h"
#include "capstan/training.h"

int main(int argc, char** argv) {
  std::string coordinator;
  std::string name = "numbers";
  int pause_ms = 0;
  int crash_after = -1;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string flag = argv[i];
    if (flag == "--coordinator") coordinator = argv[i + 1];
    else if (flag == "--name") name = argv[i + 1];
    else if (flag == "--pause-ms") pause_ms = std::atoi(argv[i + 1]);
    else if (flag == "--crash-after") crash_after = std::atoi(argv[i + 1]);
    else if (flag != "--http-port" && flag != "--port-file") {
      std::fprintf(stderr,
                   "usage: input_program --coordinator HOST:PORT [--name NAME] [--pause-ms N] [--crash-after N]\n");
      return 2;
    }
  }
  auto client = capstan::ClusterCoordinator::connect(coordinator);
  if (!client.ok()) {
    std::fprintf(stderr, "connect: %s\n", client.status().to_string().c_str());
    return 1;
  }
  auto numbers = capstan::data::Dataset::range(60).shard(capstan::data::kShardHint, capstan::data::kShardHint);
  auto dataset = (*client)->create_per_worker_dataset(numbers, name);
  if (!dataset.ok()) {
    std::fprintf(stderr, "create_per_worker_dataset: %s\n", dataset.status().to_string().c_str());
    return 1;
  }
  std::printf("dataset %lld\n", static_cast<long long>(dataset->id));
  std::fflush(stdout);
  std::set<int64_t> ended;  // workers whose iterator ended
  int printed = 0;
  while (ended.size() < 2) {
    // Rounds of 4 closures, so that both workers get some (one at a time
    // would all go to the worker whose lane is free first).
    std::vector<capstan::RemoteValue> round;
    for (int i = 0; i < 4; ++i) {
      auto value = (*client)->schedule("next_element", capstan::Element{{dataset->arg()}, {}});
      if (!value.ok()) {
        std::fprintf(stderr, "schedule: %s\n", value.status().to_string().c_str());
        return 1;
      }
      round.push_back(*value);
    }
    if (crash_after >= 0 && printed >= crash_after) {
      // done() is answered after the schedules before it: the round is the
      // coordinator's now.
      auto done = (*client)->done();
      if (!done.ok()) {
        std::fprintf(stderr, "done: %s\n", done.status().to_string().c_str());
        return 1;
      }
      std::printf("crashing with %zu closure(s) in flight\n", round.size());
      std::fflush(stdout);
      ::raise(SIGKILL);
    }
    for (const auto& value : round) {
      auto element = (*client)->fetch(value);
      if (!element.ok()) {
        std::fprintf(stderr, "fetch: %s\n", element.status().to_string().c_str());
        return 1;
      }
      int64_t id = element->components[0].flat<int64_t>()[0];
      int64_t worker = element->components[1].flat<int64_t>()[0];
      if (id < 0) {
        ended.insert(worker);
        continue;
      }
      std::printf("id %lld worker %lld\n", static_cast<long long>(id), static_cast<long long>(worker));
      std::fflush(stdout);
      ++printed;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(pause_ms));
  }
  return 0;
}
