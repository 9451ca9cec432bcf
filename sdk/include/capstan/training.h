// Parameter-server training: TensorFlow's ParameterServerStrategy +
// ClusterCoordinator, against Capstan's coordinator daemon.
//
// The training program:
//   auto cluster = capstan::ClusterCoordinator::connect("127.0.0.1:7000", options).value();
//   cluster->create_variable({"w", *Tensor::zeros(DType::kFloat32, {2, 1}),
//                             Optimizer::adagrad(0.05)}).value();
//   auto dataset = cluster->create_per_worker_dataset(my_pipeline).value();
//   for (int step = 0; step < 10; ++step) {
//     cluster->schedule("train_step", {dataset.arg()}).value();
//   }
//   cluster->join();                                   // raises the first closure error
//   auto loss = cluster->fetch(cluster->schedule("eval", {}).value());
//
// The functions ("train_step") live in a module the workers load
// (worker-server --module libmodel.so), registered with
// FunctionRegistry::register_closure; they get a ClosureContext to read and
// update variables and to read their worker's per-worker iterator.
#ifndef CAPSTAN_TRAINING_H_
#define CAPSTAN_TRAINING_H_

#include "capstan/export.h"

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "capstan/client.h"
#include "capstan/collectives.h"
#include "capstan/status.h"
#include "capstan/tensor.h"

namespace capstan CAPSTAN_API {

namespace data {
class Dataset;
class Iterator;
}  // namespace data
class MirroredStrategy;

// An optimizer applied on the parameter servers (Keras semantics).
// The one description of an optimizer, everywhere in Capstan: the program
// creates variables with it, the parameter servers apply it, checkpoints
// record it. Only the fields its kind uses matter.
struct Optimizer {
  // kNone: an assign-only variable (no gradients applied).
  enum class Kind { kNone, kSgd, kMomentum, kAdagrad, kAdam, kFtrl };
  Kind kind = Kind::kSgd;
  double learning_rate = 0.01;
  double momentum = 0.0;
  bool nesterov = false;
  double initial_accumulator_value = 0.1;
  double epsilon = 1e-7;
  double beta_1 = 0.9;
  double beta_2 = 0.999;
  double learning_rate_power = -0.5;
  double l1 = 0, l2 = 0, l2_shrinkage = 0, beta = 0;

  // Field by field (a re-created variable must ask for the same optimizer).
  bool operator==(const Optimizer&) const = default;

  static Optimizer none();
  static Optimizer sgd(double learning_rate);
  static Optimizer momentum_sgd(double learning_rate, double momentum, bool nesterov = false);
  static Optimizer adagrad(double learning_rate, double initial_accumulator_value = 0.1,
                           double epsilon = 1e-7);
  static Optimizer adam(double learning_rate, double beta_1 = 0.9, double beta_2 = 0.999,
                        double epsilon = 1e-7);
  static Optimizer ftrl(double learning_rate, double l1 = 0, double l2 = 0,
                        double learning_rate_power = -0.5,
                        double initial_accumulator_value = 0.1);
};

// Keras' identifiers: "none", "sgd", "momentum", "adagrad", "adam", "ftrl".
std::string optimizer_name(Optimizer::Kind kind);
// Inverse of optimizer_name(); nullopt for an unknown name.
std::optional<Optimizer::Kind> optimizer_kind_from_name(std::string_view name);

// tf.distribute.experimental.partitioners.
struct Partitioner {
  std::string kind = "none";  // "none", "fixed_shards", "min_size", "max_size"
  int64_t num_shards = 1;
  int64_t min_shard_bytes = 256 << 10;
  int64_t max_shard_bytes = 0;
  int64_t max_shards = 1;
  int64_t bytes_per_string = 16;

  static Partitioner none();
  static Partitioner fixed_shards(int64_t num_shards);
  static Partitioner min_size(int64_t min_shard_bytes = 256 << 10, int64_t max_shards = 1,
                              int64_t bytes_per_string = 16);
  static Partitioner max_size(int64_t max_shard_bytes, int64_t max_shards = 0,
                              int64_t bytes_per_string = 16);
};

struct VariableSpec {
  std::string name;
  Tensor initial;  // the whole initial value (see initializers below)
  Optimizer optimizer = Optimizer::none();
  Partitioner partitioner = Partitioner::none();
};

// Initializers (tf.keras.initializers).
Result<Tensor> zeros_initializer(DType dtype, Shape shape);
Result<Tensor> constant_initializer(DType dtype, Shape shape, double value);
Result<Tensor> random_normal_initializer(DType dtype, Shape shape, double mean, double stddev,
                                         uint64_t seed);
Result<Tensor> random_uniform_initializer(DType dtype, Shape shape, double minval, double maxval,
                                          uint64_t seed);

struct ShardInfo {
  std::string name;  // "w/part_0"
  int ps_task = 0;
  std::string ps_address;
  int64_t first_row = 0;
  int64_t rows = 0;
};

struct VariableInfo {
  std::string name;
  DType dtype = DType::kInvalid;
  Shape shape;
  std::vector<ShardInfo> shards;
};

// A closure's future result (tf.distribute.experimental.coordinator.RemoteValue).
struct RemoteValue {
  int64_t id = 0;
};

// A dataset each worker iterates on its own (create_per_worker_dataset).
struct PerWorkerDataset {
  int64_t id = 0;
  // The closure argument that stands for "this worker's iterator": pass it
  // in schedule()'s args; the closure reads it with
  // ClosureContext::iterator(args.components[i]).
  Tensor arg() const;
};

class ClusterCoordinator {
 public:
  // Connects to the coordinator daemon; the variables and closures of an
  // earlier connection (a training program that crashed) are still there.
  static Result<std::unique_ptr<ClusterCoordinator>> connect(const std::string& address,
                                                             ClientOptions options = {});
  ~ClusterCoordinator();

  // Creates (or, for a reconnecting program, finds) a variable, placed on
  // the parameter servers round-robin and partitioned along axis 0.
  Result<VariableInfo> create_variable(const VariableSpec& spec);
  Result<std::vector<VariableInfo>> variables();

  // Queues `function` (registered in the workers' module) with `args`;
  // returns at once. Raises (returns) the pending error of an earlier
  // closure instead, as TF does; the error is then cleared.
  Result<RemoteValue> schedule(const std::string& function, const Element& args = {});
  // Blocks until every scheduled closure has finished; returns the first
  // closure error (once).
  Status join();
  // Whether every scheduled closure has finished; the first error too.
  Result<bool> done();
  // Blocks for a closure's value: its result, its error, or Cancelled when
  // an earlier failure cancelled it.
  Result<Element> fetch(const RemoteValue& value);

  // Each worker builds the pipeline with SHARD_HINT resolved to
  // (number of workers, its index) and keeps its own iterator: built when a
  // worker joins; one that was dropped and registers again (or registers
  // with a restarted coordinator that has a work_dir) keeps it where it was.
  Result<PerWorkerDataset> create_per_worker_dataset(const data::Dataset& dataset);
  // TF's form: `dataset_function`, registered in the workers' module with
  // register_dataset_function, is called on each worker with its
  // InputContext (number of workers, worker index) and returns its pipeline.
  Result<PerWorkerDataset> create_per_worker_dataset(const std::string& dataset_function);
  // Named: a program that restarted (after a crash or kill -9) and creates
  // it again under the same name gets the same dataset back, its workers'
  // iterators where they were (AlreadyExists when the definition differs).
  // Unnamed ones are new each time, as in TF.
  Result<PerWorkerDataset> create_per_worker_dataset(const data::Dataset& dataset, const std::string& name);
  Result<PerWorkerDataset> create_per_worker_dataset(const std::string& dataset_function, const std::string& name);

  // Writes every variable (values, optimizer slots and steps) to
  // `directory`/ckpt-<step>: safetensors files, one per parameter server
  // task, and a manifest; atomically; keeps the newest `max_to_keep`
  // (0: all). Returns the checkpoint's path.
  Result<std::string> save_checkpoint(const std::string& directory, int64_t step, int max_to_keep = 5);
  // Restores a checkpoint (a ckpt-N path, or a directory: its latest) into
  // the variables as they are placed now: the number of parameter servers
  // and the partitioning may differ from when it was saved. Variables not
  // created yet are created. Returns the checkpoint's step. A checkpoint
  // with a missing or damaged file is refused (DataLoss naming the file).
  // Variables created since the checkpoint was saved keep their values (TF's
  // default; restore_checkpoint(path, true) lists them, or refuses them).
  Result<int64_t> restore_checkpoint(const std::string& path);
  struct RestoreResult {
    int64_t step = 0;
    std::vector<std::string> not_in_checkpoint;  // left as they were
  };
  // `strict`: NotFound naming the variables the checkpoint lacks, nothing
  // restored.
  Result<RestoreResult> restore_checkpoint(const std::string& path, bool strict);

  // Reads a whole variable (from its shards, in parallel).
  Result<Tensor> read_variable(const std::string& name);
  Status assign_variable(const std::string& name, const Tensor& value);
  // What a closure's context offers, from the program itself: the hybrid
  // layout (sparse tables on the parameter servers, updated asynchronously,
  // beside mirrored dense layers) and multi-client programs use them.
  Result<Tensor> gather(const std::string& name, const Tensor& ids);
  Status apply_gradients(const std::string& name, const Tensor& gradient);
  Status apply_sparse_gradients(const std::string& name, const Tensor& ids, const Tensor& rows);
  int num_workers();
  // Shows a training figure on the coordinator's status page (`/` on its
  // HTTP port), plotted over the last minutes: e.g. report_scalar("loss",
  // 0.31, step). The coordinator keeps the last 600 points of at most 32
  // tags; a tag over 128 bytes or a value that is not finite is
  // InvalidArgument. One RPC: call it where the program prints progress.
  Status report_scalar(const std::string& tag, double value, int64_t step);

  // Collective groups with the coordinator as the rendezvous (TF's
  // MultiWorkerMirroredStrategy collectives; torchrun's store): listens on
  // `host` (the interface the other ranks reach; port picked), joins the
  // next group `name` of `size` ranks as `rank` (-1: the lowest free one),
  // waits until all `size` have joined (Unavailable naming the missing
  // ranks after options.timeout), then connects to them. Joining the same
  // name again after a failure forms the next generation. Any process that
  // can reach the coordinator may join: workers' closures and users' own
  // training binaries (multi-client mode) alike.
  Result<std::unique_ptr<Communicator>> join_group(const std::string& name, int size, int rank = -1,
                                                   const std::string& host = "127.0.0.1",
                                                   CollectiveOptions options = {});

 private:
  friend class MirroredStrategy;  // talks to the coordinator through impl_
  struct CAPSTAN_HIDDEN Impl;
  explicit ClusterCoordinator(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// tf.train.CheckpointManager: numbered checkpoints in one directory.
class CheckpointManager {
 public:
  CheckpointManager(ClusterCoordinator& cluster, std::string directory, int max_to_keep = 5)
      : cluster_(cluster), directory_(std::move(directory)), max_to_keep_(max_to_keep) {}
  Result<std::string> save(int64_t step) { return cluster_.save_checkpoint(directory_, step, max_to_keep_); }
  // Restores the newest checkpoint; NotFound when there is none.
  Result<int64_t> restore_latest() { return cluster_.restore_checkpoint(directory_); }
  const std::string& directory() const { return directory_; }

 private:
  ClusterCoordinator& cluster_;
  const std::string directory_;
  const int max_to_keep_;
};

}  // namespace capstan

#endif  // CAPSTAN_TRAINING_H_
