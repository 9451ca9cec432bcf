// The coordinator's memory over a long run: a program that schedules
// closures and drops their RemoteValues (a training loop that never
// fetches) must not grow the coordinator, which keeps only what is in
// flight and what the program still holds (issue 37). Labelled stress:
// scripts/test.sh runs it, the sanitizer builds leave it out.
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "capstan/training.h"
#include "tests/integration/training_cluster.h"

namespace capstan::testing {
namespace {

// The resident memory of `pid` in KiB (/proc/<pid>/status VmRSS); 0 when
// it is gone.
int64_t rss_kib(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6));
  }
  return 0;
}

TEST_CASE("the SDK releases dropped RemoteValues and those fetched once: a second fetch_once says released",
          "[training][release]") {
  Training t(/*num_ps=*/1, /*num_workers=*/1);
  RemoteValue kept = t.client->schedule("noop").value();
  RemoteValue once = t.client->schedule("noop").value();
  RemoteValue copy = once;  // copies share the value
  for (int i = 0; i < 10; ++i) REQUIRE(t.client->schedule("noop").ok());  // dropped at once
  REQUIRE(t.client->join().ok());
  REQUIRE(t.client->fetch_once(once).ok());
  Status again = t.client->fetch_once(copy).status();
  CHECK(again.code() == StatusCode::kNotFound);
  CHECK_THAT(again.message(), Catch::Contains("closure " + std::to_string(once.id)) && Catch::Contains("released"));
  // The releases go within a second when no schedule carries them.
  CHECK(wait_until([&]() { return metric(*t.coordinator, "capstan_coordinator_results_kept") == 1; },
                   std::chrono::seconds(10)));
  CHECK(metric(*t.coordinator, "capstan_coordinator_closures_released_total") == 11);
  CHECK(t.client->fetch(kept).ok());
  CHECK(t.client->fetch(kept).ok());
}

TEST_CASE("coordinator memory stays flat over a million closures whose values the program drops",
          "[training][release][stress]") {
  constexpr int kClosures = 1'000'000;
  constexpr int kSamples = 20;
  constexpr int64_t kMaxGrowthKib = 64 * 1024;
  Training t(/*num_ps=*/1, /*num_workers=*/2);
  const pid_t coordinator = t.coordinator->pid();
  // One value the program keeps all along: still fetched at the end.
  RemoteValue kept = t.client->schedule("noop").value();
  // Warm up (allocator pools, connections), then the baseline.
  for (int i = 0; i < 20'000; ++i) REQUIRE(t.client->schedule("noop").ok());
  REQUIRE(t.client->join().ok());
  const int64_t baseline = rss_kib(coordinator);
  REQUIRE(baseline > 0);
  std::vector<int64_t> samples, values_kept;
  for (int sample = 0; sample < kSamples; ++sample) {
    for (int i = 0; i < kClosures / kSamples; ++i) {
      auto value = t.client->schedule("noop");  // dropped at once
      REQUIRE(value.ok());
    }
    REQUIRE(t.client->join().ok());
    samples.push_back(rss_kib(coordinator));
    values_kept.push_back(metric(*t.coordinator, "capstan_coordinator_results_kept"));
  }
  std::string trace;
  for (size_t i = 0; i < samples.size(); ++i) trace += std::to_string(samples[i] / 1024) + " (" + std::to_string(values_kept[i]) + " kept) ";
  const std::string figures = "coordinator RSS " + std::to_string(baseline / 1024) + " MB after the warm-up; every " +
                              std::to_string(kClosures / kSamples) + " closures (MB): " + trace;
  std::printf("%s\n", figures.c_str());  // in the test's log whether it passes or not
  INFO(figures);
  const int64_t peak = *std::max_element(samples.begin(), samples.end());
  CHECK(peak - baseline < kMaxGrowthKib);
  // Released, not merely compact: at most the values of a release call
  // still on its way when join() returned, and `kept`.
  CHECK(values_kept.back() < kClosures / kSamples);
  // Flat, not merely under the bound: the second half grows no further
  // than the allocator's slack.
  CHECK(samples.back() - samples[kSamples / 2] < 16 * 1024);
  CHECK(t.client->fetch(kept).ok());
}

}  // namespace
}  // namespace capstan::testing
