#include "daemons/ps_server/shard_checkpoints.h"

#include <catch2/catch.hpp>

#include <map>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "io/testing.h"

namespace capstan::ps_server {
namespace {

Tensor f32(const std::vector<float>& values, Shape shape) {
  auto t = Tensor::from_vector<float>(values, std::move(shape));
  REQUIRE(t.ok());
  return *t;
}
Tensor i64(const std::vector<int64_t>& values) {
  auto t = Tensor::from_vector<int64_t>(values, {static_cast<int64_t>(values.size())});
  REQUIRE(t.ok());
  return *t;
}
std::vector<float> floats(const Tensor& t) {
  auto flat = t.flat<float>();
  return {flat.begin(), flat.end()};
}

// One parameter server: its stores and its checkpoint code.
struct Server {
  VariableStore store;
  TableStore tables;
  ShardCheckpoints checkpoints{store, tables};
};

const EmbeddingTableSpec kTable{"emb", 2, DType::kFloat32, EmbeddingInitializer::zeros(), Optimizer::adagrad(0.5), {}};
TableConfig table_config() {
  return TableConfig{kTable.dtype, kTable.dim, kTable.initializer, kTable.optimizer, kTable.options};
}

// Saves `servers` as the coordinator would: a snapshot and a file each, then
// the manifest from their answers. `w` is float32[5, 2] in two shards: rows
// [0, 3) on server 0, [3, 5) on server 1; "emb" a table with a shard on each.
std::string save(std::vector<Server*> servers, const std::string& dir, int64_t step) {
  auto writer = checkpoint::CheckpointWriter::begin(dir, step, 0);
  REQUIRE(writer.ok());
  checkpoint::ManifestVariable w{"w", DType::kFloat32, {5, 2}, {3, 2}, {}, Optimizer::adam(0.1), {}, 0, {}};
  checkpoint::ManifestVariable emb{"emb", DType::kFloat32, {0, 2}, {}, {}, kTable.optimizer, {}, 0,
                                   checkpoint::ManifestTable{2, kTable.initializer, kTable.options, 0}};
  std::vector<checkpoint::ManifestFile> files;
  int64_t first_row = 0;
  for (size_t task = 0; task < servers.size(); ++task) {
    const std::string part = "/part_" + std::to_string(task);
    auto snapshot = servers[task]->checkpoints.snapshot({{"w" + part}, {"emb" + part, true, 0}});
    REQUIRE(snapshot.ok());
    REQUIRE(snapshot->saved.size() == 2);
    const ps::SavedShard& ws = snapshot->saved[0];
    const ps::SavedShard& es = snapshot->saved[1];
    const std::string file = checkpoint::ps_file_name(static_cast<int>(task));
    w.shards.push_back({"w" + part, file, task == 0 ? 0 : 3, ws.shape[0]});
    w.slots = ws.slots;
    w.optimizer_step = std::max(w.optimizer_step, ws.step);
    emb.shards.push_back({"emb" + part, file, first_row, es.shape[0]});
    emb.partitioning.push_back(es.shape[0]);
    emb.slots = es.slots;
    emb.optimizer_step = std::max(emb.optimizer_step, es.step);
    first_row += es.shape[0];
    auto written = servers[task]->checkpoints.write(*snapshot, (*writer)->path(), file);
    REQUIRE(written.ok());
    files.push_back(*written);
  }
  emb.shape = {first_row, 2};
  checkpoint::Manifest manifest;
  manifest.variables = {w, emb};
  std::string path = (*writer)->checkpoint_path();
  REQUIRE((*writer)->commit(manifest, files).ok());
  return path;
}

ps::RestoreItem w_rows(const std::string& shard, int64_t first, int64_t rows, Optimizer optimizer = Optimizer::adam(0.1)) {
  ps::RestoreItem item;
  item.name = shard;
  item.variable = "w";
  item.first_row = first;
  item.rows = rows;
  item.dtype = DType::kFloat32;
  item.shape = {rows, 2};
  item.optimizer = optimizer;
  return item;
}

ps::RestoreItem emb_part(int part, int parts) {
  ps::RestoreItem item;
  item.name = "emb/part_" + std::to_string(part);
  item.variable = "emb";
  item.table = kTable;
  item.table_part = part;
  item.table_parts = parts;
  return item;
}

// Two servers trained a little: w's rows hold 0..9 then took one Adam step;
// the table holds 12 keys, each on the server table_shard_of(key, 2) names.
struct Trained {
  Server a, b;
  std::vector<int64_t> keys;
  Trained() {
    REQUIRE(a.store.create("w/part_0", f32({0, 1, 2, 3, 4, 5}, {3, 2}), Optimizer::adam(0.1)).ok());
    REQUIRE(b.store.create("w/part_1", f32({6, 7, 8, 9}, {2, 2}), Optimizer::adam(0.1)).ok());
    REQUIRE(a.store.apply_dense("w/part_0", f32({1, 1, 1, 1, 1, 1}, {3, 2}), 4).ok());
    REQUIRE(b.store.apply_dense("w/part_1", f32({1, 1, 1, 1}, {2, 2}), 4).ok());
    REQUIRE(a.tables.create("emb/part_0", table_config()).ok());
    REQUIRE(b.tables.create("emb/part_1", table_config()).ok());
    for (int64_t k = 1; k <= 12; ++k) keys.push_back(k * 7919);
    for (int64_t k : keys) {
      Server& s = table_shard_of(k, 2) == 0 ? a : b;
      auto table = s.tables.find(table_shard_of(k, 2) == 0 ? "emb/part_0" : "emb/part_1");
      REQUIRE(table.ok());
      REQUIRE((*table)->lookup(i64({k}), true).ok());
      REQUIRE((*table)->apply_gradients(i64({k}), f32({float(k % 5), 1}, {1, 2}), 3).ok());
    }
  }
};

TEST_CASE("parameter servers write their own shard files, and three new ones read back their rows and keys",
          "[ps_server][checkpoint]") {
  io::testing::TempDir dir;
  Trained t;
  const std::string path = save({&t.a, &t.b}, dir.path(), 7);
  auto reader = checkpoint::CheckpointReader::open(path);  // every file's CRC32C checked
  REQUIRE(reader.ok());
  auto whole = (*reader)->read_variable("w");
  REQUIRE(whole.ok());

  // Three servers now: w in rows [0, 2), [2, 4), [4, 5); the table in 3 parts.
  Server n[3];
  REQUIRE(n[0].checkpoints.restore(path, {w_rows("w/part_0", 0, 2), emb_part(0, 3)}).ok());
  REQUIRE(n[1].checkpoints.restore(path, {w_rows("w/part_1", 2, 2), emb_part(1, 3)}).ok());
  REQUIRE(n[2].checkpoints.restore(path, {w_rows("w/part_2", 4, 1), emb_part(2, 3)}).ok());
  std::vector<float> joined;
  for (int i = 0; i < 3; ++i) {
    auto v = n[i].store.read("w/part_" + std::to_string(i));
    REQUIRE(v.ok());
    for (float x : floats(*v)) joined.push_back(x);
    auto info = n[i].store.info("w/part_" + std::to_string(i));
    REQUIRE(info.ok());
    CHECK(info->step == 4);
    CHECK(info->optimizer.kind == Optimizer::Kind::kAdam);
  }
  CHECK(joined == floats(*whole));
  // Adam's slots came with the rows: the second server's m is rows 2..3 of the saved m.
  auto m = n[1].store.slots("w/part_1");
  REQUIRE(m.ok());
  CHECK(floats(m->at("m")) == floats((*reader)->read_slot_rows("w", "m", 2, 4).value()));

  // Every key is back once, on the part that holds it now, with its row.
  int64_t rows = 0;
  for (int i = 0; i < 3; ++i) {
    auto table = n[i].tables.find("emb/part_" + std::to_string(i));
    REQUIRE(table.ok());
    auto exported = (*table)->export_rows(0);
    REQUIRE(exported.ok());
    for (int64_t k : exported->keys.flat<int64_t>()) CHECK(table_shard_of(k, 3) == i);
    rows += exported->keys.num_elements();
    CHECK((*table)->step() == 3);
  }
  CHECK(rows == static_cast<int64_t>(t.keys.size()));
  auto again = n[2].tables.find("emb/part_2").value()->lookup(i64({t.keys[0]}), false);
  auto before = (table_shard_of(t.keys[0], 2) == 0 ? t.a : t.b)
                    .tables.find(table_shard_of(t.keys[0], 2) == 0 ? "emb/part_0" : "emb/part_1")
                    .value()
                    ->lookup(i64({t.keys[0]}), false);
  if (table_shard_of(t.keys[0], 3) == 2) CHECK(floats(*again) == floats(*before));
}

TEST_CASE("a snapshot is the shard as it was: an update after it does not reach the file",
          "[ps_server][checkpoint]") {
  io::testing::TempDir dir;
  Server s;
  REQUIRE(s.store.create("w/part_0", f32({1, 2}, {1, 2}), Optimizer::adagrad(1.0)).ok());
  auto writer = checkpoint::CheckpointWriter::begin(dir.path(), 1, 0);
  REQUIRE(writer.ok());
  auto snapshot = s.checkpoints.snapshot({{"w/part_0"}});
  REQUIRE(snapshot.ok());
  REQUIRE(s.store.apply_dense("w/part_0", f32({1, 1}, {1, 2})).ok());  // copies: the snapshot holds the old buffers
  auto written = s.checkpoints.write(*snapshot, (*writer)->path(), "ps-0.safetensors");
  REQUIRE(written.ok());
  auto file = checkpoint::SafetensorsReader::open((*writer)->path() + "/ps-0.safetensors");
  REQUIRE(file.ok());
  // Value and slots as they were at the snapshot, though the update moved both.
  CHECK(floats((*file)->read("w/part_0").value()) == std::vector<float>{1, 2});
  CHECK(floats((*file)->read("w/part_0/slot/accumulator").value()) == std::vector<float>{0.1f, 0.1f});
  CHECK(floats(s.store.read("w/part_0").value())[0] < 1);
  CHECK(floats(s.store.slots("w/part_0").value().at("accumulator"))[0] == Approx(1.1f));
  // Another snapshot, no update: the slots are lent, not copied, and stay right.
  auto second = s.checkpoints.snapshot({{"w/part_0"}});
  REQUIRE(second.ok());
  CHECK(floats(second->shards[0].slots[0].second)[0] == Approx(1.1f));
  REQUIRE(s.store.apply_dense("w/part_0", f32({1, 1}, {1, 2})).ok());
  CHECK(floats(second->shards[0].slots[0].second)[0] == Approx(1.1f));
  CHECK(floats(s.store.slots("w/part_0").value().at("accumulator"))[0] == Approx(2.1f));
}

TEST_CASE("bad save and restore requests are refused, naming the value, and change nothing",
          "[ps_server][checkpoint]") {
  io::testing::TempDir dir;
  Trained t;
  auto snapshot = t.a.checkpoints.snapshot({{"w/part_0"}});
  REQUIRE(snapshot.ok());
  CHECK(t.a.checkpoints.snapshot({{"nope"}}).status().code() == StatusCode::kNotFound);
  CHECK(t.a.checkpoints.snapshot({{"w/part_0"}, {"w/part_0"}}).status().code() == StatusCode::kInvalidArgument);
  // Only into a save in progress, only as ps-<task>.safetensors, never over a file.
  auto elsewhere = t.a.checkpoints.write(*snapshot, dir.path(), "ps-0.safetensors");
  CHECK(elsewhere.status().code() == StatusCode::kInvalidArgument);
  CHECK(elsewhere.status().message().find(dir.path()) != std::string::npos);
  auto writer = checkpoint::CheckpointWriter::begin(dir.path(), 3, 0);
  REQUIRE(writer.ok());
  CHECK(t.a.checkpoints.write(*snapshot, (*writer)->path(), "../x.safetensors").status().code() ==
        StatusCode::kInvalidArgument);
  REQUIRE(t.a.checkpoints.write(*snapshot, (*writer)->path(), "ps-0.safetensors").ok());
  CHECK(t.a.checkpoints.write(*snapshot, (*writer)->path(), "ps-0.safetensors").status().code() ==
        StatusCode::kAlreadyExists);
  writer->reset();

  const std::string path = save({&t.a, &t.b}, dir.path(), 9);
  Server n;
  REQUIRE(n.store.create("w/part_0", f32({5, 5}, {1, 2}), Optimizer::adam(0.1)).ok());
  // A shape that is not the checkpoint's rows, a variable it lacks, rows past its end.
  ps::RestoreItem wrong = w_rows("w/part_0", 0, 1);
  wrong.shape = {1, 3};
  Status refused = n.checkpoints.restore(path, {wrong});
  CHECK(refused.code() == StatusCode::kInvalidArgument);
  CHECK(refused.message().find("w/part_0") != std::string::npos);
  ps::RestoreItem absent = w_rows("v/part_0", 0, 1);
  absent.variable = "v";
  CHECK(n.checkpoints.restore(path, {w_rows("w/part_0", 0, 1), absent}).code() == StatusCode::kNotFound);
  CHECK(n.checkpoints.restore(path, {w_rows("w/part_0", 4, 2)}).code() == StatusCode::kInvalidArgument);
  ps::RestoreItem not_table = emb_part(0, 1);
  not_table.variable = "w";
  CHECK(n.checkpoints.restore(path, {not_table}).code() == StatusCode::kInvalidArgument);
  CHECK(n.checkpoints.restore(dir.file("ckpt-404"), {w_rows("w/part_0", 0, 1)}).code() == StatusCode::kNotFound);
  // Checked before anything changed.
  CHECK(floats(n.store.read("w/part_0").value()) == std::vector<float>{5, 5});
  CHECK_FALSE(n.store.info("v/part_0").ok());
}

TEST_CASE("a restore into another optimizer kind takes the values and starts the slots afresh",
          "[ps_server][checkpoint]") {
  io::testing::TempDir dir;
  Trained t;
  const std::string path = save({&t.a, &t.b}, dir.path(), 2);
  Server n;
  REQUIRE(n.checkpoints.restore(path, {w_rows("w/part_0", 0, 5, Optimizer::adagrad(0.1))}).ok());
  auto slots = n.store.slots("w/part_0");
  REQUIRE(slots.ok());
  REQUIRE(slots->count("accumulator") == 1);
  CHECK(floats(slots->at("accumulator")) == std::vector<float>(10, 0.1f));
  auto reader = checkpoint::CheckpointReader::open(path);
  REQUIRE(reader.ok());
  CHECK(floats(n.store.read("w/part_0").value()) == floats((*reader)->read_variable("w").value()));
}

}  // namespace
}  // namespace capstan::ps_server
