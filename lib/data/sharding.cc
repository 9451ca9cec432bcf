#include "data/sharding.h"

#include <functional>
#include <set>

#include "data/definition.h"
#include "data/io/file.h"

namespace capstan::data {
namespace {

using Op = wire::Op;

bool is_file_source(Op::Reader op) {
  return op.isListFiles() || op.isTextLine() || op.isTfRecord() || op.isFixedLength();
}

Result<int64_t> count_files(Op::Reader op) {
  switch (op.which()) {
    case Op::LIST_FILES: {
      std::set<std::string> matched;
      for (auto pattern : op.getListFiles().getPatterns()) {
        CAPSTAN_ASSIGN_OR_RETURN(auto files, io::match_files(pattern.cStr()));
        matched.insert(files.begin(), files.end());
      }
      return static_cast<int64_t>(matched.size());
    }
    case Op::TEXT_LINE: return static_cast<int64_t>(op.getTextLine().getFiles().size());
    case Op::TF_RECORD: return static_cast<int64_t>(op.getTfRecord().getFiles().size());
    case Op::FIXED_LENGTH: return static_cast<int64_t>(op.getFixedLength().getFiles().size());
    default: return int64_t{0};
  }
}

// Finds the first file source under `op` (depth first through inputs).
bool find_file_source(Op::Reader op, Op::Reader* found) {
  if (is_file_source(op)) {
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
    case ShardingPolicy::kHint: return dataset.resolve_shard_hint(num_workers, index);
    case ShardingPolicy::kData: return dataset.shard(num_workers, index);
    case ShardingPolicy::kFile:
    case ShardingPolicy::kFileOrData: break;
  }
  Op::Reader source;
  if (!find_file_source(dataset.impl()->root(), &source)) {
    if (policy == ShardingPolicy::kFileOrData) return dataset.shard(num_workers, index);
    return Status::FailedPrecondition("FILE sharding needs a file-based source (list_files, text_line_dataset, "
                                      "tfrecord_dataset or fixed_length_record_dataset); the pipeline has none");
  }
  CAPSTAN_ASSIGN_OR_RETURN(int64_t files, count_files(source));
  if (files < num_workers) {
    return Status::InvalidArgument("FILE sharding: the pipeline reads " + std::to_string(files) +
                                   " file(s), fewer than the " + std::to_string(num_workers) +
                                   " workers; use DATA or DYNAMIC sharding, or more files");
  }
  // Rebuild the definition with this worker's files only.
  capnp::MallocMessageBuilder message;
  message.setRoot(dataset.impl()->def());
  auto root = message.getRoot<wire::DatasetDef>().getRoot();
  // Walk the builder to the same source (same path of inputs).
  std::function<bool(Op::Builder)> rewrite = [&](Op::Builder op) -> bool {
    Op::Reader r = op.asReader();
    if (is_file_source(r)) {
      auto keep = [num_workers, index](capnp::List<capnp::Text>::Reader files) {
        std::vector<std::string> mine;
        for (unsigned k = 0; k < files.size(); ++k) {
          if (static_cast<int64_t>(k) % num_workers == index) mine.emplace_back(files[k].cStr());
        }
        return mine;
      };
      auto set = [](capnp::List<capnp::Text>::Builder out, const std::vector<std::string>& files) {
        for (unsigned k = 0; k < files.size(); ++k) out.set(k, files[k]);
      };
      switch (r.which()) {
        case Op::LIST_FILES: {
          // Shard the (sorted) file list right after list_files.
          capnp::MallocMessageBuilder scratch;
          scratch.setRoot(r);
          // Every worker must order the files the same way before taking its
          // share: an unseeded shuffle would hand workers overlapping files.
          auto listed = scratch.getRoot<Op>().getListFiles();
          if (listed.getShuffle() && !listed.getHasSeed()) {
            listed.setHasSeed(true);
            listed.setSeed(0x5eed);
          }
          auto list_files = scratch.getRoot<Op>().asReader();
          auto shard = op.initShard();
          shard.setNumShards(num_workers);
          shard.setIndex(index);
          op.setInput(list_files);
          return true;
        }
        case Op::TEXT_LINE: {
          auto mine = keep(r.getTextLine().getFiles());
          set(op.getTextLine().initFiles(static_cast<unsigned>(mine.size())), mine);
          return true;
        }
        case Op::TF_RECORD: {
          auto mine = keep(r.getTfRecord().getFiles());
          set(op.getTfRecord().initFiles(static_cast<unsigned>(mine.size())), mine);
          return true;
        }
        case Op::FIXED_LENGTH: {
          auto mine = keep(r.getFixedLength().getFiles());
          set(op.getFixedLength().initFiles(static_cast<unsigned>(mine.size())), mine);
          return true;
        }
        default: return false;
      }
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
