#include "placement/partitioner.h"

#include <catch2/catch.hpp>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace capstan::placement {
namespace {

using Parts = std::vector<int64_t>;

Parts parts(const Partitioner& p, const Shape& shape, DType dtype = DType::kFloat32) {
  auto result = partition(p, shape, dtype);
  INFO(result.status().to_string());
  REQUIRE(result.ok());
  return *result;
}

void require_invalid(const Result<Parts>& result, const std::string& needle) {
  REQUIRE_FALSE(result.ok());
  CHECK(result.status().code() == StatusCode::kInvalidArgument);
  INFO(result.status().message());
  CHECK(result.status().message().find(needle) != std::string::npos);
}

TEST_CASE("FixedShardsPartitioner docstring example: 2 shards of a [10, 3] variable") {
  CHECK(parts(Partitioner::fixed_shards(2), {10, 3}) == Parts{2, 1});
  CHECK(parts(Partitioner::fixed_shards(2), {10, 4}) == Parts{2, 1});
}

TEST_CASE("FixedShardsPartitioner gives one entry per axis, only axis 0 split") {
  CHECK(parts(Partitioner::fixed_shards(3), {10}) == Parts{3});
  CHECK(parts(Partitioner::fixed_shards(3), {10, 4, 5}) == Parts{3, 1, 1});
}

TEST_CASE("FixedShardsPartitioner is capped by the first dimension") {
  CHECK(parts(Partitioner::fixed_shards(5), {3, 2}) == Parts{3, 1});
  CHECK(parts(Partitioner::fixed_shards(5), {1, 100}) == Parts{1, 1});
}

TEST_CASE("FixedShardsPartitioner gives 0 shards for a variable with no rows, as TF does") {
  const Parts result = parts(Partitioner::fixed_shards(2), {0, 4});
  CHECK(result == Parts{0, 1});
  CHECK_FALSE(check_partitions(result, {0, 4}).ok());
}

TEST_CASE("MinSizePartitioner docstring examples: [6, 1] float32 with 4-byte minimum") {
  CHECK(parts(Partitioner::min_size(4, 2), {6, 1}) == Parts{2, 1});
  CHECK(parts(Partitioner::min_size(4, 10), {6, 1}) == Parts{6, 1});
}

TEST_CASE("MinSizePartitioner defaults: 256K minimum, at most 1 shard") {
  // min_max_variable_partitioner's example: float32 [1024, 1024] is 4 MiB,
  // 16 slices of 256K.
  CHECK(parts(Partitioner::min_size(256 << 10, 16), {1024, 1024}) == Parts{16, 1});
  CHECK(parts(Partitioner::min_size(256 << 10, 100), {1024, 1024}) == Parts{16, 1});
  CHECK(parts(Partitioner::min_size(256 << 10, 8), {1024, 1024}) == Parts{8, 1});
  CHECK(parts(Partitioner::min_size(), {1024, 1024}) == Parts{1, 1});
  const Partitioner p = Partitioner::min_size();
  CHECK(p.min_shard_bytes == 256 * 1024);
  CHECK(p.max_shards == 1);
  CHECK(p.bytes_per_string == 16);
}

TEST_CASE("MinSizePartitioner rounds the shard count up") {
  // 25 float32 = 100 bytes; 100 / 30 = 3.33 -> 4 shards.
  CHECK(parts(Partitioner::min_size(30, 10), {25, 1}) == Parts{4, 1});
  // 100 / 100 = 1 exactly.
  CHECK(parts(Partitioner::min_size(100, 10), {25, 1}) == Parts{1, 1});
  // A variable smaller than the minimum still gets one shard.
  CHECK(parts(Partitioner::min_size(1 << 20, 10), {25, 1}) == Parts{1, 1});
}

TEST_CASE("MinSizePartitioner is capped by the first dimension") {
  CHECK(parts(Partitioner::min_size(1, 100), {3, 1000}) == Parts{3, 1});
  CHECK(parts(Partitioner::min_size(4, 10), {0, 4}) == Parts{1, 1});
}

TEST_CASE("MinSizePartitioner sizes string variables with bytes_per_string") {
  // 6 strings x 16 bytes = 96 bytes / 32 = 3 shards.
  CHECK(parts(Partitioner::min_size(32, 10), {6, 1}, DType::kString) == Parts{3, 1});
  // 6 x 8 = 48 bytes / 32 -> 2 shards.
  CHECK(parts(Partitioner::min_size(32, 10, 8), {6, 1}, DType::kString) == Parts{2, 1});
  // The same shape as float32 is 24 bytes: one shard.
  CHECK(parts(Partitioner::min_size(32, 10), {6, 1}, DType::kFloat32) == Parts{1, 1});
}

TEST_CASE("MaxSizePartitioner docstring examples: [6, 1] float32") {
  CHECK(parts(Partitioner::max_size(4), {6, 1}) == Parts{6, 1});
  CHECK(parts(Partitioner::max_size(4, 2), {6, 1}) == Parts{2, 1});
  CHECK(parts(Partitioner::max_size(1024), {6, 1}) == Parts{1, 1});
}

TEST_CASE("MaxSizePartitioner fits whole rows per shard and rounds the count up") {
  // Rows of 3 float32 = 12 bytes; 30 bytes hold 2 rows; 10 rows -> 5 shards.
  CHECK(parts(Partitioner::max_size(30), {10, 3}) == Parts{5, 1});
  // 36 bytes hold 3 rows; 10 rows -> 4 shards (3, 3, 2, 2 rows).
  CHECK(parts(Partitioner::max_size(36), {10, 3}) == Parts{4, 1});
  // A row larger than the maximum: every row becomes its own shard.
  CHECK(parts(Partitioner::max_size(11), {10, 3}) == Parts{10, 1});
}

TEST_CASE("MaxSizePartitioner max_shards 0 means no limit, like TF's None") {
  CHECK(Partitioner::max_size(4).max_shards == 0);
  CHECK(parts(Partitioner::max_size(4, 0), {100, 1}) == Parts{100, 1});
  CHECK(parts(Partitioner::max_size(4, 7), {100, 1}) == Parts{7, 1});
  CHECK(parts(Partitioner::max_size(4, 1000), {100, 1}) == Parts{100, 1});
}

TEST_CASE("MaxSizePartitioner sizes string variables with bytes_per_string") {
  // Rows of 2 strings x 16 bytes = 32 bytes; 64 bytes hold 2 rows -> 5 shards.
  CHECK(parts(Partitioner::max_size(64), {10, 2}, DType::kString) == Parts{5, 1});
  // 8 bytes per string: rows of 16 bytes, 4 per shard -> 3 shards.
  CHECK(parts(Partitioner::max_size(64, 0, 8), {10, 2}, DType::kString) == Parts{3, 1});
}

TEST_CASE("MaxSizePartitioner gives an empty variable one shard") {
  CHECK(parts(Partitioner::max_size(4), {0, 3}) == Parts{1, 1});
  CHECK(parts(Partitioner::max_size(4), {5, 0}) == Parts{1, 1});
}

TEST_CASE("partitioners use the dtype's element size") {
  // 4 rows of one element, 8 bytes per shard.
  CHECK(parts(Partitioner::max_size(8), {4, 1}, DType::kFloat64) == Parts{4, 1});
  CHECK(parts(Partitioner::max_size(8), {4, 1}, DType::kFloat32) == Parts{2, 1});
  CHECK(parts(Partitioner::max_size(8), {4, 1}, DType::kBFloat16) == Parts{1, 1});
  CHECK(parts(Partitioner::max_size(8), {16, 1}, DType::kInt8) == Parts{2, 1});
  CHECK(parts(Partitioner::min_size(8, 100), {16, 1}, DType::kInt64) == Parts{16, 1});
  CHECK(parts(Partitioner::min_size(8, 100), {16, 1}, DType::kInt32) == Parts{8, 1});
  CHECK(parts(Partitioner::min_size(8, 10), {16, 1}, DType::kBool) == Parts{2, 1});
}

TEST_CASE("scalars are never partitioned") {
  const Shape scalar{};
  CHECK(parts(Partitioner::none(), scalar).empty());
  CHECK(parts(Partitioner::fixed_shards(4), scalar).empty());
  CHECK(parts(Partitioner::min_size(1, 10), scalar).empty());
  CHECK(parts(Partitioner::max_size(1), scalar).empty());
  CHECK(parts(Partitioner::max_size(1), scalar, DType::kString).empty());
}

TEST_CASE("no partitioner leaves every axis whole") {
  CHECK(parts(Partitioner::none(), {1000, 1000}) == Parts{1, 1});
  CHECK(parts(Partitioner{}, {7}) == Parts{1});
}

TEST_CASE("invalid partitioner arguments are InvalidArgument naming the argument") {
  const Shape shape{10, 4};
  require_invalid(partition(Partitioner::fixed_shards(0), shape, DType::kFloat32), "num_shards");
  require_invalid(partition(Partitioner::fixed_shards(-2), shape, DType::kFloat32), "num_shards");
  require_invalid(partition(Partitioner::min_size(0), shape, DType::kFloat32), "min_shard_bytes");
  require_invalid(partition(Partitioner::min_size(4, 0), shape, DType::kFloat32), "max_shards");
  require_invalid(partition(Partitioner::min_size(4, 1, 0), shape, DType::kString),
                  "bytes_per_string");
  require_invalid(partition(Partitioner::max_size(0), shape, DType::kFloat32), "max_shard_bytes");
  require_invalid(partition(Partitioner{Partitioner::Kind::kMaxSize}, shape, DType::kFloat32),
                  "max_shard_bytes");
  require_invalid(partition(Partitioner::max_size(4, -1), shape, DType::kFloat32), "max_shards");
  require_invalid(partition(Partitioner::max_size(4, 0, 0), shape, DType::kString),
                  "bytes_per_string");
}

TEST_CASE("invalid partitioner arguments are reported even for scalars") {
  require_invalid(partition(Partitioner::fixed_shards(0), {}, DType::kFloat32), "num_shards");
}

TEST_CASE("invalid dtypes and shapes are InvalidArgument") {
  require_invalid(partition(Partitioner::fixed_shards(2), {10, 4}, DType::kInvalid), "dtype");
  require_invalid(partition(Partitioner::fixed_shards(2), {-1, 4}, DType::kFloat32),
                  "not fully defined");
  const int64_t big = std::numeric_limits<int64_t>::max() / 2;
  require_invalid(partition(Partitioner::min_size(4, 10), {big, 1}, DType::kFloat64), "overflow");
  require_invalid(partition(Partitioner::max_size(4), {2, big}, DType::kFloat64), "overflow");
}

TEST_CASE("partitioner_string names the TF partitioner and its arguments") {
  CHECK(partitioner_string(Partitioner::fixed_shards(2)) == "FixedShardsPartitioner(num_shards=2)");
  CHECK(partitioner_string(Partitioner::min_size(4, 2)) ==
        "MinSizePartitioner(min_shard_bytes=4, max_shards=2, bytes_per_string=16)");
  CHECK(partitioner_string(Partitioner::max_size(4)) ==
        "MaxSizePartitioner(max_shard_bytes=4, max_shards=None, bytes_per_string=16)");
}

TEST_CASE("check_partitions accepts [n, 1, ...] with n >= 1, even above the row count") {
  CHECK(check_partitions({3, 1}, {10, 4}).ok());
  CHECK(check_partitions({1, 1}, {10, 4}).ok());
  CHECK(check_partitions({4}, {10}).ok());
  CHECK(check_partitions({20, 1, 1}, {10, 4, 2}).ok());  // placement caps it at 10
  CHECK(check_partitions({}, {}).ok());
}

TEST_CASE("check_partitions rejects partitioning an axis other than 0") {
  Status s = check_partitions({2, 2}, {10, 4});
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK(s.message().find("elements are 1 besides the first element") != std::string::npos);
  CHECK(s.message().find("[2, 2]") != std::string::npos);
  CHECK(check_partitions({1, 3}, {10, 4}).code() == StatusCode::kInvalidArgument);
  CHECK(check_partitions({2, 1, 0}, {10, 4, 2}).code() == StatusCode::kInvalidArgument);
}

TEST_CASE("check_partitions rejects zero or negative shards on axis 0") {
  Status s = check_partitions({0, 1}, {10, 4});
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK(s.message().find("[0, 1]") != std::string::npos);
  CHECK(check_partitions({-1, 1}, {10, 4}).code() == StatusCode::kInvalidArgument);
  CHECK(check_partitions({0}, {0}).code() == StatusCode::kInvalidArgument);
}

TEST_CASE("check_partitions rejects a result of the wrong rank") {
  Status s = check_partitions({2}, {10, 4});
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK(s.message().find("one entry per axis") != std::string::npos);
  CHECK(check_partitions({2, 1, 1}, {10, 4}).code() == StatusCode::kInvalidArgument);
  CHECK(check_partitions({}, {10}).code() == StatusCode::kInvalidArgument);
  CHECK(check_partitions({1}, {}).code() == StatusCode::kInvalidArgument);
}

TEST_CASE("shard_rows is TF's div split: earlier shards take the remainder") {
  CHECK(*shard_rows(13, 5) == Parts{3, 3, 3, 2, 2});
  CHECK(*shard_rows(10, 4) == Parts{3, 3, 2, 2});  // TF's own comment example
  CHECK(*shard_rows(10, 2) == Parts{5, 5});
  CHECK(*shard_rows(7, 7) == Parts{1, 1, 1, 1, 1, 1, 1});
  CHECK(*shard_rows(7, 1) == Parts{7});
  CHECK(*shard_rows(0, 1) == Parts{0});
}

TEST_CASE("shard_rows rejects empty shards and bad counts") {
  require_invalid(shard_rows(3, 4), "non-empty");
  require_invalid(shard_rows(0, 2), "non-empty");
  require_invalid(shard_rows(10, 0), "non-empty");
  require_invalid(shard_rows(-1, 1), "non-negative");
}

TEST_CASE("shard_offsets gives each shard's first row") {
  CHECK(shard_offsets({3, 3, 3, 2, 2}) == Parts{0, 3, 6, 9, 11});
  CHECK(shard_offsets({3, 3, 2, 2}) == Parts{0, 3, 6, 8});
  CHECK(shard_offsets({5}) == Parts{0});
  CHECK(shard_offsets({}).empty());
}

}  // namespace
}  // namespace capstan::placement
