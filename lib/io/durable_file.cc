#include "io/durable_file.h"

#include <cerrno>
#include <cstdio>
#include <cstring>

namespace capstan::io {

Status errno_to_status(int error_number, std::string_view context) {
  std::string message(context);
  message += ": ";
  message += std::strerror(error_number);
  switch (error_number) {
    case ENOENT:
    case ENOTDIR:
    case ENXIO:
    case ENODEV:
      return Status::NotFound(std::move(message));
    case EACCES:
    case EPERM:
    case EROFS:
      return Status::PermissionDenied(std::move(message));
    case ENOSPC:
    case EDQUOT:
    case EFBIG:
    case EMFILE:
    case ENFILE:
    case ENOMEM:
      return Status::ResourceExhausted(std::move(message));
    case EEXIST:
    case ENOTEMPTY:
      return Status::AlreadyExists(std::move(message));
    case EIO:
      return Status::DataLoss(std::move(message));
    case EISDIR:
    case ELOOP:
    case ETXTBSY:
    case EBUSY:
      return Status::FailedPrecondition(std::move(message));
    case EINVAL:
    case ENAMETOOLONG:
      return Status::InvalidArgument(std::move(message));
    case EAGAIN:
    case EINTR:
    case ESTALE:
      return Status::Unavailable(std::move(message));
    default:
      return Status::Unknown(std::move(message));
  }
}

Status fsync_dir(const std::string& dir) { return local_file_system().sync_dir(dir); }

Status commit_file_durably(FileSystem& fs, const std::string& tmp_path, const std::string& path) {
  CAPSTAN_RETURN_IF_ERROR(fs.sync_file(tmp_path));
  CAPSTAN_RETURN_IF_ERROR(fs.rename(tmp_path, path));
  return fs.sync_dir(parent_dir(path));
}

Status commit_file_durably(const std::string& tmp_path, const std::string& path) {
  return commit_file_durably(local_file_system(), tmp_path, path);
}

Status write_file_durably(FileSystem& fs, const std::string& path, const std::vector<std::string_view>& pieces) {
  const std::string tmp = path + ".tmp";
  Status status;
  {
    size_t bytes = 0;
    for (std::string_view piece : pieces) bytes += piece.size();
    CAPSTAN_ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file, bytes >= kBulkFileBytes
                                                                     ? fs.open_bulk_writable(tmp)
                                                                     : fs.open_writable(tmp, WriteMode::kTruncate));
    for (std::string_view piece : pieces) {
      status = file->append(piece);
      if (!status.ok()) break;
    }
    if (status.ok()) status = file->sync();
    Status closed = file->close();
    if (status.ok()) status = closed;
  }
  if (status.ok()) status = fs.rename(tmp, path);
  if (!status.ok()) {
    (void)fs.remove(tmp);  // best effort: the failure above is the one to report
    return status;
  }
  return fs.sync_dir(parent_dir(path));
}

Status write_file_durably(FileSystem& fs, const std::string& path, std::string_view bytes) {
  return write_file_durably(fs, path, std::vector<std::string_view>{bytes});
}

Status write_file_durably(const std::string& path, std::string_view bytes) {
  return write_file_durably(local_file_system(), path, bytes);
}

Status write_file_durably(const std::string& path, const std::vector<std::string_view>& pieces) {
  return write_file_durably(local_file_system(), path, pieces);
}

}  // namespace capstan::io
