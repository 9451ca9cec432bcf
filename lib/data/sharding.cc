#include "data/sharding.h"

#include <functional>

#include "data/definition.h"
#include "data/op_kernel.h"

namespace capstan::data {
namespace {

using Op = wire::Op;

const engine::OpKernel::FileSource* file_source_of(Op::Reader op) {
  const engine::OpKernel* kernel = engine::find_op_kernel(op.which());
  return kernel != nullptr ? kernel->file_source : nullptr;
}

// Finds the first file source under `op` (depth first through inputs).
bool find_file_source(Op::Reader op, Op::Reader* found) {
  if (file_source_of(op) != nullptr) {
    *found = op;
    return true;
  }
  if (op.hasInput() && find_file_source(op.getInput(), found)) return true;
  for (auto in : op.getInputs()) {
    if (find_file_source(in, found)) return true;
  }
  return false;
}

}  // namespace

Result<Dataset> apply_sharding(const Dataset& dataset, ShardingPolicy policy, int64_t num_workers,
                               int64_t index) {
  if (num_workers <= 0) return Status::InvalidArgument("number of workers must be positive, got " + std::to_string(num_workers));
  if (index < 0 || index >= num_workers) {
    return Status::InvalidArgument("worker index " + std::to_string(index) + " is not in [0, " +
                                   std::to_string(num_workers) + ")");
  }
  switch (policy) {
    case ShardingPolicy::kOff: return dataset;
    case ShardingPolicy::kHint: return resolve_shard_hints(dataset, num_workers, index);
    case ShardingPolicy::kData: return shard_definition(dataset, num_workers, index);
    case ShardingPolicy::kFile:
    case ShardingPolicy::kFileOrData: break;
  }
  Op::Reader source;
  if (!find_file_source(dataset.impl()->root(), &source)) {
    if (policy == ShardingPolicy::kFileOrData) return shard_definition(dataset, num_workers, index);
    return Status::FailedPrecondition("FILE sharding needs a file-based source (list_files, text_line_dataset, "
                                      "tfrecord_dataset or fixed_length_record_dataset); the pipeline has none");
  }
  CAPSTAN_ASSIGN_OR_RETURN(auto files, file_source_of(source)->files(source));
  if (static_cast<int64_t>(files.size()) < num_workers) {
    return Status::InvalidArgument("FILE sharding: the pipeline reads " + std::to_string(files.size()) +
                                   " file(s), fewer than the " + std::to_string(num_workers) +
                                   " workers; use DATA or DYNAMIC sharding, or more files");
  }
  // Rebuild the definition with this worker's files only: walk the builder to
  // the same source (same path of inputs).
  capnp::MallocMessageBuilder message;
  message.setRoot(dataset.impl()->def());
  auto root = message.getRoot<wire::DatasetDef>().getRoot();
  std::function<bool(Op::Builder)> rewrite = [&](Op::Builder op) -> bool {
    if (const auto* source = file_source_of(op.asReader())) {
      source->keep_share(op, num_workers, index);
      return true;
    }
    if (op.hasInput() && rewrite(op.getInput())) return true;
    for (auto in : op.getInputs()) {
      if (rewrite(in)) return true;
    }
    return false;
  };
  rewrite(root);
  return Dataset(std::make_shared<const Dataset::Impl>(message));
}

}  // namespace capstan::data
