#include "placement/placement.h"

#include <catch2/catch.hpp>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

namespace capstan::placement {
namespace {

std::vector<ShardPlacement> place_ok(Placer& placer, const std::string& name, const Shape& shape,
                                     const Partitioner& partitioner,
                                     DType dtype = DType::kFloat32) {
  auto result = placer.place(name, shape, dtype, partitioner);
  INFO(result.status().to_string());
  REQUIRE(result.ok());
  return *result;
}

std::vector<int> tasks_of(const std::vector<ShardPlacement>& shards) {
  std::vector<int> tasks;
  for (const auto& s : shards) tasks.push_back(s.ps_task);
  return tasks;
}

std::vector<std::string> names_of(const std::vector<ShardPlacement>& shards) {
  std::vector<std::string> names;
  for (const auto& s : shards) names.push_back(s.name);
  return names;
}

TEST_CASE("shards of all variables go round robin over the PS tasks in creation order") {
  Placer placer(2);
  auto a = place_ok(placer, "a", {9, 4}, Partitioner::fixed_shards(3));
  CHECK(tasks_of(a) == std::vector<int>{0, 1, 0});
  auto b = place_ok(placer, "b", {9, 4}, Partitioner::none());
  CHECK(tasks_of(b) == std::vector<int>{1});
  auto c = place_ok(placer, "c", {4}, Partitioner::fixed_shards(2));
  CHECK(tasks_of(c) == std::vector<int>{0, 1});
  CHECK(placer.counter() == 6);
}

TEST_CASE("round robin wraps across variable boundaries") {
  Placer placer(3);
  CHECK(tasks_of(place_ok(placer, "a", {8, 2}, Partitioner::fixed_shards(2))) ==
        std::vector<int>{0, 1});
  CHECK(tasks_of(place_ok(placer, "b", {8, 2}, Partitioner::fixed_shards(2))) ==
        std::vector<int>{2, 0});
  CHECK(tasks_of(place_ok(placer, "c", {}, Partitioner::fixed_shards(2))) == std::vector<int>{1});
}

TEST_CASE("one PS holds every shard") {
  Placer placer(1);
  CHECK(tasks_of(place_ok(placer, "a", {8, 2}, Partitioner::fixed_shards(4))) ==
        std::vector<int>{0, 0, 0, 0});
  CHECK(placer.counter() == 4);
}

TEST_CASE("partitioned shards are named name/part_i") {
  Placer placer(4);
  auto shards = place_ok(placer, "dense/kernel", {12, 3}, Partitioner::fixed_shards(3));
  CHECK(names_of(shards) ==
        std::vector<std::string>{"dense/kernel/part_0", "dense/kernel/part_1",
                                 "dense/kernel/part_2"});
}

TEST_CASE("shards split the rows by the div strategy with offsets and shard shapes") {
  Placer placer(2);
  auto shards = place_ok(placer, "emb", {13, 4}, Partitioner::fixed_shards(5));
  REQUIRE(shards.size() == 5);
  const std::vector<int64_t> rows{3, 3, 3, 2, 2};
  const std::vector<int64_t> first{0, 3, 6, 9, 11};
  for (size_t i = 0; i < shards.size(); ++i) {
    CHECK(shards[i].rows == rows[i]);
    CHECK(shards[i].first_row == first[i]);
    CHECK(shards[i].shape == Shape{rows[i], 4});
  }
}

TEST_CASE("shards keep the trailing dimensions of the variable") {
  Placer placer(2);
  auto shards = place_ok(placer, "t", {5, 2, 3}, Partitioner::fixed_shards(2));
  REQUIRE(shards.size() == 2);
  CHECK(shards[0].shape == Shape{3, 2, 3});
  CHECK(shards[1].shape == Shape{2, 2, 3});
}

TEST_CASE("a variable partitioned into exactly one shard keeps its plain name") {
  // TF only renames to name/part_i when there is more than one partition.
  Placer placer(2);
  auto fixed_one = place_ok(placer, "w", {10, 4}, Partitioner::fixed_shards(1));
  REQUIRE(fixed_one.size() == 1);
  CHECK(fixed_one[0].name == "w");
  auto min_size = place_ok(placer, "v", {10, 4}, Partitioner::min_size());
  REQUIRE(min_size.size() == 1);
  CHECK(min_size[0].name == "v");
  CHECK(min_size[0].ps_task == 1);
}

TEST_CASE("the shard count is capped by the number of rows") {
  Placer placer(4);
  auto shards = place_ok(placer, "small", {3, 2}, Partitioner::fixed_shards(8));
  CHECK(shards.size() == 3);
  auto one_row = place_ok(placer, "row", {1, 100}, Partitioner::fixed_shards(8));
  REQUIRE(one_row.size() == 1);
  CHECK(one_row[0].name == "row");
  CHECK(placer.counter() == 4);
}

TEST_CASE("a scalar variable is placed as one unpartitioned shard") {
  Placer placer(2);
  auto shards = place_ok(placer, "step", {}, Partitioner::fixed_shards(4), DType::kInt64);
  REQUIRE(shards.size() == 1);
  CHECK(shards[0].name == "step");
  CHECK(shards[0].shape.empty());
  CHECK(shards[0].first_row == 0);
  CHECK(shards[0].rows == 1);
  CHECK(placer.counter() == 1);
}

TEST_CASE("an unpartitioned variable is one shard with the full shape") {
  Placer placer(2);
  auto shards = place_ok(placer, "bias", {7, 3}, Partitioner::none());
  REQUIRE(shards.size() == 1);
  CHECK(shards[0].name == "bias");
  CHECK(shards[0].ps_task == 0);
  CHECK(shards[0].first_row == 0);
  CHECK(shards[0].rows == 7);
  CHECK(shards[0].shape == Shape{7, 3});
}

TEST_CASE("an empty variable under MinSizePartitioner is one shard of zero rows") {
  Placer placer(2);
  auto shards = place_ok(placer, "empty", {0, 4}, Partitioner::min_size(4, 10));
  REQUIRE(shards.size() == 1);
  CHECK(shards[0].rows == 0);
  CHECK(shards[0].shape == Shape{0, 4});
}

TEST_CASE("set_counter continues the round robin of a restarted coordinator") {
  Placer placer(3);
  placer.set_counter(4);
  CHECK(placer.counter() == 4);
  CHECK(tasks_of(place_ok(placer, "a", {6, 1}, Partitioner::fixed_shards(3))) ==
        std::vector<int>{1, 2, 0});
  CHECK(placer.counter() == 7);
}

// Placing float32 "w" of `shape` with `partitioner` on 2 tasks is
// InvalidArgument, its message holding each of `parts`, and leaves the
// placer's counter.
void check_refused(const Partitioner& partitioner, const Shape& shape,
                   std::initializer_list<std::string> parts) {
  Placer placer(2);
  auto result = placer.place("w", shape, DType::kFloat32, partitioner);
  REQUIRE_FALSE(result.ok());
  CHECK(result.status().code() == StatusCode::kInvalidArgument);
  for (const std::string& part : parts) CHECK(result.status().message().find(part) != std::string::npos);
  CHECK(placer.counter() == 0);
}

TEST_CASE("a bad partitioner is InvalidArgument naming the variable and leaves the counter") {
  check_refused(Partitioner::max_size(0), {10, 4}, {"variable 'w'", "max_shard_bytes"});
}

TEST_CASE("FixedShardsPartitioner on a variable with no rows fails the partition check") {
  check_refused(Partitioner::fixed_shards(2), {0, 4}, {"besides the first element"});
}

TEST_CASE("a bad shape or dtype is InvalidArgument") {
  Placer placer(2);
  CHECK(placer.place("w", {-1, 4}, DType::kFloat32, Partitioner::fixed_shards(2)).status().code() ==
        StatusCode::kInvalidArgument);
  CHECK(placer.place("w", {4, 4}, DType::kInvalid, Partitioner::none()).status().code() ==
        StatusCode::kInvalidArgument);
  CHECK(placer.counter() == 0);
}

TEST_CASE("a variable needs a name") {
  Placer placer(2);
  auto result = placer.place("", {10, 4}, DType::kFloat32, Partitioner::none());
  CHECK(result.status().code() == StatusCode::kInvalidArgument);
  CHECK(placer.counter() == 0);
}

TEST_CASE("placing needs at least one PS task") {
  Placer placer(0);
  auto result = placer.place("w", {10, 4}, DType::kFloat32, Partitioner::none());
  CHECK(result.status().code() == StatusCode::kInvalidArgument);
  CHECK(result.status().message().find("num_ps") != std::string::npos);
  CHECK(placer.counter() == 0);
}

}  // namespace
}  // namespace capstan::placement
