// What several ops' iterators share (each op's own iterator is in its file
// here, data/ops/<op>.cc, beside its kernel): element and state helpers, the
// file readers of the file sources, the background prefetcher of prefetch and
// interleave, and the constructors one op borrows from another.
#ifndef CAPSTAN_LIB_DATA_OPS_COMMON_H_
#define CAPSTAN_LIB_DATA_OPS_COMMON_H_

#include <atomic>
#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "data/definition.h"
#include "data/engine.h"
#include "data/io/file.h"
#include "data/iterator_state.h"
#include "data/op_kernel.h"
#include "sync/mutex.h"

namespace capstan::data::engine {

using IteratorPtr = std::unique_ptr<IteratorBase>;
// Makes a fresh iterator of an op's input (repeat re-creates it per epoch).
using IteratorFactory = std::function<Result<IteratorPtr>()>;

// ---- Elements and saved state ------------------------------------------------------

io::Compression to_io(Compression c);
Element scalar_element(Tensor t);
Result<Tensor> string_scalar(const std::string& value);

// A seed for epoch `epoch` of an op: reproducible when the user gave one.
uint64_t epoch_seed(std::optional<uint64_t> seed, uint64_t epoch);

// Epochs begun by an op's iterators (each shuffles with its epoch's seed).
struct EpochCounter final : PipelineState {
  std::atomic<uint64_t> next{0};
  void save(StateWriter& writer) override;
  Status restore(StateReader& reader) override;
};

// FailedPrecondition for an iterator reading splits: where it is lives with
// whoever hands the splits out.
Status on_splits(const char* op);

// An op whose position is its input's alone (map, filter, batch).
Status save_through(StateWriter& writer, const char* op, IteratorBase& input);
Status restore_through(StateReader& reader, const char* op, IteratorBase& input);

// An input that may not exist (between a repeat's epochs, after a take
// ended): a flag, then its state when it does.
Status save_optional(StateWriter& writer, IteratorBase* input);

// Elements kept in a buffer, written with their count.
void write_elements(StateWriter& writer, const std::vector<Element>& elements);
// Reads them back (each element is checked as it is read, so a count larger
// than the bytes hold fails at the end of the state, not in an allocation).
Status read_elements(StateReader& reader, std::vector<Element>* elements);

// Counts restored elements against the memory budget, as filling did.
Status charge_all(HeldBytes& held, const std::vector<Element>& elements);

// Collects up to n elements of the input, counting them in `held`; sets
// *end when none came. Over the memory budget, drops them and fails.
Status collect(IteratorBase& input, int64_t n, std::vector<Element>* batch, bool* end, HeldBytes& held);

// batch and padded_batch: batches of up to batch_size input elements (the
// last one short unless drop_remainder), each assembled by the op. A batch
// is collected within one call: only the input has a position.
class BatchingIterator : public IteratorBase {
 public:
  BatchingIterator(IteratorPtr input, int64_t batch_size, bool drop_remainder, MemoryBudget& memory, const char* op)
      : input_(std::move(input)),
        batch_size_(batch_size),
        drop_remainder_(drop_remainder),
        op_(op),
        held_(memory, op) {}
  Status get_next(Element* out, bool* end) final;
  Status save(StateWriter& writer) final { return save_through(writer, op_, *input_); }
  Status restore(StateReader& reader) final { return restore_through(reader, op_, *input_); }

 protected:
  // One output element from a batch's elements (at least one).
  virtual Result<Element> assemble(const std::vector<Element>& batch) = 0;
  // True where assemble() stacks rows of one layout (batch): then each
  // element is copied into the batch as it comes (stream_batch).
  virtual bool stacks_rows() const { return false; }

 private:
  Status stream_batch(Element* out, bool* end);
  // The input's next element, counted in held_ (over the budget: held_ is
  // cleared and the error returned).
  Status next_counted(Element* e, bool* input_end);
  // Collects the rest of a batch already holding `batch` and assembles it.
  Status finish_collected(std::vector<Element> batch, Element* out, bool* end);

  IteratorPtr input_;
  const int64_t batch_size_;
  const bool drop_remainder_;
  const char* const op_;
  HeldBytes held_;
};

// The first fields of take's, skip's and repeat's state: the op's name, then
// a count in [min, INT64_MAX] (`what` names it in errors).
void save_count(StateWriter& writer, const char* op, int64_t count);
Status restore_count(StateReader& reader, const char* op, int64_t* count, int64_t min, const char* what);

// The elements of a list, saved as an index into it (from_tensors,
// from_tensor_slices, list_files). `save_elements`: the elements go into the
// saved state too (list_files, whose order a restored iterator could not
// reproduce: an unseeded shuffle, or files added since).
IteratorPtr make_vector_iterator(std::vector<Element> elements, const char* op, bool save_elements = false);

// ---- File sources ------------------------------------------------------------------

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

// The FileSource of a source op whose group holds a `files` list
// (text_line_dataset, tfrecord_dataset, fixed_length_record_dataset):
// kReader and kBuilder get the group (&Op::Reader::getTextLine,
// &Op::Builder::getTextLine); kRead makes the op's iterator over a queue of
// files.
template <auto kReader, auto kBuilder, IteratorPtr (*kRead)(Op::Reader op, FileQueue files)>
constexpr OpKernel::FileSource kFileListSource{
    .files = [](Op::Reader op) -> Result<std::vector<std::string>> { return texts((op.*kReader)().getFiles()); },
    .keep_share =
        [](Op::Builder op, int64_t num_workers, int64_t index) {
          auto mine = share_of((op.asReader().*kReader)().getFiles(), num_workers, index);
          set_texts((op.*kBuilder)().initFiles(static_cast<unsigned>(mine.size())), mine);
        },
    .read_splits = [](Op::Reader op, SplitProvider* splits) { return kRead(op, FileQueue(splits)); },
};

// ---- Background producers (map, prefetch, interleave) ------------------------------

// One result of a background producer: an element, an error, or the end.
struct Item {
  Status status;
  Element element;
  bool end = false;
  // An error that ends the producer (over the memory budget): like the end
  // marker it stays for later calls.
  bool terminal = false;

  void save(StateWriter& writer) const {
    writer.write_status(status);
    writer.write_bool(end);
    writer.write_bool(terminal);
    if (status.ok() && !end) writer.write_element(element);
  }
  Status restore(StateReader& reader) {
    CAPSTAN_RETURN_IF_ERROR(reader.read_status(&status));
    CAPSTAN_RETURN_IF_ERROR(reader.read_bool(&end));
    CAPSTAN_RETURN_IF_ERROR(reader.read_bool(&terminal));
    if (status.ok() && !end) CAPSTAN_RETURN_IF_ERROR(reader.read_element(&element));
    return Status::Ok();
  }
};

// Reads `count` saved items (bounded by the bytes left, as each read checks).
Status read_items(StateReader& reader, std::vector<Item>* items);

// Pulls from its input on a background thread into a bounded queue. The
// thread starts with the first take() or ready() (so that a restore comes
// before it pulls anything).
class Prefetcher {
 public:
  Prefetcher(IteratorPtr input, std::shared_ptr<Knob> capacity, int64_t ram_budget, MemoryBudget& memory)
      : input_(std::move(input)), capacity_(std::move(capacity)), ram_budget_(ram_budget), memory_(memory) {}
  ~Prefetcher() {
    {
      MutexLock lock(mutex_);
      cancelled_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
    MutexLock lock(mutex_);
    for (auto& item : queue_) {
      if (item.status.ok() && !item.end) memory_.release(footprint(item.element));
    }
  }

  // Pauses the thread (until the whole pipeline is saved), then writes the
  // queued items and the input's position.
  Status save(StateWriter& writer) {
    {
      MutexLock lock(mutex_);
      paused_ = true;
      while (busy_) cv_.wait(mutex_);
    }
    writer.defer([this]() {
      {
        MutexLock lock(mutex_);
        paused_ = false;
      }
      cv_.notify_all();
    });
    bool finished = false;
    {
      MutexLock lock(mutex_);
      writer.write_int(static_cast<int64_t>(queue_.size()));
      for (const auto& item : queue_) item.save(writer);
      finished = !queue_.empty() && (queue_.back().end || queue_.back().terminal);
    }
    // The thread is parked outside input_ (or gone): reading it is safe.
    return finished ? Status::Ok() : input_->save(writer);
  }

  Status restore(StateReader& reader) {
    std::vector<Item> items;
    CAPSTAN_RETURN_IF_ERROR(read_items(reader, &items));
    bool finished = !items.empty() && (items.back().end || items.back().terminal);
    {
      MutexLock lock(mutex_);
      if (started_) return Status::FailedPrecondition("prefetch: restore after the first element");
      for (auto& item : items) {
        if (item.status.ok() && !item.end) {
          Status charged = memory_.charge(footprint(item.element), "prefetch");
          if (!charged.ok()) return charged;
        }
        queue_.push_back(std::move(item));
      }
      // A producer that had ended does not start again.
      started_ = finished;
    }
    return finished ? Status::Ok() : input_->restore(reader);
  }

  // Blocks until an item is ready.
  Item take() {
    MutexLock lock(mutex_);
    start();
    if (queue_.empty()) {
      auto started = std::chrono::steady_clock::now();
      while (queue_.empty()) cv_.wait(mutex_);
      capacity_->record_wait(std::chrono::steady_clock::now() - started);
    }
    if (queue_.front().end || queue_.front().terminal) return queue_.front();  // stays for later calls
    Item item = std::move(queue_.front());
    queue_.pop_front();
    if (item.status.ok()) memory_.release(footprint(item.element));
    cv_.notify_all();
    return item;
  }
  // Whether take() would return at once.
  bool ready() {
    MutexLock lock(mutex_);
    start();
    return !queue_.empty();
  }

 private:
  void start() REQUIRES(mutex_) {
    if (started_) return;
    started_ = true;
    thread_ = std::thread([this]() { run(); });
  }

  void run() {
    while (true) {
      {
        MutexLock lock(mutex_);
        while (!cancelled_ && (paused_ || static_cast<int64_t>(queue_.size()) >= capacity_->value())) {
          cv_.wait(mutex_);
        }
        if (cancelled_) return;
        busy_ = true;
      }
      Item item;
      item.status = input_->get_next(&item.element, &item.end);
      if (item.status.ok() && !item.end) {
        note_size(item.element.byte_size());
        Status charged = memory_.charge(footprint(item.element), "prefetch");
        if (!charged.ok()) {
          item = Item{charged, Element(), false, true};
          // Drop what is buffered: the consumer sees the error next.
          MutexLock lock(mutex_);
          for (auto& queued : queue_) {
            if (queued.status.ok() && !queued.end) memory_.release(footprint(queued.element));
          }
          queue_.clear();
        }
      }
      bool end = (item.status.ok() && item.end) || item.terminal;
      {
        MutexLock lock(mutex_);
        queue_.push_back(std::move(item));
        busy_ = false;
      }
      cv_.notify_all();
      if (end) return;
    }
  }

  // Keeps the autotuned buffer within the RAM budget for elements this size.
  void note_size(size_t bytes) {
    average_bytes_ = average_bytes_ == 0 ? static_cast<double>(bytes) : 0.9 * average_bytes_ + 0.1 * static_cast<double>(bytes);
    if (average_bytes_ > 0 && ram_budget_ > 0) {
      capacity_->set_max(std::max<int64_t>(1, static_cast<int64_t>(static_cast<double>(ram_budget_) / average_bytes_)));
    }
  }

  IteratorPtr input_;  // prefetch thread only
  std::shared_ptr<Knob> capacity_;
  const int64_t ram_budget_;
  MemoryBudget& memory_;
  double average_bytes_ = 0;  // prefetch thread only
  std::thread thread_;
  Mutex mutex_;
  CondVar cv_;
  std::deque<Item> queue_ GUARDED_BY(mutex_);
  bool cancelled_ GUARDED_BY(mutex_) = false;
  bool started_ GUARDED_BY(mutex_) = false;
  bool paused_ GUARDED_BY(mutex_) = false;  // by save()
  bool busy_ GUARDED_BY(mutex_) = false;    // the thread is in input_->get_next
};

// ---- Constructors other ops reuse --------------------------------------------------

// map(parallel) fused with the batch() after it (map.cc): workers produce
// whole batches.
IteratorPtr make_map_and_batch(IteratorPtr input, MapFunction fn, int64_t parallelism, int64_t batch_size,
                               bool drop_remainder, bool deterministic, Pipeline& pipeline);
// interleave (interleave.cc), for tfrecord_dataset's parallel reads.
// cycle_length resolved (> 0); parallel: prefetch every open cycle element
// on its own thread.
IteratorPtr make_interleave(IteratorPtr input, InterleaveFunction fn, int64_t cycle_length, int64_t block_length,
                            bool parallel, bool deterministic, Pipeline& pipeline);

}  // namespace capstan::data::engine

#endif  // CAPSTAN_LIB_DATA_OPS_COMMON_H_
