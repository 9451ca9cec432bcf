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
#include "capstan/phases.h"
#include "capstan/status.h"
#include "capstan/tensor.h"

namespace capstan CAPSTAN_API {

namespace data {
class Dataset;
class Iterator;
}  // namespace data
class MirroredStrategy;

// A learning rate that changes as training goes (Keras'
// tf.keras.optimizers.schedules), part of an Optimizer. It is evaluated at
// the variable's `iterations`: the number of updates applied to it before
// this one (TF's optimizer.iterations; 0 for the first update). The rate at
// iterations 0 is always the optimizer's learning_rate (Keras'
// initial_learning_rate; values[0] for piecewise_constant_decay).
//
//   constant                  lr = learning_rate
//   exponential_decay         lr = learning_rate * decay_rate ^ (iterations / decay_steps)
//                             (staircase: the exponent's integer part)
//   piecewise_constant_decay  lr = values[0] while iterations <= boundaries[0],
//                             values[i] while boundaries[i-1] < iterations <= boundaries[i],
//                             values.back() after boundaries.back()
//   cosine_decay              lr = learning_rate * ((1 - alpha) * 0.5 *
//                                  (1 + cos(pi * min(iterations, decay_steps) / decay_steps)) + alpha)
//
// Only the fields its kind uses matter; the factories leave the others at
// their defaults.
struct LearningRateSchedule {
  enum class Kind { kConstant, kExponentialDecay, kPiecewiseConstantDecay, kCosineDecay };
  Kind kind = Kind::kConstant;
  int64_t decay_steps = 0;            // exponential_decay, cosine_decay: > 0
  double decay_rate = 0;              // exponential_decay: > 0
  bool staircase = false;             // exponential_decay
  double alpha = 0;                   // cosine_decay: the final fraction of the rate, in [0, 1]
  std::vector<int64_t> boundaries{};  // piecewise_constant_decay: increasing iteration counts >= 0
  std::vector<double> values{};       // piecewise_constant_decay: boundaries.size() + 1 rates > 0

  bool operator==(const LearningRateSchedule&) const = default;

  static LearningRateSchedule constant();
  static LearningRateSchedule exponential_decay(int64_t decay_steps, double decay_rate, bool staircase = false);
  static LearningRateSchedule piecewise_constant_decay(std::vector<int64_t> boundaries, std::vector<double> values);
  static LearningRateSchedule cosine_decay(int64_t decay_steps, double alpha = 0);
};

// Keras' names in snake case: "constant", "exponential_decay",
// "piecewise_constant_decay", "cosine_decay".
std::string learning_rate_schedule_name(LearningRateSchedule::Kind kind);
// Inverse of learning_rate_schedule_name(); nullopt for an unknown name.
std::optional<LearningRateSchedule::Kind> learning_rate_schedule_kind_from_name(std::string_view name);

// An optimizer applied on the parameter servers (Keras semantics).
// The one description of an optimizer, everywhere in Capstan: the program
// creates variables with it, the parameter servers apply it, checkpoints
// record it. Only the fields its kind uses matter.
//
//   Optimizer::adam(0.001).with_schedule(LearningRateSchedule::cosine_decay(10000))
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
  // How learning_rate changes with the variable's updates (every kind but none).
  LearningRateSchedule schedule{};

  // Field by field (a re-created variable must ask for the same optimizer).
  bool operator==(const Optimizer&) const = default;

  // This optimizer with `schedule`. A piecewise_constant_decay schedule
  // also sets learning_rate to its values[0] (when it has values), as the
  // rate of the first update is the learning_rate.
  Optimizer with_schedule(LearningRateSchedule schedule) const;

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

// The rate of the update that follows `iterations` (>= 0) earlier updates:
// `optimizer`'s schedule at `iterations`, from its learning_rate.
double learning_rate_at(const Optimizer& optimizer, int64_t iterations);

// How one optimizer update is applied (ClosureContext::apply_gradients,
// MirroredVariables::apply_averaged_gradients).
struct ApplyOptions {
  // The rate of this update instead of the optimizer's own learning_rate
  // and schedule: Keras' optimizer.learning_rate, set before
  // apply_gradients (tf.keras.callbacks.LearningRateScheduler does). Used
  // as the schedule's value would be: Adam's bias correction and FTRL's
  // beta term take it; FTRL, which divides by the rate, leaves the
  // variable and its slots alone at 0. Finite and >= 0 (InvalidArgument
  // naming it otherwise, nothing applied). nullopt: the optimizer's own.
  std::optional<double> learning_rate{};
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

// A variable's initial value, computed by the parameter servers, each for
// the rows it holds (tf.keras.initializers). Element i (row-major) of the
// whole variable depends on (kind, parameters, seed, i) only, so a variable
// is the same tensor however it is partitioned and wherever its shards live.
// The random kinds draw from SplitMix64 at a counter made of (seed, i, draw):
// seeded and deterministic, not the same numbers as TensorFlow's.
//
//   zeros, constant(value)          any fixed-size dtype (value in range)
//   random_normal(mean, stddev)     float32 / float64
//   truncated_normal(mean, stddev)  a normal redrawn while beyond 2 stddev of
//                                   the mean (TF's truncated_normal)
//   random_uniform(minval, maxval)  [minval, maxval)
//   glorot_uniform                  uniform in +-sqrt(6 / (fan_in + fan_out))
//   glorot_normal                   truncated_normal(0, sqrt(2 / (fan_in +
//                                   fan_out)) / .87962566103423978)
//
// fan_in and fan_out are Keras' (compute_fans), from the whole variable's
// shape: [] -> 1, 1; [n] -> n, n; [a, b] -> a, b; [..., a, b] -> a * r,
// b * r with r the product of the leading dims. A random kind on another
// dtype, a stddev < 0, minval > maxval or a value that is not finite is
// InvalidArgument naming it.
struct Initializer {
  // kNone: no initializer (VariableSpec::initial holds the value).
  enum class Kind { kNone, kZeros, kConstant, kRandomNormal, kTruncatedNormal, kRandomUniform,
                    kGlorotUniform, kGlorotNormal };
  Kind kind = Kind::kNone;
  double value = 0;                  // constant
  double mean = 0, stddev = 0.05;    // random_normal, truncated_normal (Keras' defaults)
  double minval = -0.05, maxval = 0.05;  // random_uniform (Keras' defaults)
  uint64_t seed = 0;                 // the random kinds

  bool operator==(const Initializer&) const = default;

  static Initializer zeros();
  static Initializer constant(double value);
  static Initializer random_normal(double mean = 0, double stddev = 0.05, uint64_t seed = 0);
  static Initializer truncated_normal(double mean = 0, double stddev = 0.05, uint64_t seed = 0);
  static Initializer random_uniform(double minval = -0.05, double maxval = 0.05, uint64_t seed = 0);
  static Initializer glorot_uniform(uint64_t seed = 0);
  static Initializer glorot_normal(uint64_t seed = 0);
};

// Keras' identifiers: "none", "zeros", "constant", "random_normal",
// "truncated_normal", "random_uniform", "glorot_uniform", "glorot_normal".
std::string initializer_name(Initializer::Kind kind);
// Inverse of initializer_name(); nullopt for an unknown name.
std::optional<Initializer::Kind> initializer_kind_from_name(std::string_view name);

// A variable on the parameter servers. Its value is either `initial` (the
// whole tensor, which the program writes straight to the parameter servers
// holding its shards, in chunks of at most 64 MiB, never through the
// coordinator; a scalar's few bytes go with the request) or
// `initializer`'s, computed by the parameter servers for a variable of
// `dtype` and `shape` ({} is a scalar). Giving both, or
// neither, is InvalidArgument saying which to drop or give; so is a dtype or
// shape that disagrees with `initial`.
//
//   cluster->create_variable({.name = "w", .optimizer = Optimizer::adam(1e-3),
//                             .partitioner = Partitioner::fixed_shards(4),
//                             .initializer = Initializer::glorot_uniform(7),
//                             .dtype = DType::kFloat32, .shape = {1 << 20, 64}});
struct VariableSpec {
  std::string name{};
  Tensor initial{};  // the whole initial value; Tensor() when `initializer` gives it
  Optimizer optimizer = Optimizer::none();
  Partitioner partitioner = Partitioner::none();
  Initializer initializer{};  // instead of `initial`
  DType dtype = DType::kInvalid;  // with `initializer`
  Shape shape{};                  // with `initializer`
};

// Initializers (tf.keras.initializers) that make the whole value in the
// program (Initializer above makes it on the parameter servers instead).
Result<Tensor> zeros_initializer(DType dtype, Shape shape);
Result<Tensor> constant_initializer(DType dtype, Shape shape, double value);
Result<Tensor> random_normal_initializer(DType dtype, Shape shape, double mean, double stddev,
                                         uint64_t seed);
Result<Tensor> random_uniform_initializer(DType dtype, Shape shape, double minval, double maxval,
                                          uint64_t seed);

// ---- Embedding tables without a fixed vocabulary (dynamic hash tables) -----
//
// A hash-table variable on the parameter servers: keys are int64 ids of any
// value (no vocabulary, no hashing into a fixed range), values are rows of
// `dim` elements with their optimizer slots. Key k lives on parameter server
// table_shard_of(k, number of parameter servers) (stable and documented:
// SplitMix64's finalizer of k, modulo the count).
//
//   cluster->create_embedding_table({"user_emb", 64, DType::kFloat32,
//       EmbeddingInitializer::random_normal(0, 0.05, 7), Optimizer::adagrad(0.1),
//       {.min_count = 2, .ttl_steps = 100000, .max_rows = 10'000'000}}).value();
//   // in a closure:
//   Tensor rows = ctx.lookup("user_emb", ids).value();          // [n, 64]
//   ctx.apply_sparse_gradients("user_emb", ids, gradient_rows);  // the table's optimizer
//
// Semantics (TensorFlow Recommenders Addons' dynamic embedding, on TF2's
// parameter-server training):
//   lookup(ids)         missing keys that are admitted are inserted, with the
//                       initializer's row; keys not admitted yet get the
//                       default row (not inserted). Duplicates are looked up
//                       once.
//   lookup(ids, false)  evaluation: never inserts; missing keys get the
//                       default row.
//   apply_sparse_gradients  updates the rows of the keys present (repeated ids
//                       summed); gradients of keys not in the table (not
//                       admitted, or evicted meanwhile) are dropped. Adam is
//                       lazy on a table (only the named rows' m and v move).
//   admission           min_count > 1: a key is inserted at its min_count-th
//                       recent lookup, counted in a count-min sketch (16-bit
//                       counters that halve now and then, not a map of keys:
//                       approximate); admit_probability < 1:
//                       each lookup of a missing key inserts it with that
//                       probability.
//   eviction            ttl_steps / ttl_seconds: rows not updated for that
//                       long go; max_rows / max_bytes per parameter server:
//                       the least recently updated (eviction = "lru") or the
//                       least often looked-up (eviction = "lfu") rows go, with
//                       their slots, to stay under the cap (kept per 1/16 of
//                       a shard: at least 16 rows; max_bytes approximate).
struct EmbeddingInitializer {
  std::string kind = "random_normal";  // "zeros", "constant", "random_normal"
  double value = 0;                    // constant
  double mean = 0, stddev = 0.05;      // random_normal (Keras' defaults)
  uint64_t seed = 0;                   // random_normal: row of key k depends on (seed, k) only

  static EmbeddingInitializer zeros();
  static EmbeddingInitializer constant(double value);
  static EmbeddingInitializer random_normal(double mean = 0, double stddev = 0.05, uint64_t seed = 0);
  bool operator==(const EmbeddingInitializer&) const = default;
};

struct EmbeddingTableOptions {
  int64_t min_count = 1;            // lookups before a key is inserted (1: at once)
  double admit_probability = 1.0;   // (0, 1]: chance that a lookup of a missing key inserts it
  int64_t ttl_steps = 0;            // evict rows not updated for this many optimizer steps (0: never)
  int64_t ttl_seconds = 0;          // evict rows not updated for this many seconds (0: never)
  int64_t max_rows = 0;             // per parameter server (0: no cap)
  int64_t max_bytes = 0;            // per parameter server: rows, slots and per-key metadata (0: no cap)
  std::string eviction = "lru";     // which rows a cap evicts: "lru" or "lfu"
  double default_value = 0;         // every element of the default row
  bool operator==(const EmbeddingTableOptions&) const = default;
};

struct EmbeddingTableSpec {
  std::string name;
  int64_t dim = 0;                  // elements per row, >= 1
  DType dtype = DType::kFloat32;    // float32 or float64
  EmbeddingInitializer initializer;
  Optimizer optimizer = Optimizer::sgd(0.01);
  EmbeddingTableOptions options;
  bool operator==(const EmbeddingTableSpec&) const = default;
};

// The parameter server (0 .. num_shards-1) that holds `key`.
uint64_t table_key_hash(int64_t key);
inline int table_shard_of(int64_t key, int num_shards) {
  return static_cast<int>(table_key_hash(key) % static_cast<uint64_t>(num_shards));
}

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
  Shape shape;  // an embedding table's: [0, dim] (it has no fixed number of rows)
  std::vector<ShardInfo> shards;
  bool embedding_table = false;
};

// A closure's future result (tf.distribute.experimental.coordinator.RemoteValue).
// A handle: copies share one value. When the last copy goes, the value is
// released: the coordinator is told (with the program's next schedule
// calls, or within a second) that nobody will fetch it, and drops it, as
// TF frees a RemoteValue's result with the Python object. So the
// coordinator keeps only the values the program still holds, however many
// closures it runs. ClusterCoordinator::fetch_once releases at the fetch.
// A RemoteValue may outlive its ClusterCoordinator (it then releases
// nothing: the coordinator lets a gone client's values go by itself).
class RemoteValue {
 public:
  RemoteValue() = default;
  // The closure `id` of this program's ClusterCoordinator, found by
  // fetch() while a handle from schedule() keeps it; this one releases
  // nothing.
  explicit RemoteValue(int64_t id) : id(id) {}

  // The closure's number in its ClusterCoordinator (what errors name). For
  // reading: the handle releases the closure it was made for.
  int64_t id = 0;

 private:
  friend class ClusterCoordinator;
  struct CAPSTAN_HIDDEN Holder;  // releases the value when the last copy goes
  std::shared_ptr<Holder> holder_;
};

// A dataset each worker iterates on its own (create_per_worker_dataset).
struct PerWorkerDataset {
  int64_t id = 0;
  // The closure argument that stands for "this worker's iterator": pass it
  // in schedule()'s args; the closure reads it with
  // ClosureContext::iterator(args.components[i]).
  Tensor arg() const;
};

// A worker's time as the coordinator saw it (ClusterCoordinator::
// worker_stats()).
struct WorkerStats {
  int task_index = -1;
  std::string address;
  int64_t runs = 0;  // closures and synchronous steps that returned a value
  // Summed over those runs: queued at the coordinator, then on the worker
  // input, parameter servers, collectives, and total (capstan/phases.h).
  PhaseTimes phases;
  double busy_seconds = 0;  // per run, smoothed, collectives left out
  // busy_seconds relative to the median worker's (1: typical; 2: twice as
  // slow); none until the worker has run a few steps.
  std::optional<double> straggler_score;
  bool straggler = false;  // the coordinator's log named it slow
};
struct ClusterStats {
  std::vector<WorkerStats> workers;  // registered, by task index
  PhaseTimes totals;                 // every run of every worker seen
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

  // Creates (or, for a reconnecting program, finds: AlreadyExists when the
  // spec differs) a dynamic embedding table with one shard on every
  // parameter server (EmbeddingTableSpec above).
  Result<VariableInfo> create_embedding_table(const EmbeddingTableSpec& spec);
  Result<VariableInfo> create_embedding_table(const std::string& name, int64_t dim, DType dtype,
                                              const EmbeddingInitializer& initializer, const Optimizer& optimizer,
                                              const EmbeddingTableOptions& options = {});
  // ClosureContext::lookup from the program (evaluation: insert = false).
  Result<Tensor> lookup(const std::string& table, const Tensor& ids, bool insert = true);
  // Delta export for online serving: writes the rows of `table` changed
  // since checkpoint `since_checkpoint` (a ckpt-N path or a directory: its
  // latest; "" for every row) to the safetensors file `path` on the
  // coordinator's machine ("keys" int64[n], "values" [n, dim], "meta"
  // int64[n, 4]); returns n. Keys evicted since are not listed.
  Result<int64_t> export_embedding_table(const std::string& table, const std::string& since_checkpoint,
                                         const std::string& path);

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
  // fetch(), for a program that needs the value once: a value fetched is
  // released at once (not when the RemoteValue goes), and a later fetch of
  // it is NotFound saying so. An error is not released: fetch it
  // again, or drop the RemoteValue.
  Result<Element> fetch_once(const RemoteValue& value);

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
  // Where the workers' time went and which of them is slow: each
  // registered worker's runs, phase totals and straggler score, and every
  // run's phases summed (format_phases(stats.totals) for a progress line).
  Result<ClusterStats> worker_stats();
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
