// The pipeline engine against TensorFlow's documented behaviour: element
// order, end of sequence, errors and cardinality of every op.
#include <catch2/catch.hpp>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <thread>

#include <capnp/message.h>
#include <capnp/serialize.h>

#include "capstan/data/dataset.h"
#include "capstan_schemas/common.capnp.h"
#include "data/io/tfrecord.h"
#include "data/test_util.h"

namespace capstan::data {
namespace {

namespace fs = std::filesystem;
using testing::drain;
using testing::drain_ints;
using testing::drain_strings;
using testing::TempDir;

int64_t as_int(const Element& e) { return e.components.at(0).flat<int64_t>()[0]; }

// Every element (component 0 flattened as int64 rows).
std::vector<std::vector<int64_t>> rows(const Dataset& ds, const FunctionRegistry* fns = nullptr) {
  std::vector<std::vector<int64_t>> out;
  for (const Element& e : drain(ds, fns)) out.push_back(testing::values<int64_t>(e.components.at(0)));
  return out;
}

Status make_error(const Dataset& ds, const FunctionRegistry* fns = nullptr) {
  auto it = ds.make_iterator(fns);
  return it.status();
}

Element ints_element(std::vector<int64_t> values, Shape shape) {
  Element e;
  e.components.push_back(*Tensor::from_vector<int64_t>(values, std::move(shape)));
  return e;
}

// The elements one after the other (from_tensors of each, concatenated).
Dataset concatenated(const std::vector<Element>& elements) {
  Dataset ds = Dataset::from_tensors(elements.at(0));
  for (size_t i = 1; i < elements.size(); ++i) ds = ds.concatenate(Dataset::from_tensors(elements[i]));
  return ds;
}

void write_records(const std::string& path, const std::vector<std::string>& records,
                   io::Compression compression = io::Compression::kNone) {
  auto writer = io::TFRecordWriter::open(path, compression);
  REQUIRE(writer.ok());
  for (const auto& r : records) REQUIRE((*writer)->write(r).ok());
  REQUIRE((*writer)->close().ok());
}

// A registry with the functions the tests use.
struct Functions {
  Functions() {
    registry.register_map("times_two", [](Element e) -> Result<Element> {
      int64_t x = e.components[0].flat<int64_t>()[0];
      return Element{{Tensor::scalar<int64_t>(2 * x)}, {}};
    });
    registry.register_map("count_calls", [this](Element e) -> Result<Element> {
      ++calls;
      return e;
    });
    registry.register_map("fail_on_3", [](Element e) -> Result<Element> {
      if (e.components[0].flat<int64_t>()[0] == 3) return Status::InvalidArgument("three is bad");
      return e;
    });
    registry.register_map("slow_square", [](Element e) -> Result<Element> {
      int64_t x = e.components[0].flat<int64_t>()[0];
      std::this_thread::sleep_for(std::chrono::microseconds(200 * ((x * 7) % 5)));
      return Element{{Tensor::scalar<int64_t>(x * x)}, {}};
    });
    registry.register_filter("even", [](const Element& e) -> Result<bool> {
      return e.components[0].flat<int64_t>()[0] % 2 == 0;
    });
    registry.register_map("range_of_x", [](Element e) -> Result<Element> {
      int64_t x = e.components[0].flat<int64_t>()[0];
      std::vector<int64_t> v(static_cast<size_t>(x), x);
      return Element{{*Tensor::from_vector<int64_t>(v, {x})}, {}};
    });
    // TF's interleave example: each x becomes from_tensors(x).repeat(6).
    registry.register_interleave("x_six_times", [](const Element& e) -> Result<Dataset> {
      return Dataset::from_tensors(e).repeat(6);
    });
    registry.register_interleave("bad_interleave", [](const Element&) -> Result<Dataset> {
      return Status::InvalidArgument("no dataset for you");
    });
  }
  FunctionRegistry registry;
  std::atomic<int> calls{0};
};

}  // namespace

TEST_CASE("range follows Python's range", "[data][source]") {
  CHECK(drain_ints(Dataset::range(5)) == std::vector<int64_t>{0, 1, 2, 3, 4});
  CHECK(drain_ints(Dataset::range(2, 5)) == std::vector<int64_t>{2, 3, 4});
  CHECK(drain_ints(Dataset::range(1, 5, 2)) == std::vector<int64_t>{1, 3});
  CHECK(drain_ints(Dataset::range(5, 1, -2)) == std::vector<int64_t>{5, 3});
  CHECK(drain_ints(Dataset::range(0)).empty());
  CHECK(drain_ints(Dataset::range(5, 1)).empty());
  CHECK(Dataset::range(1, 5, 2).cardinality() == 2);
  CHECK(Dataset::range(5, 1, -2).cardinality() == 2);
  CHECK(Dataset::range(5, 1).cardinality() == 0);
}

TEST_CASE("range with step 0 is an error naming the op", "[data][source]") {
  Status s = make_error(Dataset::range(0, 5, 0));
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK_THAT(s.message(), Catch::Contains("range: step must not be 0"));
}

TEST_CASE("from_tensors yields the element once, from_tensor_slices row by row", "[data][source]") {
  auto whole = rows(Dataset::from_tensors(ints_element({1, 2, 3, 4, 5, 6}, {3, 2})));
  REQUIRE(whole.size() == 1);
  CHECK(whole[0] == std::vector<int64_t>{1, 2, 3, 4, 5, 6});
  auto sliced = rows(Dataset::from_tensor_slices(ints_element({1, 2, 3, 4, 5, 6}, {3, 2})));
  CHECK(sliced == std::vector<std::vector<int64_t>>{{1, 2}, {3, 4}, {5, 6}});
  CHECK(Dataset::from_tensor_slices(ints_element({1, 2, 3, 4, 5, 6}, {3, 2})).cardinality() == 3);
}

TEST_CASE("from_tensor_slices rejects scalars and mismatched first dimensions", "[data][source]") {
  CHECK(make_error(Dataset::from_tensor_slices(ints_element({1}, {}))).code() == StatusCode::kInvalidArgument);
  Element mixed = ints_element({1, 2, 3}, {3});
  mixed.components.push_back(*Tensor::from_vector<int64_t>({1, 2}, {2}));
  Status s = make_error(Dataset::from_tensor_slices(mixed));
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK_THAT(s.message(), Catch::Contains("different first dimensions"));
}

TEST_CASE("map applies a registered function in order", "[data][map]") {
  Functions f;
  CHECK(drain_ints(Dataset::range(4).map(Fn::named("times_two")), &f.registry) == std::vector<int64_t>{0, 2, 4, 6});
  CHECK(Dataset::range(4).map(Fn::named("times_two")).cardinality() == 4);
}

TEST_CASE("an unknown function fails at make_iterator with NotFound", "[data][map]") {
  Functions f;
  Status s = make_error(Dataset::range(4).map(Fn::named("nope")), &f.registry);
  CHECK(s.code() == StatusCode::kNotFound);
  CHECK_THAT(s.message(), Catch::Contains("'nope'"));
  CHECK(make_error(Dataset::range(4).filter(Fn::named("nope")), &f.registry).code() == StatusCode::kNotFound);
}

TEST_CASE("parallel map keeps input order when deterministic", "[data][map]") {
  Functions f;
  std::vector<int64_t> expected;
  for (int64_t i = 0; i < 200; ++i) expected.push_back(i * i);
  for (int64_t n : {int64_t{1}, int64_t{4}, kAutotune}) {
    INFO("num_parallel_calls " << n);
    CHECK(drain_ints(Dataset::range(200).map(Fn::named("slow_square"), n), &f.registry) == expected);
  }
}

TEST_CASE("non-deterministic parallel map yields every element once", "[data][map]") {
  Functions f;
  auto got = drain_ints(Dataset::range(200).map(Fn::named("slow_square"), 4, false), &f.registry);
  std::multiset<int64_t> got_set(got.begin(), got.end());
  std::multiset<int64_t> expected;
  for (int64_t i = 0; i < 200; ++i) expected.insert(i * i);
  CHECK(got_set == expected);
}

TEST_CASE("a failing map element is an error and iteration continues", "[data][map]") {
  Functions f;
  for (int64_t parallel : {int64_t{0}, int64_t{3}}) {
    auto it = Dataset::range(6).map(Fn::named("fail_on_3"), parallel).make_iterator(&f.registry);
    REQUIRE(it.ok());
    std::vector<int64_t> seen;
    int errors = 0;
    while (true) {
      auto next = (*it)->get_next();
      if (!next.ok()) {
        CHECK_THAT(next.status().message(), Catch::Contains("three is bad"));
        ++errors;
        continue;
      }
      if (!next->has_value()) break;
      seen.push_back(as_int(**next));
    }
    CHECK(errors == 1);
    CHECK(seen == std::vector<int64_t>{0, 1, 2, 4, 5});
  }
}

TEST_CASE("filter keeps matching elements and has unknown cardinality", "[data][filter]") {
  Functions f;
  CHECK(drain_ints(Dataset::range(7).filter(Fn::named("even")), &f.registry) == std::vector<int64_t>{0, 2, 4, 6});
  CHECK(Dataset::range(7).filter(Fn::named("even")).cardinality() == kUnknownCardinality);
}

TEST_CASE("batch groups consecutive elements, drop_remainder drops the short batch", "[data][batch]") {
  CHECK(rows(Dataset::range(8).batch(3)) == std::vector<std::vector<int64_t>>{{0, 1, 2}, {3, 4, 5}, {6, 7}});
  CHECK(rows(Dataset::range(8).batch(3, true)) == std::vector<std::vector<int64_t>>{{0, 1, 2}, {3, 4, 5}});
  CHECK(Dataset::range(8).batch(3).cardinality() == 3);
  CHECK(Dataset::range(8).batch(3, true).cardinality() == 2);
  CHECK(rows(Dataset::range(0).batch(3)).empty());
  auto it = Dataset::range(4).batch(2).make_iterator();
  auto first = (*it)->get_next();
  REQUIRE(first.ok());
  CHECK((**first).components[0].shape() == Shape{2});
}

TEST_CASE("batch_size must be positive", "[data][batch]") {
  Status s = make_error(Dataset::range(4).batch(0));
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK_THAT(s.message(), Catch::Contains("batch: batch_size must be positive, got 0"));
}

TEST_CASE("batching elements of different shapes is an error", "[data][batch]") {
  Functions f;
  auto it = Dataset::range(1, 4).map(Fn::named("range_of_x")).batch(3).make_iterator(&f.registry);
  REQUIRE(it.ok());
  auto next = (*it)->get_next();
  REQUIRE_FALSE(next.ok());
  CHECK(next.status().code() == StatusCode::kInvalidArgument);
  CHECK_THAT(next.status().message(), Catch::Contains("different shapes"));
}

TEST_CASE("a batch whose layout changes mid-way names the first misfit, and the next batch starts after it",
          "[data][batch]") {
  // Elements are copied into the batch as they come; a misfit sends the
  // batch down the collecting path with the rows so far: the same error,
  // and the input consumed to the batch's end, as TF.
  Functions f;
  auto it = Dataset::range(1, 7).map(Fn::named("range_of_x")).batch(3).make_iterator(&f.registry);
  REQUIRE(it.ok());
  auto first = (*it)->get_next();
  REQUIRE_FALSE(first.ok());
  CHECK_THAT(first.status().message(),
             Catch::Contains("First element had shape [1] and element 1 had shape [2]"));
  auto second = (*it)->get_next();
  REQUIRE_FALSE(second.ok());
  CHECK_THAT(second.status().message(),
             Catch::Contains("First element had shape [4] and element 1 had shape [5]"));
  auto done = (*it)->get_next();
  REQUIRE(done.ok());
  CHECK_FALSE(done->has_value());
  // Elements of one layout, then a misfit at the third: the two rows already
  // copied are given back as they were.
  std::vector<Element> elements = {ints_element({1, 2}, {2}), ints_element({3, 4}, {2}), ints_element({5}, {1})};
  auto mixed = concatenated(elements).batch(3).make_iterator();
  REQUIRE(mixed.ok());
  auto misfit = (*mixed)->get_next();
  REQUIRE_FALSE(misfit.ok());
  CHECK_THAT(misfit.status().message(),
             Catch::Contains("First element had shape [2] and element 2 had shape [1]"));
}

TEST_CASE("batch stacks every component, a short last batch keeps its rows, strings included", "[data][batch]") {
  std::vector<Element> elements;
  for (int64_t i = 0; i < 5; ++i) {
    Element e = ints_element({i, 10 * i}, {2});
    e.components.push_back(*Tensor::from_vector<float>({0.5f * static_cast<float>(i)}, {}));
    e.components.push_back(*Tensor::from_strings({"s" + std::to_string(i)}, {}));
    e.names = {"ints", "half", "name"};
    elements.push_back(std::move(e));
  }
  for (bool strings : {false, true}) {
    std::vector<Element> input = elements;
    if (!strings) {
      for (Element& e : input) {
        e.components.pop_back();
        e.names.pop_back();
      }
    }
    auto batches = drain(concatenated(input).batch(2));
    REQUIRE(batches.size() == 3);
    CHECK(batches[0].names == input[0].names);
    CHECK(batches[0].components[0].shape() == Shape{2, 2});
    CHECK(testing::values<int64_t>(batches[1].components[0]) == std::vector<int64_t>{2, 20, 3, 30});
    CHECK(testing::values<float>(batches[1].components[1]) == std::vector<float>{1.0f, 1.5f});
    CHECK(batches[2].components[0].shape() == Shape{1, 2});
    CHECK(testing::values<int64_t>(batches[2].components[0]) == std::vector<int64_t>{4, 40});
    CHECK(batches[2].components[1].shape() == Shape{1});
    if (strings) {
      CHECK(batches[2].components[2].string_at(0) == "s4");
      CHECK(batches[1].components[2].string_at(1) == "s3");
    }
  }
}

TEST_CASE("parallel map followed by batch gives the unfused result", "[data][batch]") {
  Functions f;
  auto fused = rows(Dataset::range(10).map(Fn::named("times_two"), 3).batch(4), &f.registry);
  CHECK(fused == std::vector<std::vector<int64_t>>{{0, 2, 4, 6}, {8, 10, 12, 14}, {16, 18}});
  auto dropped = rows(Dataset::range(10).map(Fn::named("times_two"), kAutotune).batch(4, true), &f.registry);
  CHECK(dropped == std::vector<std::vector<int64_t>>{{0, 2, 4, 6}, {8, 10, 12, 14}});
}

TEST_CASE("padded_batch pads to the longest element or a fixed shape", "[data][batch]") {
  Functions f;
  // TF's example: x -> fill([x], x), padded_batch(2).
  auto padded = rows(Dataset::range(1, 5).map(Fn::named("range_of_x")).padded_batch(2, {{-1}}), &f.registry);
  CHECK(padded == std::vector<std::vector<int64_t>>{{1, 0, 2, 2}, {3, 3, 3, 0, 4, 4, 4, 4}});
  auto fixed = rows(Dataset::range(1, 3).map(Fn::named("range_of_x"))
                        .padded_batch(2, {{3}}, {Tensor::scalar<int64_t>(-1)}),
                    &f.registry);
  CHECK(fixed == std::vector<std::vector<int64_t>>{{1, -1, -1, 2, 2, -1}});
  auto too_small = Dataset::range(1, 5).map(Fn::named("range_of_x")).padded_batch(4, {{2}}).make_iterator(&f.registry);
  REQUIRE(too_small.ok());
  CHECK((*too_small)->get_next().status().code() == StatusCode::kInvalidArgument);
}

TEST_CASE("rebatch re-slices batches", "[data][batch]") {
  CHECK(rows(Dataset::range(10).batch(4).rebatch(3)) ==
        std::vector<std::vector<int64_t>>{{0, 1, 2}, {3, 4, 5}, {6, 7, 8}, {9}});
  CHECK(rows(Dataset::range(10).batch(4).rebatch(3, true)) ==
        std::vector<std::vector<int64_t>>{{0, 1, 2}, {3, 4, 5}, {6, 7, 8}});
  CHECK(make_error(Dataset::range(3).rebatch(0)).code() == StatusCode::kInvalidArgument);
}

TEST_CASE("shuffle permutes the input, a seed makes it reproducible", "[data][shuffle]") {
  auto a = drain_ints(Dataset::range(100).shuffle(20, 42));
  auto b = drain_ints(Dataset::range(100).shuffle(20, 42));
  CHECK(a == b);
  std::vector<int64_t> sorted = a;
  std::sort(sorted.begin(), sorted.end());
  CHECK(sorted == drain_ints(Dataset::range(100)));
  CHECK(a != drain_ints(Dataset::range(100)));
  CHECK(drain_ints(Dataset::range(10).shuffle(1, 3)) == drain_ints(Dataset::range(10)));
  CHECK(Dataset::range(100).shuffle(20).cardinality() == 100);
  CHECK(make_error(Dataset::range(3).shuffle(0)).code() == StatusCode::kInvalidArgument);
}

TEST_CASE("shuffle reshuffles each epoch unless told not to", "[data][shuffle]") {
  auto both = drain_ints(Dataset::range(50).shuffle(50, 7).repeat(2));
  REQUIRE(both.size() == 100);
  std::vector<int64_t> first(both.begin(), both.begin() + 50), second(both.begin() + 50, both.end());
  CHECK(first != second);
  auto same = drain_ints(Dataset::range(50).shuffle(50, 7, false).repeat(2));
  CHECK(std::vector<int64_t>(same.begin(), same.begin() + 50) == std::vector<int64_t>(same.begin() + 50, same.end()));
}

TEST_CASE("repeat repeats count times or forever", "[data][repeat]") {
  CHECK(drain_ints(Dataset::range(3).repeat(2)) == std::vector<int64_t>{0, 1, 2, 0, 1, 2});
  CHECK(drain_ints(Dataset::range(3).repeat(0)).empty());
  CHECK(drain_ints(Dataset::range(3).repeat().take(7)) == std::vector<int64_t>{0, 1, 2, 0, 1, 2, 0});
  CHECK(drain_ints(Dataset::range(0).repeat()).empty());  // an empty input does not spin
  CHECK(Dataset::range(3).repeat().cardinality() == kInfiniteCardinality);
  CHECK(Dataset::range(3).repeat(4).cardinality() == 12);
  CHECK(make_error(Dataset::range(3).repeat(-2)).code() == StatusCode::kInvalidArgument);
}

TEST_CASE("shard takes every num_shards-th element from index", "[data][shard]") {
  CHECK(drain_ints(Dataset::range(20).shard(5, 1)) == std::vector<int64_t>{1, 6, 11, 16});
  CHECK(drain_ints(Dataset::range(3).shard(5, 4)).empty());
  CHECK(Dataset::range(20).shard(5, 1).cardinality() == 4);
  CHECK(Dataset::range(22).shard(5, 1).cardinality() == 5);
  CHECK(Dataset::range(22).shard(5, 2).cardinality() == 4);
}

TEST_CASE("shard arguments are checked", "[data][shard]") {
  Status s = make_error(Dataset::range(20).shard(5, 5));
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK_THAT(s.message(), Catch::Contains("index must be in [0, 5), got 5"));
  CHECK(make_error(Dataset::range(20).shard(0, 0)).code() == StatusCode::kInvalidArgument);
  CHECK(make_error(Dataset::range(20).shard(3, -2)).code() == StatusCode::kInvalidArgument);
}

TEST_CASE("SHARD_HINT must be resolved before iterating", "[data][shard]") {
  auto hinted = Dataset::range(20).shard(kShardHint, kShardHint);
  CHECK(make_error(hinted).code() == StatusCode::kFailedPrecondition);
  CHECK(drain_ints(hinted.resolve_shard_hint(4, 2)) == std::vector<int64_t>{2, 6, 10, 14, 18});
}

TEST_CASE("interleave follows TensorFlow's cycle and block order", "[data][interleave]") {
  Functions f;
  // tf.data docs: range(1, 6).interleave(lambda x: from_tensors(x).repeat(6),
  //                                      cycle_length=2, block_length=4)
  std::vector<int64_t> expected = {1, 1, 1, 1, 2, 2, 2, 2, 1, 1, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4,
                                   3, 3, 4, 4, 5, 5, 5, 5, 5, 5};
  CHECK(drain_ints(Dataset::range(1, 6).interleave(Fn::named("x_six_times"), 2, 4), &f.registry) == expected);
  CHECK(drain_ints(Dataset::range(1, 6).interleave(Fn::named("x_six_times"), 2, 4, 2), &f.registry) == expected);
  CHECK(drain_ints(Dataset::range(1, 6).interleave(Fn::named("x_six_times"), 2, 4, kAutotune, true), &f.registry) ==
        expected);
}

TEST_CASE("non-deterministic parallel interleave yields every element", "[data][interleave]") {
  Functions f;
  auto got = drain_ints(Dataset::range(1, 6).interleave(Fn::named("x_six_times"), 3, 2, 3, false), &f.registry);
  std::multiset<int64_t> got_set(got.begin(), got.end()), expected;
  for (int64_t x = 1; x < 6; ++x) for (int i = 0; i < 6; ++i) expected.insert(x);
  CHECK(got_set == expected);
}

TEST_CASE("interleave arguments and function errors are reported", "[data][interleave]") {
  Functions f;
  CHECK(make_error(Dataset::range(3).interleave(Fn::named("x_six_times"), 0), &f.registry).code() ==
        StatusCode::kInvalidArgument);
  CHECK(make_error(Dataset::range(3).interleave(Fn::named("x_six_times"), 2, 0), &f.registry).code() ==
        StatusCode::kInvalidArgument);
  auto it = Dataset::range(3).interleave(Fn::named("bad_interleave"), 2).make_iterator(&f.registry);
  REQUIRE(it.ok());
  auto next = (*it)->get_next();
  REQUIRE_FALSE(next.ok());
  CHECK_THAT(next.status().message(), Catch::Contains("no dataset for you"));
}

TEST_CASE("prefetch passes elements through unchanged", "[data][prefetch]") {
  CHECK(drain_ints(Dataset::range(100).prefetch(3)) == drain_ints(Dataset::range(100)));
  CHECK(drain_ints(Dataset::range(100).prefetch(kAutotune)) == drain_ints(Dataset::range(100)));
  CHECK(drain_ints(Dataset::range(5).prefetch(0)) == drain_ints(Dataset::range(5)));
  CHECK(Dataset::range(100).prefetch(kAutotune).cardinality() == 100);
}

TEST_CASE("take and skip", "[data][take]") {
  CHECK(drain_ints(Dataset::range(10).take(3)) == std::vector<int64_t>{0, 1, 2});
  CHECK(drain_ints(Dataset::range(2).take(3)) == std::vector<int64_t>{0, 1});
  CHECK(drain_ints(Dataset::range(3).take(-1)) == std::vector<int64_t>{0, 1, 2});
  CHECK(drain_ints(Dataset::range(10).take(0)).empty());
  CHECK(drain_ints(Dataset::range(5).skip(3)) == std::vector<int64_t>{3, 4});
  CHECK(drain_ints(Dataset::range(5).skip(-1)).empty());
  CHECK(drain_ints(Dataset::range(5).skip(9)).empty());
  CHECK(Dataset::range(10).take(3).cardinality() == 3);
  CHECK(Dataset::range(10).skip(3).cardinality() == 7);
  CHECK(Dataset::range(10).repeat().take(5).cardinality() == 5);
}

TEST_CASE("enumerate puts each element's index, from start, in front", "[data][enumerate]") {
  auto it = Dataset::range(10, 13).enumerate(5).make_iterator();
  REQUIRE(it.ok());
  for (int64_t i = 0; i < 3; ++i) {
    auto next = (*it)->get_next();
    REQUIRE(next.ok());
    REQUIRE(next->has_value());
    const Element& e = **next;
    REQUIRE(e.components.size() == 2);
    CHECK(e.components[0].dtype() == DType::kInt64);
    CHECK(e.components[0].rank() == 0);
    CHECK(e.components[0].flat<int64_t>()[0] == 5 + i);
    CHECK(e.components[1].flat<int64_t>()[0] == 10 + i);
  }
  auto end = (*it)->get_next();
  REQUIRE(end.ok());
  CHECK_FALSE(end->has_value());

  CHECK(drain_ints(Dataset::range(3).enumerate()) == std::vector<int64_t>{0, 1, 2});
  CHECK(drain_ints(Dataset::range(3).enumerate(-2)) == std::vector<int64_t>{-2, -1, 0});
  CHECK(Dataset::range(7).enumerate().cardinality() == 7);
  CHECK(Dataset::range(7).repeat().enumerate().cardinality() == kInfiniteCardinality);
  CHECK(Dataset::range(7).shard(2, 0).enumerate(1).debug_string() == "range(0, 7, 1).shard(2, 0).enumerate(1)");
}

TEST_CASE("enumerate past INT64_MAX is OutOfRange, not a wrapped index", "[data][enumerate]") {
  auto it = Dataset::range(3).enumerate(std::numeric_limits<int64_t>::max()).make_iterator();
  REQUIRE(it.ok());
  auto first = (*it)->get_next();
  REQUIRE(first.ok());
  REQUIRE(first->has_value());
  CHECK((*first)->components[0].flat<int64_t>()[0] == std::numeric_limits<int64_t>::max());
  auto second = (*it)->get_next();
  REQUIRE_FALSE(second.ok());
  CHECK(second.status().code() == StatusCode::kOutOfRange);
  CHECK_THAT(second.status().message(), Catch::Contains("INT64_MAX"));
}

TEST_CASE("enumerate drops component names, as zip does for an unnamed component", "[data][enumerate]") {
  Element named;
  named.components.push_back(Tensor::from_vector<int64_t>({1, 2}, {2}).value());
  named.names = {"x"};
  auto it = Dataset::from_tensor_slices(named).enumerate().make_iterator();
  REQUIRE(it.ok());
  auto next = (*it)->get_next();
  REQUIRE(next.ok());
  REQUIRE(next->has_value());
  CHECK((*next)->components.size() == 2);
  CHECK((*next)->names.empty());
}

TEST_CASE("enumerate resumes its count from a saved iterator", "[data][enumerate]") {
  Dataset ds = Dataset::range(100, 110).shuffle(4, 9).enumerate(3);
  auto first = ds.make_iterator();
  REQUIRE(first.ok());
  for (int i = 0; i < 4; ++i) REQUIRE((*first)->get_next().ok());
  auto state = (*first)->save();
  REQUIRE(state.ok());
  std::vector<std::pair<int64_t, int64_t>> rest_first;
  std::vector<std::pair<int64_t, int64_t>> rest_restored;
  auto drain = [](Iterator& it, std::vector<std::pair<int64_t, int64_t>>* out) {
    while (true) {
      auto next = it.get_next();
      REQUIRE(next.ok());
      if (!next->has_value()) return;
      out->emplace_back((*next)->components[0].flat<int64_t>()[0], (*next)->components[1].flat<int64_t>()[0]);
    }
  };
  drain(**first, &rest_first);
  auto restored = ds.make_iterator();
  REQUIRE(restored.ok());
  REQUIRE((*restored)->restore(*state).ok());
  drain(**restored, &rest_restored);
  REQUIRE(rest_first.size() == 6);
  CHECK(rest_first.front().first == 7);
  CHECK(rest_restored == rest_first);
}

// ---- unbatch ---------------------------------------------------------------------

// An element of an int64 [rows, 2] matrix and a string vector of `rows`.
Element pair_batch(int64_t first, int64_t rows) {
  std::vector<int64_t> m;
  std::vector<std::string> s;
  for (int64_t r = 0; r < rows; ++r) {
    m.push_back(first + r);
    m.push_back(10 * (first + r));
    s.push_back("s" + std::to_string(first + r));
  }
  Element e;
  e.components.push_back(*Tensor::from_vector<int64_t>(m, {rows, 2}));
  e.components.push_back(*Tensor::from_strings(s, {rows}));
  e.names = {"m", "s"};
  return e;
}

TEST_CASE("unbatch splits every component along its first dimension", "[data][unbatch]") {
  auto elements = drain(Dataset::from_tensors(pair_batch(4, 3)).unbatch());
  REQUIRE(elements.size() == 3);
  for (int64_t r = 0; r < 3; ++r) {
    const Element& e = elements[static_cast<size_t>(r)];
    REQUIRE(e.components.size() == 2);
    CHECK(e.names == std::vector<std::string>{"m", "s"});
    CHECK(e.components[0].shape() == Shape{2});
    CHECK(testing::values<int64_t>(e.components[0]) == std::vector<int64_t>{4 + r, 10 * (4 + r)});
    CHECK(e.components[1].rank() == 0);
    CHECK(e.components[1].string_at(0) == "s" + std::to_string(4 + r));
  }
  // Input elements of different batch sizes, an empty one among them.
  CHECK(drain_ints(Dataset::range(7).batch(3).unbatch()) == std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6});
  CHECK(drain_ints(Dataset::from_tensors(ints_element({}, {0})).concatenate(Dataset::range(2).batch(2)).unbatch()) ==
        std::vector<int64_t>{0, 1});
  CHECK(Dataset::range(3).batch(2).unbatch().debug_string() == "range(0, 3, 1).batch(2).unbatch()");
}

TEST_CASE("batch then unbatch gives back the input, and unbatch then batch the batches", "[data][unbatch]") {
  for (int64_t k : {1, 2, 3, 5, 17}) {
    INFO("batch size " << k);
    CHECK(drain_ints(Dataset::range(17).batch(k).unbatch()) == drain_ints(Dataset::range(17)));
    CHECK(rows(Dataset::range(17).batch(k).unbatch().batch(k)) == rows(Dataset::range(17).batch(k)));
  }
  // With drop_remainder only the whole batches come back.
  CHECK(drain_ints(Dataset::range(7).batch(3, true).unbatch()) == std::vector<int64_t>{0, 1, 2, 3, 4, 5});
}

TEST_CASE("unbatch refuses scalars and components of different first dimensions", "[data][unbatch]") {
  Element mismatched = pair_batch(0, 3);
  mismatched.components[1] = *Tensor::from_strings({"a", "b"}, {2});
  auto it = Dataset::from_tensors(mismatched).unbatch().make_iterator();
  REQUIRE(it.ok());
  auto next = (*it)->get_next();
  REQUIRE_FALSE(next.ok());
  CHECK(next.status().code() == StatusCode::kInvalidArgument);
  CHECK_THAT(next.status().message(), Catch::Contains("Component 0 had size 3 but component 1 had size 2"));

  auto scalars = Dataset::range(3).unbatch().make_iterator();
  REQUIRE(scalars.ok());
  auto first = (*scalars)->get_next();
  REQUIRE_FALSE(first.ok());
  CHECK(first.status().code() == StatusCode::kInvalidArgument);
  CHECK_THAT(first.status().message(), Catch::Contains("non-scalar") && Catch::Contains("component 0"));
  // The bad element is dropped with its error; the next one is read.
  auto second = (*scalars)->get_next();
  CHECK_FALSE(second.ok());
}

TEST_CASE("unbatch cardinality is known only under a drop_remainder batch", "[data][unbatch]") {
  CHECK(Dataset::range(10).batch(3, true).unbatch().cardinality() == 9);
  CHECK(Dataset::range(10).batch(3).unbatch().cardinality() == kUnknownCardinality);
  CHECK(Dataset::range(10).batch(3, true).repeat().unbatch().cardinality() == kUnknownCardinality);
  CHECK(Dataset::range(10).repeat().batch(3, true).unbatch().cardinality() == kInfiniteCardinality);
  CHECK(Dataset::from_tensors(pair_batch(0, 3)).unbatch().cardinality() == kUnknownCardinality);
}

TEST_CASE("unbatch resumes in the middle of an input element", "[data][unbatch]") {
  Dataset ds = Dataset::from_tensors(pair_batch(0, 4)).concatenate(Dataset::from_tensors(pair_batch(100, 3))).unbatch();
  auto strings = [](const std::vector<Element>& elements) {
    std::vector<std::string> out;
    for (const Element& e : elements) out.emplace_back(e.components.at(1).string_at(0));
    return out;
  };
  auto whole = strings(drain(ds));
  REQUIRE(whole.size() == 7);
  for (size_t k : {0, 1, 2, 4, 5, 7}) {
    INFO("saved after " << k);
    auto saved = ds.make_iterator();
    REQUIRE(saved.ok());
    auto head = strings(testing::drain(**saved, k));
    auto state = (*saved)->save();
    REQUIRE(state.ok());
    auto rest = strings(testing::drain(**saved));
    auto restored = ds.make_iterator();
    REQUIRE(restored.ok());
    REQUIRE((*restored)->restore(*state).ok());
    auto resumed = strings(testing::drain(**restored));
    CHECK(resumed == rest);
    head.insert(head.end(), resumed.begin(), resumed.end());
    CHECK(head == whole);
  }
}

TEST_CASE("zip pairs elements and stops at the shortest", "[data][zip]") {
  std::vector<std::pair<int64_t, int64_t>> pairs;
  for (const Element& e : drain(Dataset::zip({Dataset::range(3), Dataset::range(10, 15)}))) {
    REQUIRE(e.components.size() == 2);
    pairs.emplace_back(e.components[0].flat<int64_t>()[0], e.components[1].flat<int64_t>()[0]);
  }
  CHECK(pairs == std::vector<std::pair<int64_t, int64_t>>{{0, 10}, {1, 11}, {2, 12}});
  CHECK(Dataset::zip({Dataset::range(3), Dataset::range(10, 15)}).cardinality() == 3);
  CHECK(Dataset::zip({Dataset::range(3), Dataset::range(1).repeat()}).cardinality() == 3);
}

TEST_CASE("concatenate appends, different element types are an error", "[data][concatenate]") {
  CHECK(drain_ints(Dataset::range(3).concatenate(Dataset::range(10, 12))) == std::vector<int64_t>{0, 1, 2, 10, 11});
  CHECK(Dataset::range(3).concatenate(Dataset::range(10, 12)).cardinality() == 5);
  Element floats;
  floats.components.push_back(Tensor::scalar<float>(1.5f));
  auto it = Dataset::range(1).concatenate(Dataset::from_tensors(floats)).make_iterator();
  REQUIRE(it.ok());
  REQUIRE((*it)->get_next().ok());
  auto bad = (*it)->get_next();
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().code() == StatusCode::kInvalidArgument);
}

TEST_CASE("cache() computes once and serves later epochs from memory", "[data][cache]") {
  Functions f;
  auto ds = Dataset::range(5).map(Fn::named("count_calls")).cache().repeat(3);
  CHECK(drain_ints(ds, &f.registry).size() == 15);
  CHECK(f.calls.load() == 5);
}

TEST_CASE("a partially read cache is discarded", "[data][cache]") {
  Functions f;
  auto ds = Dataset::range(5).map(Fn::named("count_calls")).cache();
  CHECK(drain_ints(ds.take(2).concatenate(ds), &f.registry) == std::vector<int64_t>{0, 1, 0, 1, 2, 3, 4});
  CHECK(f.calls.load() == 7);
}

TEST_CASE("cache(file) writes once and is reused by a later run", "[data][cache]") {
  Functions f;
  TempDir dir;
  std::string file = dir.file("cache.bin");
  auto ds = Dataset::range(6).map(Fn::named("count_calls")).cache(file);
  CHECK(drain_ints(ds, &f.registry) == std::vector<int64_t>{0, 1, 2, 3, 4, 5});
  CHECK(fs::exists(file));
  CHECK(drain_ints(ds, &f.registry) == std::vector<int64_t>{0, 1, 2, 3, 4, 5});
  CHECK(f.calls.load() == 6);
  // An abandoned first pass leaves no cache file behind.
  std::string other = dir.file("partial.bin");
  CHECK(drain_ints(Dataset::range(6).cache(other).take(2)).size() == 2);
  CHECK_FALSE(fs::exists(other));
}

TEST_CASE("tfrecord_dataset reads records of several files in order", "[data][files]") {
  TempDir dir;
  write_records(dir.file("a.tfrecord"), {"a0", "a1"});
  write_records(dir.file("b.tfrecord.gz"), {"b0", "b1", "b2"}, io::Compression::kGzip);
  CHECK(drain_strings(Dataset::tfrecord_dataset({dir.file("a.tfrecord")})) == std::vector<std::string>{"a0", "a1"});
  CHECK(drain_strings(Dataset::tfrecord_dataset({dir.file("b.tfrecord.gz")}, Compression::kGzip)) ==
        std::vector<std::string>{"b0", "b1", "b2"});
  write_records(dir.file("c.tfrecord"), {"c0", "c1", "c2"});
  CHECK(drain_strings(Dataset::tfrecord_dataset({dir.file("a.tfrecord"), dir.file("c.tfrecord")})) ==
        std::vector<std::string>{"a0", "a1", "c0", "c1", "c2"});
  // num_parallel_reads interleaves the files one record at a time.
  auto ds = Dataset::tfrecord_dataset({dir.file("a.tfrecord"), dir.file("c.tfrecord")}, Compression::kNone, 2);
  CHECK(drain_strings(ds) == std::vector<std::string>{"a0", "c0", "a1", "c1", "c2"});
}

TEST_CASE("a missing file is an error naming it", "[data][files]") {
  auto it = Dataset::tfrecord_dataset({"/nonexistent/x.tfrecord"}).make_iterator();
  REQUIRE(it.ok());
  auto next = (*it)->get_next();
  REQUIRE_FALSE(next.ok());
  CHECK_THAT(next.status().message(), Catch::Contains("/nonexistent/x.tfrecord"));
}

TEST_CASE("list_files globs, sorts and shuffles reproducibly", "[data][files]") {
  TempDir dir;
  for (const char* name : {"c.txt", "a.txt", "b.txt", "skip.dat"}) std::ofstream(dir.file(name)) << name;
  CHECK(drain_strings(Dataset::list_files({dir.file("*.txt")}, false)) ==
        std::vector<std::string>{dir.file("a.txt"), dir.file("b.txt"), dir.file("c.txt")});
  auto s1 = drain_strings(Dataset::list_files({dir.file("*.txt")}, true, 5));
  auto s2 = drain_strings(Dataset::list_files({dir.file("*.txt")}, true, 5));
  CHECK(s1 == s2);
  CHECK(std::set<std::string>(s1.begin(), s1.end()).size() == 3);
  Status none = make_error(Dataset::list_files({dir.file("*.none")}));
  CHECK(none.code() == StatusCode::kInvalidArgument);
  CHECK_THAT(none.message(), Catch::Contains("no files matched pattern"));
}

TEST_CASE("list_files then interleave reads files round robin", "[data][files]") {
  TempDir dir;
  write_records(dir.file("0.tfrecord"), {"x0", "x1"});
  write_records(dir.file("1.tfrecord"), {"y0", "y1"});
  write_records(dir.file("2.tfrecord"), {"z0"});
  auto ds = Dataset::list_files({dir.file("*.tfrecord")}, false).interleave(Fn::tfrecord_dataset(), 3, 1);
  CHECK(drain_strings(ds) == std::vector<std::string>{"x0", "y0", "z0", "x1", "y1"});
}

TEST_CASE("text_line_dataset yields lines without newlines", "[data][files]") {
  TempDir dir;
  std::ofstream(dir.file("t.txt")) << "first\r\nsecond\n\nlast";
  CHECK(drain_strings(Dataset::text_line_dataset({dir.file("t.txt")})) ==
        std::vector<std::string>{"first", "second", "", "last"});
}

TEST_CASE("fixed_length_record_dataset skips header and footer", "[data][files]") {
  TempDir dir;
  std::ofstream(dir.file("f.bin")) << "HHaabbccFFF";
  CHECK(drain_strings(Dataset::fixed_length_record_dataset({dir.file("f.bin")}, 2, 2, 3)) ==
        std::vector<std::string>{"aa", "bb", "cc"});
  CHECK(make_error(Dataset::fixed_length_record_dataset({dir.file("f.bin")}, 0)).code() ==
        StatusCode::kInvalidArgument);
}

TEST_CASE("decode_csv as a built-in map function", "[data][builtin]") {
  TempDir dir;
  std::ofstream(dir.file("d.csv")) << "1,2.5,x\n3,,y\n";
  CsvSpec spec;
  spec.record_defaults = {*Tensor::zeros(DType::kInt64, {0}), Tensor::scalar<float>(-1.0f),
                          *Tensor::from_strings({""}, {})};
  auto it = Dataset::text_line_dataset({dir.file("d.csv")}).map(Fn::decode_csv(spec)).make_iterator();
  REQUIRE(it.ok());
  auto first = (*it)->get_next();
  REQUIRE(first.ok());
  REQUIRE((*first)->components.size() == 3);
  CHECK((*first)->components[0].flat<int64_t>()[0] == 1);
  CHECK((*first)->components[1].flat<float>()[0] == 2.5f);
  auto second = (*it)->get_next();
  REQUIRE(second.ok());
  CHECK((*second)->components[1].flat<float>()[0] == -1.0f);
  CHECK((*second)->components[2].string_at(0) == "y");
}

TEST_CASE("cast as a built-in map function", "[data][builtin]") {
  auto it = Dataset::range(3).map(Fn::cast(DType::kFloat32)).make_iterator();
  REQUIRE(it.ok());
  auto next = (*it)->get_next();
  REQUIRE(next.ok());
  CHECK((*next)->components[0].dtype() == DType::kFloat32);
}

TEST_CASE("a definition survives serialization", "[data][serialize]") {
  Functions f;
  auto ds = Dataset::range(20).shuffle(5, 1).map(Fn::named("times_two"), 2).batch(3).prefetch(kAutotune);
  auto back = Dataset::deserialize(ds.serialize());
  REQUIRE(back.ok());
  CHECK(rows(*back, &f.registry) == rows(ds, &f.registry));
  CHECK(back->cardinality() == 7);
  CHECK(back->debug_string() == ds.debug_string());
  CHECK(ds.debug_string() == "range(0, 20, 1).shuffle(5).map(times_two).batch(3).prefetch(-1)");
}

// Found by fuzz/definition_fuzz: a well-formed message whose pointers have
// the wrong kinds for DatasetDef (a list where the root op belongs) passed
// deserialize and then threw out of debug_string(), ending the process.
TEST_CASE("a definition with a list where an op belongs is InvalidArgument at deserialize",
          "[data][serialize][fuzz]") {
  capnp::MallocMessageBuilder message;
  auto element = message.initRoot<wire::Element>();  // pointer 0: a list (DatasetDef: the root op)
  element.initComponents(1)[0].initShape(1).set(0, 3);
  auto words = capnp::messageToFlatArray(message);
  std::string bytes(reinterpret_cast<const char*>(words.begin()), words.size() * sizeof(capnp::word));
  auto parsed = Dataset::deserialize(bytes);
  CHECK(parsed.status().code() == StatusCode::kInvalidArgument);
  CHECK_THAT(parsed.status().message(), Catch::Contains("malformed dataset definition"));
}

// Found by fuzz/definition_fuzz: 120 bytes whose pointers share their
// targets, so walking the tree took minutes (pointer amplification). The
// check's traversal budget is a small multiple of the message size.
TEST_CASE("a definition whose pointers amplify the walk is refused quickly", "[data][serialize][fuzz]") {
  const std::string bytes(
      "\x00\x00\x00\x00\x0e\x00\x00\x00\x00\x00\x00\x00\x00\x00\x02\x00\x04\x00\x00\x00\x04\x00\x07\x00"
      "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x0a\x00\x00\x00\x00\x00\x00\x00"
      "\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
      "\x2d\x00\x00\x09\x00\x00\x00\x2f\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
      "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00",
      120);
  // Before the budget this call did not return for minutes (the test's
  // ctest timeout catches a regression).
  auto parsed = Dataset::deserialize(bytes);
  CHECK(parsed.status().code() == StatusCode::kInvalidArgument);
}

// Found by fuzz/definition_fuzz (UBSan: signed overflow in the batch
// cardinality, rounding up as n + b - 1).
TEST_CASE("the cardinality of a batch of nearly INT64_MAX elements does not overflow", "[data][fuzz]") {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  CHECK(Dataset::range(0, kMax).batch(4).cardinality() == kMax / 4 + 1);
  CHECK(Dataset::range(0, kMax).batch(4, /*drop_remainder=*/true).cardinality() == kMax / 4);
}

TEST_CASE("a malformed definition is InvalidArgument", "[data][serialize]") {
  CHECK(Dataset::deserialize("").status().code() == StatusCode::kInvalidArgument);
  CHECK(Dataset::deserialize("abc").status().code() == StatusCode::kInvalidArgument);
  std::string garbage(64, '\xff');
  auto bad = Dataset::deserialize(garbage);
  if (bad.ok()) CHECK(bad->make_iterator().status().code() == StatusCode::kInvalidArgument);
  else CHECK(bad.status().code() == StatusCode::kInvalidArgument);
}

TEST_CASE("destroying an iterator mid-stream stops its background work", "[data][lifecycle]") {
  Functions f;
  {
    auto it = Dataset::range(0, 1 << 30)
                  .map(Fn::named("count_calls"), 2)
                  .prefetch(8)
                  .make_iterator(&f.registry);
    REQUIRE(it.ok());
    for (int i = 0; i < 10; ++i) REQUIRE((*it)->get_next().ok());
  }
  int after = f.calls.load();
  CHECK(after < 1000);  // bounded buffers: only a few elements ahead
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  CHECK(f.calls.load() == after);  // threads are gone
}

TEST_CASE("options turn autotune and determinism off", "[data][options]") {
  Functions f;
  Options options;
  options.autotune = false;
  options.deterministic = false;
  auto got =
      drain_ints(Dataset::range(100).map(Fn::named("slow_square"), kAutotune).with_options(options), &f.registry);
  CHECK(std::multiset<int64_t>(got.begin(), got.end()).size() == 100);
}

}  // namespace capstan::data

namespace capstan::data {

TEST_CASE("a range split provider hands out index chunks", "[data][splits]") {
  auto ds = Dataset::range(10, 20, 2);  // 10, 12, ..., 18
  auto splits = ds.make_split_provider(2);
  REQUIRE(splits.ok());
  CHECK((*splits)->num_splits() == 3);
  std::vector<std::vector<int64_t>> chunks;
  while (true) {
    auto next = (*splits)->get_next();
    REQUIRE(next.ok());
    if (!next->has_value()) break;
    auto flat = (*next)->components[0].flat<int64_t>();
    chunks.emplace_back(flat.begin(), flat.end());
  }
  CHECK(chunks == std::vector<std::vector<int64_t>>{{0, 2}, {2, 4}, {4, 5}});
  (*splits)->reset();
  CHECK((*splits)->get_next().value().has_value());
}

TEST_CASE("iterators sharing a split provider see every element once", "[data][splits]") {
  Functions f;
  auto ds = Dataset::range(100).map(Fn::named("times_two"));
  auto splits = ds.make_split_provider(7);
  REQUIRE(splits.ok());
  auto a = ds.make_iterator(&f.registry, splits->get());
  auto b = ds.make_iterator(&f.registry, splits->get());
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  std::multiset<int64_t> seen;
  bool a_done = false, b_done = false;
  int from_a = 0, from_b = 0;
  while (!a_done || !b_done) {
    for (auto* it : {&*a, &*b}) {
      bool& done = it == &*a ? a_done : b_done;
      if (done) continue;
      auto next = (*it)->get_next();
      REQUIRE(next.ok());
      if (!next->has_value()) {
        done = true;
        continue;
      }
      seen.insert(as_int(**next));
      (it == &*a ? from_a : from_b)++;
    }
  }
  std::multiset<int64_t> expected;
  for (int64_t i = 0; i < 100; ++i) expected.insert(2 * i);
  CHECK(seen == expected);
  CHECK(from_a > 0);
  CHECK(from_b > 0);
}

TEST_CASE("file sources split by file", "[data][splits]") {
  TempDir dir;
  write_records(dir.file("0.tfrecord"), {"a", "b"});
  write_records(dir.file("1.tfrecord"), {"c"});
  auto ds = Dataset::list_files({dir.file("*.tfrecord")}, false).interleave(Fn::tfrecord_dataset(), 2);
  auto splits = ds.make_split_provider();
  REQUIRE(splits.ok());
  CHECK((*splits)->num_splits() == 2);
  auto it = ds.make_iterator(nullptr, splits->get());
  REQUIRE(it.ok());
  CHECK(testing::string_scalars(drain(**it)) == std::vector<std::string>{"a", "c", "b"});
  auto direct = Dataset::tfrecord_dataset({dir.file("0.tfrecord"), dir.file("1.tfrecord")});
  CHECK(direct.make_split_provider().value()->num_splits() == 2);
}

TEST_CASE("pipelines with an unsplittable source cannot be split", "[data][splits]") {
  auto two = Dataset::zip({Dataset::range(3), Dataset::range(4)}).make_split_provider();
  CHECK(two.status().code() == StatusCode::kFailedPrecondition);
  CHECK_THAT(two.status().message(), Catch::Contains("range, range") && Catch::Contains("make_split_providers"));
  auto tensors = Dataset::from_tensors(ints_element({1}, {1})).make_split_provider();
  CHECK(tensors.status().code() == StatusCode::kFailedPrecondition);
  CHECK_THAT(tensors.status().message(), Catch::Contains("from_tensors cannot be split"));
  auto mixed = Dataset::zip({Dataset::range(3), Dataset::from_tensors(ints_element({1}, {1}))}).make_split_providers();
  CHECK(mixed.status().code() == StatusCode::kFailedPrecondition);
  CHECK(Dataset::range(3).make_split_provider(0).status().code() == StatusCode::kInvalidArgument);
}

// Every element (component 0, and component 1 when there is one) that
// `readers` iterators sharing `ds`'s split providers produce, reading in
// turn; at most `limit` elements in all.
struct SplitRead {
  std::multiset<int64_t> first, second;
  std::vector<int> per_reader;
};
SplitRead read_with_splits(const Dataset& ds, int readers, int64_t limit = INT64_MAX) {
  auto providers = ds.make_split_providers();
  REQUIRE(providers.ok());
  std::vector<SplitProvider*> raw;
  for (auto& p : *providers) raw.push_back(p.get());
  std::vector<std::unique_ptr<Iterator>> its;
  for (int r = 0; r < readers; ++r) {
    auto it = ds.make_iterator(nullptr, raw);
    REQUIRE(it.ok());
    its.push_back(std::move(*it));
  }
  SplitRead out;
  out.per_reader.assign(static_cast<size_t>(readers), 0);
  std::vector<bool> done(static_cast<size_t>(readers), false);
  int64_t total = 0;
  for (int open = readers; open > 0 && total < limit;) {
    for (size_t r = 0; r < its.size() && total < limit; ++r) {
      if (done[r]) continue;
      auto next = its[r]->get_next();
      REQUIRE(next.ok());
      if (!next->has_value()) {
        done[r] = true;
        --open;
        continue;
      }
      out.first.insert((*next)->components.at(0).flat<int64_t>()[0]);
      if ((*next)->components.size() > 1) out.second.insert((*next)->components[1].flat<int64_t>()[0]);
      ++out.per_reader[r];
      ++total;
    }
  }
  return out;
}

std::multiset<int64_t> each_times(int64_t begin, int64_t end, int times) {
  std::multiset<int64_t> out;
  for (int t = 0; t < times; ++t) {
    for (int64_t i = begin; i < end; ++i) out.insert(i);
  }
  return out;
}

TEST_CASE("DYNAMIC splits with repeat: every element of every repetition once", "[data][splits]") {
  // TF resets the split provider per repetition: range(20).repeat(5) is 100
  // elements however many readers share the splits.
  auto ds = Dataset::range(20).repeat(5);
  CHECK(ds.make_split_provider().value()->num_splits() == 100);
  auto one = read_with_splits(ds, 1);
  CHECK(one.first == each_times(0, 20, 5));
  auto three = read_with_splits(ds, 3);
  CHECK(three.first == each_times(0, 20, 5));
  for (int n : three.per_reader) CHECK(n > 0);

  auto small = Dataset::range(3).repeat(2);
  CHECK(small.cardinality() == 6);
  auto provider = small.make_split_provider();
  REQUIRE(provider.ok());
  auto it = small.make_iterator(nullptr, provider->get());
  REQUIRE(it.ok());
  std::vector<int64_t> got;
  while (auto next = (*it)->get_next().value()) got.push_back(as_int(*next));
  CHECK(got == std::vector<int64_t>{0, 1, 2, 0, 1, 2});

  // repeat(0) and an empty input end at once, even repeated forever.
  CHECK(read_with_splits(Dataset::range(5).repeat(0), 2).first.empty());
  CHECK(read_with_splits(Dataset::range(0).repeat(), 2).first.empty());
}

TEST_CASE("DYNAMIC splits with an infinite repeat keep coming", "[data][splits]") {
  auto ds = Dataset::range(1).repeat();
  auto read = read_with_splits(ds, 5, 500);
  CHECK(read.first == each_times(0, 1, 500));
  for (int n : read.per_reader) CHECK(n == 100);
}

TEST_CASE("DYNAMIC splits of zip and concatenate: one provider per source", "[data][splits]") {
  auto zipped = Dataset::zip({Dataset::range(10), Dataset::range(100, 110)});
  auto providers = zipped.make_split_providers();
  REQUIRE(providers.ok());
  CHECK(providers->size() == 2);
  // One reader pairs the sources in order, as without splits.
  auto one = read_with_splits(zipped, 1);
  CHECK(one.first == each_times(0, 10, 1));
  CHECK(one.second == each_times(100, 110, 1));
  // Several readers: every element of each input once.
  auto three = read_with_splits(zipped, 3);
  CHECK(three.first == each_times(0, 10, 1));
  CHECK(three.second == each_times(100, 110, 1));

  auto concatenated = Dataset::range(100).concatenate(Dataset::range(100, 200));
  CHECK(concatenated.make_split_providers().value().size() == 2);
  auto two = read_with_splits(concatenated, 2);
  CHECK(two.first == each_times(0, 200, 1));
  CHECK(two.per_reader[0] > 0);
  CHECK(two.per_reader[1] > 0);
  // Repeated, through the concatenation.
  CHECK(read_with_splits(concatenated.repeat(3), 2).first == each_times(0, 200, 3));

  // One provider per source, or InvalidArgument.
  auto single = Dataset::range(3).make_split_provider();
  REQUIRE(single.ok());
  auto wrong = zipped.make_iterator(nullptr, single->get());
  CHECK(wrong.status().code() == StatusCode::kInvalidArgument);
  CHECK_THAT(wrong.status().message(), Catch::Contains("2 source(s) but 1 split provider(s)"));
}

// ---- save / load / snapshot (tf.data.Dataset.save, load, snapshot) -------------------

std::vector<std::vector<int64_t>> batches_of(const Dataset& ds) {
  auto it = ds.make_iterator();
  REQUIRE(it.ok());
  std::vector<std::vector<int64_t>> out;
  while (auto next = (*it)->get_next().value()) {
    auto flat = next->components.at(0).flat<int64_t>();
    out.emplace_back(flat.begin(), flat.end());
  }
  return out;
}

TEST_CASE("save then load gives back the elements in order, in shards, compressed or not", "[data][save]") {
  TempDir dir;
  auto ds = Dataset::range(100).batch(7);
  for (auto compression : {Compression::kNone, Compression::kGzip}) {
    std::string path = dir.file(compression == Compression::kGzip ? "gzip" : "plain");
    SaveOptions options;
    options.compression = compression;
    options.num_shards = 3;
    REQUIRE(ds.save(path, options).ok());
    CHECK(fs::exists(path + "/dataset_spec.json"));
    CHECK(fs::exists(path + "/shard_00002.tfrecord"));
    auto loaded = Dataset::load(path);
    REQUIRE(loaded.ok());
    CHECK(loaded->cardinality() == 15);
    CHECK(batches_of(*loaded) == batches_of(ds));
    CHECK(loaded->debug_string() == "load(" + path + ")");
    // A loaded dataset is a dataset like any other.
    CHECK(batches_of(loaded->take(2)) == batches_of(ds.take(2)));
  }
}

TEST_CASE("save refuses an existing path, load names what is missing or damaged", "[data][save]") {
  TempDir dir;
  REQUIRE(Dataset::range(3).save(dir.file("a")).ok());
  Status again = Dataset::range(3).save(dir.file("a"));
  CHECK(again.code() == StatusCode::kAlreadyExists);
  CHECK(Dataset::load(dir.file("none")).status().code() == StatusCode::kNotFound);
  {
    std::ofstream spec(dir.file("a") + "/dataset_spec.json", std::ios::trunc);
    spec << "{\"format\": \"capstan-saved-dataset-1\", \"num_elements\": 3}";
  }
  auto damaged = Dataset::load(dir.file("a"));
  CHECK(damaged.status().code() == StatusCode::kDataLoss);
  CHECK_THAT(damaged.status().message(), Catch::Contains("compression"));
}

TEST_CASE("a save that fails leaves nothing behind", "[data][save]") {
  TempDir dir;
  Functions f;
  SaveOptions options;
  options.functions = &f.registry;
  Status failed = Dataset::range(10).map(Fn::named("fail_on_3")).save(dir.file("out"), options);
  CHECK(failed.code() == StatusCode::kInvalidArgument);
  CHECK(fs::is_empty(dir.path()));
  CHECK(Dataset::load(dir.file("out")).status().code() == StatusCode::kNotFound);
}

TEST_CASE("a loaded dataset splits by shard for dynamic sharding", "[data][save][splits]") {
  TempDir dir;
  SaveOptions options;
  options.num_shards = 4;
  REQUIRE(Dataset::range(40).save(dir.file("s"), options).ok());
  auto loaded = Dataset::load(dir.file("s"));
  REQUIRE(loaded.ok());
  CHECK(loaded->make_split_provider().value()->num_splits() == 4);
  auto read = read_with_splits(*loaded, 2);
  CHECK(read.first == each_times(0, 40, 1));
  CHECK(read.per_reader[0] > 0);
  CHECK(read.per_reader[1] > 0);
}

TEST_CASE("snapshot: the first complete iteration writes, later ones read", "[data][save]") {
  TempDir dir;
  Functions f;
  auto ds = Dataset::range(5).map(Fn::named("count_calls")).snapshot(dir.file("snap"));
  CHECK(ds.cardinality() == 5);
  // An iteration that stops early leaves no snapshot.
  {
    auto it = ds.make_iterator(&f.registry);
    REQUIRE(it.ok());
    REQUIRE((*it)->get_next().ok());
  }
  CHECK(f.calls == 1);
  CHECK(drain_ints(ds, &f.registry) == std::vector<int64_t>{0, 1, 2, 3, 4});
  CHECK(f.calls == 6);
  // Later iterations, here or in another pipeline object, read the snapshot.
  CHECK(drain_ints(ds, &f.registry) == std::vector<int64_t>{0, 1, 2, 3, 4});
  auto again = Dataset::deserialize(ds.serialize());
  REQUIRE(again.ok());
  CHECK(drain_ints(*again, &f.registry) == std::vector<int64_t>{0, 1, 2, 3, 4});
  CHECK(f.calls == 6);
  // A different pipeline gets its own snapshot.
  auto other = Dataset::range(3).map(Fn::named("count_calls")).snapshot(dir.file("snap"));
  CHECK(drain_ints(other, &f.registry) == std::vector<int64_t>{0, 1, 2});
  CHECK(f.calls == 9);
  int snapshots = 0;
  for (const auto& entry : fs::directory_iterator(dir.file("snap"))) {
    CHECK(fs::exists(entry.path() / "dataset_spec.json"));
    ++snapshots;
  }
  CHECK(snapshots == 2);
  CHECK(ds.debug_string() == "range(0, 5, 1).map(count_calls).snapshot(" + dir.file("snap") + ")");
}

// ---- Memory budget: hostile sizes fail their pipeline, not the process ----------------

// The first error of `ds` (component 0 ignored), reading at most `limit`
// elements; OK when none came.
Status first_error(const Dataset& ds, int64_t limit = 10'000'000) {
  auto it = ds.make_iterator();
  if (!it.ok()) return it.status();
  for (int64_t i = 0; i < limit; ++i) {
    auto next = (*it)->get_next();
    if (!next.ok()) return next.status();
    if (!next->has_value()) return Status::Ok();
  }
  return Status::Ok();
}

Dataset with_budget(const Dataset& ds, int64_t bytes) {
  Options options;
  options.memory_budget = bytes;
  return ds.with_options(options);
}

TEST_CASE("buffers past the memory budget fail with ResourceExhausted naming the op", "[data][memory]") {
  const int64_t huge = int64_t{1} << 40;
  auto endless = Dataset::range(0, int64_t{1} << 62);
  for (auto [ds, op] : std::vector<std::pair<Dataset, std::string>>{
           {endless.shuffle(huge), "shuffle"},
           {endless.batch(huge), "batch"},
           {endless.padded_batch(huge, std::vector<Shape>{}), "padded_batch"},
           {endless.prefetch(huge), "prefetch"},
           {Dataset::range(1'000'000).cache().repeat(2), "cache"}}) {
    INFO(op);
    Status error = first_error(with_budget(ds, 1 << 20));
    CHECK(error.code() == StatusCode::kResourceExhausted);
    CHECK_THAT(error.message(), Catch::StartsWith(op + ":") && Catch::Contains("memory budget of 1 MiB"));
  }
  // The same pipelines fit once they are small enough.
  CHECK(first_error(with_budget(Dataset::range(1000).shuffle(1000).batch(10).prefetch(4), 1 << 20)).ok());
  // The error stays: a shuffle over budget does not start again.
  auto it = with_budget(endless.shuffle(huge), 1 << 20).make_iterator();
  REQUIRE(it.ok());
  CHECK((*it)->get_next().status().code() == StatusCode::kResourceExhausted);
  CHECK((*it)->get_next().status().code() == StatusCode::kResourceExhausted);
}

TEST_CASE("sizes that become threads or slots are bounded at validation", "[data][memory]") {
  Functions f;
  auto map = Dataset::range(10).map(Fn::named("times_two"), int64_t{1} << 40).make_iterator(&f.registry);
  CHECK(map.status().code() == StatusCode::kInvalidArgument);
  CHECK_THAT(map.status().message(), Catch::Contains("num_parallel_calls must be in [0, 1024]"));
  auto interleave = Dataset::range(10)
                        .interleave(Fn::named("range_of_x"), int64_t{1} << 31, int64_t{1} << 40)
                        .make_iterator(&f.registry);
  CHECK(interleave.status().code() == StatusCode::kInvalidArgument);
  CHECK_THAT(interleave.status().message(), Catch::Contains("cycle_length must be at most 1024"));
}

}  // namespace capstan::data
