// fit on real daemons: parameter servers, a coordinator and worker-servers
// loading torch_test_module.cc, whose register_model'd "fit_mlp" is the
// test MLP (4 -> 8 -> 1) as a binary classifier trained with sgd (0.5), and
// "fit_hybrid" the Tower (an embedding on the parameter servers, a mirrored
// head). The multi-client strategy's tests, whose programs hold the module
// themselves, are in fit_multi_client_test.cc. One case reads its training
// batches through the tf.data service (a data-dispatcher and two data
// workers beside the cluster).
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
#include "capstan/data/service.h"
#include "capstan/strategy.h"
#include "tests/integration/training_cluster.h"
#include "torch/tests/fit_test_util.h"
#include "tests/build_path.h"

namespace capstan::torch {
namespace {

using capstan::testing::Daemon;
using capstan::testing::TestCluster;
using capstan::testing::Training;
using capstan::testing::wait_until;
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
  Training t(/*num_ps=*/2, /*num_workers=*/2, {}, true, capstan::testing::build_path(CAPSTAN_TORCH_TEST_MODULE));
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
  // Each line ends with where the workers' time went (worker_stats()).
  CHECK_THAT(printed, Catch::Contains(" - time: queued ") && Catch::Contains("ps ") && Catch::Contains("compute "));

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
  Training t(/*num_ps=*/1, /*num_workers=*/1, {}, true, capstan::testing::build_path(CAPSTAN_TORCH_TEST_MODULE));
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
  Training t(/*num_ps=*/1, /*num_workers=*/2, {}, true, capstan::testing::build_path(CAPSTAN_TORCH_TEST_MODULE));
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

// The tf.data service beside the training cluster: a data-dispatcher and two
// data workers that have registered with it.
struct DataService {
  explicit DataService(TestCluster& cluster) {
    dispatcher = &cluster.start("data-dispatcher");
    for (int i = 0; i < 2; ++i) {
      workers.push_back(&cluster.start("data-worker", {"--dispatcher", dispatcher->address(), "--task-index",
                                                       std::to_string(i)}));
    }
    REQUIRE(wait_until([this]() {
      std::string log = dispatcher->log();
      for (Daemon* w : workers) {
        if (log.find("data worker " + w->address() + " registered") == std::string::npos) return false;
      }
      return true;
    }, std::chrono::seconds(15)));
  }
  Daemon* dispatcher = nullptr;
  std::vector<Daemon*> workers;
};

TEST_CASE("fit trains the classifier on a per-worker dataset that each worker reads from the tf.data service") {
  Training t(/*num_ps=*/2, /*num_workers=*/2, {}, true, capstan::testing::build_path(CAPSTAN_TORCH_TEST_MODULE));
  DataService service(t.cluster);
  create_mlp_variables(*t.client);
  // The pipeline runs on the data workers; each training worker's iterator
  // reads its batches from them (the definition the worker-servers get is
  // from_dataset_id's).
  const data::Dataset pipeline = examples(4096, 1).shuffle(1024, 2).repeat().batch(64, true);
  const std::string id = data::service::register_dataset(service.dispatcher->address(), pipeline).value();
  data::service::ReadOptions read;
  std::string mode;
  // (Not kDynamic: from_tensor_slices has no split provider here, only
  // range and file sources do.)
  SECTION("a shared job, each data worker its shard of the elements (kData)") {
    read.processing_mode = data::service::ProcessingMode::kData;
    read.job_name = "fit-train-data";
    mode = "DATA";
  }
  SECTION("parallel epochs: a shared job, each data worker running the whole pipeline (kOff)") {
    read.processing_mode = data::service::ProcessingMode::kOff;
    read.job_name = "fit-train-off";
    mode = "OFF";
  }
  PerWorkerDataset train = t.client
                               ->create_per_worker_dataset(
                                   data::service::from_dataset_id(service.dispatcher->address(), id, read))
                               .value();
  PerWorkerDataset validation =
      t.client->create_per_worker_dataset(examples(1024, 3).repeat().batch(128, true)).value();
  ParameterServerFitStrategy strategy(*t.client);
  History history = fit(strategy, "fit_mlp",
                        {.epochs = 5,
                         .steps_per_epoch = 40,
                         .train = train,
                         .validation = validation,
                         .validation_steps = 8,
                         .learning_rate = kLearningRate})
                        .value();
  CHECK(history.epoch == std::vector<int>{0, 1, 2, 3, 4});
  const auto& h = history.history;
  for (const char* key : {"loss", "accuracy", "auc", "val_loss", "val_accuracy", "val_auc"}) {
    INFO(key);
    REQUIRE(h.count(key) == 1);
    CHECK(h.at(key).size() == 5);
  }
  // The bar of "fit trains a LibTorch classifier ...".
  CHECK(h.at("loss").back() < h.at("loss").front());
  CHECK(h.at("val_loss").back() < h.at("val_loss").front());
  CHECK(h.at("val_accuracy").back() > 0.9);
  CHECK(h.at("val_auc").back() > 0.95);
  // The batches came through the service: the dispatcher made the job, and
  // the data workers served its tasks.
  const std::string dispatcher_log = service.dispatcher->log();
  INFO(dispatcher_log);
  CHECK(dispatcher_log.find("created job") != std::string::npos);
  CHECK(dispatcher_log.find("mode " + mode) != std::string::npos);
  int serving = 0;
  for (Daemon* w : service.workers) serving += w->log().find(": serving") != std::string::npos ? 1 : 0;
  CHECK(serving == 2);
}

// Makes an epoch worse than the ones before, deterministically: when epoch
// `at` begins it negates the output layer (every prediction flips), and the
// LearningRateScheduler beside it runs that epoch and the later ones at
// rate 0, so no step repairs it.
struct Sabotage : Callback {
  ClusterCoordinator* cluster;
  int at;
  Sabotage(ClusterCoordinator* cluster, int at) : cluster(cluster), at(at) {}
  Status on_epoch_begin(int epoch, FitState&) override {
    if (epoch != at) return Status::Ok();
    for (const char* name : {"fit/second.weight", "fit/second.bias"}) {
      std::vector<float> value = read(*cluster, name);
      for (float& v : value) v = -v;
      const int64_t n = static_cast<int64_t>(value.size());
      CAPSTAN_RETURN_IF_ERROR(cluster->assign_variable(
          name, Tensor::from_vector(value, std::string(name) == "fit/second.bias" ? Shape{1} : Shape{1, n}).value()));
    }
    return Status::Ok();
  }
};

// Every variable of the MLP, by name.
std::map<std::string, std::vector<float>> read_all(ClusterCoordinator& cluster) {
  std::map<std::string, std::vector<float>> values;
  for (const MirroredVariableSpec& p : mlp_parameters()) values[p.name] = read(cluster, p.name);
  return values;
}

// The variables at every epoch's end.
struct AllSnapshots : Callback {
  ClusterCoordinator* cluster;
  std::vector<std::map<std::string, std::vector<float>>> values;
  explicit AllSnapshots(ClusterCoordinator* cluster) : cluster(cluster) {}
  Status on_epoch_end(int, const Logs&, FitState&) override {
    values.push_back(read_all(*cluster));
    return Status::Ok();
  }
};

TEST_CASE("ModelCheckpoint save_best_only and EarlyStopping restore_best_weights on a real cluster") {
  // One worker: the validation pass (8 x 128 = the 1024 examples once) and
  // its loss are the same whenever the variables are.
  Training t(/*num_ps=*/2, /*num_workers=*/1, {}, true, capstan::testing::build_path(CAPSTAN_TORCH_TEST_MODULE));
  create_mlp_variables(*t.client);
  PerWorkerDataset train =
      t.client->create_per_worker_dataset(examples(4096, 1).shuffle(1024, 2).repeat().batch(64, true)).value();
  PerWorkerDataset validation =
      t.client->create_per_worker_dataset(examples(1024, 3).repeat().batch(128, true)).value();
  ParameterServerFitStrategy strategy(*t.client);
  const std::string checkpoints = temp_dir("best");
  const std::string best_weights = temp_dir("early");
  // Epochs 0 and 1 train (val_loss improves); epoch 2 begins with the output
  // layer negated and 2.. train at rate 0: val_loss is far worse from then on.
  LearningRateScheduler schedule([](int epoch, double) { return epoch >= 2 ? 0.0 : kLearningRate; });
  Sabotage sabotage(t.client.get(), 2);
  ModelCheckpoint checkpoint({.directory = checkpoints, .monitor = "val_loss", .save_best_only = true});
  EarlyStopping stop({.monitor = "val_loss", .patience = 2, .restore_best_weights_dir = best_weights});
  AllSnapshots snapshots(t.client.get());
  History history = fit(strategy, "fit_mlp",
                        {.epochs = 6,
                         .steps_per_epoch = 20,
                         .train = train,
                         .validation = validation,
                         .validation_steps = 8,
                         .learning_rate = kLearningRate,
                         .callbacks = {&schedule, &sabotage, &snapshots, &checkpoint, &stop}})
                        .value();
  const std::vector<double>& val_loss = history.history.at("val_loss");
  INFO("val_loss " << ::Catch::Detail::stringify(val_loss));
  REQUIRE(val_loss.size() >= 3);
  REQUIRE(val_loss[1] < val_loss[0]);
  REQUIRE(val_loss[2] > val_loss[1]);

  // EarlyStopping: epochs 2 and 3 without improvement (patience 2), so fit
  // stops after epoch 3, and the variables are epoch 1's again.
  CHECK(history.epoch == std::vector<int>{0, 1, 2, 3});
  CHECK(stop.best_epoch() == 1);
  CHECK(stop.stopped_epoch() == 3);
  REQUIRE(snapshots.values.size() == 4);
  CHECK(snapshots.values[3] != snapshots.values[1]);
  CHECK(read_all(*t.client) == snapshots.values[1]);
  CHECK(std::filesystem::exists(std::filesystem::path(best_weights) / "ckpt-2"));
  // evaluate on the restored variables: the best epoch's val_loss.
  MetricState restored = strategy.evaluate("fit_mlp", validation, 8).value();
  CHECK(restored.logs("val_").at("val_loss") == Approx(val_loss[1]).epsilon(1e-5));

  // ModelCheckpoint: only the improving epochs, 0 and 1, were saved
  // (ckpt-<epoch + 1>), as checkpoint directories on disk.
  REQUIRE(checkpoint.saved().size() == 2);
  CHECK(checkpoint.saved()[0].find("ckpt-1") != std::string::npos);
  CHECK(checkpoint.saved()[1].find("ckpt-2") != std::string::npos);
  std::vector<std::string> on_disk;
  for (const auto& entry : std::filesystem::directory_iterator(checkpoints)) {
    if (entry.path().filename().string().rfind("ckpt-", 0) == 0) on_disk.push_back(entry.path().filename().string());
  }
  std::sort(on_disk.begin(), on_disk.end());
  CHECK(on_disk == std::vector<std::string>{"ckpt-1", "ckpt-2"});
  // Restoring each gives its epoch's variables and val_loss back.
  for (int epoch : {0, 1}) {
    INFO("epoch " << epoch);
    // Move away from it first (the sabotaged variables of epoch 3).
    for (const auto& [name, value] : snapshots.values[3]) {
      const Tensor current = t.client->read_variable(name).value();
      REQUIRE(t.client->assign_variable(name, Tensor::from_vector(value, current.shape()).value()).ok());
    }
    CHECK(strategy.restore_checkpoint(checkpoint.saved()[static_cast<size_t>(epoch)]).value() == epoch + 1);
    CHECK(read_all(*t.client) == snapshots.values[static_cast<size_t>(epoch)]);
    MetricState evaluated = strategy.evaluate("fit_mlp", validation, 8).value();
    CHECK(evaluated.logs("val_").at("val_loss") == Approx(val_loss[static_cast<size_t>(epoch)]).epsilon(1e-5));
  }
  std::filesystem::remove_all(checkpoints);
  std::filesystem::remove_all(best_weights);
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
  Training t(/*num_ps=*/1, /*num_workers=*/2, {}, true, capstan::testing::build_path(CAPSTAN_TORCH_TEST_MODULE));
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
  Training t(/*num_ps=*/1, /*num_workers=*/2, {}, true, capstan::testing::build_path(CAPSTAN_TORCH_TEST_MODULE));
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
  Training t(/*num_ps=*/2, /*num_workers=*/2, {}, true, capstan::testing::build_path(CAPSTAN_TORCH_TEST_MODULE));
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
