// fit's driver and callbacks: no LibTorch here (capstan/fit.h); the steps
// are register_model's closures (model.cc).
#include "capstan/fit.h"

#include "capstan/strategy.h"

#include <cmath>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <sstream>
#include <utility>

namespace capstan::torch {
namespace {

const Tensor* component(const Element& element, const std::string& name) {
  for (size_t i = 0; i < element.names.size() && i < element.components.size(); ++i) {
    if (element.names[i] == name) return &element.components[i];
  }
  return nullptr;
}

Result<const Tensor*> scalar_component(const Element& element, const std::string& name, DType dtype) {
  const Tensor* tensor = component(element, name);
  if (tensor == nullptr || tensor->dtype() != dtype || tensor->num_elements() != 1) {
    return Status::InvalidArgument("a fit step's result needs a " + std::string(dtype_name(dtype)) +
                                   " scalar named '" + name +
                                   "' (is the closure register_model's \"<model>/train_step\"?)");
  }
  return tensor;
}

bool is_max_mode(MonitorMode mode, const std::string& monitor) {
  if (mode != MonitorMode::kAuto) return mode == MonitorMode::kMax;
  return monitor.find("acc") != std::string::npos || monitor.find("auc") != std::string::npos;
}

Result<double> monitored(const Logs& logs, const std::string& monitor, const char* who) {
  auto found = logs.find(monitor);
  if (found != logs.end()) return found->second;
  std::string names;
  for (const auto& [name, value] : logs) names += (names.empty() ? "" : ", ") + name;
  return Status::InvalidArgument(std::string(who) + ": the monitored '" + monitor + "' is not among the logs (" +
                                 names + "); monitor one of them, or add validation for a val_ one");
}

}  // namespace

// ---- Metrics ---------------------------------------------------------------------

std::vector<double> auc_thresholds(int num_thresholds) {
  constexpr double kEpsilon = 1e-7;
  std::vector<double> thresholds;
  if (num_thresholds < 3) return thresholds;
  thresholds.push_back(0.0 - kEpsilon);
  for (int i = 1; i <= num_thresholds - 2; ++i) thresholds.push_back(static_cast<double>(i) / (num_thresholds - 1));
  thresholds.push_back(1.0 + kEpsilon);
  return thresholds;
}

Status MetricState::add(const Element& step) {
  CAPSTAN_ASSIGN_OR_RETURN(const Tensor* loss, scalar_component(step, "loss_sum", DType::kFloat64));
  CAPSTAN_ASSIGN_OR_RETURN(const Tensor* examples_t, scalar_component(step, "examples", DType::kInt64));
  CAPSTAN_ASSIGN_OR_RETURN(const Tensor* correct_t, scalar_component(step, "correct", DType::kInt64));
  const Tensor* confusion = component(step, "confusion");
  if (confusion == nullptr || confusion->dtype() != DType::kInt64 || confusion->shape().size() != 2 ||
      confusion->shape()[0] != 4 || confusion->shape()[1] < 2) {
    return Status::InvalidArgument(
        "a fit step's result needs an int64 [4, thresholds] tensor named 'confusion' (tp, fp, tn, fn)" +
        (confusion == nullptr ? std::string()
                              : "; it has " + std::string(dtype_name(confusion->dtype())) +
                                    shape_string(confusion->shape())));
  }
  const auto t = static_cast<size_t>(confusion->shape()[1]);
  if (!tp.empty() && tp.size() != t) {
    return Status::InvalidArgument("a fit step's confusion counts have " + std::to_string(t) +
                                   " thresholds, earlier ones " + std::to_string(tp.size()) +
                                   ": every step must use the model's auc_thresholds");
  }
  if (tp.empty()) tp.assign(t, 0), fp.assign(t, 0), tn.assign(t, 0), fn.assign(t, 0);
  auto counts = confusion->flat<int64_t>();
  for (size_t i = 0; i < t; ++i) {
    tp[i] += counts[i];
    fp[i] += counts[t + i];
    tn[i] += counts[2 * t + i];
    fn[i] += counts[3 * t + i];
  }
  loss_sum += loss->flat<double>()[0];
  examples += examples_t->flat<int64_t>()[0];
  correct += correct_t->flat<int64_t>()[0];
  return Status::Ok();
}

void MetricState::merge(const MetricState& other) {
  loss_sum += other.loss_sum;
  examples += other.examples;
  correct += other.correct;
  if (tp.empty()) {
    tp = other.tp, fp = other.fp, tn = other.tn, fn = other.fn;
  } else if (other.tp.size() == tp.size()) {
    for (size_t i = 0; i < tp.size(); ++i) {
      tp[i] += other.tp[i], fp[i] += other.fp[i], tn[i] += other.tn[i], fn[i] += other.fn[i];
    }
  }
}

std::map<std::string, double> MetricState::logs(const std::string& prefix) const {
  std::map<std::string, double> logs;
  if (examples <= 0) return logs;
  logs[prefix + "loss"] = loss_sum / static_cast<double>(examples);
  logs[prefix + "accuracy"] = static_cast<double>(correct) / static_cast<double>(examples);
  if (auto auc = roc_auc(tp, fp, tn, fn); auc.ok()) logs[prefix + "auc"] = *auc;
  return logs;
}

Result<double> roc_auc(const std::vector<int64_t>& tp, const std::vector<int64_t>& fp,
                       const std::vector<int64_t>& tn, const std::vector<int64_t>& fn) {
  const size_t n = tp.size();
  if (n < 2 || fp.size() != n || tn.size() != n || fn.size() != n) {
    return Status::InvalidArgument("roc_auc: confusion counts of " + std::to_string(tp.size()) + ", " +
                                   std::to_string(fp.size()) + ", " + std::to_string(tn.size()) + ", " +
                                   std::to_string(fn.size()) + " thresholds; all four need the same count, >= 2");
  }
  auto rate = [](int64_t hits, int64_t misses) {
    return hits + misses == 0 ? 0.0 : static_cast<double>(hits) / static_cast<double>(hits + misses);
  };
  double auc = 0;
  for (size_t i = 0; i + 1 < n; ++i) {
    const double x0 = rate(fp[i], tn[i]), x1 = rate(fp[i + 1], tn[i + 1]);
    const double y0 = rate(tp[i], fn[i]), y1 = rate(tp[i + 1], fn[i + 1]);
    auc += (x0 - x1) * (y0 + y1) / 2;
  }
  return auc;
}

// ---- Parameter servers ------------------------------------------------------------

Result<MetricState> ParameterServerFitStrategy::run(const std::string& function, const Element& args,
                                                    int64_t steps) {
  std::vector<RemoteValue> values;
  values.reserve(static_cast<size_t>(steps));
  for (int64_t i = 0; i < steps; ++i) {
    CAPSTAN_ASSIGN_OR_RETURN(RemoteValue value, cluster_.schedule(function, args));
    values.push_back(std::move(value));
  }
  CAPSTAN_RETURN_IF_ERROR(cluster_.join());
  MetricState state;
  for (const RemoteValue& value : values) {
    CAPSTAN_ASSIGN_OR_RETURN(Element result, cluster_.fetch_once(value));
    CAPSTAN_RETURN_IF_ERROR(state.add(result));
  }
  return state;
}

namespace {

// register_model's train_step arguments: the dataset, and the rate (a
// float64 scalar) or none (float64 [0]).
Result<Element> train_args(const PerWorkerDataset& dataset, std::optional<double> learning_rate) {
  Tensor rate = Tensor::scalar<double>(learning_rate.value_or(0));
  if (!learning_rate) {
    CAPSTAN_ASSIGN_OR_RETURN(rate, Tensor::zeros(DType::kFloat64, {0}));
  }
  return Element{{dataset.arg(), std::move(rate)}, {"dataset", "learning_rate"}};
}

}  // namespace

Result<MetricState> ParameterServerFitStrategy::train(const std::string& model, const PerWorkerDataset& dataset,
                                                      int64_t steps, std::optional<double> learning_rate) {
  CAPSTAN_ASSIGN_OR_RETURN(Element args, train_args(dataset, learning_rate));
  return run(model + "/train_step", args, steps);
}

Result<MetricState> ParameterServerFitStrategy::evaluate(const std::string& model, const PerWorkerDataset& dataset,
                                                         int64_t steps) {
  Element args{{dataset.arg()}, {"dataset"}};
  return run(model + "/eval_step", args, steps);
}

Result<std::string> ParameterServerFitStrategy::save_checkpoint(const std::string& directory, int64_t step,
                                                                int max_to_keep) {
  return cluster_.save_checkpoint(directory, step, max_to_keep);
}

Result<int64_t> ParameterServerFitStrategy::restore_checkpoint(const std::string& path) {
  return cluster_.restore_checkpoint(path);
}

// ---- Mirrored strategy ------------------------------------------------------------

namespace {

// The cluster's workers' phases so far; none when it does not answer.
std::optional<PhaseTimes> workers_phases(ClusterCoordinator& cluster) {
  auto stats = cluster.worker_stats();
  return stats.ok() ? std::optional<PhaseTimes>(stats->totals) : std::nullopt;
}

}  // namespace

std::optional<PhaseTimes> ParameterServerFitStrategy::phases() { return workers_phases(cluster_); }

std::optional<PhaseTimes> MirroredFitStrategy::phases() {
  return cluster_ != nullptr ? workers_phases(*cluster_) : std::nullopt;
}

Result<MetricState> MirroredFitStrategy::run(const std::string& function, const Element& args, int64_t steps) {
  MetricState state;
  for (int64_t i = 0; i < steps; ++i) {
    Result<PerReplica> replicas = strategy_.run(function, args);
    if (!replicas.ok()) {
      return replicas.status().with_context(function + ": step " + std::to_string(i + 1) + " of " +
                                            std::to_string(steps));
    }
    for (const Element& replica : replicas->values) CAPSTAN_RETURN_IF_ERROR(state.add(replica));
  }
  return state;
}

Result<MetricState> MirroredFitStrategy::train(const std::string& model, const PerWorkerDataset& dataset,
                                               int64_t steps, std::optional<double> learning_rate) {
  CAPSTAN_ASSIGN_OR_RETURN(Element args, train_args(dataset, learning_rate));
  return run(model + "/train_step", args, steps);
}

Result<MetricState> MirroredFitStrategy::evaluate(const std::string& model, const PerWorkerDataset& dataset,
                                                  int64_t steps) {
  Element args{{dataset.arg()}, {"dataset"}};
  return run(model + "/eval_step", args, steps);
}

Result<std::string> MirroredFitStrategy::save_checkpoint(const std::string& directory, int64_t step,
                                                         int max_to_keep) {
  return strategy_.save_checkpoint(directory, step, max_to_keep);
}

Result<int64_t> MirroredFitStrategy::restore_checkpoint(const std::string& path) {
  return strategy_.restore_checkpoint(path);
}

// ---- Callbacks --------------------------------------------------------------------

ProgressLogger::ProgressLogger(std::ostream* out) : out_(out != nullptr ? out : &std::cout) {}

Status ProgressLogger::on_epoch_begin(int /*epoch*/, FitState& /*state*/) {
  start_ = std::chrono::steady_clock::now();
  return Status::Ok();
}

Status ProgressLogger::on_epoch_end(int epoch, const Logs& logs, FitState& state) {
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  std::ostringstream line;
  line << "Epoch " << epoch + 1 << "/" << state.epochs << " - " << state.steps_per_epoch << " steps - "
       << std::fixed << std::setprecision(2) << seconds << "s" << std::setprecision(4);
  // Training logs first, then validation's, as Keras prints them.
  for (const bool validation : {false, true}) {
    for (const auto& [name, value] : logs) {
      if ((name.rfind("val_", 0) == 0) == validation) line << " - " << name << ": " << value;
    }
  }
  if (state.phases) line << " - time: " << format_phases(*state.phases);
  *out_ << line.str() << std::endl;
  return Status::Ok();
}

ModelCheckpoint::ModelCheckpoint(ModelCheckpointOptions options) : options_(std::move(options)) {}

Status ModelCheckpoint::on_epoch_end(int epoch, const Logs& logs, FitState& state) {
  if (options_.directory.empty()) {
    return Status::InvalidArgument("ModelCheckpoint: no directory; set ModelCheckpointOptions::directory");
  }
  if (options_.save_best_only) {
    CAPSTAN_ASSIGN_OR_RETURN(double value, monitored(logs, options_.monitor, "ModelCheckpoint"));
    const bool max = is_max_mode(options_.mode, options_.monitor);
    if (best_ && !(max ? value > *best_ : value < *best_)) return Status::Ok();
    best_ = value;
  }
  CAPSTAN_ASSIGN_OR_RETURN(std::string path,
                           state.strategy->save_checkpoint(options_.directory, epoch + 1, options_.max_to_keep));
  saved_.push_back(std::move(path));
  return Status::Ok();
}

BackupAndRestore::BackupAndRestore(std::string backup_dir) : backup_dir_(std::move(backup_dir)) {}

Status BackupAndRestore::on_train_begin(FitState& state) {
  if (backup_dir_.empty()) return Status::InvalidArgument("BackupAndRestore: an empty backup_dir; name a directory");
  Result<int64_t> restored = state.strategy->restore_checkpoint(backup_dir_);
  if (!restored.ok()) {
    // No backup: a first run.
    return restored.status().code() == StatusCode::kNotFound ? Status::Ok() : restored.status();
  }
  state.initial_epoch = static_cast<int>(*restored);
  return Status::Ok();
}

Status BackupAndRestore::on_epoch_end(int epoch, const Logs& /*logs*/, FitState& state) {
  // The step is the number of epochs done: where a restart resumes.
  return state.strategy->save_checkpoint(backup_dir_, epoch + 1, /*max_to_keep=*/1).status();
}

Status BackupAndRestore::on_train_end(const Logs& /*last_logs*/, FitState& /*state*/) {
  std::error_code error;
  std::filesystem::remove_all(backup_dir_, error);
  return Status::Ok();  // a backup left behind (another machine's) only costs disk
}

EarlyStopping::EarlyStopping(EarlyStoppingOptions options) : options_(std::move(options)) {}

Status EarlyStopping::on_train_begin(FitState& /*state*/) {
  best_.reset();
  best_epoch_.reset();
  stopped_epoch_.reset();
  wait_ = 0;
  if (options_.patience < 0) {
    return Status::InvalidArgument("EarlyStopping: patience " + std::to_string(options_.patience) +
                                   " is negative; use 0 or more epochs");
  }
  return Status::Ok();
}

Status EarlyStopping::on_epoch_end(int epoch, const Logs& logs, FitState& state) {
  CAPSTAN_ASSIGN_OR_RETURN(double value, monitored(logs, options_.monitor, "EarlyStopping"));
  const bool max = is_max_mode(options_.mode, options_.monitor);
  const double delta = std::abs(options_.min_delta);
  const bool improved = !best_ || (max ? value - delta > *best_ : value + delta < *best_);
  if (improved) {
    best_ = value;
    best_epoch_ = epoch;
    wait_ = 0;
    if (!options_.restore_best_weights_dir.empty()) {
      CAPSTAN_RETURN_IF_ERROR(
          state.strategy->save_checkpoint(options_.restore_best_weights_dir, epoch + 1, /*max_to_keep=*/1).status());
    }
    return Status::Ok();
  }
  // Keras counts the epoch first, then stops once the wait reaches patience.
  if (++wait_ >= options_.patience) {
    stopped_epoch_ = epoch;
    state.stop_training = true;
    if (!options_.restore_best_weights_dir.empty()) {
      CAPSTAN_RETURN_IF_ERROR(state.strategy->restore_checkpoint(options_.restore_best_weights_dir).status());
    }
  }
  return Status::Ok();
}

LearningRateScheduler::LearningRateScheduler(std::function<double(int, double)> schedule)
    : schedule_(std::move(schedule)) {}

Status LearningRateScheduler::on_epoch_begin(int epoch, FitState& state) {
  const double rate = schedule_(epoch, state.learning_rate);
  if (!std::isfinite(rate) || rate < 0) {
    std::ostringstream value;
    value << rate;
    return Status::InvalidArgument("LearningRateScheduler: the schedule gave epoch " + std::to_string(epoch) +
                                   " the rate " + value.str() + "; a rate is finite and >= 0");
  }
  state.learning_rate = rate;
  return Status::Ok();
}

TensorBoard::TensorBoard(std::string logdir) : logdir_(std::move(logdir)) {}

Status TensorBoard::on_train_begin(FitState& /*state*/) {
  CAPSTAN_ASSIGN_OR_RETURN(train_, SummaryWriter::create(logdir_ + "/train"));
  CAPSTAN_ASSIGN_OR_RETURN(validation_, SummaryWriter::create(logdir_ + "/validation"));
  return Status::Ok();
}

Status TensorBoard::on_epoch_end(int epoch, const Logs& logs, FitState& /*state*/) {
  if (!train_ || !validation_) return Status::FailedPrecondition("TensorBoard: on_epoch_end before on_train_begin");
  for (const auto& [name, value] : logs) {
    if (name.rfind("val_", 0) == 0) {
      CAPSTAN_RETURN_IF_ERROR(validation_->scalar("epoch_" + name.substr(4), value, epoch));
    } else if (name == "lr") {
      CAPSTAN_RETURN_IF_ERROR(train_->scalar("epoch_learning_rate", value, epoch));
    } else {
      CAPSTAN_RETURN_IF_ERROR(train_->scalar("epoch_" + name, value, epoch));
    }
  }
  CAPSTAN_RETURN_IF_ERROR(train_->flush());
  return validation_->flush();
}

Status TensorBoard::on_train_end(const Logs& /*last_logs*/, FitState& /*state*/) {
  if (!train_ || !validation_) return Status::Ok();
  Status train = train_->close();
  Status validation = validation_->close();
  return train.ok() ? validation : train;
}

std::string TensorBoard::train_path() const { return train_ ? train_->path() : std::string(); }
std::string TensorBoard::validation_path() const { return validation_ ? validation_->path() : std::string(); }

// ---- fit ----------------------------------------------------------------------------

Result<History> fit(FitStrategy& strategy, const std::string& model, const FitOptions& options) {
  if (model.empty()) return Status::InvalidArgument("fit: an empty model name; pass register_model's name");
  if (options.epochs < 1) {
    return Status::InvalidArgument("fit: epochs " + std::to_string(options.epochs) + "; train 1 or more");
  }
  if (options.steps_per_epoch < 1) {
    return Status::InvalidArgument("fit: steps_per_epoch " + std::to_string(options.steps_per_epoch) +
                                   "; set it (> 0): per-worker datasets have no known length, so repeat them");
  }
  if (options.validation.has_value() != (options.validation_steps > 0)) {
    return Status::InvalidArgument(
        "fit: validation_steps " + std::to_string(options.validation_steps) +
        (options.validation ? " with a validation dataset; set validation_steps > 0"
                            : " without a validation dataset; set FitOptions::validation, or validation_steps 0"));
  }
  if (!std::isfinite(options.learning_rate) || options.learning_rate < 0) {
    return Status::InvalidArgument("fit: learning_rate " + std::to_string(options.learning_rate) +
                                   "; give the optimizers' rate (>= 0; 0: unknown)");
  }
  for (size_t i = 0; i < options.callbacks.size(); ++i) {
    if (options.callbacks[i] == nullptr) {
      return Status::InvalidArgument("fit: callbacks[" + std::to_string(i) + "] is null");
    }
  }

  FitState state{.strategy = &strategy,
                 .epochs = options.epochs,
                 .steps_per_epoch = options.steps_per_epoch,
                 .learning_rate = options.learning_rate};
  for (Callback* callback : options.callbacks) CAPSTAN_RETURN_IF_ERROR(callback->on_train_begin(state));

  History history;
  Logs logs;
  for (int epoch = state.initial_epoch; epoch < options.epochs && !state.stop_training; ++epoch) {
    for (Callback* callback : options.callbacks) CAPSTAN_RETURN_IF_ERROR(callback->on_epoch_begin(epoch, state));
    std::optional<double> rate;  // none: the optimizers' own rates and schedules
    if (state.learning_rate != options.learning_rate) {
      if (options.learning_rate == 0) {
        return Status::InvalidArgument(
            "fit: a callback set the learning rate but FitOptions::learning_rate is 0; give the optimizers' rate");
      }
      rate = state.learning_rate;
    }
    CAPSTAN_ASSIGN_OR_RETURN(MetricState train, strategy.train(model, options.train, options.steps_per_epoch, rate));
    logs = train.logs();
    if (options.learning_rate > 0) logs["lr"] = state.learning_rate;
    if (options.validation) {
      CAPSTAN_ASSIGN_OR_RETURN(MetricState validation,
                               strategy.evaluate(model, *options.validation, options.validation_steps));
      logs.merge(validation.logs("val_"));
    }
    history.epoch.push_back(epoch);
    for (const auto& [name, value] : logs) history.history[name].push_back(value);
    state.phases = strategy.phases();
    for (Callback* callback : options.callbacks) CAPSTAN_RETURN_IF_ERROR(callback->on_epoch_end(epoch, logs, state));
  }
  for (Callback* callback : options.callbacks) CAPSTAN_RETURN_IF_ERROR(callback->on_train_end(logs, state));
  return history;
}

}  // namespace capstan::torch
