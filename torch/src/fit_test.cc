// fit's driver, metrics and callbacks against a scripted strategy (no
// cluster, no LibTorch).
#include "capstan/fit.h"

#include <catch2/catch.hpp>

#include <filesystem>
#include <sstream>

#include "torch/tests/fit_test_util.h"

namespace capstan::torch {
namespace {

using testing::Interrupt;
using testing::temp_dir;

// Metric state of `examples` examples with loss `loss` (accuracy `accuracy`).
MetricState state(double loss, double accuracy = 0.5, int64_t examples = 100) {
  MetricState s;
  s.loss_sum = loss * static_cast<double>(examples);
  s.examples = examples;
  s.correct = static_cast<int64_t>(accuracy * static_cast<double>(examples));
  return s;
}

// Trains nothing: each epoch's train loss and validation loss come from
// scripts; records the rates (-1: none) and checkpoints it was asked for.
class ScriptedStrategy : public FitStrategy {
 public:
  std::vector<double> train_losses, val_losses;
  std::vector<double> rates;
  std::vector<std::pair<std::string, int64_t>> saved;
  std::vector<std::string> restored;
  std::map<std::string, int64_t> latest;  // directory -> newest step

  Result<MetricState> train(const std::string& model, const PerWorkerDataset&, int64_t steps,
                            std::optional<double> learning_rate) override {
    CHECK(model == "m");
    CHECK(steps == 10);
    rates.push_back(learning_rate.value_or(-1));
    const size_t epoch = rates.size() - 1;
    return state(epoch < train_losses.size() ? train_losses[epoch] : 1.0);
  }
  Result<MetricState> evaluate(const std::string&, const PerWorkerDataset&, int64_t steps) override {
    CHECK(steps == 3);
    const size_t epoch = rates.size() - 1;
    return state(epoch < val_losses.size() ? val_losses[epoch] : 1.0, 0.75);
  }
  Result<std::string> save_checkpoint(const std::string& directory, int64_t step, int) override {
    saved.emplace_back(directory, step);
    latest[directory] = step;
    return directory + "/ckpt-" + std::to_string(step);
  }
  Result<int64_t> restore_checkpoint(const std::string& path) override {
    restored.push_back(path);
    auto found = latest.find(path);
    if (found == latest.end()) return Status::NotFound("no checkpoint in '" + path + "'");
    return found->second;
  }
};

FitOptions options(int epochs, std::vector<Callback*> callbacks = {}) {
  return FitOptions{.epochs = epochs,
                    .steps_per_epoch = 10,
                    .validation = PerWorkerDataset{7},
                    .validation_steps = 3,
                    .learning_rate = 0.1,
                    .callbacks = std::move(callbacks)};
}

// Records the epochs it saw begin and end.
struct Recorder : Callback {
  std::vector<int> begun, ended;
  int first_epoch = -1;
  Status on_train_begin(FitState& state) override {
    first_epoch = state.initial_epoch;
    return Status::Ok();
  }
  Status on_epoch_begin(int epoch, FitState&) override {
    begun.push_back(epoch);
    return Status::Ok();
  }
  Status on_epoch_end(int epoch, const Logs&, FitState&) override {
    ended.push_back(epoch);
    return Status::Ok();
  }
};

TEST_CASE("roc_auc of confusion counts matches a hand-computed ROC curve") {
  // Scores 0.1 (neg), 0.4 (pos), 0.35 (neg), 0.8 (pos) at thresholds
  // -eps, 0.3, 0.5, 1+eps (p > t is positive):
  //   t=-eps: tp 2 fp 2 tn 0 fn 0 -> (fpr 1, tpr 1)
  //   t=0.3:  tp 2 fp 1 tn 1 fn 0 -> (0.5, 1)
  //   t=0.5:  tp 1 fp 0 tn 2 fn 1 -> (0, 0.5)
  //   t=1+eps: all negative       -> (0, 0)
  // Trapezoids: (1-0.5)*(1+1)/2 + (0.5-0)*(1+0.5)/2 + 0 = 0.5 + 0.375 = 0.875.
  Result<double> auc = roc_auc({2, 2, 1, 0}, {2, 1, 0, 0}, {0, 1, 2, 2}, {0, 0, 1, 2});
  REQUIRE(auc.ok());
  CHECK(*auc == Approx(0.875));
  // A perfect ranking and an inverted one.
  CHECK(*roc_auc({1, 1, 0}, {1, 0, 0}, {0, 1, 1}, {0, 0, 1}) == Approx(1.0));
  CHECK(*roc_auc({1, 0, 0}, {1, 1, 0}, {0, 0, 1}, {0, 1, 1}) == Approx(0.0));
}

TEST_CASE("roc_auc refuses counts of different lengths, naming them") {
  Status status = roc_auc({1, 2}, {1}, {1, 2}, {1, 2}).status();
  CHECK(status.code() == StatusCode::kInvalidArgument);
  CHECK_THAT(status.message(), Catch::Contains("2, 1, 2, 2"));
}

TEST_CASE("auc_thresholds are Keras' 200: -eps, i/199, 1+eps") {
  std::vector<double> t = auc_thresholds(200);
  REQUIRE(t.size() == 200);
  CHECK(t[0] < 0);
  CHECK(t[1] == Approx(1.0 / 199));
  CHECK(t[198] == Approx(198.0 / 199));
  CHECK(t[199] > 1);
}

TEST_CASE("MetricState sums steps' results and reports loss, accuracy and auc") {
  auto step = [](double loss_sum, int64_t n, int64_t correct, std::vector<int64_t> confusion) {
    return Element{{Tensor::scalar<double>(loss_sum), Tensor::scalar<int64_t>(n), Tensor::scalar<int64_t>(correct),
                    Tensor::from_vector<int64_t>(confusion, {4, 2}).value()},
                   {"loss_sum", "examples", "correct", "confusion"}};
  };
  MetricState s;
  // Two steps, thresholds (-eps, 1+eps): everything positive at the first.
  REQUIRE(s.add(step(3.0, 4, 3, {2, 0, 2, 0, 0, 2, 0, 2})).ok());
  REQUIRE(s.add(step(1.0, 4, 4, {1, 0, 3, 0, 0, 3, 0, 1})).ok());
  Logs logs = s.logs("val_");
  CHECK(logs.at("val_loss") == Approx(0.5));
  CHECK(logs.at("val_accuracy") == Approx(7.0 / 8));
  CHECK(logs.at("val_auc") == Approx(0.5));  // the diagonal from (1, 1) to (0, 0)
  CHECK(s.tp == std::vector<int64_t>{3, 0});

  SECTION("a result without confusion counts is refused, naming them") {
    Element bad = step(1.0, 1, 1, {0, 0, 0, 0, 0, 0, 0, 0});
    bad.names[3] = "other";
    Status status = s.add(bad);
    CHECK(status.code() == StatusCode::kInvalidArgument);
    CHECK_THAT(status.message(), Catch::Contains("'confusion'"));
  }
  SECTION("a loss of the wrong dtype is refused, naming it") {
    Element bad = step(1.0, 1, 1, {0, 0, 0, 0, 0, 0, 0, 0});
    bad.components[0] = Tensor::scalar<float>(1.0f);
    CHECK_THAT(s.add(bad).message(), Catch::Contains("float64") && Catch::Contains("'loss_sum'"));
  }
}

TEST_CASE("fit runs the epochs, validates each and returns Keras' History") {
  ScriptedStrategy strategy;
  strategy.train_losses = {0.9, 0.7, 0.5};
  strategy.val_losses = {0.95, 0.8, 0.6};
  Recorder recorder;
  History history = fit(strategy, "m", options(3, {&recorder})).value();
  CHECK(history.epoch == std::vector<int>{0, 1, 2});
  CHECK(history.history.at("loss") == std::vector<double>{0.9, 0.7, 0.5});
  CHECK(history.history.at("val_loss") == std::vector<double>{0.95, 0.8, 0.6});
  CHECK(history.history.at("val_accuracy") == std::vector<double>{0.75, 0.75, 0.75});
  CHECK(history.history.at("lr") == std::vector<double>{0.1, 0.1, 0.1});
  for (const char* key : {"loss", "accuracy", "val_loss", "val_accuracy", "lr"}) CHECK(history.history.count(key));
  CHECK(recorder.begun == std::vector<int>{0, 1, 2});
  CHECK(recorder.ended == std::vector<int>{0, 1, 2});
  CHECK(strategy.rates == std::vector<double>{-1, -1, -1});
}

TEST_CASE("fit refuses invalid options, naming the field and the fix") {
  ScriptedStrategy strategy;
  FitOptions o = options(2);
  SECTION("no steps_per_epoch") {
    o.steps_per_epoch = 0;
    CHECK_THAT(fit(strategy, "m", o).status().message(), Catch::Contains("steps_per_epoch 0") &&
                                                             Catch::Contains("repeat"));
  }
  SECTION("zero epochs") {
    o.epochs = 0;
    CHECK_THAT(fit(strategy, "m", o).status().message(), Catch::Contains("epochs 0"));
  }
  SECTION("validation steps without a validation dataset") {
    o.validation.reset();
    CHECK_THAT(fit(strategy, "m", o).status().message(), Catch::Contains("validation_steps 3"));
  }
  SECTION("a null callback") {
    o.callbacks = {nullptr};
    CHECK_THAT(fit(strategy, "m", o).status().message(), Catch::Contains("callbacks[0]"));
  }
  CHECK(strategy.rates.empty());
}

TEST_CASE("EarlyStopping stops once the monitored loss has not improved for `patience` epochs") {
  // val_loss: 1.0, 0.8, 0.81, 0.79 (an improvement under min_delta 0.05),
  // 0.9: best at epoch 1; epochs 2, 3, 4 do not improve by 0.05: with
  // patience 3 fit stops after epoch 4.
  ScriptedStrategy strategy;
  strategy.val_losses = {1.0, 0.8, 0.81, 0.79, 0.9, 0.5, 0.4};
  EarlyStopping stop({.monitor = "val_loss", .min_delta = 0.05, .patience = 3});
  History history = fit(strategy, "m", options(7, {&stop})).value();
  CHECK(history.epoch == std::vector<int>{0, 1, 2, 3, 4});
  CHECK(stop.stopped_epoch() == 4);
  CHECK(stop.best_epoch() == 1);
}

TEST_CASE("EarlyStopping on a metric to maximize, with patience 0, and best weights restored") {
  EarlyStopping stop({.monitor = "val_auc", .patience = 0, .restore_best_weights_dir = "best"});
  ScriptedStrategy strategy;
  FitState state{.strategy = &strategy};
  REQUIRE(stop.on_train_begin(state).ok());
  REQUIRE(stop.on_epoch_end(0, {{"val_auc", 0.7}}, state).ok());
  REQUIRE(stop.on_epoch_end(1, {{"val_auc", 0.8}}, state).ok());
  CHECK_FALSE(state.stop_training);
  REQUIRE(stop.on_epoch_end(2, {{"val_auc", 0.75}}, state).ok());
  CHECK(state.stop_training);
  CHECK(stop.stopped_epoch() == 2);
  // Saved at each improvement (steps = epochs done), restored at the stop.
  CHECK(strategy.saved == std::vector<std::pair<std::string, int64_t>>{{"best", 1}, {"best", 2}});
  CHECK(strategy.restored == std::vector<std::string>{"best"});
}

TEST_CASE("EarlyStopping names a monitored metric missing from the logs, and the ones there") {
  EarlyStopping stop({.monitor = "val_auc"});
  ScriptedStrategy strategy;
  FitState state{.strategy = &strategy};
  REQUIRE(stop.on_train_begin(state).ok());
  Status status = stop.on_epoch_end(0, {{"loss", 1.0}}, state);
  CHECK(status.code() == StatusCode::kInvalidArgument);
  CHECK_THAT(status.message(), Catch::Contains("'val_auc'") && Catch::Contains("(loss)"));
}

TEST_CASE("LearningRateScheduler sets each epoch's rate, steps carry it once it differs from the initial rate") {
  ScriptedStrategy strategy;
  LearningRateScheduler schedule([](int epoch, double rate) { return epoch < 2 ? rate : rate / 2; });
  History history = fit(strategy, "m", options(4, {&schedule})).value();
  // The first two epochs keep the optimizers' own rate (and schedule).
  CHECK(strategy.rates == std::vector<double>{-1, -1, 0.05, 0.025});
  CHECK(history.history.at("lr") == std::vector<double>{0.1, 0.1, 0.05, 0.025});

  SECTION("a negative rate is refused, naming the epoch and the rate") {
    LearningRateScheduler bad([](int, double) { return -1.0; });
    CHECK_THAT(fit(strategy, "m", options(1, {&bad})).status().message(),
               Catch::Contains("epoch 0") && Catch::Contains("-1"));
  }
  SECTION("without the optimizers' rate, a schedule has nothing to start from") {
    LearningRateScheduler fixed([](int, double) { return 0.05; });
    FitOptions o = options(1, {&fixed});
    o.learning_rate = 0;
    CHECK_THAT(fit(strategy, "m", o).status().message(), Catch::Contains("FitOptions::learning_rate"));
  }
}

TEST_CASE("BackupAndRestore: a fit interrupted in epoch 2 resumes at epoch 3 from its backup") {
  const std::string dir = temp_dir("test-backup");
  std::filesystem::create_directories(dir);  // removed by the finished fit
  ScriptedStrategy strategy;
  BackupAndRestore backup(dir);
  Interrupt interrupt(1);
  Result<History> first = fit(strategy, "m", options(4, {&backup, &interrupt}));
  CHECK(first.status().code() == StatusCode::kAborted);
  CHECK(strategy.latest.at(dir) == 2);  // epochs 0 and 1 done

  Recorder recorder;
  History second = fit(strategy, "m", options(4, {&backup, &recorder})).value();
  CHECK(recorder.first_epoch == 2);
  CHECK(second.epoch == std::vector<int>{2, 3});
  CHECK(strategy.restored.back() == dir);
  CHECK(strategy.latest.at(dir) == 4);
  CHECK_FALSE(std::filesystem::exists(dir));
}

TEST_CASE("ModelCheckpoint with save_best_only saves the epochs that improve the monitored metric") {
  ScriptedStrategy strategy;
  strategy.val_losses = {1.0, 0.8, 0.9, 0.7};
  ModelCheckpoint checkpoint({.directory = "ckpts", .save_best_only = true});
  fit(strategy, "m", options(4, {&checkpoint})).value();
  CHECK(checkpoint.saved() == std::vector<std::string>{"ckpts/ckpt-1", "ckpts/ckpt-2", "ckpts/ckpt-4"});
}

TEST_CASE("ProgressLogger prints one line per epoch, training logs before validation's") {
  ScriptedStrategy strategy;
  strategy.train_losses = {0.5};
  std::ostringstream out;
  ProgressLogger progress(&out);
  fit(strategy, "m", options(1, {&progress})).value();
  const std::string line = out.str();
  CHECK_THAT(line, Catch::StartsWith("Epoch 1/1 - 10 steps - "));
  CHECK_THAT(line, Catch::Contains(" - loss: 0.5000") && Catch::Contains(" - val_loss: 1.0000"));
  CHECK(line.find("val_accuracy") > line.find("lr: "));
}

TEST_CASE("TensorBoard writes each epoch's logs as epoch_ scalars, validation's in their own run") {
  const std::string dir = temp_dir("test-tensorboard");
  ScriptedStrategy strategy;
  strategy.train_losses = {0.9, 0.6};
  strategy.val_losses = {0.8, 0.7};
  TensorBoard board(dir);
  fit(strategy, "m", options(2, {&board})).value();
  std::map<std::string, std::vector<std::pair<int64_t, double>>> train, validation;
  for (const ScalarEvent& e : read_scalar_events(board.train_path()).value()) train[e.tag].emplace_back(e.step, e.value);
  for (const ScalarEvent& e : read_scalar_events(board.validation_path()).value()) {
    validation[e.tag].emplace_back(e.step, e.value);
  }
  REQUIRE(train.at("epoch_loss").size() == 2);
  CHECK(train.at("epoch_loss")[0].first == 0);
  CHECK(train.at("epoch_loss")[0].second == Approx(0.9));
  CHECK(train.at("epoch_loss")[1].first == 1);
  CHECK(train.at("epoch_loss")[1].second == Approx(0.6));
  CHECK(train.count("epoch_learning_rate") == 1);
  CHECK(train.count("epoch_val_loss") == 0);
  REQUIRE(validation.at("epoch_loss").size() == 2);
  CHECK(validation.at("epoch_loss")[1].second == Approx(0.7));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace capstan::torch
