#include "checkpoint/checkpoint.h"

#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <string>
#include <vector>

#include "io/crc32c.h"
#include "io/memory_file_system.h"
#include "data/tensor_util.h"
#include "data/test_util.h"

namespace capstan::checkpoint {
namespace {

using data::testing::make;
using data::testing::make_strings;
using data::testing::message_contains;
using data::testing::read_bytes;
using data::testing::TempDir;
using data::testing::write_bytes;

bool exists(const std::string& path) { return ::access(path.c_str(), F_OK) == 0; }

// A float32 tensor of `shape` holding start, start + 1, ...
Tensor iota(Shape shape, float start) {
  std::vector<float> values(static_cast<size_t>(shape_num_elements(shape)));
  for (size_t i = 0; i < values.size(); ++i) values[i] = start + static_cast<float>(i);
  return make<float>(values, std::move(shape));
}

// A variable to save: its value, how it is split, and its slots.
struct Variable {
  std::string name;
  Tensor value;
  std::vector<int64_t> partitioning;
  std::map<std::string, Tensor> slots;
};

// Adds the files of `variables` to `writer`, shard i of each in file
// ps-<i % num_ps>.safetensors, as PS tasks would; the manifest to commit.
Result<Manifest> add_files(CheckpointWriter& writer, int64_t step, const std::vector<Variable>& variables,
                           int num_ps) {
  Manifest manifest;
  std::map<std::string, std::vector<std::pair<std::string, Tensor>>> files;
  for (const auto& v : variables) {
    ManifestVariable mv;
    mv.name = v.name;
    mv.dtype = v.value.dtype();
    mv.shape = v.value.shape();
    mv.partitioning = v.partitioning;
    mv.optimizer = Optimizer::adagrad(0.5);
    mv.optimizer_step = step;
    for (const auto& [slot, tensor] : v.slots) mv.slots.push_back(slot);
    int64_t first_row = 0;
    for (size_t i = 0; i < v.partitioning.size(); ++i) {
      const std::string file = "ps-" + std::to_string(i % num_ps) + ".safetensors";
      const int64_t rows = v.partitioning[i];
      ManifestShard shard{v.partitioning.size() == 1 ? v.name : shard_name(v.name, i), file,
                          first_row, rows};
      auto piece = [&](const Tensor& t) {
        return t.rank() == 0 ? t : *data::slice_rows(t, first_row, first_row + rows);
      };
      files[file].emplace_back(shard.name, piece(v.value));
      for (const auto& [slot, tensor] : v.slots) {
        files[file].emplace_back(slot_tensor_name(shard.name, slot), piece(tensor));
      }
      mv.shards.push_back(shard);
      first_row += rows;
    }
    manifest.variables.push_back(std::move(mv));
  }
  for (const auto& [file, tensors] : files) {
    CAPSTAN_RETURN_IF_ERROR(writer.add_file(file, tensors, {{"step", std::to_string(step)}}));
  }
  return manifest;
}

// Saves `variables` as checkpoint `step` of `dir` (see add_files), through `fs`.
Status save(const std::string& dir, int64_t step, int max_to_keep,
            const std::vector<Variable>& variables, int num_ps = 2,
            io::FileSystem& fs = io::local_file_system()) {
  CAPSTAN_ASSIGN_OR_RETURN(auto writer, CheckpointWriter::begin(dir, step, max_to_keep, fs));
  CAPSTAN_ASSIGN_OR_RETURN(Manifest manifest, add_files(*writer, step, variables, num_ps));
  return writer->commit(std::move(manifest));
}

// "w": 13 x 4 in shards [3, 3, 3, 2, 2] with an "accumulator" slot.
Variable sample_w() {
  return {"w", iota({13, 4}, 0), {3, 3, 3, 2, 2}, {{"accumulator", iota({13, 4}, 1000)}}};
}

std::unique_ptr<CheckpointReader> open_ok(const std::string& path,
                                          CheckpointReaderOptions options = {}) {
  auto reader = CheckpointReader::open(path, options);
  INFO(reader.status().to_string());
  REQUIRE(reader.ok());
  return std::move(*reader);
}

// Opening checkpoint `path` fails with DataLoss saying it is damaged and
// naming `file`.
void require_damaged(const std::string& path, const std::string& file,
                     const std::string& why = "") {
  auto reader = CheckpointReader::open(path);
  REQUIRE_FALSE(reader.ok());
  INFO(reader.status().to_string());
  CHECK(reader.status().code() == StatusCode::kDataLoss);
  CHECK(message_contains(reader.status(), "checkpoint " + path + " is damaged"));
  CHECK(message_contains(reader.status(), file));
  CHECK(message_contains(reader.status(), why));
}

void flip_byte(const std::string& path, size_t offset) {
  std::string bytes = read_bytes(path);
  REQUIRE(offset < bytes.size());
  bytes[offset] = static_cast<char>(bytes[offset] ^ 0x01);
  write_bytes(path, bytes);
}

// Rewrites the manifest of checkpoint `path` through `edit`.
template <typename Edit>
void edit_manifest(const std::string& path, Edit edit) {
  const std::string file = path + "/manifest.json";
  auto manifest = parse_manifest(read_bytes(file), file);
  REQUIRE(manifest.ok());
  edit(*manifest);
  write_bytes(file, to_json(*manifest));
}

// ------------------------------------------------------------ round trips

TEST_CASE("checkpoint: a variable split [3,3,3,2,2] over two files reads back whole") {
  TempDir dir;
  const Variable w = sample_w();
  REQUIRE(save(dir.path(), 5, 0, {w}).ok());
  auto reader = open_ok(dir.file("ckpt-5"));
  CHECK(reader->manifest().step == 5);
  const ManifestVariable* mv = reader->manifest().find_variable("w");
  REQUIRE(mv != nullptr);
  CHECK(mv->partitioning == std::vector<int64_t>{3, 3, 3, 2, 2});
  CHECK(mv->shards[1].file == "ps-1.safetensors");

  auto value = reader->read_variable("w");
  REQUIRE(value.ok());
  CHECK(value->equals(w.value));
  auto accumulator = reader->read_slot("w", "accumulator");
  REQUIRE(accumulator.ok());
  CHECK(accumulator->equals(w.slots.at("accumulator")));
}

TEST_CASE("checkpoint: read_variable_rows reads any rows, across shard boundaries") {
  TempDir dir;
  const Variable w = sample_w();
  REQUIRE(save(dir.path(), 5, 0, {w}).ok());
  auto reader = open_ok(dir.file("ckpt-5"));
  for (int64_t begin = 0; begin <= 13; ++begin) {
    for (int64_t end = begin; end <= 13; ++end) {
      INFO("rows [" << begin << ", " << end << ")");
      auto rows = reader->read_variable_rows("w", begin, end);
      REQUIRE(rows.ok());
      CHECK(rows->equals(*data::slice_rows(w.value, begin, end)));
      auto slot_rows = reader->read_slot_rows("w", "accumulator", begin, end);
      REQUIRE(slot_rows.ok());
      CHECK(slot_rows->equals(*data::slice_rows(w.slots.at("accumulator"), begin, end)));
    }
  }
}

TEST_CASE("checkpoint: restoring into a different partitioning reassembles the variable") {
  TempDir dir;
  const Variable w = sample_w();
  REQUIRE(save(dir.path(), 5, 0, {w}, /*num_ps=*/2).ok());
  auto reader = open_ok(dir.file("ckpt-5"));
  // Three new PS tasks holding [5, 4, 4] rows, then one holding all of them.
  std::vector<Tensor> parts;
  int64_t row = 0;
  for (int64_t rows : {5, 4, 4}) {
    auto part = reader->read_variable_rows("w", row, row + rows);
    REQUIRE(part.ok());
    parts.push_back(*part);
    row += rows;
  }
  auto whole = data::concat_rows({&parts[0], &parts[1], &parts[2]});
  REQUIRE(whole.ok());
  CHECK(whole->equals(w.value));

  REQUIRE(save(dir.path(), 6, 0, {{"w", *whole, {13}, {}}}, /*num_ps=*/1).ok());
  auto resaved = open_ok(dir.file("ckpt-6"));
  CHECK(resaved->read_variable("w")->equals(w.value));
}

TEST_CASE("checkpoint: scalar, string and empty variables round-trip") {
  TempDir dir;
  const Tensor step = Tensor::scalar<int64_t>(42);
  const Tensor vocab = make_strings({"the", "", "quick", "brown", "fox"}, {5});
  const Tensor empty = make<float>({}, {0, 3});
  REQUIRE(save(dir.path(), 1, 0,
               {{"global_step", step, {1}, {}},
                {"vocab", vocab, {2, 3}, {}},
                {"empty", empty, {0, 0}, {{"m", empty}}}})
              .ok());
  auto reader = open_ok(dir.file("ckpt-1"));
  CHECK(reader->read_variable("global_step")->equals(step));
  CHECK(reader->read_variable("vocab")->equals(vocab));
  CHECK(reader->read_variable_rows("vocab", 1, 4)->equals(*data::slice_rows(vocab, 1, 4)));
  CHECK(reader->read_variable("empty")->equals(empty));
  CHECK(reader->read_slot("empty", "m")->equals(empty));
}

TEST_CASE("checkpoint: unknown names are NotFound, bad row ranges InvalidArgument") {
  TempDir dir;
  REQUIRE(save(dir.path(), 5, 0, {sample_w(), {"s", Tensor::scalar<float>(1), {1}, {}}}).ok());
  auto reader = open_ok(dir.file("ckpt-5"));
  CHECK(reader->read_variable("nope").status().code() == StatusCode::kNotFound);
  CHECK(reader->read_slot("w", "momentum").status().code() == StatusCode::kNotFound);
  CHECK(reader->read_slot("nope", "accumulator").status().code() == StatusCode::kNotFound);
  CHECK(reader->read_slot_rows("w", "momentum", 0, 1).status().code() == StatusCode::kNotFound);
  CHECK(reader->read_variable_rows("nope", 0, 1).status().code() == StatusCode::kNotFound);
  CHECK(reader->read_variable_rows("w", 0, 14).status().code() == StatusCode::kInvalidArgument);
  CHECK(reader->read_variable_rows("w", -1, 2).status().code() == StatusCode::kInvalidArgument);
  CHECK(reader->read_variable_rows("w", 3, 2).status().code() == StatusCode::kInvalidArgument);
  CHECK(reader->read_variable_rows("s", 0, 1).status().code() == StatusCode::kInvalidArgument);
}

// ------------------------------------------------------------ the directory

TEST_CASE("checkpoint: commit lays out the directory and checksums every file") {
  TempDir dir;
  REQUIRE(save(dir.path(), 5, 0, {sample_w()}).ok());
  const std::string ckpt = dir.file("ckpt-5");
  CHECK(exists(ckpt + "/manifest.json"));
  CHECK_FALSE(exists(dir.file("ckpt-5.tmp")));
  auto reader = open_ok(ckpt);
  const auto& files = reader->manifest().files;
  REQUIRE(files.size() == 2);
  for (const auto& file : files) {
    const std::string bytes = read_bytes(ckpt + "/" + file.name);
    CHECK(file.size == bytes.size());
    CHECK(file.crc32c == io::crc32c(bytes.data(), bytes.size()));
  }
  CHECK(files[0].name == "ps-0.safetensors");
  CHECK(files[1].name == "ps-1.safetensors");
  auto index = read_checkpoint_index(dir.path());
  REQUIRE(index.ok());
  CHECK(*index == CheckpointIndex{"ckpt-5", {"ckpt-5"}});
}

TEST_CASE("checkpoint: max_to_keep=2 keeps the two newest and updates the index") {
  TempDir dir;
  for (int64_t step : {10, 20, 30}) REQUIRE(save(dir.path(), step, 2, {sample_w()}).ok());
  auto all = list_checkpoints(dir.path());
  REQUIRE(all.ok());
  CHECK(*all == std::vector<std::string>{dir.file("ckpt-20"), dir.file("ckpt-30")});
  CHECK_FALSE(exists(dir.file("ckpt-10")));
  CHECK(*latest_checkpoint(dir.path()) == dir.file("ckpt-30"));
  auto index = read_checkpoint_index(dir.path());
  REQUIRE(index.ok());
  CHECK(*index == CheckpointIndex{"ckpt-30", {"ckpt-20", "ckpt-30"}});
}

TEST_CASE("checkpoint: max_to_keep 0 keeps every checkpoint") {
  TempDir dir;
  for (int64_t step : {1, 2, 3}) REQUIRE(save(dir.path(), step, 0, {sample_w()}).ok());
  CHECK(list_checkpoints(dir.path())->size() == 3);
  CHECK(read_checkpoint_index(dir.path())->kept ==
        std::vector<std::string>{"ckpt-1", "ckpt-2", "ckpt-3"});
}

TEST_CASE("checkpoint: list_checkpoints orders by step and skips other entries") {
  TempDir dir;
  for (int64_t step : {10, 9, 100}) REQUIRE(save(dir.path(), step, 0, {sample_w()}).ok());
  REQUIRE(::mkdir(dir.file("ckpt-7.tmp").c_str(), 0755) == 0);
  REQUIRE(::mkdir(dir.file("ckpt-x").c_str(), 0755) == 0);
  REQUIRE(::mkdir(dir.file("ckpt--3").c_str(), 0755) == 0);
  REQUIRE(::mkdir(dir.file("ckpt-08").c_str(), 0755) == 0);
  write_bytes(dir.file("ckpt-50"), "a file, not a checkpoint");
  auto all = list_checkpoints(dir.path() + "/");
  REQUIRE(all.ok());
  CHECK(*all ==
        std::vector<std::string>{dir.file("ckpt-9"), dir.file("ckpt-10"), dir.file("ckpt-100")});
}

TEST_CASE("checkpoint: latest_checkpoint of an empty or missing directory is NotFound") {
  TempDir dir;
  CHECK(latest_checkpoint(dir.path()).status().code() == StatusCode::kNotFound);
  CHECK(latest_checkpoint(dir.file("missing")).status().code() == StatusCode::kNotFound);
  CHECK(list_checkpoints(dir.file("missing")).status().code() == StatusCode::kNotFound);
  CHECK(list_checkpoints(dir.path())->empty());
}

TEST_CASE("checkpoint: the index is NotFound before the first save, DataLoss when damaged") {
  TempDir dir;
  CHECK(read_checkpoint_index(dir.path()).status().code() == StatusCode::kNotFound);
  write_bytes(dir.file("checkpoint"), "{\"latest\": ");
  auto index = read_checkpoint_index(dir.path());
  CHECK(index.status().code() == StatusCode::kDataLoss);
  CHECK(message_contains(index.status(), dir.file("checkpoint")));
}

TEST_CASE("checkpoint: a leftover .tmp directory is ignored, then cleaned by the next commit") {
  TempDir dir;
  REQUIRE(save(dir.path(), 2, 0, {sample_w()}).ok());
  // What a save of step 3 that crashed before its rename leaves.
  REQUIRE(::mkdir(dir.file("ckpt-3.tmp").c_str(), 0755) == 0);
  write_bytes(dir.file("ckpt-3.tmp/ps-0.safetensors"), "half a file");
  CHECK(*latest_checkpoint(dir.path()) == dir.file("ckpt-2"));
  CHECK(list_checkpoints(dir.path())->size() == 1);

  REQUIRE(save(dir.path(), 4, 0, {sample_w()}).ok());
  CHECK_FALSE(exists(dir.file("ckpt-3.tmp")));
  CHECK(*latest_checkpoint(dir.path()) == dir.file("ckpt-4"));
}

TEST_CASE("checkpoint: begin replaces the .tmp directory a crashed save of its step left") {
  TempDir dir;
  REQUIRE(::mkdir(dir.file("ckpt-3.tmp").c_str(), 0755) == 0);
  write_bytes(dir.file("ckpt-3.tmp/stale.safetensors"), "stale");
  REQUIRE(save(dir.path(), 3, 0, {sample_w()}).ok());
  auto reader = open_ok(dir.file("ckpt-3"));
  CHECK(reader->manifest().files.size() == 2);  // not stale.safetensors
  CHECK_FALSE(exists(dir.file("ckpt-3/stale.safetensors")));
}

TEST_CASE("checkpoint: a writer dropped without commit removes its .tmp directory") {
  TempDir dir;
  {
    auto writer = CheckpointWriter::begin(dir.path(), 8, 0);
    REQUIRE(writer.ok());
    REQUIRE((*writer)->add_file("ps-0.safetensors", {{"x", Tensor::scalar<float>(1)}}).ok());
    CHECK(exists(dir.file("ckpt-8.tmp/ps-0.safetensors")));
    CHECK((*writer)->path() == dir.file("ckpt-8.tmp"));
    CHECK((*writer)->checkpoint_path() == dir.file("ckpt-8"));
  }
  CHECK_FALSE(exists(dir.file("ckpt-8.tmp")));
  CHECK(latest_checkpoint(dir.path()).status().code() == StatusCode::kNotFound);
}

TEST_CASE("checkpoint: begin creates missing parent directories") {
  TempDir dir;
  REQUIRE(save(dir.file("a/b/c"), 1, 0, {sample_w()}).ok());
  CHECK(*latest_checkpoint(dir.file("a/b/c")) == dir.file("a/b/c/ckpt-1"));
}

TEST_CASE("checkpoint: an existing step is AlreadyExists") {
  TempDir dir;
  REQUIRE(save(dir.path(), 5, 0, {sample_w()}).ok());
  auto writer = CheckpointWriter::begin(dir.path(), 5, 0);
  CHECK(writer.status().code() == StatusCode::kAlreadyExists);
  CHECK(message_contains(writer.status(), "ckpt-5"));
}

TEST_CASE("checkpoint: a step that appears during the save is AlreadyExists at commit") {
  TempDir dir;
  auto writer = CheckpointWriter::begin(dir.path(), 5, 0);
  REQUIRE(writer.ok());
  REQUIRE(::mkdir(dir.file("ckpt-5").c_str(), 0755) == 0);
  write_bytes(dir.file("ckpt-5/other"), "another writer's");
  CHECK((*writer)->commit(Manifest{}).code() == StatusCode::kAlreadyExists);
  CHECK(read_bytes(dir.file("ckpt-5/other")) == "another writer's");
}

TEST_CASE("checkpoint: a negative step is InvalidArgument") {
  TempDir dir;
  CHECK(CheckpointWriter::begin(dir.path(), -1, 0).status().code() == StatusCode::kInvalidArgument);
}

TEST_CASE("checkpoint: commit refuses a manifest the files do not back, and can be retried") {
  TempDir dir;
  auto begun = CheckpointWriter::begin(dir.path(), 5, 0);
  REQUIRE(begun.ok());
  CheckpointWriter& writer = **begun;
  REQUIRE(writer.add_file("ps-0.safetensors", {{"v", iota({2, 3}, 0)}}).ok());

  ManifestVariable v;
  v.name = "v";
  v.dtype = DType::kFloat32;
  v.shape = {2, 3};
  v.partitioning = {2};
  v.shards = {{"v", "ps-0.safetensors", 0, 2}};
  auto commit_with = [&writer](ManifestVariable var) {
    Manifest m;
    m.variables = {std::move(var)};
    return writer.commit(std::move(m));
  };

  ManifestVariable missing_tensor = v;
  missing_tensor.shards[0].name = "u";
  Status status = commit_with(missing_tensor);
  CHECK(status.code() == StatusCode::kInvalidArgument);
  CHECK(message_contains(status, "file ps-0.safetensors has no tensor 'u'"));

  ManifestVariable wrong_shape = v;
  wrong_shape.shape = {2, 4};
  status = commit_with(wrong_shape);
  CHECK(status.code() == StatusCode::kInvalidArgument);
  CHECK(message_contains(status, "is float32 [2, 3]; the manifest says float32 [2, 4]"));

  ManifestVariable missing_slot = v;
  missing_slot.slots = {"m"};
  status = commit_with(missing_slot);
  CHECK(status.code() == StatusCode::kInvalidArgument);
  CHECK(message_contains(status, "no tensor 'v/slot/m'"));

  ManifestVariable missing_file = v;
  missing_file.shards[0].file = "ps-1.safetensors";
  status = commit_with(missing_file);
  CHECK(status.code() == StatusCode::kInvalidArgument);
  CHECK(message_contains(status, "'ps-1.safetensors' is not in files"));

  CHECK_FALSE(exists(dir.file("ckpt-5")));
  REQUIRE(commit_with(v).ok());
  CHECK(open_ok(dir.file("ckpt-5"))->read_variable("v")->equals(iota({2, 3}, 0)));
}

TEST_CASE("checkpoint: a file that is not safetensors fails the commit") {
  TempDir dir;
  auto writer = CheckpointWriter::begin(dir.path(), 5, 0);
  REQUIRE(writer.ok());
  write_bytes((*writer)->path() + "/ps-0.safetensors", "not safetensors");
  Manifest m;
  m.variables = {{"v", DType::kFloat32, {1}, {1}, {{"v", "ps-0.safetensors", 0, 1}}, {}, {}, 0, std::nullopt}};
  Status status = (*writer)->commit(m);
  CHECK(status.code() == StatusCode::kDataLoss);
  CHECK(message_contains(status, "ps-0.safetensors"));
}

TEST_CASE("checkpoint: a subdirectory in the save fails the commit") {
  TempDir dir;
  auto writer = CheckpointWriter::begin(dir.path(), 5, 0);
  REQUIRE(writer.ok());
  REQUIRE(::mkdir(((*writer)->path() + "/sub").c_str(), 0755) == 0);
  CHECK((*writer)->commit(Manifest{}).code() == StatusCode::kFailedPrecondition);
}

TEST_CASE("checkpoint: commit and add_file after a commit are FailedPrecondition") {
  TempDir dir;
  auto writer = CheckpointWriter::begin(dir.path(), 5, 0);
  REQUIRE(writer.ok());
  REQUIRE((*writer)->commit(Manifest{}).ok());
  CHECK((*writer)->commit(Manifest{}).code() == StatusCode::kFailedPrecondition);
  CHECK((*writer)->add_file("ps-0.safetensors", {}).code() == StatusCode::kFailedPrecondition);
  CHECK(open_ok(dir.file("ckpt-5"))->manifest().variables.empty());
}

TEST_CASE("checkpoint: add_file refuses names that are not plain data file names") {
  TempDir dir;
  auto writer = CheckpointWriter::begin(dir.path(), 5, 0);
  REQUIRE(writer.ok());
  for (const char* name : {"", ".", "..", "a/b", "../escape", "manifest.json", "x.tmp"}) {
    INFO(name);
    CHECK((*writer)->add_file(name, {}).code() == StatusCode::kInvalidArgument);
  }
  REQUIRE((*writer)->add_file("ps-0.safetensors", {}).ok());
  CHECK((*writer)->add_file("ps-0.safetensors", {}).code() == StatusCode::kInvalidArgument);
}

TEST_CASE("checkpoint: files that other processes wrote into path() are checksummed too") {
  TempDir dir;
  auto writer = CheckpointWriter::begin(dir.path(), 5, 0);
  REQUIRE(writer.ok());
  // Two PS tasks write their own files; the coordinator commits.
  REQUIRE(
      write_safetensors((*writer)->path() + "/ps-0.safetensors", {{"v/part_0", iota({2}, 0)}}, {})
          .ok());
  REQUIRE(
      write_safetensors((*writer)->path() + "/ps-1.safetensors", {{"v/part_1", iota({1}, 2)}}, {})
          .ok());
  Manifest m;
  m.variables = {{"v",
                  DType::kFloat32,
                  {3},
                  {2, 1},
                  {{"v/part_0", "ps-0.safetensors", 0, 2}, {"v/part_1", "ps-1.safetensors", 2, 1}},
                  {},
                  {},
                  0,
                  std::nullopt}};
  REQUIRE((*writer)->commit(m).ok());
  auto reader = open_ok(dir.file("ckpt-5"));
  CHECK(reader->manifest().files.size() == 2);
  CHECK(reader->read_variable("v")->equals(iota({3}, 0)));
}

// ------------------------------------------------------------ damage

// ---- Through io::MemoryFileSystem: the disk's failures and a crash.

TEST_CASE("checkpoint: a failed fsync fails the commit and leaves the previous checkpoint the latest, readable") {
  io::MemoryFileSystem fs;
  REQUIRE(save("/ckpt", 1, 0, {sample_w()}, 2, fs).ok());

  Variable newer = sample_w();
  newer.value = iota({13, 4}, 500);
  {
    auto writer = CheckpointWriter::begin("/ckpt", 2, 0, fs);
    REQUIRE(writer.ok());
    auto manifest = add_files(**writer, 2, {newer}, 2);
    REQUIRE(manifest.ok());
    fs.fail_next_sync(Status::DataLoss("the disk lost the write"));
    Status failed = (*writer)->commit(std::move(*manifest));
    INFO(failed.to_string());
    CHECK(failed.code() == StatusCode::kDataLoss);
    CHECK(message_contains(failed, "the disk lost the write"));
    CHECK(fs.stat("/ckpt/ckpt-2.tmp").ok());
  }

  CHECK(latest_checkpoint("/ckpt", fs).value() == "/ckpt/ckpt-1");
  CHECK(list_checkpoints("/ckpt", fs).value() == std::vector<std::string>{"/ckpt/ckpt-1"});
  CHECK_FALSE(fs.stat("/ckpt/ckpt-2.tmp").ok());  // the failed writer removed its save
  auto reader = CheckpointReader::open("/ckpt/ckpt-1", {}, fs);
  INFO(reader.status().to_string());
  REQUIRE(reader.ok());
  CHECK((*reader)->read_variable("w").value().equals(sample_w().value));
  CHECK(read_checkpoint_index("/ckpt", fs).value().latest == "ckpt-1");
}

TEST_CASE("checkpoint: a full disk fails add_file and the save, not the previous checkpoint") {
  io::MemoryFileSystem fs;
  REQUIRE(save("/ckpt", 1, 0, {sample_w()}, 2, fs).ok());

  auto writer = CheckpointWriter::begin("/ckpt", 2, 0, fs);
  REQUIRE(writer.ok());
  fs.fail_writes_after(100, Status::ResourceExhausted("disk full"));
  Status added = (*writer)->add_file("ps-0.safetensors", {{"w", iota({13, 4}, 0)}});
  CHECK(added.code() == StatusCode::kResourceExhausted);
  CHECK(message_contains(added, "disk full"));
  fs.allow_writes();
  writer->reset();

  CHECK(list_checkpoints("/ckpt", fs).value() == std::vector<std::string>{"/ckpt/ckpt-1"});
  CHECK(fs.list_dir("/ckpt").value().size() == 2);  // ckpt-1 and the index, no .tmp left
  CHECK(CheckpointReader::open("/ckpt/ckpt-1", {}, fs).ok());
}

TEST_CASE("checkpoint: a committed checkpoint survives a crash, a save in progress does not") {
  io::MemoryFileSystem fs;
  REQUIRE(io::create_dirs(fs, "/ckpt", /*sync=*/true).ok());
  REQUIRE(save("/ckpt", 1, 0, {sample_w()}, 2, fs).ok());
  auto in_progress = CheckpointWriter::begin("/ckpt", 2, 0, fs);
  REQUIRE(in_progress.ok());
  REQUIRE((*in_progress)->add_file("ps-0.safetensors", {{"w", iota({13, 4}, 0)}}).ok());

  fs.crash();

  CHECK(latest_checkpoint("/ckpt", fs).value() == "/ckpt/ckpt-1");
  auto reader = CheckpointReader::open("/ckpt/ckpt-1", {}, fs);
  INFO(reader.status().to_string());
  REQUIRE(reader.ok());
  CHECK((*reader)->read_variable("w").value().equals(sample_w().value));
  CHECK((*reader)->read_slot("w", "accumulator").value().equals(sample_w().slots.at("accumulator")));
}

TEST_CASE("checkpoint reader: a missing checkpoint is NotFound") {
  TempDir dir;
  CHECK(CheckpointReader::open(dir.file("ckpt-1")).status().code() == StatusCode::kNotFound);
  write_bytes(dir.file("ckpt-2"), "");
  CHECK(CheckpointReader::open(dir.file("ckpt-2")).status().code() ==
        StatusCode::kFailedPrecondition);
}

TEST_CASE("checkpoint reader: a missing file is refused, naming it") {
  TempDir dir;
  REQUIRE(save(dir.path(), 5, 0, {sample_w()}).ok());
  REQUIRE(::unlink(dir.file("ckpt-5/ps-1.safetensors").c_str()) == 0);
  require_damaged(dir.file("ckpt-5"), "file ps-1.safetensors is missing");
}

TEST_CASE("checkpoint reader: a flipped byte in a shard file is refused, naming the file") {
  TempDir dir;
  REQUIRE(save(dir.path(), 5, 0, {sample_w()}).ok());
  const std::string file = dir.file("ckpt-5/ps-1.safetensors");
  flip_byte(file, read_bytes(file).size() - 1);  // the last byte of data
  require_damaged(dir.file("ckpt-5"), "file ps-1.safetensors has crc32c");
}

TEST_CASE("checkpoint reader: every byte of every file, flipped, is refused") {
  TempDir dir;
  REQUIRE(save(dir.path(), 5, 0, {{"v", iota({3, 2}, 0), {2, 1}, {}}}).ok());
  for (const char* name : {"ps-0.safetensors", "ps-1.safetensors"}) {
    const std::string file = dir.file("ckpt-5/") + name;
    const std::string original = read_bytes(file);
    for (size_t i = 0; i < original.size(); ++i) {
      INFO(name << " byte " << i);
      flip_byte(file, i);
      require_damaged(dir.file("ckpt-5"), std::string("file ") + name);
      write_bytes(file, original);
    }
  }
  CHECK(open_ok(dir.file("ckpt-5"))->read_variable("v")->equals(iota({3, 2}, 0)));
}

TEST_CASE("checkpoint reader: a file of the wrong size is refused, naming it") {
  TempDir dir;
  REQUIRE(save(dir.path(), 5, 0, {sample_w()}).ok());
  const std::string file = dir.file("ckpt-5/ps-0.safetensors");
  write_bytes(file, read_bytes(file) + "x");
  require_damaged(dir.file("ckpt-5"), "file ps-0.safetensors has");
}

TEST_CASE("checkpoint reader: a missing or damaged manifest is DataLoss") {
  TempDir dir;
  REQUIRE(save(dir.path(), 5, 0, {sample_w()}).ok());
  const std::string manifest = dir.file("ckpt-5/manifest.json");
  const std::string original = read_bytes(manifest);
  write_bytes(manifest, original.substr(0, original.size() / 2));
  require_damaged(dir.file("ckpt-5"), manifest, "not valid JSON");
  REQUIRE(::unlink(manifest.c_str()) == 0);
  require_damaged(dir.file("ckpt-5"), "manifest.json is missing");
}

TEST_CASE("checkpoint reader: a manifest of a newer format is InvalidArgument") {
  TempDir dir;
  REQUIRE(save(dir.path(), 5, 0, {sample_w()}).ok());
  const std::string manifest = dir.file("ckpt-5/manifest.json");
  std::string text = read_bytes(manifest);
  text.replace(text.find("\"format_version\": 1"), 19, "\"format_version\": 2");
  write_bytes(manifest, text);
  CHECK(CheckpointReader::open(dir.file("ckpt-5")).status().code() == StatusCode::kInvalidArgument);
}

TEST_CASE("checkpoint reader: tensors that do not match the manifest are DataLoss") {
  TempDir dir;
  REQUIRE(save(dir.path(), 5, 0, {sample_w()}).ok());
  const std::string ckpt = dir.file("ckpt-5");
  const std::string original = read_bytes(ckpt + "/manifest.json");

  edit_manifest(ckpt, [](Manifest& m) { m.variables[0].dtype = DType::kFloat64; });
  require_damaged(ckpt, "ps-0.safetensors", "is float32 [3, 4]; the manifest says float64 [3, 4]");

  write_bytes(ckpt + "/manifest.json", original);
  edit_manifest(ckpt, [](Manifest& m) { m.variables[0].slots = {"accumulator", "m"}; });
  require_damaged(ckpt, "file ps-0.safetensors has no tensor 'w/part_0/slot/m'");
}

TEST_CASE("checkpoint reader: a shard file that is not safetensors is DataLoss naming it") {
  TempDir dir;
  REQUIRE(save(dir.path(), 5, 0, {sample_w()}).ok());
  const std::string ckpt = dir.file("ckpt-5");
  const std::string junk = "not a safetensors file at all";
  write_bytes(ckpt + "/ps-1.safetensors", junk);
  edit_manifest(ckpt, [&junk](Manifest& m) {
    m.files[1].size = junk.size();
    m.files[1].crc32c = io::crc32c(junk.data(), junk.size());
  });
  require_damaged(ckpt, "file ps-1.safetensors: corrupt safetensors file");
}

TEST_CASE("checkpoint reader: deferred verification finds a damaged file when first needed") {
  TempDir dir;
  const Variable w = sample_w();
  REQUIRE(save(dir.path(), 5, 0, {w}).ok());
  const std::string file = dir.file("ckpt-5/ps-1.safetensors");
  flip_byte(file, read_bytes(file).size() - 1);

  auto reader = open_ok(dir.file("ckpt-5"), {.verify_checksums_on_open = false});
  auto rows = reader->read_variable_rows("w", 0, 3);  // shard 0, in ps-0
  REQUIRE(rows.ok());
  CHECK(rows->equals(*data::slice_rows(w.value, 0, 3)));
  for (int attempt = 0; attempt < 2; ++attempt) {
    auto more = reader->read_variable_rows("w", 3, 6);  // shard 1, in ps-1
    CHECK(more.status().code() == StatusCode::kDataLoss);
    CHECK(message_contains(more.status(), "file ps-1.safetensors has crc32c"));
  }
  CHECK(reader->read_variable("w").status().code() == StatusCode::kDataLoss);
}

TEST_CASE("checkpoint reader: deferred verification still checks sizes at open") {
  TempDir dir;
  REQUIRE(save(dir.path(), 5, 0, {sample_w()}).ok());
  const std::string file = dir.file("ckpt-5/ps-1.safetensors");
  write_bytes(file, read_bytes(file) + "x");
  auto reader = CheckpointReader::open(dir.file("ckpt-5"), {.verify_checksums_on_open = false});
  CHECK(reader.status().code() == StatusCode::kDataLoss);
  CHECK(message_contains(reader.status(), "ps-1.safetensors"));
}

// ------------------------------------------------------------ describe

TEST_CASE("checkpoint: describe shows step, files and variables") {
  TempDir dir;
  REQUIRE(save(dir.path(), 5, 0, {sample_w(), {"global_step", Tensor::scalar<int64_t>(5), {1}, {}}})
              .ok());
  auto reader = open_ok(dir.file("ckpt-5"));
  const auto& files = reader->manifest().files;
  auto crc = [](uint32_t value) {
    char buf[16];
    std::snprintf(buf, sizeof(buf), "0x%08x", value);
    return std::string(buf);
  };
  const std::string expected = "checkpoint " + dir.file("ckpt-5") + "\n" +
                               "step: 5\n"
                               "files:\n"
                               "  ps-0.safetensors  " +
                               std::to_string(files[0].size) + " bytes  crc32c " +
                               crc(files[0].crc32c) + "\n" + "  ps-1.safetensors  " +
                               std::to_string(files[1].size) + " bytes  crc32c " +
                               crc(files[1].crc32c) + "\n" +
                               "variables:\n"
                               "  w  float32 [13, 4]  partitioning [3, 3, 3, 2, 2]\n"
                               "    w/part_0  rows [0, 3)  in ps-0.safetensors\n"
                               "    w/part_1  rows [3, 6)  in ps-1.safetensors\n"
                               "    w/part_2  rows [6, 9)  in ps-0.safetensors\n"
                               "    w/part_3  rows [9, 11)  in ps-1.safetensors\n"
                               "    w/part_4  rows [11, 13)  in ps-0.safetensors\n"
                               "    optimizer: adagrad learning_rate=0.5 initial_accumulator_value=0.1 epsilon=1e-07  step 5\n"
                               "    slots: accumulator\n"
                               "  global_step  int64 []  partitioning [1]\n"
                               "    global_step  rows [0, 1)  in ps-0.safetensors\n"
                               "    optimizer: adagrad learning_rate=0.5 initial_accumulator_value=0.1 epsilon=1e-07  step 5\n"
                               "    slots: none\n";
  CHECK(describe(*reader) == expected);
}

}  // namespace
}  // namespace capstan::checkpoint
