// The census input pipelines, shared by the training program (which
// registers them with the data service or builds per-worker datasets) and
// the module's evaluation closure. The named functions ("census_is_record",
// "census_features") are the module's: workers and data workers load it.
#ifndef CAPSTAN_EXAMPLES_CENSUS_PIPELINE_H_
#define CAPSTAN_EXAMPLES_CENSUS_PIPELINE_H_

#include <capstan/data/dataset.h>
#include <capstan/data/parsing.h>

#include <optional>
#include <string>

#include "features.h"

namespace census {

// tf.io.decode_csv for adult.data / adult.test: integers for the numeric
// columns, text for the rest; "?" is missing (the column's default: 0 or "").
inline capstan::data::CsvSpec csv_spec() {
  capstan::data::CsvSpec spec;
  for (int column = 0; column < kNumColumns; ++column) {
    switch (column) {
      case kAge: case kFnlwgt: case kEducationNum: case kCapitalGain: case kCapitalLoss: case kHoursPerWeek:
        spec.record_defaults.push_back(capstan::Tensor::scalar<int64_t>(0));
        break;
      default:
        spec.record_defaults.push_back(*capstan::Tensor::from_strings({""}, {}));
    }
  }
  spec.na_value = "?";
  spec.trim_whitespace = true;  // fields are separated by ", "
  return spec;
}

// (wide_ids int64[kNumWideFields], numeric float32[kNumeric], label float32)
// for each record of the GZIP-compressed CSV file `path`, reading every
// `num_shards`-th record from `index` (kShardHint: the data service's or the
// per-worker dataset's shard).
inline capstan::data::Dataset examples(const std::string& path, int64_t num_shards, int64_t index) {
  using capstan::data::Fn;
  return capstan::data::Dataset::text_line_dataset({path}, capstan::data::Compression::kGzip)
      .filter(Fn::named("census_is_record"))  // drops adult.test's first line and blank lines
      .shard(num_shards, index)
      .map(Fn::decode_csv(csv_spec()))
      .map(Fn::named("census_features"));
}

// Training: shuffled each epoch, repeated forever, batched.
inline capstan::data::Dataset training_batches(const std::string& path, int64_t batch_size,
                                               std::optional<uint64_t> seed) {
  return examples(path, capstan::data::kShardHint, capstan::data::kShardHint)
      .shuffle(10000, seed)
      .repeat()
      .batch(batch_size, /*drop_remainder=*/true);
}

}  // namespace census

#endif  // CAPSTAN_EXAMPLES_CENSUS_PIPELINE_H_
