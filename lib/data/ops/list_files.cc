// list_files(patterns, shuffle, seed): the matching file names, sorted or
// shuffled per epoch; FILE and DYNAMIC sharding divide the names.
#include <random>
#include <set>

#include "data/io/file.h"
#include "data/op_kernel.h"
#include "data/ops/common.h"

namespace capstan::data::engine {

namespace {

class FileNameIterator final : public IteratorBase {
 public:
  explicit FileNameIterator(FileQueue files) : files_(std::move(files)) {}
  Status save(StateWriter&) override { return on_splits("list_files"); }
  Status restore(StateReader&) override { return on_splits("list_files"); }
  Status get_next(Element* out, bool* end) override {
    CAPSTAN_ASSIGN_OR_RETURN(auto file, files_.next());
    *end = !file;
    if (file) {
      CAPSTAN_ASSIGN_OR_RETURN(Tensor t, string_scalar(*file));
      *out = scalar_element(std::move(t));
    }
    return Status::Ok();
  }

 private:
  FileQueue files_;
};

// The files the patterns match, sorted; a pattern that matches nothing is
// InvalidArgument.
Result<std::vector<std::string>> matching_files(const std::vector<std::string>& patterns) {
  std::set<std::string> matched;
  for (const auto& pattern : patterns) {
    CAPSTAN_ASSIGN_OR_RETURN(auto files, io::match_files(pattern));
    if (files.empty()) return Status::InvalidArgument("list_files: no files matched pattern: " + pattern);
    matched.insert(files.begin(), files.end());
  }
  return std::vector<std::string>(matched.begin(), matched.end());
}

Result<IteratorPtr> make_list_files(const std::vector<std::string>& patterns, bool shuffle,
                                    std::optional<uint64_t> seed, Pipeline& pipeline,
                                    const void* key) {
  CAPSTAN_ASSIGN_OR_RETURN(std::vector<std::string> files, matching_files(patterns));
  if (shuffle) {
    auto epochs = pipeline.state<EpochCounter>(key);
    std::mt19937_64 rng(epoch_seed(seed, epochs->next++));
    std::shuffle(files.begin(), files.end(), rng);
  }
  std::vector<Element> elements;
  for (const auto& f : files) {
    CAPSTAN_ASSIGN_OR_RETURN(Tensor t, string_scalar(f));
    elements.push_back(scalar_element(std::move(t)));
  }
  return make_vector_iterator(std::move(elements), "list_files", /*save_elements=*/true);
}

constexpr OpKernel::FileSource kListFilesSource{
    .files = [](Op::Reader op) { return matching_files(texts(op.getListFiles().getPatterns())); },
    // shard(num_workers, index) right after list_files (the matches are
    // sorted, so every worker sees the same list).
    .keep_share =
        [](Op::Builder op, int64_t num_workers, int64_t index) {
          capnp::MallocMessageBuilder scratch;
          scratch.setRoot(op.asReader());
          // Every worker must order the files the same way before taking its
          // share: an unseeded shuffle would hand workers overlapping files.
          auto listed = scratch.getRoot<Op>().getListFiles();
          if (listed.getShuffle() && !listed.getHasSeed()) {
            listed.setHasSeed(true);
            listed.setSeed(0x5eed);
          }
          auto shard = op.initShard();
          shard.setNumShards(num_workers);
          shard.setIndex(index);
          op.setInput(scratch.getRoot<Op>().asReader());
        },
    .read_splits = [](Op::Reader, SplitProvider* splits) -> IteratorPtr {
      return std::make_unique<FileNameIterator>(FileQueue(splits));
    },
};

}  // namespace

CAPSTAN_DATASET_OP(kListFilesKernel) = {
    .which = Op::LIST_FILES,
    .name = "list_files",
    .inputs = Inputs::kNone,
    .describe_args =
        [](Op::Reader op, std::ostream& out) { out << op.getListFiles().getPatterns().size() << " patterns"; },
    .validate = [](Op::Reader op, const FunctionRegistry*) -> Status {
      if (op.getListFiles().getPatterns().size() == 0) return invalid_op(op, "no file patterns given");
      return Status::Ok();
    },
    .make = [](Op::Reader op, Pipeline& pipeline) -> Result<IteratorPtr> {
      auto l = op.getListFiles();
      std::optional<uint64_t> seed;
      if (l.getHasSeed()) seed = l.getSeed();
      return make_list_files(texts(l.getPatterns()), l.getShuffle(), seed, pipeline, op_key(op));
    },
    .file_source = &kListFilesSource,
};

}  // namespace capstan::data::engine
