// Split providers: how DYNAMIC sharding divides a pipeline's source.
#include "data/definition.h"
#include "data/engine.h"
#include "data/op_kernel.h"
#include "sync/mutex.h"

namespace capstan::data::engine {

namespace {

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

// A repeat's splits: its input's, `count` times (-1: forever), the input
// reset between repetitions (TF's RepeatDataset split provider).
class RepeatSplitProvider final : public SplitProvider {
 public:
  RepeatSplitProvider(std::unique_ptr<SplitProvider> input, int64_t count)
      : input_(std::move(input)), count_(count) {}
  Result<std::optional<Element>> get_next() override {
    MutexLock lock(mutex_);
    while (count_ < 0 || repetition_ < count_) {
      CAPSTAN_ASSIGN_OR_RETURN(std::optional<Element> split, input_->get_next());
      if (split.has_value()) {
        produced_this_repetition_ = true;
        return split;
      }
      // An input without splits would repeat nothing forever: end.
      if (!produced_this_repetition_) break;
      ++repetition_;
      produced_this_repetition_ = false;
      input_->reset();
    }
    return std::optional<Element>();
  }
  void reset() override {
    MutexLock lock(mutex_);
    repetition_ = 0;
    produced_this_repetition_ = false;
    input_->reset();
  }
  int64_t num_splits() const override {
    int64_t n = input_->num_splits();
    if (count_ < 0 || n < 0) return n == 0 ? 0 : -1;
    return n > INT64_MAX / std::max<int64_t>(count_, 1) ? -1 : n * count_;
  }

 private:
  const std::unique_ptr<SplitProvider> input_;
  const int64_t count_;
  Mutex mutex_;
  int64_t repetition_ GUARDED_BY(mutex_) = 0;
  bool produced_this_repetition_ GUARDED_BY(mutex_) = false;
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

std::unique_ptr<SplitProvider> make_repeat_split_provider(std::unique_ptr<SplitProvider> input, int64_t count) {
  return std::make_unique<RepeatSplitProvider>(std::move(input), count);
}

std::vector<Op::Reader> split_sources(Op::Reader op) {
  std::vector<Op::Reader> sources;
  collect_sources(op, &sources);
  return sources;
}

Result<std::vector<std::unique_ptr<SplitProvider>>> make_split_providers(Op::Reader op, int64_t range_chunk) {
  std::vector<std::unique_ptr<SplitProvider>> providers;
  const OpKernel* kernel = find_op_kernel(op.which());
  if (kernel == nullptr) return Status::InvalidArgument("unknown dataset op cannot be split");
  if (!op.hasInput() && op.getInputs().size() == 0) {
    if (kernel->file_source != nullptr) {
      CAPSTAN_ASSIGN_OR_RETURN(auto files, kernel->file_source->files(op));
      providers.push_back(make_file_split_provider(std::move(files)));
      return providers;
    }
    if (kernel->split_provider != nullptr) {
      CAPSTAN_ASSIGN_OR_RETURN(auto provider, kernel->split_provider(op, range_chunk));
      providers.push_back(std::move(provider));
      return providers;
    }
    std::string splittable;
    for (const OpKernel* k : op_kernels()) {
      if (k->file_source == nullptr && k->split_provider == nullptr) continue;
      splittable += std::string(splittable.empty() ? "" : ", ") + k->name;
    }
    return Status::FailedPrecondition(std::string(kernel->name) +
                                      " cannot be split for dynamic sharding (splittable sources: " + splittable +
                                      ")");
  }
  if (op.hasInput()) {
    CAPSTAN_ASSIGN_OR_RETURN(providers, make_split_providers(op.getInput(), range_chunk));
  }
  for (auto in : op.getInputs()) {
    CAPSTAN_ASSIGN_OR_RETURN(auto more, make_split_providers(in, range_chunk));
    for (auto& p : more) providers.push_back(std::move(p));
  }
  if (kernel->wrap_splits != nullptr) return kernel->wrap_splits(op, std::move(providers));
  return providers;
}

}  // namespace capstan::data::engine
