// Variable partitioners: how many shards a variable is split into, and how
// its rows are divided among them. These reproduce TensorFlow's rules
// (tf.distribute.experimental.partitioners.* in sharded_variable.py, built on
// min_max_variable_partitioner / variable_axis_size_partitioner in
// partitioned_variables.py, and the checks and "div" split in
// parameter_server_strategy_v2.py), so a model ported from TF gets the same
// shards.
//
// Glossary:
//   partition result  one count per axis, e.g. [3, 1] = three shards along
//                     axis 0. Capstan, like ParameterServerStrategy, only
//                     partitions axis 0; every other entry is 1.
//   "div" split       rows are dealt out in contiguous blocks; the first
//                     rows % n shards get one extra row: 13 rows in 5 shards
//                     -> 3, 3, 3, 2, 2.
//
// Example:
//   auto parts = partition(Partitioner::fixed_shards(2), {10, 4}, DType::kFloat32);
//   // *parts == {2, 1}
//   auto rows = shard_rows(10, 2);  // *rows == {5, 5}
//
// All functions here are pure and thread-safe.
#ifndef CAPSTAN_LIB_PLACEMENT_PARTITIONER_H_
#define CAPSTAN_LIB_PLACEMENT_PARTITIONER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "capstan/status.h"
#include "capstan/tensor.h"

namespace capstan::placement {

// Which partitioner a variable uses and its arguments. Arguments are checked
// by partition(), not here, so a bad one is reported as InvalidArgument.
struct Partitioner {
  enum class Kind {
    kNone,         // never partition
    kFixedShards,  // FixedShardsPartitioner(num_shards)
    kMinSize,      // MinSizePartitioner(min_shard_bytes, max_shards, bytes_per_string)
    kMaxSize,      // MaxSizePartitioner(max_shard_bytes, max_shards, bytes_per_string)
  };
  Kind kind = Kind::kNone;
  int64_t num_shards = 1;               // kFixedShards: must be >= 1
  int64_t min_shard_bytes = 256 << 10;  // kMinSize: must be >= 1 (TF default 256K)
  int64_t max_shard_bytes = 0;          // kMaxSize: must be >= 1
  // kMinSize: upper bound on shards, must be >= 1 (TF default 1).
  // kMaxSize: upper bound on shards; 0 means no limit (TF's None and 0 both
  // mean no limit), negative is invalid (TF raises ValueError).
  int64_t max_shards = 1;
  // Size assumed for each element of a string variable; must be >= 1.
  int64_t bytes_per_string = 16;

  static Partitioner none() { return Partitioner{}; }
  static Partitioner fixed_shards(int64_t n);
  static Partitioner min_size(int64_t min_shard_bytes = 256 << 10, int64_t max_shards = 1,
                              int64_t bytes_per_string = 16);
  static Partitioner max_size(int64_t max_shard_bytes, int64_t max_shards = 0,
                              int64_t bytes_per_string = 16);
};

// "FixedShardsPartitioner(num_shards=2)", ... for messages and logs.
std::string partitioner_string(const Partitioner& p);

// TF's partition result for a variable of this shape and dtype:
// [n, 1, 1, ...] with one entry per axis. Scalars are never partitioned and
// get []; kNone gives [1, 1, ...].
//   kFixedShards  n = min(num_shards, shape[0]). Note: 0 for a variable with
//                 no rows, which check_partitions() rejects, as TF does.
//   kMinSize      n = max(1, min(shape[0], max_shards,
//                                ceil(total_bytes / min_shard_bytes)))
//   kMaxSize      slices_per_shard = max(1, floor(max_shard_bytes / row_bytes)),
//                 n = ceil(shape[0] / slices_per_shard), then min(n, max_shards)
//                 when max_shards > 0. (TF divides by zero for an empty
//                 variable; Capstan gives it one shard.)
// Element sizes are dtype_size(dtype), or bytes_per_string for kString.
// InvalidArgument for bad partitioner arguments (naming the argument), an
// invalid dtype, a negative dimension, or a byte count that overflows int64.
Result<std::vector<int64_t>> partition(const Partitioner& p, const Shape& shape, DType dtype);

// Checks a partition result as ParameterServerStrategy does before creating
// shards: one entry per axis of `shape` ([] for a scalar), the first >= 1,
// all others exactly 1. A first entry larger than shape[0] is allowed; the
// caller caps it at shape[0] (as TF does). InvalidArgument otherwise.
Status check_partitions(const std::vector<int64_t>& partitions, const Shape& shape);

// TF's "div" split of `rows` rows into `shards` contiguous shards: every
// shard gets rows / shards rows and the first rows % shards shards one more.
// shard_rows(13, 5) == {3, 3, 3, 2, 2}. InvalidArgument when rows < 0,
// shards < 1, or shards > rows (an empty shard; one shard of zero rows is
// allowed, for an unpartitioned empty variable).
Result<std::vector<int64_t>> shard_rows(int64_t rows, int64_t shards);

// First row of each shard: shard_offsets({3, 3, 3, 2, 2}) == {0, 3, 6, 9, 11}.
std::vector<int64_t> shard_offsets(const std::vector<int64_t>& sizes);

}  // namespace capstan::placement

#endif  // CAPSTAN_LIB_PLACEMENT_PARTITIONER_H_
