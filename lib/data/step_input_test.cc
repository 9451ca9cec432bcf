// A step input: the elements held once, the permutation each
// epoch, and the batch of any positions.
#include "data/step_input.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <map>
#include <random>

#include "capstan/data/dataset.h"

namespace capstan::data {
namespace {

std::shared_ptr<const StepInputElements> elements_of(const data::Dataset& dataset, int64_t budget = int64_t{1} << 30) {
  auto it = dataset.make_iterator().value();
  return StepInputElements::read(*it, budget).value();
}

TEST_CASE("each epoch of a step input is a permutation of its elements, drawn from the seed and the epoch",
          "[worker][step_input]") {
  auto p0 = StepInputElements::permutation(1000, 7, 0);
  auto p1 = StepInputElements::permutation(1000, 7, 1);
  auto sorted = p0;
  std::sort(sorted.begin(), sorted.end());
  for (int64_t i = 0; i < 1000; ++i) REQUIRE(sorted[static_cast<size_t>(i)] == i);
  CHECK(p0 != p1);                                             // a fresh order each epoch
  CHECK(p0 == StepInputElements::permutation(1000, 7, 0));     // the same on every worker
  CHECK(p0 != StepInputElements::permutation(1000, 8, 0));     // another seed, another order
  // Fixed values: the order must not change between builds or machines.
  auto small = StepInputElements::permutation(8, 42, 0);
  CHECK(small == StepInputElements::permutation(8, 42, 0));
  std::vector<int64_t> identity{0, 1, 2, 3, 4, 5, 6, 7};
  CHECK(small != identity);
}

TEST_CASE("whatever the steps' splits, every element is read exactly once per epoch", "[worker][step_input]") {
  auto elements = elements_of(data::Dataset::range(97));
  REQUIRE(elements->size() == 97);
  std::mt19937 random(5);
  std::map<int64_t, std::map<int64_t, int>> seen;  // epoch -> element -> times
  int64_t position = 0;
  while (position < 3 * 97) {
    // A step of 1 to 4 replicas, global batch 10 split unevenly.
    const int replicas = 1 + static_cast<int>(random() % 4);
    int64_t start = position;
    for (int r = 0; r < replicas; ++r) {
      const int64_t count = 10 / replicas + (r < 10 % replicas ? 1 : 0);
      training::StepInput share{1, start, count, position, position + 10, 9, true, 1.0};
      Element batch = elements->batch(share).value();
      REQUIRE(batch.components.size() == 1);
      REQUIRE(batch.components[0].shape() == Shape{count});
      auto values = batch.components[0].flat<int64_t>();
      for (int64_t k = 0; k < count; ++k) ++seen[(start + k) / 97][values[static_cast<size_t>(k)]];
      start += count;
    }
    position += 10;
  }
  for (int64_t epoch = 0; epoch < 3; ++epoch) {
    REQUIRE(seen[epoch].size() == 97);
    for (const auto& [element, times] : seen[epoch]) CHECK(times == 1);
  }
}

TEST_CASE("a step input without shuffle reads the dataset's order, epoch after epoch", "[worker][step_input]") {
  auto elements = elements_of(data::Dataset::range(5));
  CHECK(elements->indices(3, 4, 0, /*shuffle=*/false) == std::vector<int64_t>{3, 4, 0, 1});
}

TEST_CASE("a step input refuses an endless or empty dataset, and a range that is not one", "[worker][step_input]") {
  auto endless = data::Dataset::range(10).repeat().make_iterator().value();
  auto refused = StepInputElements::read(*endless, 64 << 10);
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.status().code() == StatusCode::kFailedPrecondition);
  CHECK_THAT(refused.status().message(), Catch::Contains("repeat()") && Catch::Contains("step_input_memory_mib"));
  auto empty = data::Dataset::range(0).make_iterator().value();
  CHECK(StepInputElements::read(*empty, 64 << 10).status().code() == StatusCode::kFailedPrecondition);
  auto elements = elements_of(data::Dataset::range(5));
  training::StepInput none{1, 0, 0, 0, 0, 0, true, 1.0};
  CHECK(elements->batch(none).status().code() == StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace capstan::data
