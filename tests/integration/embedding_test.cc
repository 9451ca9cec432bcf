// Dynamic embedding tables with real processes: the CTR example with raw
// 40-bit ids, checkpoints restored into another number of parameter
// servers, delta export, a parameter server killed -9 and recovered, and
// bad requests.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdio>
#include <map>
#include <set>
#include <thread>

#include "capstan/training.h"
#include "checkpoint/safetensors.h"
#include "tests/harness/process.h"
#include "tests/integration/training_cluster.h"
#include "tests/build_path.h"

namespace capstan::testing {
namespace {

using namespace std::chrono_literals;

Tensor keys_tensor(const std::vector<int64_t>& keys) {
  return *Tensor::from_vector<int64_t>(keys, {static_cast<int64_t>(keys.size())});
}

// n keys spread over 2^40 values (as raw ids are).
std::vector<int64_t> spread_keys(int64_t n, uint64_t salt) {
  std::vector<int64_t> keys;
  for (int64_t i = 0; i < n; ++i) {
    keys.push_back(static_cast<int64_t>(table_key_hash(static_cast<int64_t>(salt) * 1000003 + i) >> 24));
  }
  return keys;
}

EmbeddingTableSpec adagrad_table(const std::string& name, int64_t dim) {
  return EmbeddingTableSpec{name, dim, DType::kFloat32, EmbeddingInitializer::random_normal(0, 0.1, 11),
                            Optimizer::adagrad(0.5), {}};
}

// A gradient of `value` in every element, for every key.
Tensor gradient(size_t keys, int64_t dim, float value) {
  return *Tensor::from_vector<float>(std::vector<float>(keys * static_cast<size_t>(dim), value),
                                     {static_cast<int64_t>(keys), dim});
}

}  // namespace

TEST_CASE("the CTR example with raw 40-bit ids in a dynamic table on 2 PS reaches the planted-model target "
          "with a parameter server killed -9 and recovered mid-training",
          "[embedding][fault][recovery][long]") {
  TestCluster scratch;
  const std::string dir = scratch.dir() + "/ckpt";
  Training t(2, 2, {"--checkpoint-dir", dir, "--checkpoint-every-steps", "300"}, true, capstan::testing::build_path(CAPSTAN_CTR_MODULE));
  RunResult ctr = run_ctr_with_a_ps_restart(t, {"--dynamic", "--steps", "8000", "--eval-steps", "100",
                                                "--min-workers", "2", "--log-every", "1000", "--max-gap", "2.5"});
  INFO(ctr.output);
  CHECK(ctr.exit_code == 0);
  CHECK_THAT(ctr.output, Catch::Contains("dynamic embedding table in 2 shards"));
  CHECK_THAT(ctr.output, Catch::Contains("PASS"));
  CHECK_THAT(t.coordinator->log(), Catch::Contains("restored 1 shard(s) from checkpoint"));
}

TEST_CASE("kill -9 a parameter server holding table rows: every row of the last checkpoint comes back",
          "[embedding][fault][recovery]") {
  Training t(2, 1);
  REQUIRE(t.client->create_embedding_table(adagrad_table("emb", 8)).ok());
  std::vector<int64_t> keys = spread_keys(3000, 1);
  Tensor ids = keys_tensor(keys);
  REQUIRE(t.client->lookup("emb", ids).ok());
  REQUIRE(t.client->apply_sparse_gradients("emb", ids, gradient(keys.size(), 8, 0.25f)).ok());
  TestCluster keep;
  REQUIRE(t.client->save_checkpoint(keep.dir() + "/ckpts", 7, 2).ok());
  Tensor at_checkpoint = t.client->lookup("emb", ids, /*insert=*/false).value();

  restart_ps(t, 1);
  // The coordinator restores ps:1's table shard from the checkpoint by itself.
  REQUIRE(wait_until([&]() { return t.coordinator->log().find("restored 1 shard(s) from checkpoint") != std::string::npos; },
                     30s));
  Tensor after = t.client->lookup("emb", ids, /*insert=*/false).value();
  CHECK(after.equals(at_checkpoint));
  // The slots came back too: the same step moves every row as it would have.
  REQUIRE(t.client->apply_sparse_gradients("emb", ids, gradient(keys.size(), 8, 0.25f)).ok());
  Tensor stepped = t.client->lookup("emb", ids, false).value();
  // Adagrad: accumulator 0.1 + 2 * 0.0625 after the second step; the row
  // moves by 0.5 * 0.25 / sqrt(0.225).
  double expected = 0.5 * 0.25 / std::sqrt(0.1 + 2 * 0.0625);
  CHECK(at_checkpoint.flat<float>()[0] - stepped.flat<float>()[0] == Approx(expected).epsilon(0.001));
  CHECK(at_checkpoint.flat<float>()[8 * 2999 + 7] - stepped.flat<float>()[8 * 2999 + 7] ==
        Approx(expected).epsilon(0.001));
}

TEST_CASE("an embedding table's checkpoint restores into 3 PS instead of 2, rows and slots identical, "
          "capstanctl shows its rows, a delta export holds only the rows changed since",
          "[embedding][checkpoint]") {
  TestCluster keep;
  const std::string dir = keep.dir() + "/ckpts";
  std::vector<int64_t> keys = spread_keys(5000, 2);
  Tensor ids = keys_tensor(keys);
  Tensor saved_rows, stepped_rows;
  {
    Training t(2, 1);
    REQUIRE(t.client->create_embedding_table(adagrad_table("emb", 4)).ok());
    REQUIRE(t.client->lookup("emb", ids).ok());
    REQUIRE(t.client->apply_sparse_gradients("emb", ids, gradient(keys.size(), 4, 0.5f)).ok());
    saved_rows = t.client->lookup("emb", ids, false).value();
    auto path = t.client->save_checkpoint(dir, 10, 3);
    REQUIRE(path.ok());

    // Changes after the checkpoint: 100 keys updated, 50 new keys inserted.
    std::vector<int64_t> changed(keys.begin(), keys.begin() + 100);
    std::vector<int64_t> fresh = spread_keys(50, 3);
    REQUIRE(t.client->apply_sparse_gradients("emb", keys_tensor(changed), gradient(changed.size(), 4, 1.0f)).ok());
    REQUIRE(t.client->lookup("emb", keys_tensor(fresh)).ok());
    const std::string delta = keep.dir() + "/delta.safetensors";
    auto exported = t.client->export_embedding_table("emb", *path, delta);
    REQUIRE(exported.ok());
    CHECK(*exported == 150);
    auto file = checkpoint::SafetensorsReader::open(delta).value();
    Tensor delta_keys = file->read("keys").value();
    std::set<int64_t> got(delta_keys.flat<int64_t>().begin(), delta_keys.flat<int64_t>().end());
    std::set<int64_t> want(changed.begin(), changed.end());
    want.insert(fresh.begin(), fresh.end());
    CHECK(got == want);
    CHECK(file->read("values").value().shape() == Shape{150, 4});
    // Every row, without --since.
    CHECK(t.client->export_embedding_table("emb", "", keep.dir() + "/all.safetensors").value() == 5050);

    auto inspect = t.cluster.run("capstanctl", {"checkpoint", "inspect", *path});
    CHECK(inspect.exit_code == 0);
    INFO(inspect.output);
    CHECK_THAT(inspect.output, Catch::Contains("emb") && Catch::Contains("5000"));
  }
  // A new cluster of 3 parameter servers; the program does not create the
  // table: the restore creates it with the checkpoint's spec.
  Training t(3, 1);
  REQUIRE(t.client->restore_checkpoint(dir).value() == 10);
  auto info = t.client->variables().value();
  REQUIRE(info.size() == 1);
  CHECK(info[0].embedding_table);
  CHECK(info[0].shards.size() == 3);
  CHECK(t.client->lookup("emb", ids, false).value().equals(saved_rows));
  // Every row the restore wrote counts as changed since any checkpoint (it
  // may differ from what a later one holds); a bad export path is refused.
  CHECK(t.client->export_embedding_table("emb", dir + "/ckpt-10", keep.dir() + "/after.safetensors").value() == 5000);
  CHECK(t.client->export_embedding_table("emb", "", keep.dir() + "/out.txt").status().code() ==
        StatusCode::kInvalidArgument);
  // Restored accumulators: a second step of 0.5 moves rows by
  // 0.5 * 0.5 / sqrt(0.1 + 2 * 0.25), not a fresh accumulator's step.
  REQUIRE(t.client->apply_sparse_gradients("emb", ids, gradient(keys.size(), 4, 0.5f)).ok());
  stepped_rows = t.client->lookup("emb", ids, false).value();
  CHECK(saved_rows.flat<float>()[5] - stepped_rows.flat<float>()[5] ==
        Approx(0.5 * 0.5 / std::sqrt(0.1 + 2 * 0.25)).epsilon(0.001));
}

TEST_CASE("embedding tables: bad requests get clear errors and the cluster keeps serving", "[embedding][bad-input]") {
  Training t(2, 1);
  REQUIRE(t.client->create_embedding_table(adagrad_table("emb", 4)).ok());
  REQUIRE(t.client->create_variable({"w", *Tensor::zeros(DType::kFloat32, {4, 2}), Optimizer::sgd(0.1)}).ok());

  auto bad_dim = t.client->create_embedding_table(adagrad_table("zero", 0));
  CHECK(bad_dim.status().code() == StatusCode::kInvalidArgument);
  CHECK_THAT(bad_dim.status().message(), Catch::Contains("dim 0"));
  EmbeddingTableSpec bad = adagrad_table("bad", 4);
  bad.options.eviction = "fifo";
  auto bad_eviction = t.client->create_embedding_table(bad);
  CHECK(bad_eviction.status().code() == StatusCode::kInvalidArgument);
  CHECK_THAT(bad_eviction.status().message(), Catch::Contains("fifo"));
  // The same name with another spec, or a variable's name.
  auto other = t.client->create_embedding_table(adagrad_table("emb", 8));
  CHECK(other.status().code() == StatusCode::kAlreadyExists);
  CHECK(t.client->create_embedding_table(adagrad_table("w", 4)).status().code() == StatusCode::kAlreadyExists);
  // The same spec again (a reconnecting program) is fine.
  CHECK(t.client->create_embedding_table(adagrad_table("emb", 4)).ok());

  auto lookup_variable = t.client->lookup("w", keys_tensor({1}));
  CHECK(lookup_variable.status().code() == StatusCode::kInvalidArgument);
  CHECK_THAT(lookup_variable.status().message(), Catch::Contains("gather"));
  auto gather_table = t.client->gather("emb", keys_tensor({1}));
  CHECK(gather_table.status().code() == StatusCode::kInvalidArgument);
  CHECK_THAT(gather_table.status().message(), Catch::Contains("lookup"));
  auto float_ids = t.client->lookup("emb", *Tensor::from_vector<float>({1.0f}, {1}));
  CHECK(float_ids.status().code() == StatusCode::kInvalidArgument);
  auto wrong_rows = t.client->apply_sparse_gradients("emb", keys_tensor({1, 2}), gradient(2, 3, 1.0f));
  CHECK(wrong_rows.code() == StatusCode::kInvalidArgument);
  CHECK(t.client->export_embedding_table("nope", "", t.cluster.dir() + "/x").status().code() == StatusCode::kNotFound);

  // Still serving: lookups insert, duplicates come back identical.
  Tensor rows = t.client->lookup("emb", keys_tensor({int64_t{1} << 50, 7, int64_t{1} << 50})).value();
  REQUIRE(rows.shape() == Shape{3, 4});
  for (int j = 0; j < 4; ++j) CHECK(rows.flat<float>()[j] == rows.flat<float>()[8 + j]);
}

}  // namespace capstan::testing
