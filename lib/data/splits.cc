// Split providers: how DYNAMIC sharding divides a pipeline's source.
#include "data/definition.h"
#include "data/engine.h"
#include "data/op_kernel.h"
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

}  // namespace

std::unique_ptr<SplitProvider> make_range_split_provider(int64_t num_elements, int64_t chunk) {
  return std::make_unique<RangeSplitProvider>(num_elements, chunk);
}

std::unique_ptr<SplitProvider> make_file_split_provider(std::vector<std::string> files) {
  return std::make_unique<FileSplitProvider>(std::move(files));
}

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
  const OpKernel* kernel = find_op_kernel(source.which());
  if (kernel != nullptr && kernel->file_source != nullptr) {
    CAPSTAN_ASSIGN_OR_RETURN(auto files, kernel->file_source->files(source));
    return make_file_split_provider(std::move(files));
  }
  if (kernel != nullptr && kernel->split_provider != nullptr) return kernel->split_provider(source, range_chunk);
  std::string splittable;
  for (const OpKernel* k : op_kernels()) {
    if (k->file_source == nullptr && k->split_provider == nullptr) continue;
    splittable += std::string(splittable.empty() ? "" : ", ") + k->name;
  }
  return Status::FailedPrecondition(std::string(op_name(source.which())) +
                                    " cannot be split for dynamic sharding (splittable sources: " + splittable +
                                    ")");
}

}  // namespace capstan::data::engine
