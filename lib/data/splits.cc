// Split providers: how DYNAMIC sharding divides a pipeline's source.
#include <set>

#include "data/definition.h"
#include "data/engine.h"
#include "data/io/file.h"
#include "sync/mutex.h"

namespace capstan::data::engine {
namespace {

using Op = wire::Op;

// Splits of range(): [begin, end) chunks of element indices.
class RangeSplitProvider final : public SplitProvider {
 public:
  RangeSplitProvider(int64_t num_elements, int64_t chunk) : n_(num_elements), chunk_(chunk) {}
  Result<std::optional<Element>> get_next() override {
    MutexLock lock(mutex_);
    if (next_ >= n_) return std::optional<Element>();
    int64_t begin = next_;
    int64_t end = next_ + std::min(chunk_, n_ - next_);
    next_ = end;
    CAPSTAN_ASSIGN_OR_RETURN(Tensor t, Tensor::from_vector<int64_t>({begin, end}, {2}));
    return std::optional<Element>(Element{{std::move(t)}, {}});
  }
  void reset() override {
    MutexLock lock(mutex_);
    next_ = 0;
  }
  int64_t num_splits() const override { return (n_ + chunk_ - 1) / chunk_; }

 private:
  const int64_t n_;
  const int64_t chunk_;
  Mutex mutex_;
  int64_t next_ GUARDED_BY(mutex_) = 0;
};

// Splits of file sources: one file name each.
class FileSplitProvider final : public SplitProvider {
 public:
  explicit FileSplitProvider(std::vector<std::string> files) : files_(std::move(files)) {}
  Result<std::optional<Element>> get_next() override {
    MutexLock lock(mutex_);
    if (next_ >= files_.size()) return std::optional<Element>();
    CAPSTAN_ASSIGN_OR_RETURN(Tensor t, Tensor::from_strings({files_[next_++]}, {}));
    return std::optional<Element>(Element{{std::move(t)}, {}});
  }
  void reset() override {
    MutexLock lock(mutex_);
    next_ = 0;
  }
  int64_t num_splits() const override { return static_cast<int64_t>(files_.size()); }

 private:
  const std::vector<std::string> files_;
  Mutex mutex_;
  size_t next_ GUARDED_BY(mutex_) = 0;
};

void collect_sources(Op::Reader op, std::vector<Op::Reader>* sources) {
  if (op.hasInput()) collect_sources(op.getInput(), sources);
  for (auto in : op.getInputs()) collect_sources(in, sources);
  if (!op.hasInput() && op.getInputs().size() == 0) sources->push_back(op);
}

std::vector<std::string> texts(capnp::List<capnp::Text>::Reader list) {
  std::vector<std::string> out;
  for (auto t : list) out.emplace_back(t.cStr(), t.size());
  return out;
}

}  // namespace

Result<std::unique_ptr<SplitProvider>> make_split_provider(Op::Reader root, int64_t range_chunk) {
  std::vector<Op::Reader> sources;
  collect_sources(root, &sources);
  std::string names;
  for (auto s : sources) names += std::string(names.empty() ? "" : ", ") + op_name(s.which());
  if (sources.size() != 1) {
    return Status::FailedPrecondition("dynamic sharding needs exactly one splittable source; the pipeline has " +
                                      std::to_string(sources.size()) + " (" + names + ")");
  }
  Op::Reader source = sources[0];
  switch (source.which()) {
    case Op::RANGE: {
      int64_t n = cardinality_of(source);
      return std::unique_ptr<SplitProvider>(std::make_unique<RangeSplitProvider>(std::max<int64_t>(n, 0), range_chunk));
    }
    case Op::LIST_FILES: {
      std::set<std::string> matched;
      for (const auto& pattern : texts(source.getListFiles().getPatterns())) {
        CAPSTAN_ASSIGN_OR_RETURN(auto files, io::match_files(pattern));
        if (files.empty()) return Status::InvalidArgument("list_files: no files matched pattern: " + pattern);
        matched.insert(files.begin(), files.end());
      }
      return std::unique_ptr<SplitProvider>(
          std::make_unique<FileSplitProvider>(std::vector<std::string>(matched.begin(), matched.end())));
    }
    case Op::TEXT_LINE:
      return std::unique_ptr<SplitProvider>(std::make_unique<FileSplitProvider>(texts(source.getTextLine().getFiles())));
    case Op::TF_RECORD:
      return std::unique_ptr<SplitProvider>(std::make_unique<FileSplitProvider>(texts(source.getTfRecord().getFiles())));
    case Op::FIXED_LENGTH:
      return std::unique_ptr<SplitProvider>(
          std::make_unique<FileSplitProvider>(texts(source.getFixedLength().getFiles())));
    default:
      return Status::FailedPrecondition(std::string(op_name(source.which())) +
                                        " cannot be split for dynamic sharding (splittable sources: range, "
                                        "list_files, text_line_dataset, tfrecord_dataset, "
                                        "fixed_length_record_dataset)");
  }
}

}  // namespace capstan::data::engine
