// Keras' Model.fit for Capstan: epochs of steps on a training dataset, a
// validation pass after each epoch, metrics (loss, accuracy, ROC AUC) and
// callbacks (progress line, checkpoints, back-up-and-restore, early
// stopping, learning-rate schedule, TensorBoard).
//
// The user's code is the module and the loss, registered on the workers
// with capstan::torch::register_model (capstan/torch.h), which provides the
// closures "<model>/train_step" and "<model>/eval_step". The program:
//
//   auto cluster = capstan::ClusterCoordinator::connect(address).value();
//   capstan::torch::create_variables(*cluster, *model, ps_options).value();
//   auto train = cluster->create_per_worker_dataset("train_data", "train").value();  // repeats
//   auto val = cluster->create_per_worker_dataset("val_data", "val").value();
//   capstan::torch::ParameterServerFitStrategy strategy(*cluster);
//   capstan::torch::ProgressLogger progress;
//   capstan::torch::EarlyStopping stop({.monitor = "val_loss", .patience = 2});
//   auto history = capstan::torch::fit(strategy, "mlp", {
//       .epochs = 10, .steps_per_epoch = 100, .train = train,
//       .validation = val, .validation_steps = 20,
//       .callbacks = {&progress, &stop}}).value();
//   history.history["val_auc"].back();
//
// The strategy is one argument (FitStrategy): how an epoch's steps run and
// where the variables are checkpointed; the fit call is the same on all
// four:
//   ParameterServerFitStrategy      one closure per step on the
//                                   ClusterCoordinator's queue (asynchronous
//                                   training, Keras with
//                                   ParameterServerStrategy);
//   MirroredFitStrategy             each step on every worker-server at
//                                   once as the replicas of a
//                                   MirroredStrategy (synchronous, Keras with
//                                   MultiWorkerMirroredStrategy, one client);
//     hybrid: the same strategy with a module holding capstan::torch::
//                                   Embeddings: their rows on the parameter
//                                   servers, the rest mirrored, in one step;
//   MultiWorkerMirroredFitStrategy  multi-client: every process of a
//                                   collective group runs its own fit on its
//                                   own input (Keras' MultiWorkerMirrored-
//                                   Strategy with a client per worker); logs
//                                   and History are the same on every rank,
//                                   rank 0 writes the checkpoints.
//
// Datasets: per-worker datasets (a local pipeline or a dataset function on
// every worker, or a pipeline that reads from the data service). As with
// Keras on ParameterServerStrategy, steps_per_epoch and validation_steps
// are required and the datasets should repeat: a step that finds its
// iterator exhausted fails fit with OutOfRange.
//
// Metrics are binary classification's (labels 0/1, outputs turned into
// probabilities by the model's spec): "loss" (mean over the epoch's
// examples), "accuracy" (threshold 0.5), "auc" (ROC AUC from confusion
// counts at 200 thresholds, summed over the epoch's steps: Keras'
// tf.keras.metrics.AUC); validation's are prefixed "val_". "lr" is the
// learning rate the epoch ran with.
//
// This header needs no LibTorch: a program may drive fit without including
// torch (the library, libcapstan_torch.so, links it).
//
// Thread-safety: fit runs on the calling thread; callbacks are called on it.
#ifndef CAPSTAN_FIT_H_
#define CAPSTAN_FIT_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "capstan/phases.h"
#include "capstan/status.h"
#include "capstan/summary.h"
#include "capstan/tensor.h"
#include "capstan/training.h"

namespace capstan {
class MirroredStrategy;  // capstan/strategy.h
class Communicator;      // capstan/collectives.h
class FunctionRegistry;  // capstan/functions.h
namespace data {
class Dataset;  // capstan/data/dataset.h
}
}  // namespace capstan

namespace capstan::torch {

struct ModelSpec;  // capstan/torch.h (MultiWorkerMirroredFitStrategy::create)

// ---- Metrics ---------------------------------------------------------------------

// Keras' AUC thresholds for `num_thresholds` (>= 3): 0 - 1e-7, then
// i / (num_thresholds - 1) for i in 1 .. num_thresholds - 2, then 1 + 1e-7.
// A prediction p counts as positive at threshold t when p > t.
std::vector<double> auc_thresholds(int num_thresholds);

// What steps return, summed over an epoch's steps (and its workers).
struct MetricState {
  double loss_sum = 0;   // the loss times the examples of each step
  int64_t examples = 0;
  int64_t correct = 0;   // predictions on the right side of 0.5
  // Confusion counts per threshold (auc_thresholds order); empty until the
  // first step's counts are added.
  std::vector<int64_t> tp, fp, tn, fn;

  // Adds a step's result (the closures' Element: "loss_sum" float64,
  // "examples" int64, "correct" int64, "confusion" int64[4, T] rows tp, fp,
  // tn, fn). InvalidArgument naming the component that is missing or of
  // the wrong dtype or shape (a closure that is not register_model's).
  Status add(const Element& step);
  void merge(const MetricState& other);
  // loss, accuracy, auc under `prefix` ("" or "val_"); no auc without
  // confusion counts; nothing without examples.
  std::map<std::string, double> logs(const std::string& prefix = "") const;
};

// ROC AUC from confusion counts at increasing thresholds (Keras' AUC with
// curve ROC and summation "interpolation"): the true and false positive
// rates at each threshold, and the trapezoids between neighbours.
// InvalidArgument for counts of different lengths or fewer than two;
// 0 when there are no positives or no negatives (the rates are undefined,
// Keras' divide_no_nan makes them 0).
Result<double> roc_auc(const std::vector<int64_t>& tp, const std::vector<int64_t>& fp,
                       const std::vector<int64_t>& tn, const std::vector<int64_t>& fn);

// ---- Strategies -------------------------------------------------------------------

// How fit runs a model's steps and saves its variables.
class FitStrategy {
 public:
  virtual ~FitStrategy() = default;
  // Runs `steps` training steps of `model` (register_model's name), each on
  // its worker's next batch of `dataset`; `learning_rate`, when set, is the
  // rate every step's updates apply instead of the optimizers' own
  // (ApplyOptions::learning_rate: it travels with the updates to where the
  // optimizers run). Returns once all have finished, their metrics summed.
  // The first step's error fails the call.
  virtual Result<MetricState> train(const std::string& model, const PerWorkerDataset& dataset, int64_t steps,
                                    std::optional<double> learning_rate) = 0;
  // `steps` evaluation steps (no update).
  virtual Result<MetricState> evaluate(const std::string& model, const PerWorkerDataset& dataset,
                                       int64_t steps) = 0;
  // The variables' checkpoints (ClusterCoordinator::save_checkpoint and
  // restore_checkpoint semantics: a directory of ckpt-<step>; restoring a
  // directory restores its newest; NotFound when there is none).
  virtual Result<std::string> save_checkpoint(const std::string& directory, int64_t step, int max_to_keep) = 0;
  virtual Result<int64_t> restore_checkpoint(const std::string& path) = 0;
  // Where the steps' time has gone so far (capstan/phases.h): the cluster's
  // workers' (ClusterCoordinator::worker_stats) or this process's own; none
  // when unknown. ProgressLogger prints it.
  virtual std::optional<PhaseTimes> phases() { return std::nullopt; }
};

// Parameter-server training: one closure per step, scheduled on the
// cluster's queue; the workers take them as they come (asynchronous).
// `cluster` must outlive this object.
class ParameterServerFitStrategy : public FitStrategy {
 public:
  explicit ParameterServerFitStrategy(ClusterCoordinator& cluster) : cluster_(cluster) {}
  Result<MetricState> train(const std::string& model, const PerWorkerDataset& dataset, int64_t steps,
                            std::optional<double> learning_rate) override;
  Result<MetricState> evaluate(const std::string& model, const PerWorkerDataset& dataset, int64_t steps) override;
  Result<std::string> save_checkpoint(const std::string& directory, int64_t step, int max_to_keep) override;
  Result<int64_t> restore_checkpoint(const std::string& path) override;
  std::optional<PhaseTimes> phases() override;

 private:
  Result<MetricState> run(const std::string& function, const Element& args, int64_t steps);
  ClusterCoordinator& cluster_;
};

// Synchronous training on the worker-servers (Keras' fit under
// MultiWorkerMirroredStrategy, driven by one program): each step is one
// MirroredStrategy::run of register_model's closure on every replica at
// once, each on its worker's next batch of the dataset
// (MirroredStrategy::distribute_dataset); in those steps the closures train
// a MirroredModule attached to the worker's replicas (ctx.mirrored()), so
// the strategy must be created with the module's dense parameters as its
// variables: ModelSpec::ps.prefix + each parameter's name, its shape and
// dtype, and the optimizers ModelSpec::ps names (float buffers, BatchNorm's
// running statistics, may be added as variables of their named_buffers()
// names with Optimizer::none(): they are then checkpointed; see
// MirroredModule). A step's metrics are the sum of its replicas'. A step that fails (a worker lost: Unavailable) fails the call;
// the variables stay at the last step every replica finished. `strategy`
// must outlive this object.
//
// Hybrid (strategy-hybrid: a module with capstan::torch::Embeddings): the
// embeddings' rows stay on the parameter servers and everything else is
// mirrored, in one step. The program creates the rows' variables
// (create_variables with PsOptions::embeddings_only, or create_variable /
// create_embedding_table under ModelSpec::ps.prefix + "<path>.weight") and
// the strategy with the dense parameters alone. Each replica's step
// gathers the rows its batch names, runs one backward that all-reduces the
// dense gradients (MEAN) and leaves the rows' gradients, and pushes those
// as a sparse update: the parameter servers apply one update per replica
// and step, each of its replica's batch (as asynchronous workers' would),
// not one of the replicas' mean. The checkpoint (save_checkpoint) holds
// both: the cluster's variables and the mirrored ones.
class MirroredFitStrategy : public FitStrategy {
 public:
  // With `cluster` (the strategy's), phases() reports the workers' time.
  explicit MirroredFitStrategy(MirroredStrategy& strategy, ClusterCoordinator* cluster = nullptr)
      : strategy_(strategy), cluster_(cluster) {}
  Result<MetricState> train(const std::string& model, const PerWorkerDataset& dataset, int64_t steps,
                            std::optional<double> learning_rate) override;
  Result<MetricState> evaluate(const std::string& model, const PerWorkerDataset& dataset, int64_t steps) override;
  // MirroredStrategy::save_checkpoint / restore_checkpoint (the cluster's
  // checkpoint, the mirrored variables included).
  Result<std::string> save_checkpoint(const std::string& directory, int64_t step, int max_to_keep) override;
  Result<int64_t> restore_checkpoint(const std::string& path) override;
  std::optional<PhaseTimes> phases() override;

 private:
  Result<MetricState> run(const std::string& function, const Element& args, int64_t steps);
  MirroredStrategy& strategy_;
  ClusterCoordinator* const cluster_;
};

// Multi-client synchronous training (Keras' fit under
// MultiWorkerMirroredStrategy with one client per worker: every process
// runs the same program and its own fit): each process of a collective
// group is a replica, holds the module (ModelSpec, as register_model takes
// it) and trains it with a MirroredModule on the group: the gradients are
// all-reduced (MEAN) in every step, so the replicas stay identical. No
// worker-server runs the steps; each process reads its own input:
//
//   auto group = capstan::Communicator::create(std::move(endpoint), addresses, rank).value();
//   auto strategy = capstan::torch::MultiWorkerMirroredFitStrategy::create(
//       *group, "mlp", spec, {.cluster = cluster.get()}).value();          // collective
//   auto train = strategy->distribute_dataset(examples.repeat().batch(64)).value();  // this rank's shard
//   auto history = capstan::torch::fit(*strategy, "mlp", {.epochs = 5, .steps_per_epoch = 100,
//                                                          .train = train, ...}).value();
//
// Input: distribute_dataset(d) iterates d.shard(group size, rank) in this
// process: each rank every size-th element of d (as TF's auto-sharding by
// data); of a batched d, every size-th batch, so a step's global batch is
// size times d's. create_per_worker_dataset(d) iterates d as given (a
// dataset already this process's own: its files, its data-service
// consumer index). The handles are this strategy's: another strategy does
// not know them.
//
// Every rank must run the same fit (epochs, steps, callbacks): a step is a
// collective. Metrics: each rank's epoch sums are gathered from every rank
// (all_gather) and added up in rank order, so every rank gets bit-identical
// logs and History, and callbacks that decide from the logs
// (EarlyStopping, ModelCheckpoint's save_best_only) decide the same on
// every rank. Checkpoints go through `cluster` (MirroredVariables::
// save_checkpoint: rank 0 puts the replicas into parameter-server
// variables and has the coordinator save; the other ranks wait for its
// outcome and get the same path, or its error's code); restore_checkpoint
// is read by rank 0 and broadcast to every rank (the optimizer slots start
// afresh: MirroredVariables' checkpoints do not carry them). A rank whose step fails
// (its dataset ended, its loss threw) aborts the group, so the others'
// step fails at once (Unavailable) instead of at the collective timeout.
//
// Thread-safety: one thread (the rank's training loop), like fit.
struct MultiWorkerMirroredFitOptions {
  // Where checkpoints go (see above). Every rank passes one or none alike
  // (only rank 0's is used); none: save_checkpoint and restore_checkpoint
  // are FailedPrecondition on every rank. Must outlive the strategy.
  ClusterCoordinator* cluster = nullptr;
  // The functions the datasets' map / filter / interleave name
  // (Dataset::make_iterator's); null: only built-in ones. Must outlive the
  // strategy.
  const FunctionRegistry* functions = nullptr;
  // MirroredModule's gradient buckets (MirroredOptions); the same on every rank.
  int64_t bucket_bytes = 25 << 20;
  int64_t first_bucket_bytes = 1 << 20;
};
class MultiWorkerMirroredFitStrategy : public FitStrategy {
 public:
  // Collective: every rank of `group` calls it with a model of the same
  // parameters and ModelSpec::ps (prefix, optimizers); rank 0's parameter
  // values become every replica's (MirroredModule::create). `model` is the
  // name fit is then called with. InvalidArgument for an invalid spec
  // (register_model's checks) or a module with capstan::torch::Embeddings
  // (their rows live on parameter servers: use MirroredFitStrategy's
  // hybrid). `group` must outlive the strategy; the strategy keeps the
  // spec (and so the module) alive.
  static Result<std::unique_ptr<MultiWorkerMirroredFitStrategy>> create(Communicator& group, const std::string& model,
                                                                        const ModelSpec& spec,
                                                                        MultiWorkerMirroredFitOptions options = {});
  ~MultiWorkerMirroredFitStrategy() override;

  Result<PerWorkerDataset> distribute_dataset(const data::Dataset& dataset);
  Result<PerWorkerDataset> create_per_worker_dataset(const data::Dataset& dataset);

  int rank() const;
  int num_replicas_in_sync() const;

  Result<MetricState> train(const std::string& model, const PerWorkerDataset& dataset, int64_t steps,
                            std::optional<double> learning_rate) override;
  Result<MetricState> evaluate(const std::string& model, const PerWorkerDataset& dataset, int64_t steps) override;
  Result<std::string> save_checkpoint(const std::string& directory, int64_t step, int max_to_keep) override;
  Result<int64_t> restore_checkpoint(const std::string& path) override;
  // This process's steps' time (each step run under a PhaseRecorder).
  std::optional<PhaseTimes> phases() override;

  // Collective: OK when every rank's replicas (values, optimizer slots,
  // step) are identical (MirroredModule::verify_replicas).
  Status verify_replicas();

  struct Impl;

 private:
  explicit MultiWorkerMirroredFitStrategy(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// ---- Callbacks --------------------------------------------------------------------

using Logs = std::map<std::string, double>;

// What callbacks see of a running fit, and may change.
struct FitState {
  FitStrategy* strategy = nullptr;
  int epochs = 0;                // FitOptions::epochs
  int64_t steps_per_epoch = 0;
  // The first epoch this call runs (0-based); BackupAndRestore raises it in
  // on_train_begin when it restored a backup.
  int initial_epoch = 0;
  // The learning rate the next epoch's steps use (LearningRateScheduler
  // sets it in on_epoch_begin). In an epoch where it equals
  // FitOptions::learning_rate the optimizers apply their own rates (and
  // schedules); in one where it differs, every step's updates carry it and
  // the optimizers apply it instead (FitStrategy::train's learning_rate).
  double learning_rate = 0;
  // Set by a callback (EarlyStopping): fit ends after this epoch.
  bool stop_training = false;
  // Where the steps' time has gone so far, as of the end of the epoch
  // (FitStrategy::phases()).
  std::optional<PhaseTimes> phases = std::nullopt;
};

// tf.keras.callbacks.Callback. Epochs are 0-based. An error from a callback
// ends fit with that error (later callbacks of that hook are not called, nor
// on_train_end). There is no per-batch hook: an epoch's steps run
// asynchronously on the workers, and their metrics are known at its end.
class Callback {
 public:
  virtual ~Callback() = default;
  virtual Status on_train_begin(FitState& /*state*/) { return Status::Ok(); }
  virtual Status on_epoch_begin(int /*epoch*/, FitState& /*state*/) { return Status::Ok(); }
  virtual Status on_epoch_end(int /*epoch*/, const Logs& /*logs*/, FitState& /*state*/) { return Status::Ok(); }
  virtual Status on_train_end(const Logs& /*last_logs*/, FitState& /*state*/) { return Status::Ok(); }
};

// "min" when the monitored name contains "acc" or "auc" is "max"; Keras'
// mode "auto".
enum class MonitorMode { kAuto, kMin, kMax };

// One line per epoch (Keras' verbose=2):
//   Epoch 3/10 - 100 steps - 1.25s - loss: 0.4123 - accuracy: 0.8125 - auc: 0.8874 - val_loss: ...
class ProgressLogger : public Callback {
 public:
  // `out` must outlive this object; std::cout when null.
  explicit ProgressLogger(std::ostream* out = nullptr);
  Status on_epoch_begin(int epoch, FitState& state) override;
  Status on_epoch_end(int epoch, const Logs& logs, FitState& state) override;

 private:
  std::ostream* out_;
  std::chrono::steady_clock::time_point start_;
};

struct ModelCheckpointOptions {
  std::string directory;           // ckpt-<epoch + 1> in it (the coordinator's file system)
  std::string monitor = "val_loss";
  MonitorMode mode = MonitorMode::kAuto;
  bool save_best_only = false;     // only epochs that improve `monitor`
  int max_to_keep = 5;
};
// tf.keras.callbacks.ModelCheckpoint through Capstan's checkpoints.
class ModelCheckpoint : public Callback {
 public:
  explicit ModelCheckpoint(ModelCheckpointOptions options);
  Status on_epoch_end(int epoch, const Logs& logs, FitState& state) override;
  // The checkpoints saved, in order.
  const std::vector<std::string>& saved() const { return saved_; }

 private:
  ModelCheckpointOptions options_;
  std::optional<double> best_;
  std::vector<std::string> saved_;
};

// tf.keras.callbacks.BackupAndRestore: saves the variables into
// `backup_dir` at every epoch's end (ckpt-<epochs done>); a fit that starts
// with a backup there restores it and resumes at the next epoch; a fit that
// finishes removes the backup (std::filesystem, where the program runs:
// the coordinator's file system must be the same or the backup stays).
class BackupAndRestore : public Callback {
 public:
  explicit BackupAndRestore(std::string backup_dir);
  Status on_train_begin(FitState& state) override;
  Status on_epoch_end(int epoch, const Logs& logs, FitState& state) override;
  Status on_train_end(const Logs& last_logs, FitState& state) override;

 private:
  std::string backup_dir_;
};

struct EarlyStoppingOptions {
  std::string monitor = "val_loss";
  MonitorMode mode = MonitorMode::kAuto;
  double min_delta = 0;   // an improvement smaller than this is none
  int patience = 0;       // epochs without improvement before stopping
  // Restores the best epoch's variables when stopping (saved into this
  // directory at each improvement); "" does not (Keras'
  // restore_best_weights=False).
  std::string restore_best_weights_dir{};
};
// tf.keras.callbacks.EarlyStopping. A monitored name missing from an
// epoch's logs is InvalidArgument naming it and the names there.
class EarlyStopping : public Callback {
 public:
  explicit EarlyStopping(EarlyStoppingOptions options);
  Status on_train_begin(FitState& state) override;
  Status on_epoch_end(int epoch, const Logs& logs, FitState& state) override;
  // The epoch fit stopped after (0-based), if it did.
  std::optional<int> stopped_epoch() const { return stopped_epoch_; }
  std::optional<int> best_epoch() const { return best_epoch_; }

 private:
  EarlyStoppingOptions options_;
  std::optional<double> best_;
  std::optional<int> best_epoch_, stopped_epoch_;
  int wait_ = 0;
};

// tf.keras.callbacks.LearningRateScheduler: schedule(epoch, current rate)
// -> the epoch's rate (>= 0, finite). As Keras sets optimizer.learning_rate,
// the rate is exact for every optimizer (sgd, momentum, adagrad, adam,
// ftrl): each step's updates carry it to where the optimizers run (the
// parameter servers, or each replica of a MirroredFitStrategy), which
// apply it instead of their own rate and schedule (Adam's bias correction
// and FTRL's beta term included; FTRL skips an update at rate 0). An epoch
// whose rate equals FitOptions::learning_rate carries none: the
// optimizers' own rates and schedules apply.
class LearningRateScheduler : public Callback {
 public:
  explicit LearningRateScheduler(std::function<double(int epoch, double learning_rate)> schedule);
  Status on_epoch_begin(int epoch, FitState& state) override;

 private:
  std::function<double(int, double)> schedule_;
};

// tf.keras.callbacks.TensorBoard, scalars per epoch: "<logdir>/train" gets
// "epoch_<name>" for every log without "val_" (and epoch_learning_rate),
// "<logdir>/validation" the "val_" ones without the prefix; the step is the
// epoch (0-based), as Keras writes them.
class TensorBoard : public Callback {
 public:
  explicit TensorBoard(std::string logdir);
  Status on_train_begin(FitState& state) override;
  Status on_epoch_end(int epoch, const Logs& logs, FitState& state) override;
  Status on_train_end(const Logs& last_logs, FitState& state) override;
  // The event files (after on_train_begin).
  std::string train_path() const;
  std::string validation_path() const;

 private:
  std::string logdir_;
  std::unique_ptr<SummaryWriter> train_, validation_;
};

// ---- fit ----------------------------------------------------------------------------

struct FitOptions {
  int epochs = 1;
  int64_t steps_per_epoch = 0;          // required (> 0)
  PerWorkerDataset train{};
  // Validation after every epoch when validation_steps > 0.
  std::optional<PerWorkerDataset> validation{};
  int64_t validation_steps = 0;
  // The optimizers' rate as created (PsOptions::optimizer); what
  // LearningRateScheduler starts from. 0: unknown, and a scheduler is
  // refused (its schedule would start from 0).
  double learning_rate = 0;
  // Called in order; not owned (they must outlive the call).
  std::vector<Callback*> callbacks{};
};

// Keras' History: the epochs run (0-based) and each log's values by epoch.
struct History {
  std::vector<int> epoch;
  std::map<std::string, std::vector<double>> history;
};

// Trains `model` (register_model's name) with `strategy`. Errors: invalid
// options (InvalidArgument naming the field and the fix), a step's error,
// a callback's error.
Result<History> fit(FitStrategy& strategy, const std::string& model, const FitOptions& options);

}  // namespace capstan::torch

#endif  // CAPSTAN_FIT_H_
