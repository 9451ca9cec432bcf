// Static sharding of a pipeline for the data service's processing modes
// (TensorFlow's AutoShardPolicy as the service applies it):
//   kFile        shard(num_workers, index) right after the file source
//                (list_files, or a file dataset's file list), so each worker
//                reads its own files; fewer files than workers is an error.
//   kData        shard(num_workers, index) on the pipeline's elements: every
//                worker runs the whole pipeline and keeps its share.
//   kFileOrData  kFile when the pipeline reads files, else kData.
//   kHint        kShardHint placeholders replaced by (num_workers, index).
#ifndef CAPSTAN_LIB_DATA_SHARDING_H_
#define CAPSTAN_LIB_DATA_SHARDING_H_

#include "capstan/data/dataset.h"

namespace capstan::data {

enum class ShardingPolicy { kOff, kFile, kData, kFileOrData, kHint };

// The pipeline worker `index` of `num_workers` runs. InvalidArgument for bad
// arguments or (kFile) fewer files than workers; FailedPrecondition for kFile
// on a pipeline without a file source.
Result<Dataset> apply_sharding(const Dataset& dataset, ShardingPolicy policy, int64_t num_workers,
                               int64_t index);

}  // namespace capstan::data

#endif  // CAPSTAN_LIB_DATA_SHARDING_H_
