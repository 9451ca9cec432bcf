// Constructors of the engine's iterators, one per op (ops_basic.cc,
// ops_parallel.cc). Arguments have been validated (engine.cc: validate()).
#ifndef CAPSTAN_LIB_DATA_OPS_H_
#define CAPSTAN_LIB_DATA_OPS_H_

#include <memory>
#include <string>
#include <vector>

#include "data/engine.h"

namespace capstan::data::engine {

using IteratorPtr = std::unique_ptr<IteratorBase>;
// Makes a fresh iterator of an op's input (repeat re-creates it per epoch).
using IteratorFactory = std::function<Result<IteratorPtr>()>;

// Sources.
IteratorPtr make_range(int64_t start, int64_t stop, int64_t step);
IteratorPtr make_from_tensors(Element element);
Result<IteratorPtr> make_from_tensor_slices(const Element& element);
Result<IteratorPtr> make_list_files(const std::vector<std::string>& patterns, bool shuffle,
                                    std::optional<uint64_t> seed, Pipeline& pipeline,
                                    const void* key);
// One string scalar per record/line of each file in turn.
IteratorPtr make_text_line(std::vector<std::string> files, Compression compression);
IteratorPtr make_tfrecord(std::vector<std::string> files, Compression compression);
IteratorPtr make_fixed_length(std::vector<std::string> files, int64_t record_bytes,
                              int64_t header_bytes, int64_t footer_bytes, Compression compression);

// Sources that read only the splits a provider hands out.
IteratorPtr make_split_range(int64_t start, int64_t step, SplitProvider* splits);
IteratorPtr make_split_files(SplitProvider* splits);  // list_files: the names themselves
// Record readers over the files named by the splits.
IteratorPtr make_split_text_line(SplitProvider* splits, Compression compression);
IteratorPtr make_split_tfrecord(SplitProvider* splits, Compression compression);
IteratorPtr make_split_fixed_length(SplitProvider* splits, int64_t record_bytes, int64_t header_bytes,
                                    int64_t footer_bytes, Compression compression);

// Element-wise and structural transformations.
IteratorPtr make_map(IteratorPtr input, MapFunction fn);
IteratorPtr make_filter(IteratorPtr input, FilterFunction fn);
IteratorPtr make_batch(IteratorPtr input, int64_t batch_size, bool drop_remainder, MemoryBudget& memory);
IteratorPtr make_padded_batch(IteratorPtr input, int64_t batch_size, std::vector<Shape> shapes,
                              std::vector<Tensor> padding_values, bool drop_remainder, MemoryBudget& memory);
IteratorPtr make_rebatch(IteratorPtr input, int64_t batch_size, bool drop_remainder);
IteratorPtr make_shuffle(IteratorPtr input, int64_t buffer_size, std::optional<uint64_t> seed,
                         bool reshuffle_each_iteration, Pipeline& pipeline, const void* key);
IteratorPtr make_repeat(IteratorFactory input, int64_t count);
IteratorPtr make_shard(IteratorPtr input, int64_t num_shards, int64_t index);
IteratorPtr make_take(IteratorPtr input, int64_t count);
IteratorPtr make_skip(IteratorPtr input, int64_t count);
IteratorPtr make_zip(std::vector<IteratorPtr> inputs);
IteratorPtr make_concatenate(std::vector<IteratorFactory> inputs);
IteratorPtr make_memory_cache(IteratorPtr input, Pipeline& pipeline, const void* key);
IteratorPtr make_file_cache(IteratorFactory input, std::string filename);

// Ops with background threads.
// parallelism: > 0 fixed, kAutotune tuned.
IteratorPtr make_parallel_map(IteratorPtr input, MapFunction fn, int64_t parallelism,
                              bool deterministic, Pipeline& pipeline);
// Map then batch in one op: workers produce whole batches.
IteratorPtr make_map_and_batch(IteratorPtr input, MapFunction fn, int64_t parallelism,
                               int64_t batch_size, bool drop_remainder, bool deterministic,
                               Pipeline& pipeline);
IteratorPtr make_prefetch(IteratorPtr input, int64_t buffer_size, Pipeline& pipeline);
// cycle_length resolved (> 0); parallel: prefetch every open cycle element
// on its own thread.
IteratorPtr make_interleave(IteratorPtr input, InterleaveFunction fn, int64_t cycle_length,
                            int64_t block_length, bool parallel, bool deterministic,
                            Pipeline& pipeline);

}  // namespace capstan::data::engine

#endif  // CAPSTAN_LIB_DATA_OPS_H_
