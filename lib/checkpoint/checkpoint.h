// Checkpoint directories: saving, keeping and restoring the variables and
// optimizer slots of a training job, after tf.train.CheckpointManager, in
// files that Python's `safetensors` package reads.
//
// Layout of a checkpoint root directory:
//
//   <dir>/checkpoint                  the index: latest and kept (manifest.h)
//   <dir>/ckpt-1100/manifest.json     what the files hold (manifest.h)
//   <dir>/ckpt-1100/ps-0.safetensors  shards and slots, one file per PS task
//   <dir>/ckpt-1100/ps-1.safetensors
//   <dir>/ckpt-1200/...
//   <dir>/ckpt-1300.tmp/              a save in progress, or one that crashed
//
// Saving: CheckpointWriter::begin() creates ckpt-<step>.tmp/; the data files
// are written into it (add_file(), or by PS tasks writing into path()
// directly); commit() checksums them into the manifest, writes it, fsyncs,
// and renames the directory to ckpt-<step>. The rename is the commit point:
// a ckpt-<step> directory is always complete, and a crash leaves at most a
// .tmp directory, which readers ignore and the next commit removes. Then the
// index is rewritten (tmp + rename) and the oldest checkpoints beyond
// max_to_keep are deleted.
//
// Checkpoints are ordered by step. The directory listing, not the index, is
// the truth for latest_checkpoint() and list_checkpoints(): the index is
// written after the rename, so a crash between the two leaves it one save
// behind.
//
// Restoring: CheckpointReader verifies every file against the manifest
// (size and CRC32C) and then reads logical variables whole or by rows,
// whatever their partitioning was, so a job can restore into a different
// number of PS tasks or shards (which TensorFlow forbids):
//
//   CAPSTAN_ASSIGN_OR_RETURN(std::string latest, latest_checkpoint("/ckpt"));
//   CAPSTAN_ASSIGN_OR_RETURN(auto reader, CheckpointReader::open(latest));
//   // This PS now holds rows [40, 80) of "embedding":
//   CAPSTAN_ASSIGN_OR_RETURN(Tensor rows, reader->read_variable_rows("embedding", 40, 80));
//
// One CheckpointWriter at a time per root directory (the coordinator's);
// readers may run alongside it, but a reader of a checkpoint that
// max_to_keep deletes will fail.
//
// Every file and directory is reached through an io::FileSystem, the local
// one unless a test hands in io::MemoryFileSystem (to fail an fsync or a
// write, or to crash); the writer and readers keep a reference to it, so it
// must outlive them.
#ifndef CAPSTAN_LIB_CHECKPOINT_CHECKPOINT_H_
#define CAPSTAN_LIB_CHECKPOINT_CHECKPOINT_H_

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "capstan/status.h"
#include "capstan/tensor.h"
#include "checkpoint/manifest.h"
#include "checkpoint/safetensors.h"
#include "io/file_system.h"

namespace capstan::checkpoint {

// "ckpt-1200".
std::string checkpoint_name(int64_t step);

// Writes one checkpoint.
//
// Thread-safety: not thread-safe; one thread drives a writer.
class CheckpointWriter {
 public:
  // Creates `dir` if needed and the empty directory dir/ckpt-<step>.tmp/
  // (replacing one a crashed save of the same step left). AlreadyExists when
  // dir/ckpt-<step> exists; InvalidArgument for a negative step.
  // max_to_keep: how many checkpoints commit() keeps, newest by step; 0 or
  // less keeps all (TensorFlow's max_to_keep=None).
  static Result<std::unique_ptr<CheckpointWriter>> begin(const std::string& dir, int64_t step,
                                                         int max_to_keep,
                                                         io::FileSystem& fs = io::local_file_system());
  // Removes the .tmp directory of a save that was not committed.
  ~CheckpointWriter();
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  // The .tmp directory the data files go into.
  const std::string& path() const { return tmp_path_; }
  // Where the checkpoint will be once committed: dir/ckpt-<step>.
  const std::string& checkpoint_path() const { return final_path_; }

  // Writes path()/name as a safetensors file (write_safetensors). `name` is a
  // plain file name, not "manifest.json" nor one added before
  // (InvalidArgument); FailedPrecondition after commit().
  Status add_file(const std::string& name,
                  const std::vector<std::pair<std::string, Tensor>>& tensors,
                  const std::map<std::string, std::string>& metadata = {});

  // Sets manifest.step and manifest.files (every file in path(): name, size,
  // CRC32C, whatever wrote it), checks the manifest against the files
  // (InvalidArgument: validate_manifest, or a shard or slot tensor missing or
  // of the wrong dtype or shape), writes manifest.json, fsyncs, renames the
  // directory to checkpoint_path() (AlreadyExists if it appeared meanwhile),
  // rewrites the index, deletes checkpoints beyond max_to_keep (oldest
  // first) and the .tmp directories of crashed saves. Once only
  // (FailedPrecondition after); an error after the rename leaves the
  // checkpoint committed.
  Status commit(Manifest manifest);
  // The same, for files others wrote and checksummed while writing (the
  // parameter servers' own files, issue 34): a file named in `written` is
  // not read back; its size is checked against the directory and its CRC32C
  // taken as given (the reader verifies it). Other files are checksummed.
  Status commit(Manifest manifest, const std::vector<ManifestFile>& written);

 private:
  CheckpointWriter(io::FileSystem& fs, std::string dir, int64_t step, int max_to_keep);
  Status apply_retention();

  io::FileSystem& fs_;
  const std::string dir_;
  const int64_t step_;
  const int max_to_keep_;
  const std::string tmp_path_;
  const std::string final_path_;
  bool done_ = false;  // commit() was called
  std::vector<std::string> added_;
};

// The size and CRC32C of `directory`/`name`, reading the whole file: its
// entry in a manifest.
Result<ManifestFile> describe_file(const std::string& directory, const std::string& name,
                                   io::FileSystem& fs = io::local_file_system());

// The committed checkpoints in `dir` (directories ckpt-<step>), as paths
// "dir/ckpt-<step>", oldest (lowest step) first; .tmp directories are not
// checkpoints. NotFound when `dir` does not exist.
Result<std::vector<std::string>> list_checkpoints(const std::string& dir,
                                                  io::FileSystem& fs = io::local_file_system());
// The step of a committed checkpoint's directory name "ckpt-<step>";
// nullopt for anything else (".tmp" directories included).
std::optional<int64_t> checkpoint_step(std::string_view name);
// The last of list_checkpoints(); NotFound when there is none.
Result<std::string> latest_checkpoint(const std::string& dir, io::FileSystem& fs = io::local_file_system());
// The index file dir/checkpoint; NotFound when there is none, DataLoss when
// it is damaged.
Result<CheckpointIndex> read_checkpoint_index(const std::string& dir,
                                              io::FileSystem& fs = io::local_file_system());

struct CheckpointReaderOptions {
  // True: open() reads every file to check its CRC32C. False: open() checks
  // sizes only and each file's CRC32C is checked the first time a read needs
  // that file, so restoring a few shards reads only their files.
  bool verify_checksums_on_open = true;
};

// Reads one committed checkpoint.
//
// Errors: NotFound when there is no such checkpoint, variable or slot;
// InvalidArgument for rows out of range; DataLoss "checkpoint <path> is
// damaged: ..." naming the file for a missing, resized or corrupted file, a
// bad manifest, or tensors that do not match it.
//
// Thread-safety: after open(), every method may be called from many threads.
class CheckpointReader {
 public:
  static Result<std::unique_ptr<CheckpointReader>> open(const std::string& checkpoint_dir,
                                                        CheckpointReaderOptions options = {},
                                                        io::FileSystem& fs = io::local_file_system());
  CheckpointReader(const CheckpointReader&) = delete;
  CheckpointReader& operator=(const CheckpointReader&) = delete;

  const std::string& path() const { return path_; }
  const Manifest& manifest() const { return manifest_; }

  // The whole logical variable, reassembled from its shards.
  Result<Tensor> read_variable(const std::string& name) const;
  // The whole slot `slot` of `variable` (same dtype and shape).
  Result<Tensor> read_slot(const std::string& variable, const std::string& slot) const;
  // Rows [begin, end) of dimension 0 of a variable (rank >= 1), reading only
  // the shards, and only the rows of them, that hold those rows.
  Result<Tensor> read_variable_rows(const std::string& name, int64_t begin, int64_t end) const;
  Result<Tensor> read_slot_rows(const std::string& variable, const std::string& slot, int64_t begin,
                                int64_t end) const;
  // A data file of the checkpoint by name (one besides the variables', such
  // as the per-worker iterator positions), after its CRC32C check. NotFound
  // when the checkpoint lists no such file.
  Result<const SafetensorsReader*> file(const std::string& name) const;

 private:
  struct File {
    ManifestFile entry;
    std::unique_ptr<SafetensorsReader> reader;
    std::once_flag verify_once;  // the lazy CRC check
    Status verified;
    std::once_flag open_once;  // file(): a file no variable's shard is in, opened when asked for
    Status opened;
  };

  explicit CheckpointReader(io::FileSystem& fs) : fs_(fs) {}
  Status damaged(const std::string& why) const;
  // The reader of `file`, after its CRC check where that was deferred.
  Result<const SafetensorsReader*> file_reader(const std::string& file) const;
  Result<const ManifestVariable*> find_variable(const std::string& name) const;
  // `slot` empty: the variable itself.
  Result<Tensor> read_rows(const ManifestVariable& var, const std::string& slot, int64_t begin,
                           int64_t end) const;

  // All constant after open(), but for the lazy verification state in files_.
  io::FileSystem& fs_;
  std::string path_;
  Manifest manifest_;
  std::map<std::string, std::unique_ptr<File>> files_;
};

// The text of `capstanctl checkpoint inspect DIR`: the step, the files with
// their sizes and checksums, and each variable with dtype, shape,
// partitioning, shards, optimizer and slots.
std::string describe(const CheckpointReader& reader);

}  // namespace capstan::checkpoint

#endif  // CAPSTAN_LIB_CHECKPOINT_CHECKPOINT_H_
