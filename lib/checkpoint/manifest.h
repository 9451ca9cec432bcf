// The JSON files of a checkpoint directory (see checkpoint.h for the layout):
// "manifest.json" inside each checkpoint, which says what the safetensors
// files hold, and the "checkpoint" index beside them.
//
// A manifest (format version 1), as to_json_with_checksum() writes it:
//
//   {
//     "manifest_crc32c": 1983451223,
//     "format_version": 1,
//     "step": 1200,
//     "variables": [
//       {
//         "name": "w",
//         "dtype": "float32",
//         "shape": [13, 4],
//         "partitioning": [3, 3, 3, 2, 2],
//         "shards": [
//           {"name": "w/part_0", "file": "ps-0.safetensors", "first_row": 0, "rows": 3},
//           ...
//         ],
//         "optimizer": {"kind": "adagrad",
//                       "hyperparameters": {"learning_rate": 0.05,
//                                           "initial_accumulator_value": 0.1,
//                                           "epsilon": 1e-07},
//                       "nesterov": false},
//         "slots": ["accumulator"],
//         "optimizer_step": 1200
//       }
//     ],
//     "files": [
//       {"name": "ps-0.safetensors", "size": 4096, "crc32c": 2864434397},
//       ...
//     ]
//   }
//
// Glossary:
//   variable      a logical variable, whole, as the training program sees it.
//   partitioning  the rows (of dimension 0) of each shard, in order: [3, 3,
//                 3, 2, 2] is 13 rows in 5 shards. Shard i holds rows
//                 [first_row, first_row + rows). An unpartitioned variable has
//                 one shard of all rows; a scalar variable counts as one row
//                 (partitioning [1]).
//   shard         a tensor named `name` in safetensors file `file`, of the
//                 variable's dtype and shape [rows] + shape[1:].
//   slot          an optimizer's per-variable state ("accumulator", "m",
//                 "v"): each shard's slot is the tensor "<shard>/slot/<slot>"
//                 in the shard's file, of the same dtype and shape as the
//                 shard.
//   schedule      the optimizer's learning rate schedule, when it has one
//                 other than constant: {"kind": "cosine_decay",
//                 "decay_steps": 1275, "alpha": 0}, with the fields its kind
//                 uses (exponential_decay: decay_steps, decay_rate,
//                 staircase; piecewise_constant_decay: boundaries, values).
//                 Absent: constant (every manifest written before schedules).
//   files         every data file of the checkpoint with its size and
//                 CRC32C, which readers verify.
//   manifest_crc32c  the CRC32C of the manifest itself: of to_json() of what
//                 the file holds (the canonical text, without this field).
//                 A changed byte in a value is DataLoss naming the file, not
//                 a confusing "no such variable". Optional on reading, for
//                 manifests written before it existed.
//
// Dtypes use TensorFlow's names ("float32"). Doubles are written as the
// shortest text that reads back exactly; NaN and infinities, which JSON
// lacks, as the strings "NaN", "Infinity", "-Infinity" (as protobuf's JSON
// mapping does). Unknown fields are errors: a reader of format version 1
// must understand every field of it.
//
// The index file "checkpoint" (after TensorFlow's CheckpointState) names the
// checkpoints a CheckpointWriter keeps, oldest first, and the latest one:
//
//   {"latest": "ckpt-1200", "kept": ["ckpt-1100", "ckpt-1200"]}
#ifndef CAPSTAN_LIB_CHECKPOINT_MANIFEST_H_
#define CAPSTAN_LIB_CHECKPOINT_MANIFEST_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "capstan/status.h"
#include "capstan/training.h"
#include "capstan/tensor.h"

namespace capstan::checkpoint {

inline constexpr int kManifestFormatVersion = 1;
inline constexpr std::string_view kManifestFileName = "manifest.json";
inline constexpr std::string_view kIndexFileName = "checkpoint";

// "w/part_0": TensorFlow's name for shard `part` of a partitioned variable.
std::string shard_name(std::string_view variable, size_t part);
// "w/part_0/slot/accumulator": the tensor holding `slot` of shard `shard`.
std::string slot_tensor_name(std::string_view shard, std::string_view slot);

struct ManifestShard {
  std::string name;  // the tensor's name in `file`
  std::string file;  // a name in Manifest::files
  int64_t first_row = 0;
  int64_t rows = 0;
  bool operator==(const ManifestShard&) const = default;
};

// What a dynamic embedding table adds to its variable entry ("table": {...}).
// A table is written as a variable of shape [rows, dim] whose shards are the
// parameter servers' table shards, in task order (first_row counts the rows
// before it); each shard's file holds, beside the values ("<shard>") and
// slots, the tensors "<shard>/keys" (int64[rows]) and "<shard>/meta"
// (int64[rows, 4]: lookups, last update step, last update ms, version).
struct ManifestTable {
  int64_t dim = 0;
  EmbeddingInitializer initializer;
  EmbeddingTableOptions options;
  // The checkpoint holds every change tagged with a version <= generation:
  // the rows changed since are those with a greater version.
  int64_t generation = 0;
  bool operator==(const ManifestTable&) const = default;
};
std::string table_keys_tensor_name(std::string_view shard);
std::string table_meta_tensor_name(std::string_view shard);

struct ManifestVariable {
  std::string name;
  DType dtype = DType::kInvalid;
  Shape shape;
  std::vector<int64_t> partitioning;
  std::vector<ManifestShard> shards;  // one per partition, in row order
  // Written as {"kind": "adagrad" ("" for none), "hyperparameters": {the
  // ones the kind uses, by Keras' names}, "nesterov": false}.
  Optimizer optimizer;
  std::vector<std::string> slots;
  int64_t optimizer_step = 0;  // the optimizer's iteration count
  std::optional<ManifestTable> table;  // set for an embedding table
  bool operator==(const ManifestVariable&) const = default;
};

struct ManifestFile {
  std::string name;  // a plain file name in the checkpoint directory
  uint64_t size = 0;
  uint32_t crc32c = 0;  // of the whole file, unmasked
  bool operator==(const ManifestFile&) const = default;
};

struct Manifest {
  int64_t format_version = kManifestFormatVersion;
  int64_t step = 0;
  std::vector<ManifestVariable> variables;
  std::vector<ManifestFile> files;
  bool operator==(const Manifest&) const = default;

  // nullptr when there is no such variable.
  const ManifestVariable* find_variable(std::string_view name) const;
};

// Checks what JSON cannot: the format version; unique, non-empty names;
// valid dtypes and non-negative dimensions; partitioning that sums to
// dimension 0 (1 for a scalar) and shards that follow it row by row; shards
// in listed files; file names without '/'; valid UTF-8 everywhere.
// InvalidArgument naming the field ("variables[0].shards[2].first_row: ...").
Status validate_manifest(const Manifest& manifest);

// The manifest as JSON text (the layout above, without manifest_crc32c):
// the canonical form the checksum covers. Strings must be valid UTF-8
// (validate_manifest checks it).
std::string to_json(const Manifest& manifest);
// The same with "manifest_crc32c" first: what a checkpoint's manifest.json
// holds.
std::string to_json_with_checksum(const Manifest& manifest);

// Parses and validates a manifest. Errors name `source_name` (the file) and
// the field: InvalidArgument for a format_version this code does not know,
// DataLoss for anything else (malformed JSON, missing or mistyped fields,
// what validate_manifest rejects, a manifest_crc32c that does not match).
Result<Manifest> parse_manifest(const std::string& json, const std::string& source_name);

// The "checkpoint" index file.
struct CheckpointIndex {
  std::string latest;             // "ckpt-1200"
  std::vector<std::string> kept;  // oldest first; includes `latest`
  bool operator==(const CheckpointIndex&) const = default;
};
std::string to_json(const CheckpointIndex& index);
// DataLoss naming `source_name` and the field for anything wrong.
Result<CheckpointIndex> parse_checkpoint_index(const std::string& json,
                                               const std::string& source_name);

}  // namespace capstan::checkpoint

#endif  // CAPSTAN_LIB_CHECKPOINT_MANIFEST_H_
