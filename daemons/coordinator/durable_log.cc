#include "daemons/coordinator/durable_log.h"

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "io/durable_file.h"
#include "journal/journal.h"
#include "async/status_exception.h"
#include "async/pool.h"

namespace capstan::coordinator {
namespace {

constexpr const char* kCurrentFile = "CURRENT";

std::string journal_dir(const std::string& work_dir, int64_t generation) {
  return generation == 0 ? work_dir : work_dir + "/journal-" + std::to_string(generation);
}

// The generation CURRENT names; 0 without CURRENT.
Result<int64_t> current_generation(const std::string& work_dir) {
  std::ifstream in(work_dir + "/" + kCurrentFile);
  if (!in) return int64_t{0};
  std::string name;
  in >> name;
  const std::string prefix = "journal-";
  if (name.rfind(prefix, 0) != 0 || name.size() == prefix.size() || name.size() > prefix.size() + 18 ||
      !std::all_of(name.begin() + static_cast<std::ptrdiff_t>(prefix.size()), name.end(),
                   [](char c) { return c >= '0' && c <= '9'; })) {
    return Status::DataLoss(work_dir + "/" + kCurrentFile + " does not name a journal directory ('" + name + "')");
  }
  return std::stoll(name.substr(prefix.size()));
}

// Deletes the journal of `generation` (0: the segment files in work_dir).
void remove_journal(const std::string& work_dir, int64_t generation) {
  std::error_code ignored;
  if (generation != 0) {
    std::filesystem::remove_all(journal_dir(work_dir, generation), ignored);
    return;
  }
  for (const auto& entry : std::filesystem::directory_iterator(work_dir, ignored)) {
    std::string name = entry.path().filename().string();
    if (entry.is_regular_file(ignored) && name.rfind("journal-", 0) == 0 && name.size() > 4 &&
        name.substr(name.size() - 4) == ".log") {
      std::filesystem::remove(entry.path(), ignored);
    }
  }
}

// Journals of other generations than `current`: what a compaction that
// crashed left behind (a new one CURRENT never named, or the old one).
void remove_stale_journals(const std::string& work_dir, int64_t current) {
  std::error_code ignored;
  std::vector<int64_t> stale;
  for (const auto& entry : std::filesystem::directory_iterator(work_dir, ignored)) {
    std::string name = entry.path().filename().string();
    if (!entry.is_directory(ignored) || name.rfind("journal-", 0) != 0) continue;
    std::string digits = name.substr(8);
    if (digits.empty() || digits.size() > 18 || !std::all_of(digits.begin(), digits.end(), ::isdigit)) continue;
    if (std::stoll(digits) != current) stale.push_back(std::stoll(digits));
  }
  for (int64_t g : stale) remove_journal(work_dir, g);
  if (current != 0) remove_journal(work_dir, 0);
}

}  // namespace

Result<std::unique_ptr<DurableLog>> DurableLog::open(const std::string& work_dir, boost::asio::thread_pool& pool,
                                                     std::shared_ptr<spdlog::logger> log, Compaction compaction,
                                                     std::vector<std::string>* replay) {
  CAPSTAN_ASSIGN_OR_RETURN(int64_t generation, current_generation(work_dir));
  const std::string dir = journal_dir(work_dir, generation);
  if (generation != 0 && !std::filesystem::is_directory(dir)) {
    return Status::DataLoss(work_dir + "/" + kCurrentFile + " names " + dir +
                            ", which is missing: the coordinator's state is lost; restore the directory, or start "
                            "with an empty work_dir");
  }
  CAPSTAN_ASSIGN_OR_RETURN(*replay, journal::read_all(dir));
  auto file = std::make_shared<File>();
  {
    MutexLock lock(file->mutex);
    file->generation = generation;
    CAPSTAN_ASSIGN_OR_RETURN(file->writer, journal::JournalWriter::open(dir));
  }
  remove_stale_journals(work_dir, generation);
  std::unique_ptr<DurableLog> out(
      new DurableLog(work_dir, pool, std::move(log), std::move(compaction), std::move(file)));
  out->records_ = static_cast<int64_t>(replay->size());
  return out;
}

DurableLog::DurableLog(std::string work_dir, boost::asio::thread_pool& pool, std::shared_ptr<spdlog::logger> log,
                       Compaction compaction, std::shared_ptr<File> file)
    : work_dir_(std::move(work_dir)),
      pool_(pool),
      log_(std::move(log)),
      compaction_(std::move(compaction)),
      file_(std::move(file)),
      tasks_(*this) {}

DurableLog::~DurableLog() = default;

void DurableLog::taskFailed(kj::Exception&& exception) {
  log_->error("journal task failed: {}", async::from_exception(exception).to_string());
}

int64_t DurableLog::generation() const {
  MutexLock lock(file_->mutex);
  return file_->generation;
}

Status DurableLog::append_now(const std::string& record) {
  ++records_;
  MutexLock lock(file_->mutex);
  return file_->writer->append(record);
}

Status DurableLog::write_compacted(const std::string& work_dir, File& file, const std::vector<std::string>& records) {
  MutexLock lock(file.mutex);
  const int64_t next = file.generation + 1;
  const std::string dir = journal_dir(work_dir, next);
  std::error_code ignored;
  std::filesystem::remove_all(dir, ignored);  // a compaction that crashed before CURRENT named it
  CAPSTAN_ASSIGN_OR_RETURN(auto writer, journal::JournalWriter::open(dir));
  CAPSTAN_RETURN_IF_ERROR(writer->append_batch(records));
  CAPSTAN_RETURN_IF_ERROR(
      capstan::io::write_file_durably(work_dir + "/" + kCurrentFile, "journal-" + std::to_string(next) + "\n"));
  const int64_t old = file.generation;
  file.writer = std::move(writer);  // the old writer closes, and its lock goes
  file.generation = next;
  remove_journal(work_dir, old);
  return Status::Ok();
}

bool DurableLog::compaction_due() const {
  if (!compaction_.live_records || !compaction_.snapshot) return false;
  return records_ >= compaction_.min_records && records_ > 2 * compaction_.live_records();
}

Status DurableLog::compact_if_due() {
  if (!compaction_due()) return Status::Ok();
  auto snapshot = compaction_.snapshot();
  CAPSTAN_RETURN_IF_ERROR(write_compacted(work_dir_, *file_, snapshot).with_context("compacting the journal in " +
                                                                                     work_dir_));
  log_->info("compacted the journal: {} record(s) -> {}", records_, snapshot.size());
  records_ = static_cast<int64_t>(snapshot.size());
  ++compactions_;
  return Status::Ok();
}

void DurableLog::enqueue(std::string record) {
  queue_.push_back(std::move(record));
  ++enqueued_;
  ++records_;
  flush();
}

void DurableLog::flush() {
  if (flushing_ || queue_.empty()) return;
  flushing_ = true;
  const int64_t upto = enqueued_;
  kj::Promise<Status> written = nullptr;
  if (compaction_due()) {
    // The snapshot holds the effect of the records waiting to be written:
    // they are dropped, and their waiters answered once it is durable.
    auto snapshot = std::make_shared<std::vector<std::string>>(compaction_.snapshot());
    queue_.clear();
    log_->info("compacting the journal: {} record(s) -> {}", records_, snapshot->size());
    records_ = static_cast<int64_t>(snapshot->size());
    ++compactions_;
    written = async::run_on_pool(pool_, [work_dir = work_dir_, file = file_, snapshot]() {
      return write_compacted(work_dir, *file, *snapshot);
    });
  } else {
    auto batch = std::make_shared<std::vector<std::string>>(std::exchange(queue_, {}));
    written = async::run_on_pool(pool_, [file = file_, batch]() {
      MutexLock lock(file->mutex);
      return file->writer->append_batch(*batch);
    });
  }
  tasks_.add(written.then([this, upto](Status status) {
    flushing_ = false;
    if (!status.ok() && broken_.ok()) {
      broken_ = status.with_context("journaling the closure queue in " + work_dir_);
      log_->error("{}: closures scheduled from now on are answered with this error; restart the coordinator",
                  broken_.to_string());
    }
    durable_ = upto;
    while (!waiters_.empty() && waiters_.begin()->first <= upto) {
      waiters_.begin()->second->fulfill(Status(broken_));
      waiters_.erase(waiters_.begin());
    }
    flush();
  }));
}

kj::Promise<Status> DurableLog::synced() {
  if (durable_ >= enqueued_) return Status(broken_);
  auto paf = kj::newPromiseAndFulfiller<Status>();
  waiters_.emplace(enqueued_, kj::mv(paf.fulfiller));
  return kj::mv(paf.promise);
}

}  // namespace capstan::coordinator
