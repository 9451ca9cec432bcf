#include "io/durable_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

namespace capstan::io {
namespace {

Status write_all(int fd, std::string_view bytes, const std::string& path) {
  while (!bytes.empty()) {
    ssize_t n = ::write(fd, bytes.data(), bytes.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno_to_status(errno, "cannot write '" + path + "'");
    }
    bytes.remove_prefix(static_cast<size_t>(n));
  }
  return Status::Ok();
}

Status fsync_fd(int fd, const std::string& what) {
  while (::fsync(fd) != 0) {
    if (errno == EINTR) continue;
    return errno_to_status(errno, "cannot fsync " + what);
  }
  return Status::Ok();
}

}  // namespace

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

std::string parent_dir(const std::string& path) {
  size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

Status fsync_dir(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return errno_to_status(errno, "cannot open directory '" + dir + "'");
  Status status = fsync_fd(fd, "directory '" + dir + "'");
  ::close(fd);
  return status;
}

Status commit_file_durably(const std::string& tmp_path, const std::string& path) {
  int fd = ::open(tmp_path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno_to_status(errno, "cannot open '" + tmp_path + "'");
  Status status = fsync_fd(fd, "'" + tmp_path + "'");
  ::close(fd);
  CAPSTAN_RETURN_IF_ERROR(status);
  if (::rename(tmp_path.c_str(), path.c_str()) != 0) {
    return errno_to_status(errno, "cannot rename '" + tmp_path + "' to '" + path + "'");
  }
  return fsync_dir(parent_dir(path));
}

Status write_file_durably(const std::string& path, const std::vector<std::string_view>& pieces) {
  const std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return errno_to_status(errno, "cannot create '" + tmp + "'");
  Status status;
  for (std::string_view piece : pieces) {
    status = write_all(fd, piece, tmp);
    if (!status.ok()) break;
  }
  if (status.ok()) status = fsync_fd(fd, "'" + tmp + "'");
  if (::close(fd) != 0 && status.ok()) status = errno_to_status(errno, "cannot close '" + tmp + "'");
  if (status.ok() && ::rename(tmp.c_str(), path.c_str()) != 0) {
    status = errno_to_status(errno, "cannot rename '" + tmp + "' to '" + path + "'");
  }
  if (!status.ok()) {
    ::unlink(tmp.c_str());
    return status;
  }
  return fsync_dir(parent_dir(path));
}

Status write_file_durably(const std::string& path, std::string_view bytes) {
  return write_file_durably(path, std::vector<std::string_view>{bytes});
}

}  // namespace capstan::io
