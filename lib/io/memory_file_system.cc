#include "io/memory_file_system.h"

#include <algorithm>
#include <utility>

namespace capstan::io {

struct MemoryFileSystem::Node {
  bool is_directory = false;
  std::string data;    // now
  std::string synced;  // as of the last sync: what a crash leaves
  std::map<std::string, std::shared_ptr<Node>> entries;          // a directory's, now
  std::map<std::string, std::shared_ptr<Node>> durable_entries;  // as of its last sync
};

namespace {

std::string quoted(const std::string& path) { return "'" + path + "'"; }

}  // namespace

class MemoryFileSystem::File final : public WritableFile {
 public:
  File(MemoryFileSystem& fs, std::string path, std::shared_ptr<Node> node)
      : fs_(fs), path_(std::move(path)), node_(std::move(node)) {}

  Status append(std::string_view data) override {
    if (closed_) return Status::FailedPrecondition(quoted(path_) + " is closed");
    return fs_.append_to(*node_, path_, data);
  }
  Status sync() override {
    if (closed_) return Status::FailedPrecondition(quoted(path_) + " is closed");
    return fs_.sync_node(node_, path_);
  }
  Status close() override {
    closed_ = true;
    return Status::Ok();
  }

 private:
  MemoryFileSystem& fs_;
  const std::string path_;
  const std::shared_ptr<Node> node_;
  bool closed_ = false;
};

class MemoryFileSystem::Reader final : public RandomAccessFile {
 public:
  Reader(const MemoryFileSystem& fs, std::string path, std::shared_ptr<Node> node, uint64_t size)
      : fs_(fs), path_(std::move(path)), node_(std::move(node)), size_(size) {}

  Status read(uint64_t offset, size_t n, char* out) const override {
    MutexLock lock(fs_.mutex_);
    const std::string& data = node_->data;
    if (offset > data.size() || data.size() - offset < n) {
      return Status::Internal(quoted(path_) + " shrank while being read (end of file at offset " +
                              std::to_string(std::min<uint64_t>(offset, data.size())) + ")");
    }
    std::copy_n(data.data() + offset, n, out);
    return Status::Ok();
  }
  uint64_t size() const override { return size_; }

 private:
  const MemoryFileSystem& fs_;
  const std::string path_;
  const std::shared_ptr<Node> node_;
  const uint64_t size_;
};

class MemoryFileSystem::Lock final : public DirectoryLock {
 public:
  Lock(MemoryFileSystem& fs, std::string dir, uint64_t id) : fs_(fs), dir_(std::move(dir)), id_(id) {}
  ~Lock() override { fs_.release_lock(dir_, id_); }

 private:
  MemoryFileSystem& fs_;
  const std::string dir_;
  const uint64_t id_;
};

MemoryFileSystem::MemoryFileSystem() : root_(std::make_shared<Node>()) { root_->is_directory = true; }

MemoryFileSystem::~MemoryFileSystem() = default;

std::string MemoryFileSystem::normalize(const std::string& path) {
  std::string out = "/";
  size_t i = 0;
  while (i < path.size()) {
    size_t j = path.find('/', i);
    if (j == std::string::npos) j = path.size();
    std::string_view part(path.data() + i, j - i);
    if (!part.empty() && part != ".") {
      if (out.size() > 1) out += '/';
      out += part;
    }
    i = j + 1;
  }
  return out;
}

std::shared_ptr<MemoryFileSystem::Node> MemoryFileSystem::find(const std::string& path) const {
  std::shared_ptr<Node> node = root_;
  size_t i = 1;
  while (i < path.size()) {
    size_t j = path.find('/', i);
    if (j == std::string::npos) j = path.size();
    if (!node->is_directory) return nullptr;
    auto it = node->entries.find(path.substr(i, j - i));
    if (it == node->entries.end()) return nullptr;
    node = it->second;
    i = j + 1;
  }
  return node;
}

Result<std::shared_ptr<MemoryFileSystem::Node>> MemoryFileSystem::parent_of(const std::string& path) const {
  const std::string dir = parent_dir(path);
  std::shared_ptr<Node> parent = find(dir);
  if (parent == nullptr) return Status::NotFound("no directory " + quoted(dir));
  if (!parent->is_directory) return Status::NotFound(quoted(dir) + " is not a directory");
  return parent;
}

namespace {

std::string base_name(const std::string& path) { return path.substr(path.find_last_of('/') + 1); }

}  // namespace

Result<std::unique_ptr<WritableFile>> MemoryFileSystem::open_writable(const std::string& raw_path, WriteMode mode) {
  const std::string path = normalize(raw_path);
  MutexLock lock(mutex_);
  const std::string what = (mode == WriteMode::kAppend ? "cannot open " : "cannot create ") + quoted(path);
  std::shared_ptr<Node> node = find(path);
  if (node == nullptr) {
    if (mode == WriteMode::kAppend) return Status::NotFound(what + ": no such file");
    Result<std::shared_ptr<Node>> parent = parent_of(path);
    if (!parent.ok()) return parent.status().with_context(what);
    node = std::make_shared<Node>();
    (*parent)->entries[base_name(path)] = node;
  } else if (mode == WriteMode::kCreateNew) {
    return Status::AlreadyExists(what + ": it exists");
  } else if (node->is_directory) {
    return Status::FailedPrecondition(what + ": it is a directory");
  } else if (mode == WriteMode::kTruncate) {
    node->data.clear();
  }
  return std::unique_ptr<WritableFile>(new File(*this, path, node));
}

Result<std::unique_ptr<RandomAccessFile>> MemoryFileSystem::open_readable(const std::string& raw_path) {
  const std::string path = normalize(raw_path);
  MutexLock lock(mutex_);
  std::shared_ptr<Node> node = find(path);
  if (node == nullptr) return Status::NotFound("cannot open " + quoted(path) + ": no such file");
  if (node->is_directory) return Status::FailedPrecondition(quoted(path) + " is not a regular file");
  return std::unique_ptr<RandomAccessFile>(new Reader(*this, path, node, node->data.size()));
}

Status MemoryFileSystem::append_to(Node& node, const std::string& path, std::string_view data) {
  MutexLock lock(mutex_);
  if (limit_writes_ && data.size() > writable_bytes_) {
    node.data.append(data.substr(0, static_cast<size_t>(writable_bytes_)));
    writable_bytes_ = 0;
    return write_failure_.with_context("cannot write " + quoted(path));
  }
  if (limit_writes_) writable_bytes_ -= data.size();
  node.data.append(data);
  return Status::Ok();
}

Status MemoryFileSystem::sync_node(const std::shared_ptr<Node>& node, const std::string& path) {
  std::function<void()> hook;
  {
    MutexLock lock(mutex_);
    hook = sync_hook_;
  }
  if (hook) hook();
  MutexLock lock(mutex_);
  if (!next_sync_failure_.ok()) {
    return std::exchange(next_sync_failure_, Status::Ok()).with_context("cannot fsync " + quoted(path));
  }
  node->synced = node->data;
  ++file_syncs_;
  return Status::Ok();
}

Status MemoryFileSystem::sync_file(const std::string& raw_path) {
  const std::string path = normalize(raw_path);
  std::shared_ptr<Node> node;
  {
    MutexLock lock(mutex_);
    node = find(path);
    if (node == nullptr) return Status::NotFound("cannot open " + quoted(path) + ": no such file");
  }
  return sync_node(node, path);
}

Status MemoryFileSystem::sync_dir(const std::string& raw_dir) {
  const std::string dir = normalize(raw_dir);
  MutexLock lock(mutex_);
  std::shared_ptr<Node> node = find(dir);
  if (node == nullptr) return Status::NotFound("cannot open directory " + quoted(dir) + ": no such directory");
  if (!node->is_directory) return Status::NotFound("cannot open directory " + quoted(dir) + ": not a directory");
  if (!next_sync_failure_.ok()) {
    return std::exchange(next_sync_failure_, Status::Ok()).with_context("cannot fsync directory " + quoted(dir));
  }
  node->durable_entries = node->entries;
  ++dir_syncs_;
  return Status::Ok();
}

Status MemoryFileSystem::rename(const std::string& raw_from, const std::string& raw_to) {
  const std::string from = normalize(raw_from);
  const std::string to = normalize(raw_to);
  const std::string what = "cannot rename " + quoted(from) + " to " + quoted(to);
  MutexLock lock(mutex_);
  std::shared_ptr<Node> node = find(from);
  if (node == nullptr) return Status::NotFound(what + ": no such file");
  if (to == from || to.starts_with(from + "/")) return Status::InvalidArgument(what + ": into itself");
  Result<std::shared_ptr<Node>> to_parent = parent_of(to);
  if (!to_parent.ok()) return to_parent.status().with_context(what);
  if (std::shared_ptr<Node> target = find(to); target != nullptr) {
    if (target->is_directory != node->is_directory) return Status::FailedPrecondition(what + ": types differ");
    if (target->is_directory && !target->entries.empty()) {
      return Status::AlreadyExists(what + ": the directory is not empty");
    }
  }
  CAPSTAN_ASSIGN_OR_RETURN(std::shared_ptr<Node> from_parent, parent_of(from));
  from_parent->entries.erase(base_name(from));
  (*to_parent)->entries[base_name(to)] = node;
  return Status::Ok();
}

Status MemoryFileSystem::rename_no_replace(const std::string& from, const std::string& to) {
  {
    MutexLock lock(mutex_);
    if (find(normalize(to)) != nullptr) {
      return Status::AlreadyExists("cannot rename " + quoted(normalize(from)) + " to " + quoted(normalize(to)) +
                                   ": it exists");
    }
  }
  return rename(from, to);
}

Status MemoryFileSystem::remove(const std::string& raw_path) {
  const std::string path = normalize(raw_path);
  MutexLock lock(mutex_);
  std::shared_ptr<Node> node = find(path);
  if (node == nullptr || path == "/") return Status::NotFound("cannot remove " + quoted(path) + ": no such file");
  if (node->is_directory && !node->entries.empty()) {
    return Status::AlreadyExists("cannot remove " + quoted(path) + ": the directory is not empty");
  }
  CAPSTAN_ASSIGN_OR_RETURN(std::shared_ptr<Node> parent, parent_of(path));
  parent->entries.erase(base_name(path));
  return Status::Ok();
}

Status MemoryFileSystem::remove_all(const std::string& raw_path) {
  const std::string path = normalize(raw_path);
  MutexLock lock(mutex_);
  if (path == "/") return Status::InvalidArgument("cannot remove '/'");
  if (find(path) == nullptr) return Status::Ok();
  // Dropping the entry drops the subtree with it (nodes are shared_ptrs).
  CAPSTAN_ASSIGN_OR_RETURN(std::shared_ptr<Node> parent, parent_of(path));
  parent->entries.erase(base_name(path));
  return Status::Ok();
}

Status MemoryFileSystem::truncate(const std::string& raw_path, uint64_t size) {
  const std::string path = normalize(raw_path);
  MutexLock lock(mutex_);
  std::shared_ptr<Node> node = find(path);
  if (node == nullptr) return Status::NotFound("cannot truncate " + quoted(path) + ": no such file");
  if (node->is_directory) return Status::FailedPrecondition("cannot truncate " + quoted(path) + ": a directory");
  node->data.resize(static_cast<size_t>(size), '\0');
  return Status::Ok();
}

Status MemoryFileSystem::create_dir(const std::string& raw_dir) {
  const std::string dir = normalize(raw_dir);
  const std::string what = "cannot create directory " + quoted(dir);
  MutexLock lock(mutex_);
  if (find(dir) != nullptr) return Status::AlreadyExists(what + ": it exists");
  Result<std::shared_ptr<Node>> parent = parent_of(dir);
  if (!parent.ok()) return parent.status().with_context(what);
  auto node = std::make_shared<Node>();
  node->is_directory = true;
  (*parent)->entries[base_name(dir)] = node;
  return Status::Ok();
}

Result<std::vector<std::string>> MemoryFileSystem::list_dir(const std::string& raw_dir) {
  const std::string dir = normalize(raw_dir);
  MutexLock lock(mutex_);
  std::shared_ptr<Node> node = find(dir);
  if (node == nullptr || !node->is_directory) {
    return Status::NotFound("cannot list directory " + quoted(dir) + ": no such directory");
  }
  std::vector<std::string> names;
  for (const auto& [name, child] : node->entries) names.push_back(name);
  return names;
}

Result<FileInfo> MemoryFileSystem::stat(const std::string& raw_path) {
  const std::string path = normalize(raw_path);
  MutexLock lock(mutex_);
  std::shared_ptr<Node> node = find(path);
  if (node == nullptr) return Status::NotFound("cannot stat " + quoted(path) + ": no such file");
  FileInfo info;
  info.is_directory = node->is_directory;
  info.is_regular_file = !node->is_directory;
  info.size = node->data.size();
  return info;
}

Result<std::unique_ptr<DirectoryLock>> MemoryFileSystem::lock_dir(const std::string& raw_dir) {
  const std::string dir = normalize(raw_dir);
  MutexLock lock(mutex_);
  std::shared_ptr<Node> node = find(dir);
  if (node == nullptr || !node->is_directory) {
    return Status::NotFound("cannot open directory " + quoted(dir) + ": no such directory");
  }
  const uint64_t id = next_lock_id_++;
  if (!locked_.emplace(dir, id).second) {
    return Status::FailedPrecondition("directory " + quoted(dir) + " is locked by another holder");
  }
  return std::unique_ptr<DirectoryLock>(new Lock(*this, dir, id));
}

void MemoryFileSystem::release_lock(const std::string& dir, uint64_t id) {
  MutexLock lock(mutex_);
  // A lock from before a crash no longer holds anything.
  if (auto it = locked_.find(dir); it != locked_.end() && it->second == id) locked_.erase(it);
}

void MemoryFileSystem::fail_next_sync(Status failure) {
  MutexLock lock(mutex_);
  next_sync_failure_ = std::move(failure);
}

void MemoryFileSystem::fail_writes_after(uint64_t bytes, Status failure) {
  MutexLock lock(mutex_);
  limit_writes_ = true;
  writable_bytes_ = bytes;
  write_failure_ = std::move(failure);
}

void MemoryFileSystem::allow_writes() {
  MutexLock lock(mutex_);
  limit_writes_ = false;
}

void MemoryFileSystem::on_sync(std::function<void()> hook) {
  MutexLock lock(mutex_);
  sync_hook_ = std::move(hook);
}

void MemoryFileSystem::crash() {
  MutexLock lock(mutex_);
  locked_.clear();
  // What the disk holds: from the root down, each directory's entries as of
  // its last sync, each file's bytes as of its last sync.
  std::vector<std::shared_ptr<Node>> pending = {root_};
  while (!pending.empty()) {
    std::shared_ptr<Node> node = std::move(pending.back());
    pending.pop_back();
    node->data = node->synced;
    node->entries = node->durable_entries;
    for (const auto& [name, child] : node->entries) pending.push_back(child);
  }
}

int64_t MemoryFileSystem::file_syncs() const {
  MutexLock lock(mutex_);
  return file_syncs_;
}

int64_t MemoryFileSystem::dir_syncs() const {
  MutexLock lock(mutex_);
  return dir_syncs_;
}

Result<std::string> MemoryFileSystem::contents(const std::string& raw_path) const {
  const std::string path = normalize(raw_path);
  MutexLock lock(mutex_);
  std::shared_ptr<Node> node = find(path);
  if (node == nullptr) return Status::NotFound("no file " + quoted(path));
  if (node->is_directory) return Status::FailedPrecondition(quoted(path) + " is a directory");
  return node->data;
}

void MemoryFileSystem::set_contents(const std::string& raw_path, std::string bytes) {
  const std::string path = normalize(raw_path);
  MutexLock lock(mutex_);
  std::shared_ptr<Node> node = find(path);
  if (node == nullptr || node->is_directory) return;
  node->data = std::move(bytes);
  node->synced = node->data;
}

}  // namespace capstan::io
