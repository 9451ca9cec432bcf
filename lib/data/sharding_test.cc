// Static sharding for the data service's FILE, DATA, FILE_OR_DATA and HINT
// modes.
#include "data/sharding.h"

#include <catch2/catch.hpp>

#include <set>

#include "data/io/tfrecord.h"
#include "data/test_util.h"

namespace capstan::data {
namespace {

using testing::drain_ints;
using testing::drain_strings;
using testing::TempDir;

std::vector<std::string> write_files(const TempDir& dir, int n) {
  std::vector<std::string> files;
  for (int f = 0; f < n; ++f) {
    std::string path = dir.file("part-" + std::to_string(f) + ".tfrecord");
    auto writer = io::TFRecordWriter::open(path, io::Compression::kNone);
    REQUIRE(writer.ok());
    for (int r = 0; r < 2; ++r) REQUIRE((*writer)->write("f" + std::to_string(f) + "r" + std::to_string(r)).ok());
    REQUIRE((*writer)->close().ok());
    files.push_back(path);
  }
  return files;
}

}  // namespace

TEST_CASE("DATA sharding keeps every num_workers-th element", "[data][sharding]") {
  auto ds = apply_sharding(Dataset::range(10), ShardingPolicy::kData, 3, 1);
  REQUIRE(ds.ok());
  CHECK(drain_ints(*ds) == std::vector<int64_t>{1, 4, 7});
}

TEST_CASE("HINT sharding fills in SHARD_HINT", "[data][sharding]") {
  auto ds = apply_sharding(Dataset::range(10).shard(kShardHint, kShardHint), ShardingPolicy::kHint, 4, 3);
  REQUIRE(ds.ok());
  CHECK(drain_ints(*ds) == std::vector<int64_t>{3, 7});
}

TEST_CASE("FILE sharding gives each worker its own files", "[data][sharding]") {
  TempDir dir;
  auto files = write_files(dir, 4);
  auto w0 = apply_sharding(Dataset::tfrecord_dataset(files), ShardingPolicy::kFile, 2, 0);
  auto w1 = apply_sharding(Dataset::tfrecord_dataset(files), ShardingPolicy::kFile, 2, 1);
  REQUIRE(w0.ok());
  REQUIRE(w1.ok());
  CHECK(drain_strings(*w0) == std::vector<std::string>{"f0r0", "f0r1", "f2r0", "f2r1"});
  CHECK(drain_strings(*w1) == std::vector<std::string>{"f1r0", "f1r1", "f3r0", "f3r1"});
}

TEST_CASE("FILE sharding of list_files shards the file names, even when shuffled", "[data][sharding]") {
  TempDir dir;
  write_files(dir, 3);
  auto pipeline = Dataset::list_files({dir.file("*.tfrecord")}).interleave(Fn::tfrecord_dataset(), 2);
  std::multiset<std::string> all;
  for (int i = 0; i < 3; ++i) {
    auto ds = apply_sharding(pipeline, ShardingPolicy::kFile, 3, i);
    REQUIRE(ds.ok());
    auto got = drain_strings(*ds);
    CHECK(got.size() == 2);  // one file each
    all.insert(got.begin(), got.end());
  }
  CHECK(all.size() == 6);
  CHECK(std::set<std::string>(all.begin(), all.end()).size() == 6);  // disjoint
}

TEST_CASE("FILE sharding with fewer files than workers is an error", "[data][sharding]") {
  TempDir dir;
  auto files = write_files(dir, 2);
  auto ds = apply_sharding(Dataset::tfrecord_dataset(files), ShardingPolicy::kFile, 3, 0);
  CHECK(ds.status().code() == StatusCode::kInvalidArgument);
  CHECK_THAT(ds.status().message(), Catch::Contains("2 file(s), fewer than the 3 workers"));
}

TEST_CASE("FILE sharding needs files, FILE_OR_DATA falls back to DATA", "[data][sharding]") {
  CHECK(apply_sharding(Dataset::range(6), ShardingPolicy::kFile, 2, 0).status().code() ==
        StatusCode::kFailedPrecondition);
  auto ds = apply_sharding(Dataset::range(6), ShardingPolicy::kFileOrData, 2, 1);
  REQUIRE(ds.ok());
  CHECK(drain_ints(*ds) == std::vector<int64_t>{1, 3, 5});
}

TEST_CASE("sharding arguments are checked", "[data][sharding]") {
  CHECK(apply_sharding(Dataset::range(6), ShardingPolicy::kData, 0, 0).status().code() == StatusCode::kInvalidArgument);
  CHECK(apply_sharding(Dataset::range(6), ShardingPolicy::kData, 2, 2).status().code() == StatusCode::kInvalidArgument);
  CHECK(drain_ints(apply_sharding(Dataset::range(3), ShardingPolicy::kOff, 2, 1).value()) == std::vector<int64_t>{0, 1, 2});
}

}  // namespace capstan::data
