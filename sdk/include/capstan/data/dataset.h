// Dataset: tf.data input pipelines in C++.
//
// A Dataset is an immutable pipeline definition built with the calls
// TensorFlow users know:
//
//   using capstan::data::Dataset;
//   auto ds = Dataset::list_files({"/data/train-*.tfrecord"}, /*shuffle=*/true, 42)
//                 .interleave(Fn::tfrecord_dataset(), /*cycle_length=*/4)
//                 .map(Fn::parse_example(spec), capstan::data::kAutotune)
//                 .shuffle(10000, 7)
//                 .batch(256, /*drop_remainder=*/true)
//                 .prefetch(capstan::data::kAutotune);
//   auto it = ds.make_iterator(&functions).value();
//   while (auto element = it->get_next().value()) { ... *element ... }
//
// The definition serializes to a Cap'n Proto struct (schemas/dataset.capnp),
// so the same pipeline runs in-process, on a worker, or on data-service
// workers. Element order and end-of-sequence behaviour follow TensorFlow's
// documentation for every op.
#ifndef CAPSTAN_DATA_DATASET_H_
#define CAPSTAN_DATA_DATASET_H_

#include "capstan/export.h"

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "capstan/data/parsing.h"
#include "capstan/functions.h"
#include "capstan/status.h"
#include "capstan/tensor.h"

namespace capstan CAPSTAN_API {
namespace data {

// Let the runtime pick (tf.data.AUTOTUNE).
inline constexpr int64_t kAutotune = -1;
// shard(): the worker count / index, filled in by the data service.
inline constexpr int64_t kShardHint = -1;
// cardinality() results.
inline constexpr int64_t kInfiniteCardinality = -1;
inline constexpr int64_t kUnknownCardinality = -2;

enum class Compression { kNone, kGzip };

// Dataset::save (tf.data.Dataset.save).
struct SaveOptions {
  Compression compression = Compression::kNone;
  // Files the elements are spread over (element i in shard i % num_shards);
  // load() reads them back in the saved order, and the data service's FILE
  // and DYNAMIC modes divide a loaded dataset by shard.
  int64_t num_shards = 1;
  // Resolves the pipeline's named functions (may be null).
  const FunctionRegistry* functions = nullptr;
};

// A function applied by map, filter or interleave: a named function from a
// FunctionRegistry (module), or a built-in.
class Fn {
 public:
  // A function registered under `name`.
  static Fn named(std::string name);
  // map: decode each string of component 0 as CSV (tf.io.decode_csv).
  static Fn decode_csv(CsvSpec spec);
  // map: parse component 0, serialized tf.train.Example(s) (tf.io.parse_example).
  static Fn parse_example(FeatureSpec spec);
  // map: cast every component to `dtype` (tf.cast).
  static Fn cast(DType dtype);
  // interleave: the file named by component 0 as a dataset of its records.
  static Fn tfrecord_dataset(Compression compression = Compression::kNone);
  static Fn text_line_dataset(Compression compression = Compression::kNone);

  struct CAPSTAN_HIDDEN Impl;
  const std::shared_ptr<const Impl>& impl() const { return impl_; }

 private:
  explicit Fn(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
};

// tf.data.Options.
struct Options {
  bool autotune = true;
  // Memory the autotuner may spend on buffers; 0 means half the machine's RAM.
  int64_t autotune_ram_budget = 0;
  // Threads the autotuner may use; 0 means one per core.
  int autotune_cpu_budget = 0;
  // Keep element order where parallelism could change it (per-op
  // `deterministic` arguments override this).
  bool deterministic = true;
  // Bytes the pipeline's buffers (shuffle, prefetch, batches being built,
  // memory caches) may hold at once; the op that would pass it fails with
  // ResourceExhausted. 0 means half the machine's RAM. A data worker caps it
  // with its task_memory_mib.
  int64_t memory_budget = 0;
};

class Iterator {
 public:
  virtual ~Iterator() = default;
  // The next element, or nullopt at the end of the sequence. An error from
  // one element (e.g. a failed map function) does not end the iteration.
  virtual Result<std::optional<Element>> get_next() = 0;

  // The iterator's position as bytes (tf.data's iterator checkpointing,
  // tf.train.Checkpoint(iterator=...)): restore() on a new iterator of the
  // same dataset then yields exactly the elements this one would have
  // yielded next. Every op saves its position: file offsets, shuffle buffers
  // with their random state, partial batches, interleave cycles, repeat,
  // take and skip counters, and the elements that map, prefetch and
  // interleave threads had buffered (they pause while it saves). A read
  // through the data service saves its named job and how many elements of
  // each task it handed out; restored after the job's data workers
  // restarted (a whole job restarting), it continues exactly (the rebuilt
  // tasks skip those elements). FailedPrecondition: an anonymous job,
  // coordinated reads, the cross-trainer cache. A cache or snapshot file
  // that was being written is not finished by the restored iterator; a later
  // full pass writes it.
  virtual Result<std::string> save() {
    return Status::Unimplemented("this iterator cannot save its position");
  }
  // Continues from a state save() returned. Call it before the first
  // get_next(). InvalidArgument for a state of another dataset definition or
  // damaged bytes; the iterator is then unusable.
  virtual Status restore(std::string_view state) {
    (void)state;
    return Status::Unimplemented("this iterator cannot restore a position");
  }
};

// Hands out the splits of a pipeline's source, for dynamic sharding (the
// data service's DYNAMIC mode): chunks of a range, or file names. Iterators
// made with the same provider share the work: together they see every
// element once. Thread-safe.
class SplitProvider {
 public:
  virtual ~SplitProvider() = default;
  // The next split, or nullopt when all have been handed out.
  virtual Result<std::optional<Element>> get_next() = 0;
  // Starts handing out the splits again (the next repetition).
  virtual void reset() = 0;
  virtual int64_t num_splits() const = 0;
};

class Dataset {
 public:
  // ---- Sources ----
  static Dataset range(int64_t stop);
  static Dataset range(int64_t start, int64_t stop, int64_t step = 1);
  static Dataset from_tensors(Element element);
  static Dataset from_tensor_slices(Element element);
  // Files matching the glob patterns, sorted; shuffled (per iteration) when
  // `shuffle`, reproducibly when `seed` is given.
  static Dataset list_files(std::vector<std::string> patterns, bool shuffle = true,
                            std::optional<uint64_t> seed = std::nullopt);
  static Dataset text_line_dataset(std::vector<std::string> files,
                                   Compression compression = Compression::kNone);
  static Dataset tfrecord_dataset(std::vector<std::string> files,
                                  Compression compression = Compression::kNone,
                                  int64_t num_parallel_reads = 0);
  static Dataset fixed_length_record_dataset(std::vector<std::string> files, int64_t record_bytes,
                                             int64_t header_bytes = 0, int64_t footer_bytes = 0,
                                             Compression compression = Compression::kNone);
  // A dataset save() wrote (tf.data.Dataset.load): its elements in the saved
  // order. NotFound when `path` holds no finished save, DataLoss when its
  // spec is damaged.
  static Result<Dataset> load(const std::string& path);
  static Dataset zip(const std::vector<Dataset>& datasets);

  // ---- Transformations ----
  // num_parallel_calls: 0 runs the function inline; n > 0 or kAutotune runs
  // it on threads. deterministic: nullopt follows Options::deterministic.
  Dataset map(Fn fn, int64_t num_parallel_calls = 0,
              std::optional<bool> deterministic = std::nullopt) const;
  Dataset filter(Fn fn) const;
  Dataset batch(int64_t batch_size, bool drop_remainder = false) const;
  // padded_shapes: one per component, -1 pads a dimension to the batch's
  // longest; padding_values: one scalar per component (empty: 0 / "").
  Dataset padded_batch(int64_t batch_size, std::vector<Shape> padded_shapes,
                       std::vector<Tensor> padding_values = {},
                       bool drop_remainder = false) const;
  Dataset shuffle(int64_t buffer_size, std::optional<uint64_t> seed = std::nullopt,
                  bool reshuffle_each_iteration = true) const;
  Dataset repeat(int64_t count = -1) const;  // -1: forever
  Dataset shard(int64_t num_shards, int64_t index) const;
  Dataset interleave(Fn fn, int64_t cycle_length = kAutotune, int64_t block_length = 1,
                     int64_t num_parallel_calls = 0,
                     std::optional<bool> deterministic = std::nullopt) const;
  Dataset prefetch(int64_t buffer_size) const;
  Dataset take(int64_t count) const;  // -1: all
  Dataset skip(int64_t count) const;  // -1: all
  // Each element with its index, counting from `start`, in front as component 0
  // (an int64 scalar; tf.data's (index, element) pairs, flattened).
  Dataset enumerate(int64_t start = 0) const;
  // tf.data's unbatch: each input element split along the first dimension of
  // its components into that many elements (component i of element j is row j
  // of component i). Every component needs rank >= 1 and the same first
  // dimension (InvalidArgument naming the sizes otherwise); an input element
  // with first dimension 0 yields nothing. batch(k).unbatch() gives back the
  // input.
  Dataset unbatch() const;
  Dataset concatenate(const Dataset& other) const;
  // In memory when `filename` is empty, else in that file (reused by later
  // runs once complete).
  Dataset cache(std::string filename = "") const;
  // tf.data's snapshot: the first iteration runs the pipeline above and
  // writes its elements under `path` (in a directory named by the
  // fingerprint of that pipeline); once one iteration has finished, every
  // later one (in any process) reads them from there instead. An iteration
  // that stops early leaves nothing; a changed pipeline gets a new snapshot.
  Dataset snapshot(std::string path, Compression compression = Compression::kNone) const;
  // Re-slices batches of the input into batches of `batch_size`.
  Dataset rebatch(int64_t batch_size, bool drop_remainder = false) const;
  Dataset with_options(Options options) const;
  Options options() const;

  // Finite count, kInfiniteCardinality or kUnknownCardinality.
  int64_t cardinality() const;
  // Replaces kShardHint placeholders of shard() (for static sharding).
  Dataset resolve_shard_hint(int64_t num_shards, int64_t index) const;

  // Starts iterating. `functions` resolves Fn::named and must outlive the
  // iterator (may be null when the pipeline uses only built-ins). Checks the
  // definition (arguments, functions) first and fails with InvalidArgument or
  // NotFound naming the op.
  Result<std::unique_ptr<Iterator>> make_iterator(const FunctionRegistry* functions = nullptr) const;

  // Dynamic sharding (the data service's DYNAMIC mode), as TF's split
  // providers: one provider per source of the pipeline, in depth-first order
  // (zip and concatenate have one per input source). Range sources split
  // into chunks of `range_chunk` elements, list_files and the file sources
  // into one file per split. A repeat() hands out its input's splits once
  // per repetition (forever for repeat()), so iterators sharing the
  // providers together see every element of every repetition once.
  // FailedPrecondition naming the source when one cannot be split.
  Result<std::vector<std::unique_ptr<SplitProvider>>> make_split_providers(int64_t range_chunk = 1) const;
  // The same for a pipeline with exactly one source (FailedPrecondition
  // otherwise).
  Result<std::unique_ptr<SplitProvider>> make_split_provider(int64_t range_chunk = 1) const;
  // Iterates with the sources reading only the splits the providers hand
  // out: one provider per source, as make_split_providers() orders them
  // (InvalidArgument otherwise). The providers must outlive the iterator.
  Result<std::unique_ptr<Iterator>> make_iterator(const FunctionRegistry* functions,
                                                  std::vector<SplitProvider*> splits) const;
  Result<std::unique_ptr<Iterator>> make_iterator(const FunctionRegistry* functions,
                                                  SplitProvider* splits) const;

  // Runs the pipeline and writes its elements to the directory `path`
  // (tf.data.Dataset.save; read back with load()). The directory appears
  // complete or not at all; AlreadyExists when `path` exists.
  Status save(const std::string& path, const SaveOptions& options = {}) const;

  // The Cap'n Proto encoding of the definition, and back (definitions from
  // elsewhere are checked: a malformed one is InvalidArgument).
  std::string serialize() const;
  static Result<Dataset> deserialize(const std::string& bytes);
  // A readable one-line summary: "range(0, 10, 1).map(f).batch(2)".
  std::string debug_string() const;

  struct CAPSTAN_HIDDEN Impl;
  explicit Dataset(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  const std::shared_ptr<const Impl>& impl() const { return impl_; }

 private:
  std::shared_ptr<const Impl> impl_;
};

}  // namespace data
}  // namespace capstan

#endif  // CAPSTAN_DATA_DATASET_H_
