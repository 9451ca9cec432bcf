// Iterator checkpointing (Iterator::save / restore), op by op, as TF's
// checkpoint tests do it: read k elements, save, and check that an iterator
// restored from the state yields exactly what the saved one goes on to yield
// (and, for deterministic pipelines, what an uninterrupted run yields after
// element k), at several break points: the start, inside buffers and
// epochs, and the end.
#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>
#include <thread>

#include "capstan/data/dataset.h"
#include "io/crc32c.h"
#include "data/io/tfrecord.h"
#include "data/test_util.h"
#include "rpc/tensor_codec.h"

namespace capstan::data {
namespace {

using testing::TempDir;

// An element, or an element's error, as one comparable string.
std::string describe(const Result<std::optional<Element>>& next) {
  if (!next.ok()) return "error " + std::string(status_code_name(next.status().code())) + ": " + next.status().message();
  return rpc::element_to_bytes(**next);
}

// Up to `limit` elements (errors included) until the end.
std::vector<std::string> drain(Iterator& it, size_t limit = SIZE_MAX) {
  std::vector<std::string> out;
  while (out.size() < limit) {
    auto next = it.get_next();
    if (next.ok() && !next->has_value()) break;
    out.push_back(describe(next));
  }
  return out;
}

std::unique_ptr<Iterator> iterator_of(const Dataset& ds, const FunctionRegistry* fns) {
  auto it = ds.make_iterator(fns);
  REQUIRE(it.ok());
  return std::move(*it);
}

enum class Order {
  kDeterministic,  // every run yields the same sequence
  kAsSaved,        // runs differ (unseeded randomness), but a restore continues the saved one exactly
  kAnyOrder,       // a restore yields the same elements, in any order (deterministic = false)
};

// For each break point k (past the end: the end), checks that the restored
// iterator continues where the saved one was.
void check_resumes(const Dataset& ds, const FunctionRegistry* fns, std::vector<size_t> breaks,
                   Order order = Order::kDeterministic) {
  auto full = drain(*iterator_of(ds, fns));
  REQUIRE(!full.empty());
  breaks.push_back(0);
  breaks.push_back(full.size());
  for (size_t k : breaks) {
    INFO("break after " << k << " of " << full.size() << " elements");
    auto saved = iterator_of(ds, fns);
    auto head = drain(*saved, k);
    auto state = saved->save();
    REQUIRE(state.ok());
    auto rest = drain(*saved);
    auto restored = iterator_of(ds, fns);
    Status status = restored->restore(*state);
    INFO(status.to_string());
    REQUIRE(status.ok());
    auto resumed = drain(*restored);
    if (order == Order::kAnyOrder) {
      std::sort(rest.begin(), rest.end());
      std::sort(resumed.begin(), resumed.end());
    }
    CHECK(resumed == rest);
    if (order == Order::kDeterministic) {
      head.insert(head.end(), rest.begin(), rest.end());
      CHECK(head == full);
    }
  }
}

Element column(std::vector<int64_t> values) {
  Element e;
  int64_t n = static_cast<int64_t>(values.size());
  e.components.push_back(testing::make<int64_t>(values, {n}));
  return e;
}

struct Functions {
  Functions() {
    registry.register_map("times_two", [](Element e) -> Result<Element> {
      return Element{{Tensor::scalar<int64_t>(2 * e.components[0].flat<int64_t>()[0])}, {}};
    });
    registry.register_map("fail_on_3", [](Element e) -> Result<Element> {
      if (e.components[0].flat<int64_t>()[0] % 10 == 3) return Status::InvalidArgument("three is bad");
      return e;
    });
    registry.register_map("slow", [](Element e) -> Result<Element> {
      std::this_thread::sleep_for(std::chrono::microseconds(100 * (e.components[0].flat<int64_t>()[0] % 3)));
      return e;
    });
    registry.register_map("range_of_x", [](Element e) -> Result<Element> {
      int64_t x = e.components[0].flat<int64_t>()[0];
      return Element{{*Tensor::from_vector<int64_t>(std::vector<int64_t>(static_cast<size_t>(x), x), {x})}, {}};
    });
    registry.register_filter("not_multiple_of_3", [](const Element& e) -> Result<bool> {
      return e.components[0].flat<int64_t>()[0] % 3 != 0;
    });
    registry.register_interleave("x_times_x", [](const Element& e) -> Result<Dataset> {
      return Dataset::from_tensors(e).repeat(e.components[0].flat<int64_t>()[0]).shuffle(3, 7);
    });
  }
  FunctionRegistry registry;
};

// Three TFRecord files of 10 records, "f<k>-<i>".
std::vector<std::string> record_files(const TempDir& dir, io::Compression compression = io::Compression::kNone) {
  std::vector<std::string> files;
  for (int k = 0; k < 3; ++k) {
    files.push_back(dir.file("data-" + std::to_string(k) + ".tfrecord"));
    auto writer = io::TFRecordWriter::open(files.back(), compression);
    REQUIRE(writer.ok());
    for (int i = 0; i < 10; ++i) REQUIRE((*writer)->write("f" + std::to_string(k) + "-" + std::to_string(i)).ok());
    REQUIRE((*writer)->close().ok());
  }
  return files;
}

TEST_CASE("Sources resume where they were saved", "[iterator_state]") {
  TempDir dir;
  check_resumes(Dataset::range(0, 50, 3), nullptr, {1, 7});
  check_resumes(Dataset::from_tensor_slices(column({5, 6, 7, 8})), nullptr, {2});
  check_resumes(Dataset::from_tensors(column({1, 2})), nullptr, {});

  auto files = record_files(dir);
  check_resumes(Dataset::tfrecord_dataset(files), nullptr, {1, 10, 11, 25});
  TempDir gz;
  check_resumes(Dataset::tfrecord_dataset(record_files(gz, io::Compression::kGzip), Compression::kGzip), nullptr,
                {4, 17});

  testing::write_bytes(dir.file("a.txt"), "one\ntwo\nthree\n");
  testing::write_bytes(dir.file("b.txt.gz"), testing::gzip("four\nfive\n"));
  check_resumes(Dataset::text_line_dataset({dir.file("a.txt")}), nullptr, {1, 2});
  check_resumes(Dataset::text_line_dataset({dir.file("b.txt.gz")}, Compression::kGzip), nullptr, {1});

  testing::write_bytes(dir.file("fixed.bin"), "HDRaaaabbbbccccddddFT");
  check_resumes(Dataset::fixed_length_record_dataset({dir.file("fixed.bin")}, 4, 3, 2), nullptr, {1, 3});

  // Unseeded: every run has its own order, and the saved list goes with the
  // state.
  check_resumes(Dataset::list_files({dir.path() + "/data-*"}), nullptr, {1}, Order::kAsSaved);
}

TEST_CASE("Element-wise and structural ops resume", "[iterator_state]") {
  Functions f;
  check_resumes(Dataset::range(20).map(Fn::named("times_two")).filter(Fn::named("not_multiple_of_3")), &f.registry,
                {3, 9});
  check_resumes(Dataset::range(10).batch(3), nullptr, {1, 3});
  check_resumes(Dataset::range(1, 8).map(Fn::named("range_of_x")).padded_batch(3, {{-1}}), &f.registry, {1});
  // Partial input batches stay in rebatch's state.
  check_resumes(Dataset::range(23).batch(5).rebatch(3), nullptr, {1, 2, 5});
  // Rows of the input element being split stay in unbatch's state.
  check_resumes(Dataset::range(23).batch(5).unbatch(), nullptr, {1, 3, 5, 7, 22});
  check_resumes(Dataset::range(23).batch(5).unbatch().batch(3), nullptr, {1, 2, 7});
  check_resumes(Dataset::range(30).shard(4, 1), nullptr, {0, 1, 5});
  check_resumes(Dataset::range(30).skip(7).take(12), nullptr, {1, 11});
  check_resumes(Dataset::zip({Dataset::range(10), Dataset::range(100, 108)}), nullptr, {4});
  check_resumes(Dataset::range(5).concatenate(Dataset::range(50, 53)), nullptr, {4, 5, 6});
  // Errors of single elements are part of the sequence.
  check_resumes(Dataset::range(25).map(Fn::named("fail_on_3")), &f.registry, {3, 4, 14});
}

TEST_CASE("Shuffle resumes with its buffer and random state, epochs included", "[iterator_state]") {
  // Seeded with a reshuffle per epoch: the epoch counter is saved too, so the
  // third epoch after a restore in the second is the third epoch's order.
  check_resumes(Dataset::range(20).shuffle(8, 42).repeat(3), nullptr, {5, 20, 27, 40});
  check_resumes(Dataset::range(20).shuffle(8, 42, false).repeat(2), nullptr, {25});
  check_resumes(Dataset::range(30).shuffle(10).batch(4), nullptr, {2, 5}, Order::kAsSaved);
  check_resumes(Dataset::range(6).repeat().take(20), nullptr, {6, 13});
}

TEST_CASE("Caches resume: filling, reading, and in a later epoch", "[iterator_state]") {
  TempDir dir;
  // In memory: a break inside the first epoch (filling, elements saved) and
  // in the later ones (reading the cache, the cache saved with the state).
  check_resumes(Dataset::range(10).shuffle(4, 1).cache().repeat(3), nullptr, {4, 10, 15, 29});
  // In a file: the second run reads the file; a restored run that was writing
  // reads on from its input.
  auto cached = Dataset::range(12).cache(dir.file("cache"));
  check_resumes(cached, nullptr, {5});
  REQUIRE(std::filesystem::exists(dir.file("cache")));
  check_resumes(cached, nullptr, {1, 7});
  check_resumes(Dataset::range(9).snapshot(dir.file("snap")), nullptr, {4});
  check_resumes(Dataset::range(9).snapshot(dir.file("snap")), nullptr, {4});

  REQUIRE(Dataset::range(17).save(dir.file("saved"), {}).ok());
  auto loaded = Dataset::load(dir.file("saved"));
  REQUIRE(loaded.ok());
  check_resumes(*loaded, nullptr, {1, 8});
}

TEST_CASE("Ops with threads resume with what their threads had buffered", "[iterator_state]") {
  Functions f;
  for (int64_t parallel : {int64_t{3}, kAutotune}) {
    INFO("num_parallel_calls " << parallel);
    check_resumes(Dataset::range(60).map(Fn::named("slow"), parallel), &f.registry, {1, 10, 33});
    // Fused with batch (map_and_batch), with an error inside the buffer.
    check_resumes(Dataset::range(47).map(Fn::named("fail_on_3"), parallel).batch(5), &f.registry, {1, 4});
  }
  check_resumes(Dataset::range(40).map(Fn::named("slow"), 4, false), &f.registry, {7}, Order::kAnyOrder);
  check_resumes(Dataset::range(100).prefetch(8), nullptr, {1, 50});
  check_resumes(Dataset::range(100).prefetch(kAutotune).map(Fn::named("times_two"), 2).prefetch(2), &f.registry,
                {1, 20});
}

TEST_CASE("Interleave resumes every open dataset of its cycle", "[iterator_state]") {
  Functions f;
  TempDir dir;
  auto files = record_files(dir);
  check_resumes(Dataset::range(1, 7).interleave(Fn::named("x_times_x"), 3, 2), &f.registry, {1, 5, 12});
  check_resumes(Dataset::list_files({dir.path() + "/*.tfrecord"}, false).interleave(Fn::tfrecord_dataset(), 2, 3),
                &f.registry, {4, 13});
  check_resumes(Dataset::range(1, 7).interleave(Fn::named("x_times_x"), 3, 2, 3, true), &f.registry, {1, 9});
  check_resumes(Dataset::list_files({dir.path() + "/*.tfrecord"}, true, 5)
                    .interleave(Fn::tfrecord_dataset(), 2, 1, 2, false),
                &f.registry, {6}, Order::kAnyOrder);
}

TEST_CASE("A whole input pipeline resumes after a save in the middle", "[iterator_state]") {
  Functions f;
  TempDir dir;
  auto files = record_files(dir);
  auto pipeline = Dataset::list_files({dir.path() + "/*.tfrecord"}, true, 3)
                      .interleave(Fn::tfrecord_dataset(), 2, 2, 2, true)
                      .shuffle(7, 11)
                      .batch(4)
                      .repeat(2)
                      .prefetch(3);
  check_resumes(pipeline, &f.registry, {1, 3, 8, 11});
}

// `state` (of a pipeline with one range) with the range's next value set to
// `next`, sealed again: the range's record is its op name, then the value
// as 8 little-endian bytes; the last 8 bytes are the checksum.
std::string with_range_next(const std::string& state, int64_t next) {
  std::string s = state.substr(0, state.size() - 8);
  const size_t at = s.find("range") + 5;
  for (int i = 0; i < 8; ++i) s[at + i] = static_cast<char>((static_cast<uint64_t>(next) >> (8 * i)) & 0xff);
  const uint64_t crc = capstan::io::crc32c_mask(capstan::io::crc32c(s.data(), s.size()));
  for (int i = 0; i < 8; ++i) s.push_back(static_cast<char>((crc >> (8 * i)) & 0xff));
  return s;
}

TEST_CASE("A range state whose position the range never reaches is refused (no near-endless stream)",
          "[iterator_state]") {
  auto it = iterator_of(Dataset::range(1, 30), nullptr);
  REQUIRE(it->get_next().ok());
  REQUIRE(it->get_next().ok());
  auto state = it->save();
  REQUIRE(state.ok());
  auto with_next = [&state](int64_t next) { return with_range_next(*state, next); };
  REQUIRE(iterator_of(Dataset::range(1, 30), nullptr)->restore(with_next(3)).ok());  // the seal is right
  for (int64_t bad : {int64_t{-1000}, int64_t{0}, int64_t{31}, INT64_MIN}) {
    INFO(bad);
    Status s = iterator_of(Dataset::range(1, 30), nullptr)->restore(with_next(bad));
    CHECK(s.code() == StatusCode::kInvalidArgument);
    CHECK(testing::message_contains(s, "the next value"));
  }
  // A value past stop within a step is where a finished range stands.
  auto stepped = iterator_of(Dataset::range(0, 50, 3), nullptr);
  for (int i = 0; i < 17; ++i) REQUIRE(stepped->get_next().ok());
  auto end_state = stepped->save();
  REQUIRE(end_state.ok());
  REQUIRE(iterator_of(Dataset::range(0, 50, 3), nullptr)->restore(*end_state).ok());
  // Not start plus a multiple of step.
  auto odd = iterator_of(Dataset::range(0, 50, 3), nullptr);
  REQUIRE(odd->get_next().ok());
  auto odd_state = odd->save();
  REQUIRE(odd_state.ok());
  Status s = iterator_of(Dataset::range(0, 50, 3), nullptr)->restore(with_range_next(*odd_state, 4));  // not 3
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK(testing::message_contains(s, "multiple of step 3"));
}

TEST_CASE("A state from another dataset, damaged bytes, or a late restore are refused", "[iterator_state]") {
  auto it = iterator_of(Dataset::range(10).batch(2), nullptr);
  REQUIRE(it->get_next().ok());
  auto state = it->save();
  REQUIRE(state.ok());

  auto other = iterator_of(Dataset::range(10).batch(3), nullptr);
  Status s = other->restore(*state);
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK(testing::message_contains(s, "different dataset definition"));
  // The failed iterator says so instead of running from the start.
  CHECK(other->get_next().status().code() == StatusCode::kFailedPrecondition);

  std::string damaged = *state;
  damaged[damaged.size() / 2] ^= 0x40;
  s = iterator_of(Dataset::range(10).batch(2), nullptr)->restore(damaged);
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK(testing::message_contains(s, "checksum"));

  s = iterator_of(Dataset::range(10).batch(2), nullptr)->restore(state->substr(0, 20));
  CHECK(s.code() == StatusCode::kInvalidArgument);
  s = iterator_of(Dataset::range(10).batch(2), nullptr)->restore("");
  CHECK(testing::message_contains(s, "Iterator::save()"));

  auto started = iterator_of(Dataset::range(10).batch(2), nullptr);
  REQUIRE(started->get_next().ok());
  CHECK(started->restore(*state).code() == StatusCode::kFailedPrecondition);

  // A restored iterator continues: element 1 of range(10).batch(2) is [2, 3].
  auto restored = iterator_of(Dataset::range(10).batch(2), nullptr);
  REQUIRE(restored->restore(*state).ok());
  auto next = restored->get_next();
  REQUIRE(next.ok());
  CHECK(testing::values<int64_t>((*next)->components[0]) == std::vector<int64_t>{2, 3});
}

TEST_CASE("A file that changed since the save is DataLoss, not a wrong position", "[iterator_state]") {
  TempDir dir;
  auto files = record_files(dir);
  auto ds = Dataset::tfrecord_dataset(files);
  auto it = iterator_of(ds, nullptr);
  for (int i = 0; i < 8; ++i) REQUIRE(it->get_next().ok());
  auto state = it->save();
  REQUIRE(state.ok());
  {
    auto writer = io::TFRecordWriter::open(files[0], io::Compression::kNone);
    REQUIRE(writer.ok());
    REQUIRE((*writer)->write("short").ok());
    REQUIRE((*writer)->close().ok());
  }
  Status s = iterator_of(ds, nullptr)->restore(*state);
  CHECK(s.code() == StatusCode::kDataLoss);
  CHECK(testing::message_contains(s, files[0]));
}

TEST_CASE("Saving pauses threads without losing or repeating elements", "[iterator_state]") {
  Functions f;
  // Many saves while parallel map and prefetch threads run: the sequence read
  // through all of them is the uninterrupted one.
  auto ds = Dataset::range(400).map(Fn::named("slow"), 4).prefetch(16).map(Fn::named("times_two"), 2);
  auto it = iterator_of(ds, &f.registry);
  std::vector<int64_t> got;
  while (true) {
    if (got.size() % 7 == 0) REQUIRE(it->save().ok());
    auto next = it->get_next();
    REQUIRE(next.ok());
    if (!next->has_value()) break;
    got.push_back((*next)->components[0].flat<int64_t>()[0]);
  }
  REQUIRE(got.size() == 400);
  for (int64_t i = 0; i < 400; ++i) CHECK(got[static_cast<size_t>(i)] == 2 * i);
}

}  // namespace
}  // namespace capstan::data
