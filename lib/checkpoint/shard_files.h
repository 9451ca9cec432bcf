// A parameter server's part of a checkpoint: the data file it writes itself
// (its shards, their slots, its tables' rows) and what it reads back on a
// restore, whatever partitioning the checkpoint was saved with. Transport-
// free: the ps-server's service and the coordinator's test fakes use it.
//
// Saving (issue 34's parallel save): each parameter server task writes
// "ps-<task>.safetensors" into the checkpoint's .tmp directory with
// write_shard_file() and reports its size and CRC32C; the coordinator writes
// the manifest from those reports (CheckpointWriter::commit with `written`)
// without reading the file. The tensors are named as manifest.h says:
//
//   "w/part_0"                      a variable shard's value
//   "w/part_0/slot/m"               its slots
//   "emb/part_1", "emb/part_1/keys", "emb/part_1/meta", "emb/part_1/slot/accumulator"
//                                   a table shard's rows
//
// Restoring: read_shard_rows() reads rows [first, first + n) of a saved
// variable, from only the files and byte ranges of the saved shards that
// hold them; read_table_part() gathers the rows of a table that part p of P
// holds now (table_shard_of(key, P) == p): from saved shard p alone when the
// table was saved on P shards too, else from every saved shard, filtered.
//
// Example (a parameter server with shards w/part_0 and emb/part_0):
//   auto file = write_shard_file("/ckpt/ckpt-100.tmp", "ps-0.safetensors",
//                                {{"w/part_0", value, {{"m", m}, {"v", v}}}}, {{"emb/part_0", rows, {"accumulator"}}});
//   ...
//   auto reader = CheckpointReader::open("/ckpt/ckpt-100", {.verify_checksums_on_open = false});
//   auto rows = read_shard_rows(**reader, "w", 0, 50, /*with_slots=*/true);
#ifndef CAPSTAN_LIB_CHECKPOINT_SHARD_FILES_H_
#define CAPSTAN_LIB_CHECKPOINT_SHARD_FILES_H_

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "capstan/status.h"
#include "capstan/tensor.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/manifest.h"
#include "io/file_system.h"
#include "types/table_rows.h"

namespace capstan::checkpoint {

// "ps-3.safetensors": the data file of parameter server task 3.
std::string ps_file_name(int task);
// Whether `name` is a data file name a parameter server may write
// ("ps-<task>.safetensors").
bool is_ps_file_name(const std::string& name);

// Whether `directory` is a save in progress that a server or worker may
// write into: "<dir>/ckpt-<step>.tmp" (InvalidArgument otherwise, so that a
// bad request cannot write elsewhere) that exists here (NotFound: the
// checkpoint directory must be reached at the same path everywhere, a shared
// file system). `what` starts the messages ("beginSave").
Status check_save_directory(const std::string& directory, const std::string& what,
                            io::FileSystem& fs = io::local_file_system());

// A variable shard as saved or restored: its value and its slots by name.
struct ShardTensors {
  std::string name;
  Tensor value;
  std::vector<std::pair<std::string, Tensor>> slots;  // the optimizer's order
  int64_t step = 0;
};

// A table shard as saved: its rows and the names of rows.slots, in order.
struct TableShardTensors {
  std::string name;
  ps::TableRows rows;
  std::vector<std::string> slots;
};

// Writes `directory`/`file` (is_ps_file_name; InvalidArgument otherwise),
// durably, with every tensor of `shards` and `tables`; AlreadyExists when it
// exists (a second writer of the same task). Its size and CRC32C.
Result<ManifestFile> write_shard_file(const std::string& directory, const std::string& file,
                                      const std::vector<ShardTensors>& shards,
                                      const std::vector<TableShardTensors>& tables,
                                      io::FileSystem& fs = io::local_file_system());

// Rows [first_row, first_row + rows) of variable `variable` (a scalar: the
// whole of it, first_row 0 and rows 1), and, with_slots, every slot the
// checkpoint has for it; step: the variable's optimizer step. NotFound when
// the checkpoint has no such variable; InvalidArgument for rows out of range
// or a table.
Result<ShardTensors> read_shard_rows(const CheckpointReader& reader, const std::string& variable,
                                     int64_t first_row, int64_t rows, bool with_slots);

// The rows of table `saved` that part `part` of `parts` holds, with every
// slot the checkpoint has (saved.slots order). DataLoss when a saved shard's
// tensors do not match the manifest.
Result<ps::TableRows> read_table_part(const CheckpointReader& reader, const ManifestVariable& saved, int part,
                                      int parts);

}  // namespace capstan::checkpoint

#endif  // CAPSTAN_LIB_CHECKPOINT_SHARD_FILES_H_
