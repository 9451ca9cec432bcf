// Saved datasets: what Dataset::save writes, Dataset::load reads and
// Dataset::snapshot keeps (TF's tf.data.Dataset.save / load / snapshot).
//
// A saved dataset is a directory:
//   dataset_spec.json       {"format": "capstan-saved-dataset-1",
//                            "num_elements": N, "compression": "NONE"|"GZIP",
//                            "shards": ["shard_00000.tfrecord", ...],
//                            "element_spec": [{"name", "dtype", "shape"}]}
//   shard_00000.tfrecord    TFRecord files (GZIP when compressed) holding
//   ...                     one serialized Element per record; element i is
//                           in shard i % num_shards, so reading the shards
//                           in turn gives back the saved order.
// The shards are durable before the spec is written, and the spec before
// the directory takes its final name: a directory with a spec is complete.
//
// Thread-safety: SavedDatasetWriter is used by one thread at a time; the
// free functions have no shared state.
#ifndef CAPSTAN_LIB_DATA_SAVED_DATASET_H_
#define CAPSTAN_LIB_DATA_SAVED_DATASET_H_

#include <memory>
#include <string>
#include <vector>

#include "capstan/data/dataset.h"
#include "data/engine.h"
#include "data/ops/common.h"
#include "data/io/tfrecord.h"

namespace capstan::data::engine {

inline constexpr char kSavedSpecFile[] = "dataset_spec.json";

struct SavedSpec {
  int64_t num_elements = 0;
  Compression compression = Compression::kNone;
  std::vector<std::string> shards;  // absolute paths, in shard order
};

// NotFound when `dir` holds no spec (nothing saved, or not finished);
// DataLoss when the spec is damaged.
Result<SavedSpec> read_saved_spec(const std::string& dir);

// Writes a saved dataset into `dir` (created; must not exist).
class SavedDatasetWriter {
 public:
  static Result<std::unique_ptr<SavedDatasetWriter>> create(const std::string& dir, int64_t num_shards,
                                                            Compression compression);
  ~SavedDatasetWriter();  // an unfinished writer removes its directory

  Status write(const Element& element);
  // Makes the shards durable and writes the spec: the directory is complete.
  Status finish();

 private:
  SavedDatasetWriter(std::string dir, Compression compression) : dir_(std::move(dir)), compression_(compression) {}

  const std::string dir_;
  const Compression compression_;
  std::vector<std::unique_ptr<io::TFRecordWriter>> shards_;
  std::vector<std::string> names_;
  int64_t written_ = 0;
  std::string element_spec_;  // JSON of the first element's structure
  bool finished_ = false;
};

// Elements of the shards read in turn (the saved order).
IteratorPtr make_saved_reader(std::vector<std::string> shards, Compression compression);
// Elements of the shards `splits` names (one shard file per split), in turn.
IteratorPtr make_split_saved(SplitProvider* splits, Compression compression);

// snapshot(): the elements of the complete snapshot in `dir` when there is
// one; else the input's, written to a new snapshot that takes the name `dir`
// once the input ends (a reader that stops early leaves nothing behind).
IteratorPtr make_snapshot(IteratorFactory input, std::string dir, Compression compression);

// FNV-1a of the definition of `op` (the snapshot's directory name).
uint64_t op_fingerprint(wire::Op::Reader op);

// Dataset::save: runs the pipeline and writes its elements to `path`.
Status save_dataset(const std::shared_ptr<const Dataset::Impl>& definition, const std::string& path,
                    const SaveOptions& options);

// Moves a finished directory to `path` durably. AlreadyExists when `path`
// exists.
Status commit_directory(const std::string& tmp_dir, const std::string& path);

}  // namespace capstan::data::engine

#endif  // CAPSTAN_LIB_DATA_SAVED_DATASET_H_
