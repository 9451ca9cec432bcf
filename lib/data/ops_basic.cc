// Iterators that run on the consumer's thread: sources and the element-wise
// and structural transformations. Each follows TensorFlow's documented
// element order and end-of-sequence behaviour.

#include <algorithm>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <random>
#include <set>
#include <sstream>
#include <unistd.h>

#include "data/definition.h"
#include "data/io/file.h"
#include "data/io/fixed_length.h"
#include "data/io/text_line.h"
#include "data/io/tfrecord.h"
#include "data/iterator_state.h"
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

// FailedPrecondition for an iterator reading splits: where it is lives with
// whoever hands the splits out.
Status on_splits(const char* op) {
  return Status::FailedPrecondition(std::string(op) +
                                    ": reads splits handed out by a data service dispatcher, which holds its "
                                    "position; an iterator reading splits cannot save or restore one");
}

// An op whose position is its input's alone (map, filter, batch).
Status save_through(StateWriter& writer, const char* op, IteratorBase& input) {
  writer.begin(op);
  return input.save(writer);
}
Status restore_through(StateReader& reader, const char* op, IteratorBase& input) {
  CAPSTAN_RETURN_IF_ERROR(reader.begin(op));
  return input.restore(reader);
}

// An input that may not exist (between a repeat's epochs, after a take
// ended): a flag, then its state when it does.
Status save_optional(StateWriter& writer, IteratorBase* input) {
  writer.write_bool(input != nullptr);
  return input != nullptr ? input->save(writer) : Status::Ok();
}

// Elements kept in a buffer, written with their count.
void write_elements(StateWriter& writer, const std::vector<Element>& elements) {
  writer.write_int(static_cast<int64_t>(elements.size()));
  for (const auto& e : elements) writer.write_element(e);
}

// Reads them back (each element is checked as it is read, so a count larger
// than the bytes hold fails at the end of the state, not in an allocation).
Status read_elements(StateReader& reader, std::vector<Element>* elements) {
  int64_t count = 0;
  CAPSTAN_RETURN_IF_ERROR(reader.read_int_in(&count, 0, INT64_MAX, "an element count"));
  elements->clear();
  for (int64_t i = 0; i < count; ++i) {
    Element e;
    CAPSTAN_RETURN_IF_ERROR(reader.read_element(&e));
    elements->push_back(std::move(e));
  }
  return Status::Ok();
}

// Counts restored elements against the memory budget, as filling did.
Status charge_all(HeldBytes& held, const std::vector<Element>& elements) {
  for (const auto& e : elements) CAPSTAN_RETURN_IF_ERROR(held.add(footprint(e)));
  return Status::Ok();
}

// ---- Sources ------------------------------------------------------------------

class RangeIterator final : public IteratorBase {
 public:
  RangeIterator(int64_t start, int64_t stop, int64_t step)
      : next_(start), start_(start), stop_(stop), step_(step) {}
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
  Status save(StateWriter& writer) override {
    writer.begin("range");
    writer.write_int(next_);
    return Status::Ok();
  }
  // The position must be one range(start, stop, step) reaches: a damaged
  // state could otherwise start a range(1, 30) at -2^62, a stream no
  // consumer would live to see the end of.
  Status restore(StateReader& reader) override {
    CAPSTAN_RETURN_IF_ERROR(reader.begin("range"));
    // From start to the first value past stop (within a step of it).
    const __int128 past = static_cast<__int128>(stop_) + (step_ > 0 ? step_ - 1 : step_ + 1);
    const __int128 low = step_ > 0 ? start_ : std::min<__int128>(past, start_);
    const __int128 high = step_ > 0 ? std::max<__int128>(past, start_) : start_;
    auto clamp64 = [](__int128 v) {
      return static_cast<int64_t>(std::clamp<__int128>(v, INT64_MIN, INT64_MAX));
    };
    int64_t next = 0;
    CAPSTAN_RETURN_IF_ERROR(reader.read_int_in(&next, clamp64(low), clamp64(high), "the next value"));
    const __int128 offset = static_cast<__int128>(next) - start_;
    if (next != stop_ && offset % step_ != 0) {
      return Status::InvalidArgument("iterator state: range: the next value " + std::to_string(next) +
                                     " is not start " + std::to_string(start_) + " plus a multiple of step " +
                                     std::to_string(step_));
    }
    next_ = next;
    return Status::Ok();
  }

 private:
  int64_t next_;
  const int64_t start_;
  const int64_t stop_;
  const int64_t step_;
};

// `save_elements`: the elements go into the saved state too (list_files,
// whose order a restored iterator could not reproduce: an unseeded shuffle,
// or files added since).
class VectorIterator final : public IteratorBase {
 public:
  VectorIterator(std::vector<Element> elements, const char* op, bool save_elements = false)
      : elements_(std::move(elements)), op_(op), save_elements_(save_elements) {}
  Status get_next(Element* out, bool* end) override {
    *end = next_ >= elements_.size();
    if (!*end) *out = elements_[next_++];
    return Status::Ok();
  }
  Status save(StateWriter& writer) override {
    writer.begin(op_);
    writer.write_int(static_cast<int64_t>(next_));
    if (save_elements_) write_elements(writer, elements_);
    return Status::Ok();
  }
  Status restore(StateReader& reader) override {
    CAPSTAN_RETURN_IF_ERROR(reader.begin(op_));
    int64_t next = 0;
    CAPSTAN_RETURN_IF_ERROR(reader.read_int_in(&next, 0, INT64_MAX, "the next element's index"));
    if (save_elements_) CAPSTAN_RETURN_IF_ERROR(read_elements(reader, &elements_));
    if (next > static_cast<int64_t>(elements_.size())) {
      return Status::InvalidArgument(std::string(op_) + ": the saved position " + std::to_string(next) +
                                     " is past its " + std::to_string(elements_.size()) + " elements");
    }
    next_ = static_cast<size_t>(next);
    return Status::Ok();
  }

 private:
  std::vector<Element> elements_;
  const char* const op_;
  const bool save_elements_;
  size_t next_ = 0;
};

// Where a file source gets its next file name: a fixed list, or a split
// provider.
class FileQueue {
 public:
  explicit FileQueue(std::vector<std::string> files) : files_(std::move(files)) {}
  explicit FileQueue(SplitProvider* splits) : splits_(splits) {}

  // nullopt: no more files.
  Result<std::optional<std::string>> next() {
    if (splits_ == nullptr) {
      if (next_ >= files_.size()) return std::optional<std::string>();
      return std::optional<std::string>(files_[next_++]);
    }
    CAPSTAN_ASSIGN_OR_RETURN(auto split, splits_->get_next());
    if (!split) return std::optional<std::string>();
    if (split->components.size() != 1 || split->components[0].dtype() != DType::kString ||
        split->components[0].num_elements() != 1) {
      return Status::InvalidArgument("a file split must be one file name");
    }
    return std::optional<std::string>(std::string(split->components[0].string_at(0)));
  }

  bool on_splits() const { return splits_ != nullptr; }
  // Files of the list handed out so far.
  size_t position() const { return next_; }
  // Hands out the list from file `position` on; returns that file's
  // predecessor (the file being read at `position`), if any.
  Result<std::optional<std::string>> seek(int64_t position) {
    if (position < 0 || position > static_cast<int64_t>(files_.size())) {
      return Status::InvalidArgument("the saved file position " + std::to_string(position) + " is outside the " +
                                     std::to_string(files_.size()) + " files");
    }
    next_ = static_cast<size_t>(position);
    if (next_ == 0) return std::optional<std::string>();
    return std::optional<std::string>(files_[next_ - 1]);
  }

 private:
  const std::vector<std::string> files_;
  SplitProvider* const splits_ = nullptr;
  size_t next_ = 0;
};

// Reads the records of one file after another. Its saved position is the
// file and the number of records read from it; a restore reopens the file
// and reads past them (for every format and compression alike).
template <typename Reader>
class FileRecordIterator final : public IteratorBase {
 public:
  using Opener = std::function<Result<std::unique_ptr<Reader>>(const std::string&)>;
  FileRecordIterator(FileQueue files, Opener open, const char* op)
      : files_(std::move(files)), open_(std::move(open)), op_(op) {}

  Status get_next(Element* out, bool* end) override {
    while (true) {
      if (reader_ == nullptr) {
        CAPSTAN_ASSIGN_OR_RETURN(auto file, files_.next());
        if (!file) {
          *end = true;
          return Status::Ok();
        }
        auto opened = open_(*file);
        if (!opened.ok()) return opened.status();
        reader_ = std::move(*opened);
        records_ = 0;
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
      ++records_;
      *out = scalar_element(std::move(t));
      *end = false;
      return Status::Ok();
    }
  }

  Status save(StateWriter& writer) override {
    if (files_.on_splits()) return on_splits(op_);
    writer.begin(op_);
    writer.write_int(static_cast<int64_t>(files_.position()));
    writer.write_bool(reader_ != nullptr);
    writer.write_int(records_);
    return Status::Ok();
  }

  Status restore(StateReader& reader) override {
    if (files_.on_splits()) return on_splits(op_);
    CAPSTAN_RETURN_IF_ERROR(reader.begin(op_));
    int64_t position = 0;
    bool open = false;
    int64_t records = 0;
    CAPSTAN_RETURN_IF_ERROR(reader.read_int(&position));
    CAPSTAN_RETURN_IF_ERROR(reader.read_bool(&open));
    CAPSTAN_RETURN_IF_ERROR(reader.read_int_in(&records, 0, INT64_MAX, "a record count"));
    CAPSTAN_ASSIGN_OR_RETURN(auto current, files_.seek(position));
    if (!open) return Status::Ok();
    if (!current) return Status::InvalidArgument(std::string(op_) + ": the saved state reads a file before the first");
    CAPSTAN_ASSIGN_OR_RETURN(reader_, open_(*current));
    for (records_ = 0; records_ < records; ++records_) {
      Tensor skipped;
      auto more = read_record(&skipped);
      if (!more.ok()) return more.status().with_context(std::string(op_) + ": restoring the position in " + *current);
      if (!*more) {
        return Status::DataLoss(std::string(op_) + ": " + *current + " has " + std::to_string(records_) +
                                " records, but the saved position is after record " + std::to_string(records) +
                                "; the file changed since the state was saved");
      }
    }
    return Status::Ok();
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

  FileQueue files_;
  const Opener open_;
  const char* const op_;
  std::unique_ptr<Reader> reader_;
  int64_t records_ = 0;  // read from reader_'s file
};

IteratorPtr text_line_iterator(FileQueue files, Compression compression) {
  return std::make_unique<FileRecordIterator<io::TextLineReader>>(
      std::move(files),
      [compression](const std::string& file) { return io::TextLineReader::open(file, to_io(compression)); },
      "text_line");
}

IteratorPtr tfrecord_iterator(FileQueue files, Compression compression) {
  return std::make_unique<FileRecordIterator<io::TFRecordReader>>(
      std::move(files),
      [compression](const std::string& file) { return io::TFRecordReader::open(file, to_io(compression)); },
      "tfrecord");
}

IteratorPtr fixed_length_iterator(FileQueue files, int64_t record_bytes, int64_t header_bytes,
                                  int64_t footer_bytes, Compression compression) {
  return std::make_unique<FileRecordIterator<io::FixedLengthRecordReader>>(
      std::move(files),
      [=](const std::string& file) {
        return io::FixedLengthRecordReader::open(file, record_bytes, header_bytes, footer_bytes,
                                                 to_io(compression));
      },
      "fixed_length");
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
  Status save(StateWriter&) override { return on_splits("range"); }
  Status restore(StateReader&) override { return on_splits("range"); }

 private:
  const int64_t start_;
  const int64_t step_;
  SplitProvider* const splits_;
  int64_t next_ = 0;
  int64_t end_ = 0;
};

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
  Status save(StateWriter& writer) override { return save_through(writer, "map", *input_); }
  Status restore(StateReader& reader) override { return restore_through(reader, "map", *input_); }

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
  Status save(StateWriter& writer) override { return save_through(writer, "filter", *input_); }
  Status restore(StateReader& reader) override { return restore_through(reader, "filter", *input_); }

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
  // A batch is collected within one call: only the input has a position.
  Status save(StateWriter& writer) override { return save_through(writer, "batch", *input_); }
  Status restore(StateReader& reader) override { return restore_through(reader, "batch", *input_); }

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
  Status save(StateWriter& writer) override { return save_through(writer, "padded_batch", *input_); }
  Status restore(StateReader& reader) override { return restore_through(reader, "padded_batch", *input_); }

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

  // The partial input batches, and how many rows of the first were emitted.
  Status save(StateWriter& writer) override {
    writer.begin("rebatch");
    write_elements(writer, std::vector<Element>(pending_.begin(), pending_.end()));
    writer.write_int(head_offset_);
    writer.write_bool(input_end_);
    return input_->save(writer);
  }
  Status restore(StateReader& reader) override {
    CAPSTAN_RETURN_IF_ERROR(reader.begin("rebatch"));
    std::vector<Element> pending;
    CAPSTAN_RETURN_IF_ERROR(read_elements(reader, &pending));
    CAPSTAN_RETURN_IF_ERROR(reader.read_int(&head_offset_));
    CAPSTAN_RETURN_IF_ERROR(reader.read_bool(&input_end_));
    buffered_rows_ = -head_offset_;
    for (const auto& e : pending) {
      if (e.components.empty() || e.components[0].rank() == 0 || e.components[0].shape()[0] == 0) {
        return Status::InvalidArgument("rebatch: a saved partial batch is not a non-empty batch");
      }
      buffered_rows_ += e.components[0].shape()[0];
    }
    if (head_offset_ < 0 || (pending.empty() ? head_offset_ != 0
                                             : head_offset_ >= pending.front().components[0].shape()[0])) {
      return Status::InvalidArgument("rebatch: the saved row offset " + std::to_string(head_offset_) +
                                     " is outside the first saved batch");
    }
    pending_.assign(std::make_move_iterator(pending.begin()), std::make_move_iterator(pending.end()));
    return input_->restore(reader);
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

// Epochs begun by an op's iterators (each shuffles with its epoch's seed).
struct EpochCounter final : PipelineState {
  std::atomic<uint64_t> next{0};
  void save(StateWriter& writer) override { writer.write_int(static_cast<int64_t>(next.load())); }
  Status restore(StateReader& reader) override {
    int64_t value = 0;
    CAPSTAN_RETURN_IF_ERROR(reader.read_int_in(&value, 0, INT64_MAX, "an epoch count"));
    next = static_cast<uint64_t>(value);
    return Status::Ok();
  }
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

  // The buffer and the generator's state: the restored iterator draws the
  // same indices.
  Status save(StateWriter& writer) override {
    writer.begin("shuffle");
    std::ostringstream rng;
    rng << rng_;
    writer.write_bytes(rng.str());
    write_elements(writer, buffer_);
    writer.write_bool(input_end_);
    writer.write_status(failed_);
    return input_->save(writer);
  }
  Status restore(StateReader& reader) override {
    CAPSTAN_RETURN_IF_ERROR(reader.begin("shuffle"));
    std::string rng;
    CAPSTAN_RETURN_IF_ERROR(reader.read_bytes(&rng));
    std::istringstream in(rng);
    in >> rng_;
    if (!in) return Status::InvalidArgument("shuffle: the saved random generator state does not parse");
    CAPSTAN_RETURN_IF_ERROR(read_elements(reader, &buffer_));
    if (static_cast<int64_t>(buffer_.size()) > buffer_size_) {
      return Status::InvalidArgument("shuffle: " + std::to_string(buffer_.size()) +
                                     " saved elements do not fit its buffer of " + std::to_string(buffer_size_));
    }
    CAPSTAN_RETURN_IF_ERROR(reader.read_bool(&input_end_));
    CAPSTAN_RETURN_IF_ERROR(reader.read_status(&failed_));
    held_.clear();
    CAPSTAN_RETURN_IF_ERROR(charge_all(held_, buffer_));
    return input_->restore(reader);
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

  Status save(StateWriter& writer) override {
    writer.begin("repeat");
    writer.write_int(epoch_);
    writer.write_bool(produced_this_epoch_);
    return save_optional(writer, current_.get());
  }
  Status restore(StateReader& reader) override {
    CAPSTAN_RETURN_IF_ERROR(reader.begin("repeat"));
    bool has_current = false;
    CAPSTAN_RETURN_IF_ERROR(reader.read_int_in(&epoch_, 0, INT64_MAX, "an epoch"));
    CAPSTAN_RETURN_IF_ERROR(reader.read_bool(&produced_this_epoch_));
    CAPSTAN_RETURN_IF_ERROR(reader.read_bool(&has_current));
    if (!has_current) return Status::Ok();
    CAPSTAN_ASSIGN_OR_RETURN(current_, factory_());
    return current_->restore(reader);
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
  Status save(StateWriter& writer) override {
    writer.begin("shard");
    writer.write_bool(first_);
    return input_->save(writer);
  }
  Status restore(StateReader& reader) override {
    CAPSTAN_RETURN_IF_ERROR(reader.begin("shard"));
    CAPSTAN_RETURN_IF_ERROR(reader.read_bool(&first_));
    return input_->restore(reader);
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
  Status save(StateWriter& writer) override {
    writer.begin("take");
    writer.write_int(remaining_);
    return save_optional(writer, input_.get());
  }
  Status restore(StateReader& reader) override {
    CAPSTAN_RETURN_IF_ERROR(reader.begin("take"));
    bool has_input = false;
    CAPSTAN_RETURN_IF_ERROR(reader.read_int_in(&remaining_, -1, INT64_MAX, "the elements left to take"));
    CAPSTAN_RETURN_IF_ERROR(reader.read_bool(&has_input));
    if (!has_input) {
      input_ = nullptr;
      return remaining_ == 0 ? Status::Ok() : Status::InvalidArgument("take: a saved state without its input");
    }
    return input_->restore(reader);
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
  Status save(StateWriter& writer) override {
    writer.begin("skip");
    writer.write_int(to_skip_);
    return input_->save(writer);
  }
  Status restore(StateReader& reader) override {
    CAPSTAN_RETURN_IF_ERROR(reader.begin("skip"));
    CAPSTAN_RETURN_IF_ERROR(reader.read_int_in(&to_skip_, -1, INT64_MAX, "the elements left to skip"));
    return input_->restore(reader);
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
  Status save(StateWriter& writer) override {
    writer.begin("zip");
    for (auto& input : inputs_) CAPSTAN_RETURN_IF_ERROR(input->save(writer));
    return Status::Ok();
  }
  Status restore(StateReader& reader) override {
    CAPSTAN_RETURN_IF_ERROR(reader.begin("zip"));
    for (auto& input : inputs_) CAPSTAN_RETURN_IF_ERROR(input->restore(reader));
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

  Status save(StateWriter& writer) override {
    writer.begin("concatenate");
    writer.write_int(static_cast<int64_t>(next_));
    writer.write_int(static_cast<int64_t>(signature_.size()));
    for (DType d : signature_) writer.write_int(static_cast<int64_t>(d));
    return save_optional(writer, current_.get());
  }
  Status restore(StateReader& reader) override {
    CAPSTAN_RETURN_IF_ERROR(reader.begin("concatenate"));
    int64_t next = 0;
    int64_t components = 0;
    bool has_current = false;
    CAPSTAN_RETURN_IF_ERROR(
        reader.read_int_in(&next, 0, static_cast<int64_t>(inputs_.size()), "the next dataset's index"));
    CAPSTAN_RETURN_IF_ERROR(reader.read_int_in(&components, 0, 1 << 16, "a component count"));
    signature_.clear();
    for (int64_t i = 0; i < components; ++i) {
      int64_t dtype = 0;
      CAPSTAN_RETURN_IF_ERROR(reader.read_int_in(&dtype, 0, 255, "a dtype"));
      signature_.push_back(static_cast<DType>(dtype));
    }
    CAPSTAN_RETURN_IF_ERROR(reader.read_bool(&has_current));
    next_ = static_cast<size_t>(next);
    if (!has_current) return Status::Ok();
    if (next_ == 0) return Status::InvalidArgument("concatenate: the saved state reads a dataset before the first");
    CAPSTAN_ASSIGN_OR_RETURN(current_, inputs_[next_ - 1]());
    return current_->restore(reader);
  }

 private:
  const std::vector<IteratorFactory> inputs_;
  size_t next_ = 0;
  IteratorPtr current_;
  std::vector<DType> signature_;
};

// In-memory cache: the first complete pass fills it; later passes (e.g. the
// epochs of a repeat) read from it. A pass abandoned midway caches nothing.
struct MemoryCache final : PipelineState {
  Mutex mutex;
  bool complete GUARDED_BY(mutex) = false;
  std::shared_ptr<const std::vector<Element>> elements GUARDED_BY(mutex);

  // A complete cache is saved with its elements (as TF does).
  void save(StateWriter& writer) override {
    MutexLock lock(mutex);
    writer.write_bool(complete);
    if (complete) write_elements(writer, *elements);
  }
  Status restore(StateReader& reader) override {
    bool was_complete = false;
    CAPSTAN_RETURN_IF_ERROR(reader.read_bool(&was_complete));
    if (!was_complete) return Status::Ok();
    std::vector<Element> saved;
    CAPSTAN_RETURN_IF_ERROR(read_elements(reader, &saved));
    MutexLock lock(mutex);
    elements = std::make_shared<const std::vector<Element>>(std::move(saved));
    complete = true;
    return Status::Ok();
  }
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
    if (reads_cache_ && !cached_) {  // restored: the pipeline's states are back now
      MutexLock lock(cache_->mutex);
      if (!cache_->complete) return Status::DataLoss("cache: the restored state lacks the cached elements");
      cached_ = cache_->elements;
    }
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

  // Reading the cache: the index. Filling it: what it holds so far, and the
  // input's position.
  Status save(StateWriter& writer) override {
    writer.begin("cache");
    writer.write_bool(cached_ != nullptr || reads_cache_);
    if (cached_ != nullptr || reads_cache_) {
      writer.write_int(static_cast<int64_t>(next_));
      return Status::Ok();
    }
    write_elements(writer, filling_);
    writer.write_status(failed_);
    return input_->save(writer);
  }
  Status restore(StateReader& reader) override {
    CAPSTAN_RETURN_IF_ERROR(reader.begin("cache"));
    CAPSTAN_RETURN_IF_ERROR(reader.read_bool(&reads_cache_));
    if (reads_cache_) {
      int64_t next = 0;
      CAPSTAN_RETURN_IF_ERROR(reader.read_int_in(&next, 0, INT64_MAX, "the next cached element's index"));
      next_ = static_cast<size_t>(next);
      cached_ = nullptr;  // taken from the restored cache on the first get_next
      input_ = nullptr;
      return Status::Ok();
    }
    if (cached_ != nullptr || input_ == nullptr) {
      return Status::InvalidArgument("cache: the saved state fills a cache that this pipeline already holds");
    }
    CAPSTAN_RETURN_IF_ERROR(read_elements(reader, &filling_));
    CAPSTAN_RETURN_IF_ERROR(reader.read_status(&failed_));
    held_.clear();
    CAPSTAN_RETURN_IF_ERROR(charge_all(held_, filling_));
    return input_->restore(reader);
  }

 private:
  IteratorPtr input_;
  std::shared_ptr<MemoryCache> cache_;
  bool reads_cache_ = false;  // restored while reading the cache
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
// A restored iterator that was writing reads on from its input without
// writing: the elements before the save are not in a file of this process.
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
    if (mode_ == Mode::kStart) {
      if (std::filesystem::exists(filename_)) {
        CAPSTAN_ASSIGN_OR_RETURN(reader_, io::TFRecordReader::open(filename_, io::Compression::kNone));
        mode_ = Mode::kReading;
      } else {
        CAPSTAN_ASSIGN_OR_RETURN(input_, input_factory_());
        temp_ = filename_ + ".tmp-" + std::to_string(::getpid());
        auto writer = io::TFRecordWriter::open(temp_, io::Compression::kNone);
        if (!writer.ok()) return writer.status().with_context("cache file " + filename_);
        writer_ = std::move(*writer);
        mode_ = Mode::kWriting;
      }
    }
    if (mode_ == Mode::kReading) {
      std::string record;
      CAPSTAN_ASSIGN_OR_RETURN(bool more, reader_->read(&record));
      *end = !more;
      if (!more) return Status::Ok();
      ++records_;
      return decode(record, out);
    }
    CAPSTAN_RETURN_IF_ERROR(input_->get_next(out, end));
    if (writer_ == nullptr) return Status::Ok();  // restored mid-write, or written
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

  Status save(StateWriter& writer) override {
    writer.begin("cache");
    writer.write_int(static_cast<int64_t>(mode_));
    if (mode_ == Mode::kReading) writer.write_int(records_);
    return mode_ == Mode::kWriting ? input_->save(writer) : Status::Ok();
  }
  Status restore(StateReader& reader) override {
    CAPSTAN_RETURN_IF_ERROR(reader.begin("cache"));
    int64_t mode = 0;
    CAPSTAN_RETURN_IF_ERROR(reader.read_int_in(&mode, 0, 2, "the file cache's mode"));
    mode_ = static_cast<Mode>(mode);
    if (mode_ == Mode::kReading) {
      int64_t records = 0;
      CAPSTAN_RETURN_IF_ERROR(reader.read_int_in(&records, 0, INT64_MAX, "a record count"));
      auto opened = io::TFRecordReader::open(filename_, io::Compression::kNone);
      if (!opened.ok()) return opened.status().with_context("restoring cache file " + filename_);
      reader_ = std::move(*opened);
      std::string skipped;
      for (records_ = 0; records_ < records; ++records_) {
        CAPSTAN_ASSIGN_OR_RETURN(bool more, reader_->read(&skipped));
        if (!more) return Status::DataLoss("cache file " + filename_ + " is shorter than the saved position");
      }
      return Status::Ok();
    }
    if (mode_ == Mode::kWriting) {
      CAPSTAN_ASSIGN_OR_RETURN(input_, input_factory_());
      return input_->restore(reader);
    }
    return Status::Ok();
  }

 private:
  enum class Mode : int64_t { kStart = 0, kReading = 1, kWriting = 2 };

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
  Mode mode_ = Mode::kStart;
  IteratorPtr input_;
  std::unique_ptr<io::TFRecordReader> reader_;
  int64_t records_ = 0;  // read from reader_
  std::unique_ptr<io::TFRecordWriter> writer_;
  std::string temp_;
};

}  // namespace

IteratorPtr make_range(int64_t start, int64_t stop, int64_t step) {
  return std::make_unique<RangeIterator>(start, stop, step);
}

IteratorPtr make_from_tensors(Element element) {
  return std::make_unique<VectorIterator>(std::vector<Element>{std::move(element)}, "from_tensors");
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
  return IteratorPtr(std::make_unique<VectorIterator>(std::move(elements), "from_tensor_slices"));
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
  return IteratorPtr(std::make_unique<VectorIterator>(std::move(elements), "list_files", /*save_elements=*/true));
}

IteratorPtr make_text_line(std::vector<std::string> files, Compression compression) {
  return text_line_iterator(FileQueue(std::move(files)), compression);
}

IteratorPtr make_tfrecord(std::vector<std::string> files, Compression compression) {
  return tfrecord_iterator(FileQueue(std::move(files)), compression);
}

IteratorPtr make_fixed_length(std::vector<std::string> files, int64_t record_bytes,
                              int64_t header_bytes, int64_t footer_bytes, Compression compression) {
  return fixed_length_iterator(FileQueue(std::move(files)), record_bytes, header_bytes, footer_bytes,
                               compression);
}

IteratorPtr make_split_range(int64_t start, int64_t step, SplitProvider* splits) {
  return std::make_unique<SplitRangeIterator>(start, step, splits);
}

IteratorPtr make_split_files(SplitProvider* splits) {
  return std::make_unique<FileNameIterator>(FileQueue(splits));
}

IteratorPtr make_split_text_line(SplitProvider* splits, Compression compression) {
  return text_line_iterator(FileQueue(splits), compression);
}

IteratorPtr make_split_tfrecord(SplitProvider* splits, Compression compression) {
  return tfrecord_iterator(FileQueue(splits), compression);
}

IteratorPtr make_split_fixed_length(SplitProvider* splits, int64_t record_bytes, int64_t header_bytes,
                                    int64_t footer_bytes, Compression compression) {
  return fixed_length_iterator(FileQueue(splits), record_bytes, header_bytes, footer_bytes, compression);
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
