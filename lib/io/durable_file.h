// Durable file writes and the one errno -> Status table.
//
// A durable write survives a machine crash whole or not at all: the bytes go
// to "<path>.tmp", which is fsynced, renamed over <path>, and then the
// directory holding <path> is fsynced so the rename itself is on disk. A
// reader therefore sees the old file, the new one, or none, never half of
// one. Every module that must not lose or tear a file (checkpoints, the
// dispatcher's dataset definitions, the file cache, port files) uses these
// helpers instead of its own copy.
//
// errno_to_status() is the single mapping from a failed system call to a
// Status; the code says what the caller can do (Abseil's status.h):
//
//   ENOENT ENOTDIR ENXIO ENODEV                 NotFound
//   EACCES EPERM EROFS                          PermissionDenied
//   ENOSPC EDQUOT EFBIG EMFILE ENFILE ENOMEM    ResourceExhausted
//   EEXIST ENOTEMPTY                            AlreadyExists
//   EIO                                         DataLoss (the device lost data;
//                                               retrying does not bring it back)
//   EISDIR ELOOP ETXTBSY EBUSY                  FailedPrecondition
//   EINVAL ENAMETOOLONG                         InvalidArgument
//   EAGAIN EINTR ESTALE                         Unavailable (retry)
//   anything else                               Unknown
//
// The message is "<context>: <strerror>"; the context names the path.
//
// The durable writes go through an io::FileSystem (io/file_system.h); the
// overloads without one use the local file system.
//
// Thread-safety: free functions with no shared state; safe from any thread.
#ifndef CAPSTAN_LIB_IO_DURABLE_FILE_H_
#define CAPSTAN_LIB_IO_DURABLE_FILE_H_

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "capstan/status.h"
#include "io/file_system.h"

namespace capstan::io {

// A Status for the failed call that set `error_number` (see the table above).
Status errno_to_status(int error_number, std::string_view context);

// From this size on, write_file_durably bypasses the page cache
// (FileSystem::open_bulk_writable).
inline constexpr size_t kBulkFileBytes = size_t{4} << 20;

// Writes `bytes` to `path` durably (tmp, fsync, rename, fsync the directory)
// through `fs`. On failure the tmp file is removed and `path` is unchanged.
// A file of kBulkFileBytes or more bypasses the page cache.
[[nodiscard]] Status write_file_durably(FileSystem& fs, const std::string& path,
                                        const std::vector<std::string_view>& pieces);
// The same for one piece, and both on local_file_system().
[[nodiscard]] Status write_file_durably(FileSystem& fs, const std::string& path, std::string_view bytes);
[[nodiscard]] Status write_file_durably(const std::string& path, std::string_view bytes);
[[nodiscard]] Status write_file_durably(const std::string& path, const std::vector<std::string_view>& pieces);

// Makes a complete file written elsewhere (e.g. by a streaming writer) take
// the name `path` durably: fsyncs `tmp_path`, renames it to `path` and fsyncs
// the directory. On failure `tmp_path` is left for the caller to remove.
[[nodiscard]] Status commit_file_durably(FileSystem& fs, const std::string& tmp_path, const std::string& path);
[[nodiscard]] Status commit_file_durably(const std::string& tmp_path, const std::string& path);

// local_file_system().sync_dir(dir): makes the creation, removal or renaming
// of the entries of `dir` durable.
[[nodiscard]] Status fsync_dir(const std::string& dir);

}  // namespace capstan::io

#endif  // CAPSTAN_LIB_IO_DURABLE_FILE_H_
