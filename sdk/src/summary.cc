// SummaryWriter and read_scalar_events (capstan/summary.h): Event protos
// (event.proto) in TFRecord framing, through the pipeline engine's
// TFRecordWriter and TFRecordReader.
#include "capstan/summary.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <string_view>
#include <system_error>
#include <utility>

#include "data/io/file.h"
#include "data/io/tfrecord.h"
#include "event.pb.h"
#include "io/durable_file.h"
#include "sync/mutex.h"

namespace capstan {
namespace {

using Clock = std::chrono::steady_clock;

// What TensorFlow 2 writes; TensorBoard accepts any "brain.Event:N".
constexpr std::string_view kFileVersion = "brain.Event:2";
constexpr std::string_view kFileVersionPrefix = "brain.Event:";

// The writers this process has created: the <n> of the file names.
std::atomic<uint64_t> writers_created{0};

std::string in_quotes(std::string_view s) { return "'" + std::string(s) + "'"; }

double wall_time_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string hostname() {
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0 || name[0] == '\0') return "localhost";
  return name;
}

// events.out.tfevents.<seconds, 10 digits>.<hostname>.<pid>.<n><suffix>
std::string event_file_name(const std::string& suffix) {
  const auto seconds =
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  char stamp[32];
  std::snprintf(stamp, sizeof(stamp), "%010lld", static_cast<long long>(seconds));
  return "events.out.tfevents." + std::string(stamp) + "." + hostname() + "." + std::to_string(::getpid()) + "." +
         std::to_string(writers_created.fetch_add(1)) + suffix;
}

// A Status for the failed call that set `error_number`, with what to do.
Status system_error(int error_number, const std::string& context, std::string_view fix) {
  Status status = io::errno_to_status(error_number, context);
  return Status(status.code(), status.message() + "; " + std::string(fix));
}

// The bytes of an event file on their way to it. TFRecordWriter frames the
// records into memory here; flush() hands them to the file with write(2), so
// each flush appends whole records (unless a write fails part-way).
// Not thread-safe: the SummaryWriter's mutex guards it.
class EventFileStream final : public data::io::OutputStream {
 public:
  EventFileStream(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  ~EventFileStream() override { (void)close(); }

  Status write(const void* data, size_t n) override {
    if (closed_) return Status::FailedPrecondition("write to closed event file " + in_quotes(path_));
    if (!status_.ok()) return status_;
    pending_.append(static_cast<const char*>(data), n);
    return Status::Ok();
  }

  Status flush() {
    if (!status_.ok() || closed_) return status_;
    size_t done = 0;
    while (done < pending_.size()) {
      ssize_t n = ::write(fd_, pending_.data() + done, pending_.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        status_ = system_error(errno, "cannot write TensorBoard events to " + in_quotes(path_),
                               "check that its disk has room and the file is writable");
        break;
      }
      done += static_cast<size_t>(n);
    }
    pending_.erase(0, done);
    return status_;
  }

  Status close() override {
    if (closed_) return status_;
    Status flushed = flush();
    closed_ = true;
    if (::close(fd_) != 0 && flushed.ok()) {
      status_ = system_error(errno, "cannot close event file " + in_quotes(path_),
                             "its last events may be lost; check the disk");
    }
    return status_;
  }

 private:
  const int fd_;
  const std::string path_;
  std::string pending_;  // framed records not yet written
  Status status_;        // the first error; sticky
  bool closed_ = false;
};

std::string serialize(const tfevent::Event& event) {
  std::string bytes;
  event.SerializeToString(&bytes);
  return bytes;
}

}  // namespace

struct SummaryWriter::Impl {
  // Constant after construction.
  std::string path;
  SummaryWriterOptions options;

  Mutex mutex;
  std::unique_ptr<data::io::TFRecordWriter> records GUARDED_BY(mutex);
  EventFileStream* stream GUARDED_BY(mutex) = nullptr;  // owned by `records`
  int waiting GUARDED_BY(mutex) = 0;                    // events not yet written to the file
  Clock::time_point last_flush GUARDED_BY(mutex);
  bool closed GUARDED_BY(mutex) = false;
  Status status GUARDED_BY(mutex);  // the first error (or close()'s result); sticky

  Status append(const tfevent::Event& event) REQUIRES(mutex) {
    if (closed) {
      return Status::FailedPrecondition("SummaryWriter for " + in_quotes(path) +
                                        " is closed; create a new one to write more events");
    }
    if (!status.ok()) return status;
    Status written = records->write(serialize(event));
    if (!written.ok()) return status = written;
    ++waiting;
    return Status::Ok();
  }

  Status flush() REQUIRES(mutex) {
    if (closed || !status.ok()) return status;
    status = stream->flush();
    waiting = 0;
    last_flush = Clock::now();
    return status;
  }
};

SummaryWriter::SummaryWriter(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

SummaryWriter::~SummaryWriter() { (void)close(); }

Result<std::unique_ptr<SummaryWriter>> SummaryWriter::create(const std::string& logdir,
                                                             const SummaryWriterOptions& options) {
  if (logdir.empty()) {
    return Status::InvalidArgument("SummaryWriter needs a logdir: the directory for TensorBoard's event files");
  }
  if (options.filename_suffix.find('/') != std::string::npos) {
    return Status::InvalidArgument("filename_suffix " + in_quotes(options.filename_suffix) +
                                   " contains '/'; the suffix is part of a file name");
  }
  if (options.max_queue < 1) {
    return Status::InvalidArgument("max_queue must be at least 1, got " + std::to_string(options.max_queue));
  }
  std::error_code error;
  if (std::filesystem::exists(logdir, error) && !std::filesystem::is_directory(logdir, error)) {
    return Status::FailedPrecondition(in_quotes(logdir) + " is not a directory; pass a directory (or a path "
                                      "that does not exist yet) as the logdir");
  }
  std::filesystem::create_directories(logdir, error);
  if (error) {
    return system_error(error.value(), "cannot create log directory " + in_quotes(logdir),
                        "pass a logdir this program can create and write to");
  }
  auto impl = std::make_unique<Impl>();
  impl->path = (std::filesystem::path(logdir) / event_file_name(options.filename_suffix)).string();
  impl->options = options;
  // O_EXCL: never truncate another writer's file.
  const int fd = ::open(impl->path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) {
    return system_error(errno, "cannot create event file " + in_quotes(impl->path),
                        "pass a logdir this program can write to");
  }
  Status started;
  {
    MutexLock lock(impl->mutex);
    auto stream = std::make_unique<EventFileStream>(fd, impl->path);
    impl->stream = stream.get();
    impl->records = std::make_unique<data::io::TFRecordWriter>(std::move(stream));
    tfevent::Event version;
    version.set_wall_time(wall_time_now());
    version.set_file_version(std::string(kFileVersion));
    started = impl->append(version);
    if (started.ok()) started = impl->flush();
  }
  if (!started.ok()) {
    std::filesystem::remove(impl->path, error);  // a file without its first event is no event file
    return started;
  }
  return std::unique_ptr<SummaryWriter>(new SummaryWriter(std::move(impl)));
}

Status SummaryWriter::scalar(const std::string& tag, double value, int64_t step) {
  if (tag.empty()) {
    return Status::InvalidArgument("SummaryWriter::scalar needs a tag: the name to plot the value under, "
                                   "e.g. \"train/loss\"");
  }
  MutexLock lock(impl_->mutex);
  tfevent::Event event;
  event.set_wall_time(wall_time_now());
  event.set_step(step);
  tfevent::Summary::Value* summary_value = event.mutable_summary()->add_value();
  summary_value->set_tag(tag);
  summary_value->set_simple_value(static_cast<float>(value));
  CAPSTAN_RETURN_IF_ERROR(impl_->append(event));
  if (impl_->waiting >= impl_->options.max_queue ||
      Clock::now() - impl_->last_flush >= impl_->options.flush_interval) {
    return impl_->flush();
  }
  return Status::Ok();
}

Status SummaryWriter::flush() {
  MutexLock lock(impl_->mutex);
  return impl_->flush();
}

Status SummaryWriter::close() {
  MutexLock lock(impl_->mutex);
  if (impl_->closed) return impl_->status;
  Status closed = impl_->records->close();  // flushes the stream, closes the file
  impl_->closed = true;
  impl_->stream = nullptr;
  if (impl_->status.ok()) impl_->status = closed;
  return impl_->status;
}

const std::string& SummaryWriter::path() const { return impl_->path; }

Result<std::vector<ScalarEvent>> read_scalar_events(const std::string& path) {
  auto reader = data::io::TFRecordReader::open(path, data::io::Compression::kNone);
  if (!reader.ok()) return reader.status().with_context("reading TensorBoard events");
  std::vector<ScalarEvent> scalars;
  std::string record;
  for (int64_t index = 0;; ++index) {
    const uint64_t offset = (*reader)->offset();
    auto more = (*reader)->read(&record);
    if (!more.ok()) return more.status().with_context("reading TensorBoard events");
    if (!*more) {
      if (index == 0) {
        return Status::DataLoss(in_quotes(path) + " is empty, not a TensorBoard event file (its first record "
                                "is the file_version event)");
      }
      return scalars;
    }
    tfevent::Event event;
    if (!event.ParseFromString(record)) {
      return Status::DataLoss("record at offset " + std::to_string(offset) + " in " + in_quotes(path) +
                              " is not an Event protocol buffer; is it a TensorBoard event file?");
    }
    if (index == 0) {
      if (event.what_case() != tfevent::Event::kFileVersion ||
          !std::string_view(event.file_version()).starts_with(kFileVersionPrefix)) {
        return Status::DataLoss(in_quotes(path) + " is not a TensorBoard event file: its first record is not the "
                                "file_version event (\"" + std::string(kFileVersion) + "\")");
      }
      continue;
    }
    if (event.what_case() != tfevent::Event::kSummary) continue;
    for (const tfevent::Summary::Value& value : event.summary().value()) {
      if (value.value_case() != tfevent::Summary::Value::kSimpleValue) continue;
      scalars.push_back({event.wall_time(), event.step(), value.tag(), static_cast<double>(value.simple_value())});
    }
  }
}

}  // namespace capstan
