// The mirrored variables' part of a checkpoint (issue 34 item 4): each
// strategy's variables in a file of their own, "mirrored-<strategy>.safetensors",
// written by one of the strategy's replicas (rank 0 of its group) straight
// into the checkpoint's .tmp directory, as a parameter server writes its
// shards; the coordinator adds the file's size and CRC32C to the manifest
// without reading it. On a restore the worker that seeds the group reads the
// variables back itself (read_mirrored_state), each file's CRC32C checked as
// it is first read.
//
// The format is a parameter-server variable's with one shard: tensor
// "<variable>" holds the value and "<variable>/slot/<slot>" each optimizer
// slot, so either kind of variable restores into the other. Checkpoints
// written before (one "mirrored.safetensors" of every strategy, written by
// the coordinator) read the same way: variables are found by name through
// the manifest, whatever file holds them.
//
// Example (a worker, rank 0 of strategy "dense"):
//   auto saved = write_mirrored_file("/ckpt/ckpt-100.tmp", mirrored_file_name("dense"), state);
//   ...
//   auto reader = CheckpointReader::open("/ckpt/ckpt-100", {.verify_checksums_on_open = false});
//   auto state = read_mirrored_state(**reader, specs, {"w", "b"});
#ifndef CAPSTAN_LIB_CHECKPOINT_MIRRORED_FILES_H_
#define CAPSTAN_LIB_CHECKPOINT_MIRRORED_FILES_H_

#include <string>
#include <vector>

#include "capstan/status.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/manifest.h"
#include "io/file_system.h"
#include "types/replica.h"

namespace capstan::checkpoint {

// "mirrored-dense.safetensors": the file of strategy "dense". Characters
// other than [A-Za-z0-9_-] are written as %XX, so any strategy name gives a
// plain file name of its own.
std::string mirrored_file_name(const std::string& strategy);

// Writes `state` as `directory`/`file`, durably. `directory` must be a save
// in progress, "<dir>/ckpt-<step>.tmp", that exists (check_save_directory);
// `file` must be a mirrored file name ("mirrored-*.safetensors", no '/'):
// InvalidArgument otherwise; AlreadyExists when the file exists (another
// writer of the same strategy).
Result<training::SavedReplica> write_mirrored_file(const std::string& directory, const std::string& file,
                                          const training::MirroredState& state,
                                          io::FileSystem& fs = io::local_file_system());

// The manifest entries of `saved` (one shard each, in saved.file), with the
// optimizers of `specs` (by name). InvalidArgument when a saved variable is
// not in `specs` or differs from its spec in dtype or shape.
Result<std::vector<ManifestVariable>> mirrored_manifest_entries(const training::SavedReplica& saved,
                                                                const std::vector<training::MirroredSpec>& specs);

// Checks, without reading a value, that the checkpoint's variables `names`
// fit `specs` (dtype and shape, not a table): InvalidArgument naming the
// variable otherwise, NotFound for a name the checkpoint lacks or `specs`
// has not.
Status check_mirrored(const Manifest& manifest, const std::vector<training::MirroredSpec>& specs,
                      const std::vector<std::string>& names);

// Reads variables `names` of `specs` from the checkpoint: values, the slots
// it has when the optimizer kind is the spec's (another kind's start
// afresh), and the step (the largest of theirs). Errors as check_mirrored;
// DataLoss for a damaged file.
Result<training::MirroredState> read_mirrored_state(const CheckpointReader& reader,
                                                    const std::vector<training::MirroredSpec>& specs,
                                                    const std::vector<std::string>& names);

// A seed as formReplica gives it (types/replica.h ReplicaForm): variables
// `names` read from the committed checkpoint at `path` (each file's CRC32C
// checked as it is first read), the others taken from `others` when given.
// The step is the checkpoint's when it gives any variable, else others'.
Result<training::MirroredState> read_mirrored_seed(const std::string& path,
                                                   const std::vector<training::MirroredSpec>& specs,
                                                   const std::vector<std::string>& names,
                                                   const training::MirroredState* others,
                                                   io::FileSystem& fs = io::local_file_system());

}  // namespace capstan::checkpoint

#endif  // CAPSTAN_LIB_CHECKPOINT_MIRRORED_FILES_H_
