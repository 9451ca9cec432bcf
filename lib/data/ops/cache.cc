// cache(filename): the first complete pass kept, in memory or in a file,
// and read by later passes.
#include <cstdio>
#include <filesystem>
#include <unistd.h>

#include "data/io/tfrecord.h"
#include "data/op_kernel.h"
#include "data/ops/common.h"
#include "io/durable_file.h"
#include "rpc/tensor_codec.h"
#include "sync/mutex.h"

namespace capstan::data::engine {

namespace {

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

CAPSTAN_DATASET_OP(kCacheKernel) = {
    .which = Op::CACHE,
    .name = "cache",
    .inputs = Inputs::kOne,
    .describe_args = [](Op::Reader op, std::ostream& out) { out << op.getCache().getFilename().cStr(); },
    .cardinality = input_cardinality,
    .make = [](Op::Reader op, Pipeline& pipeline) -> Result<IteratorPtr> {
      std::string filename = op.getCache().getFilename().cStr();
      if (filename.empty()) {
        CAPSTAN_ASSIGN_OR_RETURN(IteratorPtr in, make_input(op, pipeline));
        return IteratorPtr(std::make_unique<MemoryCacheIterator>(std::move(in), pipeline.state<MemoryCache>(op_key(op)),
                                                              pipeline.memory()));
      }
      return IteratorPtr(
          std::make_unique<FileCacheIterator>(input_factory(op.getInput(), pipeline), std::move(filename)));
    },
};

}  // namespace capstan::data::engine
