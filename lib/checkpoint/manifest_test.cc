#include "checkpoint/manifest.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <string>
#include <vector>

#include "data/test_util.h"

namespace capstan::checkpoint {
namespace {

using data::testing::message_contains;

// "w" of shape [13, 4] in five shards [3, 3, 3, 2, 2], placed round-robin
// on two PS tasks, with an Adagrad accumulator; and a scalar "global_step".
Manifest sample_manifest() {
  Manifest m;
  m.step = 1200;
  ManifestVariable w;
  w.name = "w";
  w.dtype = DType::kFloat32;
  w.shape = {13, 4};
  w.partitioning = {3, 3, 3, 2, 2};
  int64_t first_row = 0;
  for (size_t i = 0; i < w.partitioning.size(); ++i) {
    w.shards.push_back({shard_name("w", i), i % 2 == 0 ? "ps-0.safetensors" : "ps-1.safetensors",
                        first_row, w.partitioning[i]});
    first_row += w.partitioning[i];
  }
  w.optimizer = Optimizer::adagrad(0.1, 1e-07, 1e-07);
  w.slots = {"accumulator"};
  w.optimizer_step = 1200;
  m.variables.push_back(w);

  ManifestVariable step;
  step.name = "global_step";
  step.dtype = DType::kInt64;
  step.partitioning = {1};
  step.shards = {{"global_step", "ps-0.safetensors", 0, 1}};
  step.optimizer = Optimizer::momentum_sgd(0.01, 0.9, /*nesterov=*/true);
  m.variables.push_back(step);

  m.files = {{"ps-0.safetensors", 4096, 0xDEADBEEF}, {"ps-1.safetensors", 0, 0}};
  return m;
}

Manifest parse_ok(const std::string& json) {
  auto m = parse_manifest(json, "ckpt/manifest.json");
  INFO(m.status().to_string());
  REQUIRE(m.ok());
  return *m;
}

// Replaces the first `from` in `text` with `to` (which must be there).
std::string replace(std::string text, const std::string& from, const std::string& to) {
  size_t at = text.find(from);
  INFO("'" << from << "' in the manifest");
  REQUIRE(at != std::string::npos);
  return text.replace(at, from.size(), to);
}

// Parsing `json` fails with `code`, naming the file and `field`.
void require_parse_error(const std::string& json, const std::string& field,
                         StatusCode code = StatusCode::kDataLoss) {
  auto m = parse_manifest(json, "ckpt-5/manifest.json");
  INFO(json);
  REQUIRE_FALSE(m.ok());
  INFO(m.status().to_string());
  CHECK(m.status().code() == code);
  CHECK(message_contains(m.status(), "ckpt-5/manifest.json"));
  CHECK(message_contains(m.status(), field));
}

// An edit of the sample manifest's JSON (`from` replaced by `to`) and the
// field the parse error it makes names.
struct Edit {
  std::string from, to, field;
};

// Each of `edits`, made alone to `good`, fails the parse naming its field.
void require_edit_errors(const std::string& good, const std::vector<Edit>& edits) {
  for (const Edit& edit : edits) require_parse_error(replace(good, edit.from, edit.to), edit.field);
}

TEST_CASE("manifest: to_json and parse_manifest round-trip") {
  const Manifest m = sample_manifest();
  REQUIRE(validate_manifest(m).ok());
  CHECK(parse_ok(to_json(m)) == m);
}

TEST_CASE("manifest: the checksum covers every value, a changed byte is DataLoss naming the file") {
  const Manifest m = sample_manifest();
  const std::string text = to_json_with_checksum(m);
  REQUIRE(text.rfind("{\n  \"manifest_crc32c\": ", 0) == 0);
  auto parsed = parse_manifest(text, "ckpt-7/manifest.json");
  REQUIRE(parsed.ok());
  CHECK(to_json(*parsed) == to_json(m));
  // A byte of a variable's name, a digit more in the step and in the
  // optimizer's step: each still a valid manifest, only the checksum tells.
  for (const std::string& from : {std::string("\"name\": \"w\""), std::string("\"step\": "),
                                  std::string("\"optimizer_step\": ")}) {
    std::string damaged = text;
    auto at = damaged.find(from);
    REQUIRE(at != std::string::npos);
    if (from.back() == '"') {
      damaged[at + from.size() - 2] = 'x';
    } else {
      damaged.insert(at + from.size(), "1");
    }
    INFO(from);
    auto result = parse_manifest(damaged, "ckpt-7/manifest.json");
    CHECK(result.status().code() == StatusCode::kDataLoss);
    CHECK_THAT(result.status().message(), Catch::Contains("ckpt-7/manifest.json") && Catch::Contains("checksum"));
  }
  // Manifests written before the checksum existed still read.
  CHECK(parse_manifest(to_json(m), "old/manifest.json").ok());
}

TEST_CASE("manifest: an empty manifest round-trips") {
  Manifest m;
  CHECK(to_json(m) ==
        "{\n  \"format_version\": 1,\n  \"step\": 0,\n  \"variables\": [],\n  \"files\": []\n}\n");
  CHECK(parse_ok(to_json(m)) == m);
}

TEST_CASE("manifest: the JSON layout is the documented one") {
  Manifest m;
  m.step = 7;
  ManifestVariable v;
  v.name = "b";
  v.dtype = DType::kFloat64;
  v.shape = {2};
  v.partitioning = {2};
  v.shards = {{"b/part_0", "ps-0.safetensors", 0, 2}};
  v.optimizer = Optimizer::adam(0.001, 0.9, 0.999, 1e-07);
  v.slots = {"m", "v"};
  v.optimizer_step = 7;
  m.variables = {v};
  m.files = {{"ps-0.safetensors", 123, 4000000000u}};
  CHECK(to_json(m) ==
        "{\n"
        "  \"format_version\": 1,\n"
        "  \"step\": 7,\n"
        "  \"variables\": [\n"
        "    {\n"
        "      \"name\": \"b\",\n"
        "      \"dtype\": \"float64\",\n"
        "      \"shape\": [2],\n"
        "      \"partitioning\": [2],\n"
        "      \"shards\": [\n"
        "        {\"name\": \"b/part_0\", \"file\": \"ps-0.safetensors\", \"first_row\": 0, "
        "\"rows\": 2}\n"
        "      ],\n"
        "      \"optimizer\": {\"kind\": \"adam\", \"hyperparameters\": {\"learning_rate\": 0.001, "
        "\"beta_1\": 0.9, \"beta_2\": 0.999, \"epsilon\": 1e-07}, \"nesterov\": false},\n"
        "      \"slots\": [\"m\", \"v\"],\n"
        "      \"optimizer_step\": 7\n"
        "    }\n"
        "  ],\n"
        "  \"files\": [\n"
        "    {\"name\": \"ps-0.safetensors\", \"size\": 123, \"crc32c\": 4000000000}\n"
        "  ]\n"
        "}\n");
}

TEST_CASE("manifest: hyperparameters keep every bit, infinities and NaN included") {
  Manifest m = sample_manifest();
  Optimizer& o = m.variables[0].optimizer;
  o = Optimizer::ftrl(1.0 / 3.0);
  o.learning_rate_power = -0.0;
  o.initial_accumulator_value = 5e-324;
  o.l1 = 1.7976931348623157e308;
  o.l2 = HUGE_VAL;
  o.l2_shrinkage = -HUGE_VAL;
  o.beta = std::nan("");
  const std::string json = to_json(m);
  CHECK(json.find("\"l2\": \"Infinity\"") != std::string::npos);
  CHECK(json.find("\"beta\": \"NaN\"") != std::string::npos);
  const Optimizer parsed = parse_ok(json).variables[0].optimizer;
  CHECK(parsed.kind == Optimizer::Kind::kFtrl);
  CHECK(parsed.learning_rate == 1.0 / 3.0);
  CHECK(parsed.learning_rate_power == 0.0);
  CHECK(std::signbit(parsed.learning_rate_power));
  CHECK(parsed.initial_accumulator_value == 5e-324);
  CHECK(parsed.l1 == 1.7976931348623157e308);
  CHECK(parsed.l2 == HUGE_VAL);
  CHECK(parsed.l2_shrinkage == -HUGE_VAL);
  CHECK(std::isnan(parsed.beta));
}

TEST_CASE("manifest: an unknown optimizer or hyperparameter is refused") {
  const std::string good = to_json(sample_manifest());
  require_parse_error(replace(good, "\"kind\": \"adagrad\"", "\"kind\": \"rmsprop\""),
                      "variables[0].optimizer.kind: unknown optimizer 'rmsprop'");
  require_parse_error(replace(good, "\"learning_rate\": 0.1", "\"learning_rate\": 0.1, \"rho\": 0.9"),
                      "variables[0].optimizer.hyperparameters.rho: unknown hyperparameter");
}

TEST_CASE("manifest: every learning rate schedule round-trips, through the checksum too") {
  using S = LearningRateSchedule;
  for (const S& schedule : {S::cosine_decay(1275, 0.25), S::exponential_decay(10, 0.96, true),
                            S::piecewise_constant_decay({100, 200}, {0.1, 0.05, 1.0 / 3.0}),
                            S::piecewise_constant_decay({}, {0.1})}) {
    Manifest m = sample_manifest();
    m.variables[0].optimizer = m.variables[0].optimizer.with_schedule(schedule);
    INFO(to_json(m));
    CHECK(parse_ok(to_json(m)) == m);
    CHECK(parse_ok(to_json_with_checksum(m)) == m);
  }
}

TEST_CASE("manifest: a schedule is written with the fields its kind uses, a constant one is not written") {
  Manifest m = sample_manifest();
  CHECK_THAT(to_json(m), !Catch::Contains("\"schedule\""));
  m.variables[0].optimizer = m.variables[0].optimizer.with_schedule(LearningRateSchedule::cosine_decay(1275));
  CHECK_THAT(to_json(m), Catch::Contains("\"nesterov\": false, \"schedule\": {\"kind\": \"cosine_decay\", "
                                         "\"decay_steps\": 1275, \"alpha\": 0}},"));
  m.variables[0].optimizer = m.variables[0].optimizer.with_schedule(
      LearningRateSchedule::piecewise_constant_decay({100}, {0.1, 0.01}));
  CHECK_THAT(to_json(m), Catch::Contains("\"schedule\": {\"kind\": \"piecewise_constant_decay\", "
                                         "\"boundaries\": [100], \"values\": [0.1, 0.01]}}"));
}

TEST_CASE("manifest: a manifest written before schedules reads with constant rates") {
  // The documented layout's optimizer, as every earlier version wrote it.
  const std::string json = to_json(sample_manifest());
  REQUIRE(json.find("\"nesterov\": false},") != std::string::npos);
  for (const ManifestVariable& v : parse_ok(json).variables) {
    CHECK(v.optimizer.schedule == LearningRateSchedule::constant());
  }
}

TEST_CASE("manifest parse: a bad schedule is refused naming its field") {
  Manifest m = sample_manifest();
  m.variables[0].optimizer = m.variables[0].optimizer.with_schedule(LearningRateSchedule::cosine_decay(1275));
  const std::string good = to_json(m);
  require_parse_error(replace(good, "\"kind\": \"cosine_decay\"", "\"kind\": \"polynomial_decay\""),
                      "variables[0].optimizer.schedule.kind: unknown learning rate schedule 'polynomial_decay'");
  require_parse_error(replace(good, "\"alpha\": 0", "\"alpha\": 0, \"warmup_steps\": 5"),
                      "variables[0].optimizer.schedule.warmup_steps: unknown field");
  require_parse_error(replace(good, ", \"alpha\": 0", ""), "variables[0].optimizer.schedule.alpha: missing");
  require_parse_error(replace(good, "\"decay_steps\": 1275", "\"decay_steps\": 12.5"),
                      "variables[0].optimizer.schedule.decay_steps: expected an integer");
  require_parse_error(replace(good, "\"decay_steps\": 1275", "\"decay_steps\": 1275, \"decay_rate\": 0.5"),
                      "variables[0].optimizer.schedule.decay_rate: unknown field");
  require_parse_error(replace(good, "{\"kind\": \"cosine_decay\", \"decay_steps\": 1275, \"alpha\": 0}", "\"cosine\""),
                      "variables[0].optimizer.schedule: expected an object");
}

TEST_CASE("manifest: names that need escaping round-trip") {
  Manifest m = sample_manifest();
  m.variables[0].name = "layer \"1\"\\kernel\n\t\xc3\xa9";
  m.variables[0].slots = {"sl\x01ot"};
  CHECK(parse_ok(to_json(m)) == m);
}

TEST_CASE("manifest: shard and slot tensor names follow TensorFlow") {
  CHECK(shard_name("emb", 3) == "emb/part_3");
  CHECK(slot_tensor_name("w/part_0", "accumulator") == "w/part_0/slot/accumulator");
}

TEST_CASE("manifest: find_variable") {
  const Manifest m = sample_manifest();
  REQUIRE(m.find_variable("global_step") != nullptr);
  CHECK(m.find_variable("global_step")->dtype == DType::kInt64);
  CHECK(m.find_variable("nope") == nullptr);
}

TEST_CASE("manifest parse: text that is not JSON") {
  const std::string good = to_json(sample_manifest());
  require_parse_error("", "not valid JSON");
  require_parse_error(good.substr(0, good.size() / 2), "not valid JSON");
  require_parse_error(good + "{}", "expected end of input");
  require_parse_error(replace(good, "\"step\":", "step:"), "not valid JSON");
  require_parse_error("[1, 2]", "expected an object");
}

TEST_CASE("manifest parse: an unknown format version is InvalidArgument") {
  const std::string good = to_json(sample_manifest());
  require_parse_error(replace(good, "\"format_version\": 1", "\"format_version\": 2"),
                      "format_version 2", StatusCode::kInvalidArgument);
  require_parse_error(replace(good, "\"format_version\": 1", "\"format_version\": \"1\""),
                      "format_version: expected an integer");
  require_parse_error(replace(good, "\"format_version\": 1,", ""), "format_version: missing");
}

TEST_CASE("manifest parse: missing fields are named") {
  require_edit_errors(to_json(sample_manifest()),
                      {
                          {"\"step\": 1200,", "", "step: missing"},
                          {"\"name\": \"w\",", "", "variables[0].name: missing"},
                          {"\"dtype\": \"float32\",", "", "variables[0].dtype: missing"},
                          {", \"rows\": 3}", "}", "variables[0].shards[0].rows: missing"},
                          {", \"nesterov\": false", "", "variables[0].optimizer.nesterov: missing"},
                          {"\"slots\": [\"accumulator\"],", "", "variables[0].slots: missing"},
                          {", \"crc32c\": 3735928559", "", "files[0].crc32c: missing"},
                      });
}

TEST_CASE("manifest parse: unknown and repeated fields") {
  require_edit_errors(to_json(sample_manifest()),
                      {
                          {"\"step\": 1200,", "\"step\": 1200, \"extra\": 1,", "extra: unknown field"},
                          {"\"step\": 1200,", "\"step\": 1200, \"step\": 1201,", "step: appears twice"},
                          {"\"rows\": 3}", "\"rows\": 3, \"bytes\": 1}", "variables[0].shards[0].bytes: unknown field"},
                          {"\"learning_rate\": 0.1", "\"learning_rate\": 0.1, \"learning_rate\": 0.2",
                           "variables[0].optimizer.hyperparameters.learning_rate: appears twice"},
                      });
}

TEST_CASE("manifest parse: mistyped fields are named") {
  require_parse_error("{\"format_version\": 1, \"step\": 1, \"variables\": {}, \"files\": []}",
                      "variables: expected a list");
  require_parse_error("{\"format_version\": 1, \"step\": 1, \"variables\": [], \"files\": 3}",
                      "files: expected a list");
  require_edit_errors(to_json(sample_manifest()),
                      {
                          {"\"step\": 1200", "\"step\": \"1200\"", "step: expected an integer"},
                          {"\"step\": 1200", "\"step\": 1200.5", "step: expected an integer"},
                          {"\"name\": \"w\"", "\"name\": 5", "variables[0].name: expected a string"},
                          {"\"dtype\": \"float32\"", "\"dtype\": \"float33\"",
                           "variables[0].dtype: unknown dtype 'float33'"},
                          {"\"shape\": [13, 4]", "\"shape\": 13", "variables[0].shape: expected a list of integers"},
                          {"\"shape\": [13, 4]", "\"shape\": [13, true]", "variables[0].shape[1]: expected an integer"},
                          {"\"shards\": [", "\"shards\": [7, ", "variables[0].shards[0]: expected an object"},
                          {"\"first_row\": 0", "\"first_row\": null",
                           "variables[0].shards[0].first_row: expected an integer"},
                          {"\"kind\": \"adagrad\"", "\"kind\": [\"adagrad\"]",
                           "variables[0].optimizer.kind: expected a string"},
                          {"\"learning_rate\": 0.1", "\"learning_rate\": \"fast\"",
                           "variables[0].optimizer.hyperparameters.learning_rate: expected a number"},
                          {"\"hyperparameters\": {\"learning_rate\": 0.1, "
                           "\"initial_accumulator_value\": 1e-07, \"epsilon\": 1e-07}",
                           "\"hyperparameters\": 0.1",
                           "variables[0].optimizer.hyperparameters: expected an object"},
                          {"\"nesterov\": false", "\"nesterov\": 0",
                           "variables[0].optimizer.nesterov: expected true or false"},
                          {"\"slots\": [\"accumulator\"]", "\"slots\": [1]",
                           "variables[0].slots[0]: expected a string"},
                          {"\"size\": 4096", "\"size\": -1", "files[0].size: expected a non-negative integer"},
                          {"\"crc32c\": 3735928559", "\"crc32c\": 4294967296", "files[0].crc32c: does not fit 32 bits"},
                          {"{\"name\": \"ps-0.safetensors\", \"size\"",
                           "[], {\"name\": \"ps-0.safetensors\", \"size\"",
                           "files[0]: expected an object"},
                      });
}

TEST_CASE("manifest parse: inconsistent partitioning and shards are named") {
  require_edit_errors(to_json(sample_manifest()),
                      {
                          {"[3, 3, 3, 2, 2]", "[3, 3, 3, 2, 3]",
                           "variables[0].partitioning: covers 14 rows in 5 shards, but shape [13, 4] has 13"},
                          {"[3, 3, 3, 2, 2]", "[3, 3, 3, 6, -2]", "variables[0].partitioning: has a negative"},
                          {"\"partitioning\": [1]", "\"partitioning\": []", "variables[1].partitioning: is empty"},
                          {"\"partitioning\": [1]", "\"partitioning\": [2]",
                           "variables[1].partitioning: covers 2 rows"},
                          {"[3, 3, 3, 2, 2]", "[3, 3, 3, 4]", "variables[0].shards: has 5 entries for 4 partitions"},
                          {"\"first_row\": 3", "\"first_row\": 4",
                           "variables[0].shards[1].first_row: is 4; the partitioning puts it at 3"},
                          {"\"first_row\": 0, \"rows\": 3", "\"first_row\": 0, \"rows\": 2",
                           "variables[0].shards[0].rows: is 2; the partitioning says 3"},
                          {"\"file\": \"ps-1.safetensors\"", "\"file\": \"ps-9.safetensors\"",
                           "variables[0].shards[1].file: 'ps-9.safetensors' is not in files"},
                      });
}

TEST_CASE("manifest parse: values out of range and repeated names are named") {
  require_edit_errors(to_json(sample_manifest()),
                      {
                          {"\"step\": 1200", "\"step\": -1", "step: is negative"},
                          {"\"shape\": [13, 4]", "\"shape\": [13, -4]",
                           "variables[0].shape: [13, -4] has a negative dimension"},
                          {"\"optimizer_step\": 1200", "\"optimizer_step\": -3",
                           "variables[0].optimizer_step: is negative"},
                          {"\"name\": \"global_step\"", "\"name\": \"w\"",
                           "variables[1].name: variable 'w' is listed twice"},
                          {"\"name\": \"w\"", "\"name\": \"\"", "variables[0].name: is empty"},
                          {"[\"accumulator\"]", "[\"accumulator\", \"accumulator\"]",
                           "variables[0].slots[1]: 'accumulator' is listed twice"},
                          {"{\"name\": \"ps-1.safetensors\"", "{\"name\": \"../x\"",
                           "files[1].name: '../x' is not a data file name"},
                          {"{\"name\": \"ps-1.safetensors\"", "{\"name\": \"manifest.json\"",
                           "files[1].name: 'manifest.json' is not a data file name"},
                          {"{\"name\": \"ps-1.safetensors\"", "{\"name\": \"ps-0.safetensors\"",
                           "files[1].name: 'ps-0.safetensors' is listed twice"},
                      });
}

TEST_CASE("manifest parse: a shard name repeated within one file") {
  Manifest m = sample_manifest();
  m.variables[0].shards[2].name = "w/part_0";  // also in ps-0.safetensors
  require_parse_error(to_json(m),
                      "variables[0].shards[2].name: tensor 'w/part_0' of "
                      "'ps-0.safetensors' is used twice");
}

TEST_CASE("manifest: validate_manifest refuses what parse_manifest would") {
  Manifest m = sample_manifest();
  CHECK(validate_manifest(m).ok());
  m.variables[0].dtype = DType::kInvalid;
  Status status = validate_manifest(m);
  CHECK(status.code() == StatusCode::kInvalidArgument);
  CHECK(message_contains(status, "variables[0].dtype"));

  m = sample_manifest();
  m.files[0].name = "sub/ps-0.safetensors";
  CHECK(validate_manifest(m).code() == StatusCode::kInvalidArgument);

  m = sample_manifest();
  m.variables[0].slots = {"bad\xff"};
  CHECK(validate_manifest(m).code() == StatusCode::kInvalidArgument);

  m = sample_manifest();
  m.format_version = 2;
  CHECK(validate_manifest(m).code() == StatusCode::kInvalidArgument);
}

// A dynamic embedding table of dim 8 with 5 rows on ps-0 and 3 on ps-1.
ManifestVariable sample_table() {
  ManifestVariable t;
  t.name = "user_emb";
  t.dtype = DType::kFloat32;
  t.shape = {8, 8};
  t.partitioning = {5, 3};
  t.shards = {{"user_emb/part_0", "ps-0.safetensors", 0, 5}, {"user_emb/part_1", "ps-1.safetensors", 5, 3}};
  t.optimizer = Optimizer::adam(0.001);
  t.slots = {"m", "v"};
  t.optimizer_step = 77;
  ManifestTable table;
  table.dim = 8;
  table.initializer = EmbeddingInitializer::random_normal(0, 0.05, 0xFFFFFFFFFFFFFFFFULL);
  table.options.min_count = 3;
  table.options.admit_probability = 0.25;
  table.options.ttl_steps = 1000;
  table.options.max_rows = 1 << 20;
  table.options.eviction = "lfu";
  table.options.default_value = -0.5;
  table.generation = 12;
  t.table = table;
  return t;
}

TEST_CASE("manifest: an embedding table round-trips with its spec, generation and checksum") {
  Manifest m = sample_manifest();
  m.variables.push_back(sample_table());
  std::string json = to_json_with_checksum(m);
  CHECK_THAT(json, Catch::Contains("\"table\": {\"dim\": 8") && Catch::Contains("\"generation\": 12") &&
                       Catch::Contains("\"seed\": 18446744073709551615"));
  Manifest back = parse_ok(json);
  CHECK(back == m);
  // Manifests without tables are unchanged: no "table" key.
  CHECK_THAT(to_json(sample_manifest()), !Catch::Contains("\"table\""));
}

TEST_CASE("manifest parse: a table whose dim disagrees with its shape, or with unknown fields, is refused") {
  Manifest m = sample_manifest();
  m.variables.push_back(sample_table());
  std::string json = to_json(m);
  auto wrong_dim = parse_manifest(replace(json, "\"dim\": 8", "\"dim\": 9"), "m.json");
  CHECK(wrong_dim.status().code() == StatusCode::kDataLoss);
  CHECK(message_contains(wrong_dim.status(), "variables[2].table.dim"));
  auto unknown = parse_manifest(replace(json, "\"generation\": 12", "\"generation\": 12, \"colour\": 1"), "m.json");
  CHECK(unknown.status().code() == StatusCode::kDataLoss);
  CHECK(message_contains(unknown.status(), "colour"));
  auto negative = parse_manifest(replace(json, "\"generation\": 12", "\"generation\": -1"), "m.json");
  CHECK(negative.status().code() == StatusCode::kDataLoss);
}

TEST_CASE("checkpoint index: round trip") {
  CheckpointIndex index{"ckpt-20", {"ckpt-10", "ckpt-20"}};
  CHECK(to_json(index) == "{\"latest\": \"ckpt-20\", \"kept\": [\"ckpt-10\", \"ckpt-20\"]}\n");
  auto parsed = parse_checkpoint_index(to_json(index), "dir/checkpoint");
  REQUIRE(parsed.ok());
  CHECK(*parsed == index);
}

TEST_CASE("checkpoint index: damage is DataLoss naming the file and field") {
  auto check = [](const std::string& json, const std::string& field) {
    auto index = parse_checkpoint_index(json, "dir/checkpoint");
    INFO(json);
    REQUIRE_FALSE(index.ok());
    CHECK(index.status().code() == StatusCode::kDataLoss);
    CHECK(message_contains(index.status(), "dir/checkpoint"));
    CHECK(message_contains(index.status(), field));
  };
  check("{\"latest\": \"ckpt-2\"", "not valid JSON");
  check("{\"kept\": [\"ckpt-2\"]}", "latest: missing");
  check("{\"latest\": \"ckpt-2\"}", "kept: missing");
  check("{\"latest\": 2, \"kept\": [\"ckpt-2\"]}", "latest: expected a string");
  check("{\"latest\": \"ckpt-2\", \"kept\": \"ckpt-2\"}", "kept: expected a list of strings");
  check("{\"latest\": \"ckpt-3\", \"kept\": [\"ckpt-2\"]}", "latest: 'ckpt-3' is not the last");
  check("{\"latest\": \"ckpt-2\", \"kept\": [\"ckpt-2\"], \"x\": 1}", "x: unknown field");
}

}  // namespace
}  // namespace capstan::checkpoint
