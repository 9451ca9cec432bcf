// fit on real daemons: parameter servers, a coordinator and worker-servers
// loading torch_test_module.cc, whose register_model'd "fit_mlp" is the
// test MLP (4 -> 8 -> 1) as a binary classifier trained with sgd (0.5), and
// "fit_hybrid" the Tower (an embedding on the parameter servers, a mirrored
// head). The multi-client strategy's tests, whose programs hold the module
// themselves, are in fit_multi_client_test.cc.
//
// This file includes no LibTorch (capstan/fit.h needs none, as a training
// program's need not): the variables are created with the shapes of
// testing::Mlp's parameters and LibTorch's Linear initialization.
#include "capstan/fit.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <random>
#include <sstream>

#include "capstan/checkpoint.h"
#include "capstan/data/dataset.h"
#include "capstan/strategy.h"
#include "tests/integration/training_cluster.h"
#include "torch/tests/fit_test_util.h"

namespace capstan::torch {
namespace {

using capstan::testing::Training;
using testing::examples;
using testing::Interrupt;
using testing::temp_dir;

constexpr double kLearningRate = 0.5;  // the rate torch_test_module gives fit_mlp's optimizer

// testing::Mlp's parameters under "fit/": Linear(4, 8), Linear(8, 1), each
// drawn from U(-1/sqrt(in), 1/sqrt(in)) as LibTorch's Linear is; sgd as
// fit_mlp's spec says.
std::vector<MirroredVariableSpec> mlp_parameters() {
  struct Parameter {
    const char* name;
    Shape shape;
    double bound;
  };
  std::vector<MirroredVariableSpec> specs;
  uint64_t seed = 1;
  for (const Parameter& p : {Parameter{"first.weight", {8, 4}, 0.5}, Parameter{"first.bias", {8}, 0.5},
                             Parameter{"second.weight", {1, 8}, 1 / std::sqrt(8.0)},
                             Parameter{"second.bias", {1}, 1 / std::sqrt(8.0)}}) {
    Tensor initial = random_uniform_initializer(DType::kFloat32, p.shape, -p.bound, p.bound, seed++).value();
    specs.push_back({std::string("fit/") + p.name, initial, Optimizer::sgd(kLearningRate)});
  }
  return specs;
}

void create_mlp_variables(ClusterCoordinator& cluster) {
  for (const MirroredVariableSpec& p : mlp_parameters()) {
    cluster.create_variable({p.name, p.initial, p.optimizer}).value();
  }
}

StrategyOptions strategy_options(const std::string& name) {
  StrategyOptions options;
  options.name = name;
  options.min_replicas = 2;
  options.collective.timeout = std::chrono::seconds(30);
  return options;
}

std::vector<float> read(ClusterCoordinator& cluster, const std::string& name) {
  Tensor value = cluster.read_variable(name).value();
  auto flat = value.flat<float>();
  return {flat.begin(), flat.end()};
}

TEST_CASE("fit trains a LibTorch classifier on two parameter servers and two workers, and validates it") {
  Training t(/*num_ps=*/2, /*num_workers=*/2, {}, true, CAPSTAN_TORCH_TEST_MODULE);
  create_mlp_variables(*t.client);
  PerWorkerDataset train =
      t.client->create_per_worker_dataset(examples(4096, 1).shuffle(1024, 2).repeat().batch(64, true)).value();
  PerWorkerDataset validation =
      t.client->create_per_worker_dataset(examples(1024, 3).repeat().batch(128, true)).value();
  const std::string logdir = temp_dir("tensorboard");
  std::ostringstream lines;
  ProgressLogger progress(&lines);
  TensorBoard board(logdir);
  ParameterServerFitStrategy strategy(*t.client);

  History history = fit(strategy, "fit_mlp",
                        {.epochs = 5,
                         .steps_per_epoch = 40,
                         .train = train,
                         .validation = validation,
                         .validation_steps = 8,
                         .learning_rate = kLearningRate,
                         .callbacks = {&progress, &board}})
                        .value();
  const std::string printed = lines.str();
  INFO(printed);
  CHECK(history.epoch == std::vector<int>{0, 1, 2, 3, 4});
  for (const char* key : {"loss", "accuracy", "auc", "lr", "val_loss", "val_accuracy", "val_auc"}) {
    INFO(key);
    REQUIRE(history.history.count(key) == 1);
    CHECK(history.history.at(key).size() == 5);
  }
  const auto& h = history.history;
  // 40 steps of 64 examples an epoch: a linear rule on 4 features is learnt
  // within the first epochs; 0.9 leaves room for asynchronous steps' noise
  // (chance: about 0.5).
  CHECK(h.at("loss").back() < h.at("loss").front());
  CHECK(h.at("val_loss").back() < h.at("val_loss").front());
  CHECK(h.at("val_accuracy").back() > 0.9);
  CHECK(h.at("val_auc").back() > 0.95);
  CHECK(std::count(printed.begin(), printed.end(), '\n') == 5);

  // The TensorBoard scalars, read back: what History holds.
  std::vector<ScalarEvent> events = read_scalar_events(board.validation_path()).value();
  std::vector<double> val_auc;
  for (const ScalarEvent& e : events) {
    if (e.tag == "epoch_auc") val_auc.push_back(e.value);
  }
  REQUIRE(val_auc.size() == 5);
  for (size_t i = 0; i < 5; ++i) CHECK(val_auc[i] == Approx(h.at("val_auc")[i]).epsilon(1e-6));
  std::filesystem::remove_all(logdir);
}

// Reads a variable, by epoch, at every epoch's end (or, at_begin, when
// each epoch begins).
struct Snapshots : Callback {
  ClusterCoordinator* cluster;
  std::string variable;
  bool at_begin;
  std::map<int, std::vector<float>> values;
  explicit Snapshots(ClusterCoordinator* cluster, std::string variable = "fit/second.weight", bool at_begin = false)
      : cluster(cluster), variable(std::move(variable)), at_begin(at_begin) {}
  Status on_epoch_begin(int epoch, FitState&) override {
    if (at_begin) values[epoch] = read(*cluster, variable);
    return Status::Ok();
  }
  Status on_epoch_end(int epoch, const Logs&, FitState&) override {
    if (!at_begin) values[epoch] = read(*cluster, variable);
    return Status::Ok();
  }
};

TEST_CASE("LearningRateScheduler changes the rate the steps apply: a rate of 0 leaves the variables as they were") {
  Training t(/*num_ps=*/1, /*num_workers=*/1, {}, true, CAPSTAN_TORCH_TEST_MODULE);
  create_mlp_variables(*t.client);
  PerWorkerDataset train = t.client->create_per_worker_dataset(examples(512, 4).repeat().batch(32, true)).value();
  ParameterServerFitStrategy strategy(*t.client);
  LearningRateScheduler schedule([](int epoch, double) { return epoch == 1 ? 0.0 : kLearningRate; });
  Snapshots snapshots(t.client.get());
  History history = fit(strategy, "fit_mlp",
                        {.epochs = 3, .steps_per_epoch = 5, .train = train, .learning_rate = kLearningRate,
                         .callbacks = {&schedule, &snapshots}})
                        .value();
  CHECK(history.history.at("lr") == std::vector<double>{kLearningRate, 0.0, kLearningRate});
  REQUIRE(snapshots.values.size() == 3);
  CHECK(snapshots.values[1] == snapshots.values[0]);
  CHECK(snapshots.values[2] != snapshots.values[1]);

  SECTION("under Adam the parameter servers apply the scheduled rate itself: 0 leaves the variables as they were") {
    // fit_adam's variables: the MLP's under "fitadam/", with adam(0.01).
    for (MirroredVariableSpec p : mlp_parameters()) {
      p.name = "fitadam/" + p.name.substr(4);
      REQUIRE(t.client->create_variable({p.name, p.initial, Optimizer::adam(0.01)}).ok());
    }
    LearningRateScheduler adam_schedule([](int epoch, double) { return epoch == 1 ? 0.0 : 0.01; });
    Snapshots adam_snapshots(t.client.get(), "fitadam/second.weight");
    History adam = fit(strategy, "fit_adam",
                       {.epochs = 3, .steps_per_epoch = 5, .train = train, .learning_rate = 0.01,
                        .callbacks = {&adam_schedule, &adam_snapshots}})
                       .value();
    CHECK(adam.history.at("lr") == std::vector<double>{0.01, 0.0, 0.01});
    REQUIRE(adam_snapshots.values.size() == 3);
    const Tensor initial = mlp_parameters()[2].initial;  // second.weight
    CHECK(adam_snapshots.values[0] != std::vector<float>(initial.flat<float>().begin(), initial.flat<float>().end()));
    CHECK(adam_snapshots.values[1] == adam_snapshots.values[0]);
    CHECK(adam_snapshots.values[2] != adam_snapshots.values[1]);
  }
}

TEST_CASE("BackupAndRestore: fit interrupted in its second epoch resumes at the third with the backed-up variables") {
  Training t(/*num_ps=*/1, /*num_workers=*/2, {}, true, CAPSTAN_TORCH_TEST_MODULE);
  create_mlp_variables(*t.client);
  PerWorkerDataset train = t.client->create_per_worker_dataset(examples(512, 5).repeat().batch(32, true)).value();
  ParameterServerFitStrategy strategy(*t.client);
  const std::string backup_dir = temp_dir("backup");
  BackupAndRestore backup(backup_dir);
  FitOptions options{.epochs = 4, .steps_per_epoch = 6, .train = train, .learning_rate = kLearningRate};

  Interrupt interrupt(1);
  options.callbacks = {&backup, &interrupt};
  Status first = fit(strategy, "fit_mlp", options).status();
  CHECK(first.code() == StatusCode::kAborted);
  const std::vector<float> backed_up = read(*t.client, "fit/second.weight");
  // What the interruption lost: the variables move on (a later step, a
  // parameter server that came back empty).
  REQUIRE(t.client->assign_variable("fit/second.weight", Tensor::zeros(DType::kFloat32, {1, 8}).value()).ok());

  Snapshots begins(t.client.get(), "fit/second.weight", /*at_begin=*/true);
  options.callbacks = {&backup, &begins};
  History second = fit(strategy, "fit_mlp", options).value();
  CHECK(second.epoch == std::vector<int>{2, 3});
  REQUIRE(begins.values.count(2) == 1);
  CHECK(begins.values.at(2) == backed_up);
  CHECK_FALSE(std::filesystem::exists(backup_dir));  // a finished fit drops its backup
}

// fit of `model` through `mirrored` for 4 epochs of 30 steps, each replica
// its shard of make(4096, 1) shuffled (2 x 32 a step), validated on 4
// batches of make(1024, 3).
History fit_mirrored(MirroredStrategy& mirrored, MirroredFitStrategy& strategy, const std::string& model,
                     data::Dataset (*make)(int64_t, uint64_t)) {
  PerWorkerDataset train = mirrored.distribute_dataset(make(4096, 1).shuffle(1024, 2).repeat().batch(32, true)).value();
  PerWorkerDataset validation = mirrored.distribute_dataset(make(1024, 3).repeat().batch(64, true)).value();
  return fit(strategy, model,
             {.epochs = 4,
              .steps_per_epoch = 30,
              .train = train,
              .validation = validation,
              .validation_steps = 4,
              .learning_rate = kLearningRate})
      .value();
}

// Both replicas ran all 4 x 30 steps and still hold the same variables.
void check_replicas_agree(MirroredStrategy& mirrored) {
  REQUIRE(mirrored.verify_replicas().ok());
  std::vector<ReplicaStatus> replicas = mirrored.replicas().value();
  REQUIRE(replicas.size() == 2);
  CHECK(replicas[0].step == 120);
}

TEST_CASE("MirroredFitStrategy trains the classifier synchronously on two worker-servers as replicas") {
  Training t(/*num_ps=*/1, /*num_workers=*/2, {}, true, CAPSTAN_TORCH_TEST_MODULE);
  auto mirrored = MirroredStrategy::create(*t.client, mlp_parameters(), strategy_options("fit")).value();
  MirroredFitStrategy strategy(*mirrored);
  History history = fit_mirrored(*mirrored, strategy, "fit_mlp", examples);
  CHECK(history.epoch == std::vector<int>{0, 1, 2, 3});
  const auto& h = history.history;
  for (const char* key : {"loss", "accuracy", "auc", "val_loss", "val_accuracy", "val_auc"}) {
    INFO(key);
    REQUIRE(h.count(key) == 1);
    CHECK(h.at(key).size() == 4);
  }
  CHECK(h.at("loss").back() < h.at("loss").front());
  CHECK(h.at("val_accuracy").back() > 0.9);
  CHECK(h.at("val_auc").back() > 0.95);
  // Both replicas ran every step, and hold the same variables after 4 x 30
  // synchronous updates.
  CHECK(mirrored->num_replicas_in_sync() == 2);
  check_replicas_agree(*mirrored);

  // Checkpoints through the strategy: fit's callbacks save and restore them.
  const std::string directory = temp_dir("mirrored");
  std::string saved = strategy.save_checkpoint(directory, 120, 1).value();
  CHECK(saved.find("ckpt-120") != std::string::npos);
  CHECK(strategy.restore_checkpoint(directory).value() == 120);
  std::filesystem::remove_all(directory);
}

TEST_CASE("MirroredFitStrategy over a strategy whose variables are not the module's fails, naming the parameter") {
  Training t(/*num_ps=*/1, /*num_workers=*/2, {}, true, CAPSTAN_TORCH_TEST_MODULE);
  std::vector<MirroredVariableSpec> specs = mlp_parameters();
  specs.erase(specs.begin() + 1);  // fit/first.bias
  auto mirrored = MirroredStrategy::create(*t.client, specs, strategy_options("partial")).value();
  PerWorkerDataset train = mirrored->distribute_dataset(examples(512, 4).repeat().batch(32, true)).value();
  MirroredFitStrategy strategy(*mirrored);
  Status status =
      fit(strategy, "fit_mlp", {.epochs = 1, .steps_per_epoch = 2, .train = train, .learning_rate = kLearningRate})
          .status();
  CHECK_FALSE(status.ok());
  CHECK_THAT(status.message(), Catch::Contains("first.bias") && Catch::Contains("fit_mlp"));
}

// testing::Tower under "hyb/" as fit_hybrid trains it: the embedding's
// 20 x 3 rows (N(0, 0.05), seed 5, as capstan::torch::Embedding draws
// them) on the parameter servers with sgd (0.5), and the head's
// parameters (LibTorch's Linear(3, 1) initialization) as the mirrored
// strategy's variables.
std::vector<MirroredVariableSpec> tower_head() {
  const double bound = 1 / std::sqrt(3.0);
  return {{"hyb/head.weight", random_uniform_initializer(DType::kFloat32, {1, 3}, -bound, bound, 11).value(),
           Optimizer::sgd(kLearningRate)},
          {"hyb/head.bias", random_uniform_initializer(DType::kFloat32, {1}, -bound, bound, 12).value(),
           Optimizer::sgd(kLearningRate)}};
}

Tensor tower_rows() { return random_normal_initializer(DType::kFloat32, {20, 3}, 0, 0.05, 5).value(); }

// n examples of 3 ids in [0, 20), labelled 1 when more of them are even
// than odd: a rule the rows (one number per id, in effect) and the head
// learn together.
data::Dataset id_examples(int64_t n, uint64_t seed) {
  std::mt19937_64 random(seed);
  std::uniform_int_distribution<int64_t> id(0, 19);
  std::vector<int64_t> ids(static_cast<size_t>(n) * 3);
  std::vector<float> y(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    int even = 0;
    for (int j = 0; j < 3; ++j) {
      int64_t& v = ids[static_cast<size_t>(i * 3 + j)];
      v = id(random);
      even += v % 2 == 0 ? 1 : 0;
    }
    y[static_cast<size_t>(i)] = even >= 2 ? 1.0f : 0.0f;
  }
  return data::Dataset::from_tensor_slices(
      Element{{Tensor::from_vector(ids, {n, 3}).value(), Tensor::from_vector(y, {n, 1}).value()}, {"ids", "y"}});
}

TEST_CASE("MirroredFitStrategy trains a hybrid module: embedding rows on the parameter servers, the head mirrored") {
  Training t(/*num_ps=*/2, /*num_workers=*/2, {}, true, CAPSTAN_TORCH_TEST_MODULE);
  const Tensor rows = tower_rows();
  t.client->create_variable({"hyb/embedding.weight", rows, Optimizer::sgd(kLearningRate)}).value();
  auto mirrored = MirroredStrategy::create(*t.client, tower_head(), strategy_options("hybrid")).value();
  MirroredFitStrategy strategy(*mirrored);
  // The same fit call as for fit_mlp; only the module and its data differ.
  History history = fit_mirrored(*mirrored, strategy, "fit_hybrid", id_examples);
  const auto& h = history.history;
  INFO("loss " << h.at("loss").front() << " -> " << h.at("loss").back() << ", val_accuracy "
               << h.at("val_accuracy").back());
  CHECK(history.epoch == std::vector<int>{0, 1, 2, 3});
  CHECK(h.at("loss").back() < h.at("loss").front());
  // Chance is one half; the rule is learnt only if both halves train.
  CHECK(h.at("val_accuracy").back() > 0.9);
  CHECK(h.at("val_auc").back() > 0.95);

  // The rows moved on the parameter servers (sparse updates), the head on
  // the replicas, which still agree after 4 x 30 steps.
  const std::vector<float> before(rows.flat<float>().begin(), rows.flat<float>().end());
  CHECK(read(*t.client, "hyb/embedding.weight") != before);
  check_replicas_agree(*mirrored);

  // One checkpoint holds both halves, under the module's names.
  const std::string directory = temp_dir("hybrid");
  std::string saved = strategy.save_checkpoint(directory, 120, 1).value();
  auto reader = CheckpointReader::open(saved).value();
  CHECK(reader->read_variable("hyb/embedding.weight").value().flat<float>().size() == 60);
  CHECK(reader->read_variable("hyb/head.weight").value().flat<float>().size() == 3);
  CHECK(strategy.restore_checkpoint(directory).value() == 120);
  std::filesystem::remove_all(directory);
}

}  // namespace
}  // namespace capstan::torch
