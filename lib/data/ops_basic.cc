// Iterators that run on the consumer's thread: sources and the element-wise
// and structural transformations. Each follows TensorFlow's documented
// element order and end-of-sequence behaviour.

#include <algorithm>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <random>
#include <set>
#include <unistd.h>

#include "data/definition.h"
#include "data/io/file.h"
#include "data/io/fixed_length.h"
#include "data/io/text_line.h"
#include "data/io/tfrecord.h"
#include "data/ops.h"
#include "data/tensor_util.h"
#include "io/durable_file.h"
#include "rpc/tensor_codec.h"
#include "sync/mutex.h"

namespace capstan::data::engine {
namespace {

io::Compression to_io(Compression c) {
  return c == Compression::kGzip ? io::Compression::kGzip : io::Compression::kNone;
}

Element scalar_element(Tensor t) {
  Element e;
  e.components.push_back(std::move(t));
  return e;
}

Result<Tensor> string_scalar(const std::string& value) { return Tensor::from_strings({value}, {}); }

// A seed for epoch `epoch` of an op: reproducible when the user gave one.
uint64_t epoch_seed(std::optional<uint64_t> seed, uint64_t epoch) {
  if (!seed) return std::random_device{}() ^ (static_cast<uint64_t>(std::random_device{}()) << 32);
  // splitmix64 of (seed, epoch): different epochs get unrelated streams.
  uint64_t z = *seed + 0x9e3779b97f4a7c15ull * (epoch + 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// ---- Sources ------------------------------------------------------------------

class RangeIterator final : public IteratorBase {
 public:
  RangeIterator(int64_t start, int64_t stop, int64_t step) : next_(start), stop_(stop), step_(step) {}
  Status get_next(Element* out, bool* end) override {
    if ((step_ > 0 && next_ >= stop_) || (step_ < 0 && next_ <= stop_)) {
      *end = true;
      return Status::Ok();
    }
    *out = scalar_element(Tensor::scalar<int64_t>(next_));
    // Stop instead of overflowing past INT64_MAX.
    if (__builtin_add_overflow(next_, step_, &next_)) next_ = stop_;
    *end = false;
    return Status::Ok();
  }

 private:
  int64_t next_;
  const int64_t stop_;
  const int64_t step_;
};

class VectorIterator final : public IteratorBase {
 public:
  explicit VectorIterator(std::vector<Element> elements) : elements_(std::move(elements)) {}
  Status get_next(Element* out, bool* end) override {
    *end = next_ >= elements_.size();
    if (!*end) *out = elements_[next_++];
    return Status::Ok();
  }

 private:
  const std::vector<Element> elements_;
  size_t next_ = 0;
};

// Where a file source gets its next file name: a fixed list, or a split
// provider. nullopt: no more files.
using NextFile = std::function<Result<std::optional<std::string>>()>;

NextFile files_of(std::vector<std::string> files) {
  auto shared = std::make_shared<std::vector<std::string>>(std::move(files));
  auto next = std::make_shared<size_t>(0);
  return [shared, next]() -> Result<std::optional<std::string>> {
    if (*next >= shared->size()) return std::optional<std::string>();
    return std::optional<std::string>((*shared)[(*next)++]);
  };
}

NextFile files_of(SplitProvider* splits) {
  return [splits]() -> Result<std::optional<std::string>> {
    CAPSTAN_ASSIGN_OR_RETURN(auto split, splits->get_next());
    if (!split) return std::optional<std::string>();
    if (split->components.size() != 1 || split->components[0].dtype() != DType::kString ||
        split->components[0].num_elements() != 1) {
      return Status::InvalidArgument("a file split must be one file name");
    }
    return std::optional<std::string>(std::string(split->components[0].string_at(0)));
  };
}

// Reads the records of one file after another.
template <typename Reader>
class FileRecordIterator final : public IteratorBase {
 public:
  using Opener = std::function<Result<std::unique_ptr<Reader>>(const std::string&)>;
  FileRecordIterator(NextFile next_file, Opener open)
      : next_file_(std::move(next_file)), open_(std::move(open)) {}

  Status get_next(Element* out, bool* end) override {
    while (true) {
      if (reader_ == nullptr) {
        CAPSTAN_ASSIGN_OR_RETURN(auto file, next_file_());
        if (!file) {
          *end = true;
          return Status::Ok();
        }
        auto opened = open_(*file);
        if (!opened.ok()) return opened.status();
        reader_ = std::move(*opened);
      }
      Tensor t;
      auto more = read_record(&t);
      if (!more.ok()) {
        reader_ = nullptr;  // the file is unusable past the error: go on with the next
        return more.status();
      }
      if (!*more) {
        reader_ = nullptr;
        continue;
      }
      *out = scalar_element(std::move(t));
      *end = false;
      return Status::Ok();
    }
  }

 private:
  // The next record as a string scalar; straight into the tensor where the
  // reader can (TFRecordReader::read_tensor).
  Result<bool> read_record(Tensor* t) {
    if constexpr (requires(Reader& r, Tensor* out) { r.read_tensor(out); }) {
      return reader_->read_tensor(t);
    } else {
      std::string record;
      CAPSTAN_ASSIGN_OR_RETURN(bool more, reader_->read(&record));
      if (more) {
        CAPSTAN_ASSIGN_OR_RETURN(*t, string_scalar(record));
      }
      return more;
    }
  }

  const NextFile next_file_;
  const Opener open_;
  std::unique_ptr<Reader> reader_;
};

IteratorPtr text_line_iterator(NextFile next, Compression compression) {
  return std::make_unique<FileRecordIterator<io::TextLineReader>>(
      std::move(next), [compression](const std::string& file) {
        return io::TextLineReader::open(file, to_io(compression));
      });
}

IteratorPtr tfrecord_iterator(NextFile next, Compression compression) {
  return std::make_unique<FileRecordIterator<io::TFRecordReader>>(
      std::move(next), [compression](const std::string& file) {
        return io::TFRecordReader::open(file, to_io(compression));
      });
}

IteratorPtr fixed_length_iterator(NextFile next, int64_t record_bytes, int64_t header_bytes,
                                  int64_t footer_bytes, Compression compression) {
  return std::make_unique<FileRecordIterator<io::FixedLengthRecordReader>>(
      std::move(next), [=](const std::string& file) {
        return io::FixedLengthRecordReader::open(file, record_bytes, header_bytes, footer_bytes,
                                                 to_io(compression));
      });
}

// range() over the index chunks [begin, end) a provider hands out.
class SplitRangeIterator final : public IteratorBase {
 public:
  SplitRangeIterator(int64_t start, int64_t step, SplitProvider* splits)
      : start_(start), step_(step), splits_(splits) {}
  Status get_next(Element* out, bool* end) override {
    while (next_ >= end_) {
      CAPSTAN_ASSIGN_OR_RETURN(auto split, splits_->get_next());
      if (!split) {
        *end = true;
        return Status::Ok();
      }
      if (split->components.size() != 1 || split->components[0].dtype() != DType::kInt64 ||
          split->components[0].num_elements() != 2) {
        return Status::InvalidArgument("a range split must be an int64 [begin, end) pair");
      }
      next_ = split->components[0].flat<int64_t>()[0];
      end_ = split->components[0].flat<int64_t>()[1];
    }
    *out = scalar_element(Tensor::scalar<int64_t>(start_ + next_++ * step_));
    *end = false;
    return Status::Ok();
  }

 private:
  const int64_t start_;
  const int64_t step_;
  SplitProvider* const splits_;
  int64_t next_ = 0;
  int64_t end_ = 0;
};

class FileNameIterator final : public IteratorBase {
 public:
  explicit FileNameIterator(NextFile next) : next_(std::move(next)) {}
  Status get_next(Element* out, bool* end) override {
    CAPSTAN_ASSIGN_OR_RETURN(auto file, next_());
    *end = !file;
    if (file) {
      CAPSTAN_ASSIGN_OR_RETURN(Tensor t, string_scalar(*file));
      *out = scalar_element(std::move(t));
    }
    return Status::Ok();
  }

 private:
  const NextFile next_;
};

// ---- Transformations ----------------------------------------------------------------

class MapIterator final : public IteratorBase {
 public:
  MapIterator(IteratorPtr input, MapFunction fn) : input_(std::move(input)), fn_(std::move(fn)) {}
  Status get_next(Element* out, bool* end) override {
    Element in;
    CAPSTAN_RETURN_IF_ERROR(input_->get_next(&in, end));
    if (*end) return Status::Ok();
    CAPSTAN_ASSIGN_OR_RETURN(*out, fn_(std::move(in)));
    return Status::Ok();
  }

 private:
  IteratorPtr input_;
  const MapFunction fn_;
};

class FilterIterator final : public IteratorBase {
 public:
  FilterIterator(IteratorPtr input, FilterFunction fn) : input_(std::move(input)), fn_(std::move(fn)) {}
  Status get_next(Element* out, bool* end) override {
    while (true) {
      CAPSTAN_RETURN_IF_ERROR(input_->get_next(out, end));
      if (*end) return Status::Ok();
      CAPSTAN_ASSIGN_OR_RETURN(bool keep, fn_(*out));
      if (keep) return Status::Ok();
    }
  }

 private:
  IteratorPtr input_;
  const FilterFunction fn_;
};

// Collects up to n elements of the input, counting them in `held`; sets
// *end when none came. Over the memory budget, drops them and fails.
Status collect(IteratorBase& input, int64_t n, std::vector<Element>* batch, bool* end, HeldBytes& held) {
  batch->clear();
  held.clear();
  bool input_end = false;
  while (static_cast<int64_t>(batch->size()) < n) {
    Element e;
    CAPSTAN_RETURN_IF_ERROR(input.get_next(&e, &input_end));
    if (input_end) break;
    Status charged = held.add(footprint(e));
    if (!charged.ok()) {
      batch->clear();
      held.clear();
      return charged;
    }
    batch->push_back(std::move(e));
  }
  *end = batch->empty();
  return Status::Ok();
}

class BatchIterator final : public IteratorBase {
 public:
  BatchIterator(IteratorPtr input, int64_t batch_size, bool drop_remainder, MemoryBudget& memory)
      : input_(std::move(input)), batch_size_(batch_size), drop_remainder_(drop_remainder), held_(memory, "batch") {}
  Status get_next(Element* out, bool* end) override {
    std::vector<Element> batch;
    // The batch stays counted until the next call (its stacked copy is about
    // as large).
    CAPSTAN_RETURN_IF_ERROR(collect(*input_, batch_size_, &batch, end, held_));
    if (*end) return Status::Ok();
    if (drop_remainder_ && static_cast<int64_t>(batch.size()) < batch_size_) {
      *end = true;
      return Status::Ok();
    }
    CAPSTAN_ASSIGN_OR_RETURN(*out, batch_elements(batch));
    return Status::Ok();
  }

 private:
  IteratorPtr input_;
  const int64_t batch_size_;
  const bool drop_remainder_;
  HeldBytes held_;
};

class PaddedBatchIterator final : public IteratorBase {
 public:
  PaddedBatchIterator(IteratorPtr input, int64_t batch_size, std::vector<Shape> shapes,
                      std::vector<Tensor> padding_values, bool drop_remainder, MemoryBudget& memory)
      : input_(std::move(input)),
        batch_size_(batch_size),
        shapes_(std::move(shapes)),
        padding_values_(std::move(padding_values)),
        drop_remainder_(drop_remainder),
        held_(memory, "padded_batch") {}

  Status get_next(Element* out, bool* end) override {
    std::vector<Element> batch;
    CAPSTAN_RETURN_IF_ERROR(collect(*input_, batch_size_, &batch, end, held_));
    if (*end) return Status::Ok();
    if (drop_remainder_ && static_cast<int64_t>(batch.size()) < batch_size_) {
      *end = true;
      return Status::Ok();
    }
    size_t n = batch[0].components.size();
    if (!shapes_.empty() && shapes_.size() != n) {
      return Status::InvalidArgument("padded_batch: " + std::to_string(shapes_.size()) +
                                     " padded shapes for elements of " + std::to_string(n) +
                                     " components");
    }
    Element result;
    result.names = batch[0].names;
    for (size_t c = 0; c < n; ++c) {
      std::vector<const Tensor*> rows;
      for (const auto& e : batch) {
        if (e.components.size() != n) {
          return Status::InvalidArgument("padded_batch: elements have different numbers of components");
        }
        rows.push_back(&e.components[c]);
      }
      // Without explicit shapes every dimension pads to the batch's longest.
      Shape shape = shapes_.empty() ? Shape(rows[0]->shape().size(), -1) : shapes_[c];
      Tensor padding;
      if (c < padding_values_.size()) {
        padding = padding_values_[c];
      } else {
        CAPSTAN_ASSIGN_OR_RETURN(padding, default_padding(rows[0]->dtype()));
      }
      CAPSTAN_ASSIGN_OR_RETURN(Tensor stacked, pad_and_stack(rows, shape, padding, static_cast<int>(c)));
      result.components.push_back(std::move(stacked));
    }
    *out = std::move(result);
    return Status::Ok();
  }

 private:
  IteratorPtr input_;
  const int64_t batch_size_;
  const std::vector<Shape> shapes_;
  const std::vector<Tensor> padding_values_;
  const bool drop_remainder_;
  HeldBytes held_;
};

// Re-slices input batches (dim 0) into batches of batch_size rows.
class RebatchIterator final : public IteratorBase {
 public:
  RebatchIterator(IteratorPtr input, int64_t batch_size, bool drop_remainder)
      : input_(std::move(input)), batch_size_(batch_size), drop_remainder_(drop_remainder) {}

  Status get_next(Element* out, bool* end) override {
    while (buffered_rows_ < batch_size_ && !input_end_) {
      Element e;
      CAPSTAN_RETURN_IF_ERROR(input_->get_next(&e, &input_end_));
      if (input_end_) break;
      if (e.components.empty() || e.components[0].rank() == 0) {
        return Status::InvalidArgument("rebatch: input elements must be batches (rank >= 1)");
      }
      int64_t rows = e.components[0].shape()[0];
      for (const auto& c : e.components) {
        if (c.rank() == 0 || c.shape()[0] != rows) {
          return Status::InvalidArgument("rebatch: components of an input batch have different sizes");
        }
      }
      if (rows == 0) continue;
      buffered_rows_ += rows;
      pending_.push_back(std::move(e));
    }
    if (buffered_rows_ == 0 || (drop_remainder_ && buffered_rows_ < batch_size_)) {
      *end = true;
      return Status::Ok();
    }
    int64_t want = std::min(batch_size_, buffered_rows_);
    Element result;
    result.names = pending_.front().names;
    size_t n = pending_.front().components.size();
    std::vector<std::vector<Tensor>> parts(n);
    int64_t taken = 0;
    while (taken < want) {
      Element& head = pending_.front();
      int64_t rows = head.components[0].shape()[0];
      int64_t available = rows - head_offset_;
      int64_t take = std::min(available, want - taken);
      for (size_t c = 0; c < n; ++c) {
        CAPSTAN_ASSIGN_OR_RETURN(Tensor part, slice_rows(head.components[c], head_offset_, head_offset_ + take));
        parts[c].push_back(std::move(part));
      }
      taken += take;
      head_offset_ += take;
      if (head_offset_ == rows) {
        pending_.pop_front();
        head_offset_ = 0;
      }
    }
    buffered_rows_ -= want;
    for (size_t c = 0; c < n; ++c) {
      std::vector<const Tensor*> ptrs;
      for (const auto& p : parts[c]) ptrs.push_back(&p);
      CAPSTAN_ASSIGN_OR_RETURN(Tensor joined, concat_rows(ptrs));
      result.components.push_back(std::move(joined));
    }
    *out = std::move(result);
    *end = false;
    return Status::Ok();
  }

 private:
  IteratorPtr input_;
  const int64_t batch_size_;
  const bool drop_remainder_;
  std::deque<Element> pending_;
  int64_t head_offset_ = 0;  // rows of pending_.front() already emitted
  int64_t buffered_rows_ = 0;
  bool input_end_ = false;
};

struct EpochCounter {
  std::atomic<uint64_t> next{0};
};

// TF's shuffle: fill the buffer, then emit a uniformly chosen element and put
// the next input element in its place.
class ShuffleIterator final : public IteratorBase {
 public:
  ShuffleIterator(IteratorPtr input, int64_t buffer_size, uint64_t seed, MemoryBudget& memory)
      : input_(std::move(input)), buffer_size_(buffer_size), rng_(seed), held_(memory, "shuffle") {}

  Status get_next(Element* out, bool* end) override {
    if (!failed_.ok()) return failed_;  // over the memory budget: the buffer is gone
    while (!input_end_ && static_cast<int64_t>(buffer_.size()) < buffer_size_) {
      Element e;
      CAPSTAN_RETURN_IF_ERROR(input_->get_next(&e, &input_end_));
      if (input_end_) break;
      Status charged = held_.add(footprint(e));
      if (!charged.ok()) {
        buffer_.clear();
        buffer_.shrink_to_fit();
        held_.clear();
        failed_ = charged;
        return failed_;
      }
      buffer_.push_back(std::move(e));
    }
    if (buffer_.empty()) {
      *end = true;
      return Status::Ok();
    }
    size_t index = std::uniform_int_distribution<size_t>(0, buffer_.size() - 1)(rng_);
    *out = std::move(buffer_[index]);
    held_.remove(footprint(*out));
    *end = false;
    Element next;
    bool next_end = input_end_;
    if (!input_end_) {
      Status s = input_->get_next(&next, &next_end);
      if (!s.ok()) {
        buffer_[index] = std::move(buffer_.back());
        buffer_.pop_back();
        return s;
      }
      input_end_ = next_end;
    }
    if (!next_end) {
      Status charged = held_.add(footprint(next));
      if (!charged.ok()) {
        buffer_.clear();
        buffer_.shrink_to_fit();
        held_.clear();
        failed_ = charged;
        return Status::Ok();  // *out is good; the next call reports the error
      }
      buffer_[index] = std::move(next);
    } else {
      buffer_[index] = std::move(buffer_.back());
      buffer_.pop_back();
    }
    return Status::Ok();
  }

 private:
  IteratorPtr input_;
  const int64_t buffer_size_;
  std::mt19937_64 rng_;
  std::vector<Element> buffer_;
  bool input_end_ = false;
  HeldBytes held_;
  Status failed_;
};

class RepeatIterator final : public IteratorBase {
 public:
  RepeatIterator(IteratorFactory factory, int64_t count) : factory_(std::move(factory)), count_(count) {}

  Status get_next(Element* out, bool* end) override {
    while (count_ < 0 || epoch_ < count_) {
      if (current_ == nullptr) {
        CAPSTAN_ASSIGN_OR_RETURN(current_, factory_());
        produced_this_epoch_ = false;
      }
      CAPSTAN_RETURN_IF_ERROR(current_->get_next(out, end));
      if (!*end) {
        produced_this_epoch_ = true;
        return Status::Ok();
      }
      current_ = nullptr;
      ++epoch_;
      // An empty input repeated forever would spin: end instead (as TF does).
      if (!produced_this_epoch_) break;
    }
    *end = true;
    return Status::Ok();
  }

 private:
  const IteratorFactory factory_;
  const int64_t count_;
  int64_t epoch_ = 0;
  bool produced_this_epoch_ = false;
  IteratorPtr current_;
};

class ShardIterator final : public IteratorBase {
 public:
  ShardIterator(IteratorPtr input, int64_t num_shards, int64_t index)
      : input_(std::move(input)), num_shards_(num_shards), index_(index) {}
  Status get_next(Element* out, bool* end) override {
    // Skip to this shard's next element: positions index, index + n, ...
    int64_t skip = first_ ? index_ : num_shards_ - 1;
    first_ = false;
    for (int64_t i = 0; i < skip; ++i) {
      Element ignored;
      CAPSTAN_RETURN_IF_ERROR(input_->get_next(&ignored, end));
      if (*end) return Status::Ok();
    }
    return input_->get_next(out, end);
  }

 private:
  IteratorPtr input_;
  const int64_t num_shards_;
  const int64_t index_;
  bool first_ = true;
};

class TakeIterator final : public IteratorBase {
 public:
  TakeIterator(IteratorPtr input, int64_t count) : input_(std::move(input)), remaining_(count) {}
  Status get_next(Element* out, bool* end) override {
    if (remaining_ == 0) {
      *end = true;
      input_ = nullptr;  // stop any background work early
      return Status::Ok();
    }
    CAPSTAN_RETURN_IF_ERROR(input_->get_next(out, end));
    if (!*end && remaining_ > 0) --remaining_;
    return Status::Ok();
  }

 private:
  IteratorPtr input_;
  int64_t remaining_;  // -1: all
};

class SkipIterator final : public IteratorBase {
 public:
  SkipIterator(IteratorPtr input, int64_t count) : input_(std::move(input)), to_skip_(count) {}
  Status get_next(Element* out, bool* end) override {
    while (to_skip_ != 0) {
      Element ignored;
      CAPSTAN_RETURN_IF_ERROR(input_->get_next(&ignored, end));
      if (*end) return Status::Ok();
      if (to_skip_ > 0) --to_skip_;
    }
    return input_->get_next(out, end);
  }

 private:
  IteratorPtr input_;
  int64_t to_skip_;  // -1: everything
};

class ZipIterator final : public IteratorBase {
 public:
  explicit ZipIterator(std::vector<IteratorPtr> inputs) : inputs_(std::move(inputs)) {}
  Status get_next(Element* out, bool* end) override {
    Element result;
    bool all_named = true;
    for (auto& input : inputs_) {
      Element e;
      CAPSTAN_RETURN_IF_ERROR(input->get_next(&e, end));
      if (*end) return Status::Ok();
      all_named = all_named && e.names.size() == e.components.size();
      for (size_t i = 0; i < e.components.size(); ++i) {
        result.components.push_back(std::move(e.components[i]));
        result.names.push_back(i < e.names.size() ? e.names[i] : "");
      }
    }
    if (!all_named) result.names.clear();
    *out = std::move(result);
    return Status::Ok();
  }

 private:
  std::vector<IteratorPtr> inputs_;
};

class ConcatenateIterator final : public IteratorBase {
 public:
  explicit ConcatenateIterator(std::vector<IteratorFactory> inputs) : inputs_(std::move(inputs)) {}
  Status get_next(Element* out, bool* end) override {
    while (next_ < inputs_.size() || current_ != nullptr) {
      if (current_ == nullptr) {
        CAPSTAN_ASSIGN_OR_RETURN(current_, inputs_[next_++]());
      }
      CAPSTAN_RETURN_IF_ERROR(current_->get_next(out, end));
      if (*end) {
        current_ = nullptr;
        continue;
      }
      // The datasets must yield the same structure (TF checks the types).
      if (signature_.empty()) {
        for (const auto& c : out->components) signature_.push_back(c.dtype());
      } else {
        std::vector<DType> got;
        for (const auto& c : out->components) got.push_back(c.dtype());
        if (got != signature_) {
          return Status::InvalidArgument(
              "concatenate: the datasets have different element types (" +
              std::to_string(signature_.size()) + " vs " + std::to_string(got.size()) +
              " components, or different dtypes)");
        }
      }
      return Status::Ok();
    }
    *end = true;
    return Status::Ok();
  }

 private:
  const std::vector<IteratorFactory> inputs_;
  size_t next_ = 0;
  IteratorPtr current_;
  std::vector<DType> signature_;
};

// In-memory cache: the first complete pass fills it; later passes (e.g. the
// epochs of a repeat) read from it. A pass abandoned midway caches nothing.
struct MemoryCache {
  Mutex mutex;
  bool complete GUARDED_BY(mutex) = false;
  std::shared_ptr<const std::vector<Element>> elements GUARDED_BY(mutex);
};

class MemoryCacheIterator final : public IteratorBase {
 public:
  MemoryCacheIterator(IteratorPtr input, std::shared_ptr<MemoryCache> cache, MemoryBudget& memory)
      : input_(std::move(input)), cache_(std::move(cache)), held_(memory, "cache") {
    MutexLock lock(cache_->mutex);
    if (cache_->complete) {
      cached_ = cache_->elements;
      input_ = nullptr;
    }
  }
  Status get_next(Element* out, bool* end) override {
    if (cached_) {
      *end = next_ >= cached_->size();
      if (!*end) *out = (*cached_)[next_++];
      return Status::Ok();
    }
    CAPSTAN_RETURN_IF_ERROR(input_->get_next(out, end));
    if (*end) {
      MutexLock lock(cache_->mutex);
      if (!cache_->complete) {
        cache_->elements = std::make_shared<const std::vector<Element>>(std::move(filling_));
        cache_->complete = true;
      }
      return Status::Ok();
    }
    if (!failed_.ok()) return failed_;
    Status charged = held_.add(footprint(*out));
    if (!charged.ok()) {
      filling_.clear();
      filling_.shrink_to_fit();
      held_.clear();
      failed_ = charged;
      return failed_;
    }
    filling_.push_back(*out);
    return Status::Ok();
  }

 private:
  IteratorPtr input_;
  std::shared_ptr<MemoryCache> cache_;
  std::shared_ptr<const std::vector<Element>> cached_;
  size_t next_ = 0;
  std::vector<Element> filling_;
  // The elements this iterator caches, counted while it holds them.
  HeldBytes held_;
  Status failed_;
};

// File cache: a TFRecord file of serialized elements. The first complete
// pass writes `<filename>.tmp-<pid>` and renames it to `filename`, so a file
// under that name is always complete and is reused by later passes and runs.
class FileCacheIterator final : public IteratorBase {
 public:
  FileCacheIterator(IteratorFactory input, std::string filename)
      : input_factory_(std::move(input)), filename_(std::move(filename)) {}
  ~FileCacheIterator() override {
    if (writer_ != nullptr) {
      (void)writer_->close();
      std::remove(temp_.c_str());
    }
  }

  Status get_next(Element* out, bool* end) override {
    if (!started_) {
      started_ = true;
      if (std::filesystem::exists(filename_)) {
        CAPSTAN_ASSIGN_OR_RETURN(reader_, io::TFRecordReader::open(filename_, io::Compression::kNone));
      } else {
        CAPSTAN_ASSIGN_OR_RETURN(input_, input_factory_());
        temp_ = filename_ + ".tmp-" + std::to_string(::getpid());
        auto writer = io::TFRecordWriter::open(temp_, io::Compression::kNone);
        if (!writer.ok()) return writer.status().with_context("cache file " + filename_);
        writer_ = std::move(*writer);
      }
    }
    if (reader_ != nullptr) {
      std::string record;
      CAPSTAN_ASSIGN_OR_RETURN(bool more, reader_->read(&record));
      *end = !more;
      if (!more) return Status::Ok();
      return decode(record, out);
    }
    CAPSTAN_RETURN_IF_ERROR(input_->get_next(out, end));
    if (*end) {
      Status closed = writer_->close();
      writer_ = nullptr;
      if (!closed.ok()) return closed.with_context("cache file " + filename_);
      // Durable before it takes its name: a file under `filename_` is complete.
      Status committed = capstan::io::commit_file_durably(temp_, filename_);
      if (!committed.ok()) std::remove(temp_.c_str());
      return committed.with_context("cache file " + filename_);
    }
    return writer_->write(rpc::element_to_bytes(*out));
  }

 private:
  Status decode(const std::string& record, Element* out) {
    auto element = rpc::element_from_bytes(record);
    if (!element.ok()) {
      return Status::DataLoss("cache file " + filename_ + " holds a malformed element: " +
                              element.status().message());
    }
    *out = std::move(*element);
    return Status::Ok();
  }

  const IteratorFactory input_factory_;
  const std::string filename_;
  bool started_ = false;
  IteratorPtr input_;
  std::unique_ptr<io::TFRecordReader> reader_;
  std::unique_ptr<io::TFRecordWriter> writer_;
  std::string temp_;
};

}  // namespace

IteratorPtr make_range(int64_t start, int64_t stop, int64_t step) {
  return std::make_unique<RangeIterator>(start, stop, step);
}

IteratorPtr make_from_tensors(Element element) {
  return std::make_unique<VectorIterator>(std::vector<Element>{std::move(element)});
}

Result<IteratorPtr> make_from_tensor_slices(const Element& element) {
  if (element.components.empty()) return Status::InvalidArgument("needs at least one component");
  std::vector<std::vector<Tensor>> columns;
  for (size_t c = 0; c < element.components.size(); ++c) {
    const Tensor& t = element.components[c];
    if (t.rank() == 0) {
      return Status::InvalidArgument("component " + std::to_string(c) + " is a scalar; slicing needs rank >= 1");
    }
    if (t.shape()[0] != element.components[0].shape()[0]) {
      return Status::InvalidArgument("components have different first dimensions: " +
                                     std::to_string(element.components[0].shape()[0]) + " and " +
                                     std::to_string(t.shape()[0]) + " (component " + std::to_string(c) + ")");
    }
    CAPSTAN_ASSIGN_OR_RETURN(auto rows, unstack(t));
    columns.push_back(std::move(rows));
  }
  std::vector<Element> elements(static_cast<size_t>(element.components[0].shape()[0]));
  for (size_t i = 0; i < elements.size(); ++i) {
    elements[i].names = element.names;
    for (auto& column : columns) elements[i].components.push_back(std::move(column[i]));
  }
  return IteratorPtr(std::make_unique<VectorIterator>(std::move(elements)));
}

Result<IteratorPtr> make_list_files(const std::vector<std::string>& patterns, bool shuffle,
                                    std::optional<uint64_t> seed, Pipeline& pipeline,
                                    const void* key) {
  std::set<std::string> matched;
  for (const auto& pattern : patterns) {
    CAPSTAN_ASSIGN_OR_RETURN(auto files, io::match_files(pattern));
    if (files.empty()) return Status::InvalidArgument("list_files: no files matched pattern: " + pattern);
    matched.insert(files.begin(), files.end());
  }
  std::vector<std::string> files(matched.begin(), matched.end());
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
  return IteratorPtr(std::make_unique<VectorIterator>(std::move(elements)));
}

IteratorPtr make_text_line(std::vector<std::string> files, Compression compression) {
  return text_line_iterator(files_of(std::move(files)), compression);
}

IteratorPtr make_tfrecord(std::vector<std::string> files, Compression compression) {
  return tfrecord_iterator(files_of(std::move(files)), compression);
}

IteratorPtr make_fixed_length(std::vector<std::string> files, int64_t record_bytes,
                              int64_t header_bytes, int64_t footer_bytes, Compression compression) {
  return fixed_length_iterator(files_of(std::move(files)), record_bytes, header_bytes, footer_bytes,
                               compression);
}

IteratorPtr make_split_range(int64_t start, int64_t step, SplitProvider* splits) {
  return std::make_unique<SplitRangeIterator>(start, step, splits);
}

IteratorPtr make_split_files(SplitProvider* splits) {
  return std::make_unique<FileNameIterator>(files_of(splits));
}

IteratorPtr make_split_text_line(SplitProvider* splits, Compression compression) {
  return text_line_iterator(files_of(splits), compression);
}

IteratorPtr make_split_tfrecord(SplitProvider* splits, Compression compression) {
  return tfrecord_iterator(files_of(splits), compression);
}

IteratorPtr make_split_fixed_length(SplitProvider* splits, int64_t record_bytes, int64_t header_bytes,
                                    int64_t footer_bytes, Compression compression) {
  return fixed_length_iterator(files_of(splits), record_bytes, header_bytes, footer_bytes, compression);
}

IteratorPtr make_map(IteratorPtr input, MapFunction fn) {
  return std::make_unique<MapIterator>(std::move(input), std::move(fn));
}

IteratorPtr make_filter(IteratorPtr input, FilterFunction fn) {
  return std::make_unique<FilterIterator>(std::move(input), std::move(fn));
}

IteratorPtr make_batch(IteratorPtr input, int64_t batch_size, bool drop_remainder, MemoryBudget& memory) {
  return std::make_unique<BatchIterator>(std::move(input), batch_size, drop_remainder, memory);
}

IteratorPtr make_padded_batch(IteratorPtr input, int64_t batch_size, std::vector<Shape> shapes,
                              std::vector<Tensor> padding_values, bool drop_remainder, MemoryBudget& memory) {
  return std::make_unique<PaddedBatchIterator>(std::move(input), batch_size, std::move(shapes),
                                               std::move(padding_values), drop_remainder, memory);
}

IteratorPtr make_rebatch(IteratorPtr input, int64_t batch_size, bool drop_remainder) {
  return std::make_unique<RebatchIterator>(std::move(input), batch_size, drop_remainder);
}

IteratorPtr make_shuffle(IteratorPtr input, int64_t buffer_size, std::optional<uint64_t> seed,
                         bool reshuffle_each_iteration, Pipeline& pipeline, const void* key) {
  auto epochs = pipeline.state<EpochCounter>(key);
  uint64_t epoch = reshuffle_each_iteration ? epochs->next++ : 0;
  return std::make_unique<ShuffleIterator>(std::move(input), buffer_size, epoch_seed(seed, epoch), pipeline.memory());
}

IteratorPtr make_repeat(IteratorFactory input, int64_t count) {
  return std::make_unique<RepeatIterator>(std::move(input), count);
}

IteratorPtr make_shard(IteratorPtr input, int64_t num_shards, int64_t index) {
  return std::make_unique<ShardIterator>(std::move(input), num_shards, index);
}

IteratorPtr make_take(IteratorPtr input, int64_t count) {
  return std::make_unique<TakeIterator>(std::move(input), count);
}

IteratorPtr make_skip(IteratorPtr input, int64_t count) {
  return std::make_unique<SkipIterator>(std::move(input), count);
}

IteratorPtr make_zip(std::vector<IteratorPtr> inputs) {
  return std::make_unique<ZipIterator>(std::move(inputs));
}

IteratorPtr make_concatenate(std::vector<IteratorFactory> inputs) {
  return std::make_unique<ConcatenateIterator>(std::move(inputs));
}

IteratorPtr make_memory_cache(IteratorPtr input, Pipeline& pipeline, const void* key) {
  return std::make_unique<MemoryCacheIterator>(std::move(input), pipeline.state<MemoryCache>(key), pipeline.memory());
}

IteratorPtr make_file_cache(IteratorFactory input, std::string filename) {
  return std::make_unique<FileCacheIterator>(std::move(input), std::move(filename));
}

}  // namespace capstan::data::engine
