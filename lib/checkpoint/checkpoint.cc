#include "checkpoint/checkpoint.h"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <optional>
#include <set>

#include "io/crc32c.h"
#include "io/durable_file.h"
#include "data/tensor_util.h"
#include "rpc/optimizer_codec.h"

namespace capstan::checkpoint {
namespace {

constexpr std::string_view kCheckpointPrefix = "ckpt-";
constexpr std::string_view kTmpSuffix = ".tmp";

std::string in_quotes(std::string_view s) { return "'" + std::string(s) + "'"; }

std::string strip_trailing_slashes(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  return path;
}

std::string join(const std::string& dir, std::string_view name) {
  return dir + "/" + std::string(name);
}

// The last part of "dir/name".
std::string base_name(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

std::string hex32(uint32_t value) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "0x%08x", value);
  return buf;
}

}  // namespace

std::optional<int64_t> checkpoint_step(std::string_view name) {
  if (!name.starts_with(kCheckpointPrefix)) return std::nullopt;
  int64_t step;
  if (!internal::parse_json_int64(name.substr(kCheckpointPrefix.size()), &step) || step < 0) {
    return std::nullopt;
  }
  return step;
}

namespace {

bool is_stale_tmp(std::string_view name) {
  return name.ends_with(kTmpSuffix) &&
         checkpoint_step(name.substr(0, name.size() - kTmpSuffix.size())).has_value();
}

// A plain file name inside a checkpoint directory.
bool is_plain_file_name(const std::string& name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos;
}

struct SizeAndCrc {
  uint64_t size = 0;
  uint32_t crc = 0;
};

Result<SizeAndCrc> checksum_file(io::FileSystem& fs, const std::string& path) {
  CAPSTAN_ASSIGN_OR_RETURN(std::unique_ptr<io::RandomAccessFile> file, fs.open_readable(path));
  std::vector<char> buf(size_t{1} << 20);
  SizeAndCrc out;
  while (out.size < file->size()) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(buf.size(), file->size() - out.size));
    CAPSTAN_RETURN_IF_ERROR(file->read(out.size, n, buf.data()));
    out.crc = io::crc32c_extend(out.crc, buf.data(), n);
    out.size += n;
  }
  return out;
}

// The shape of a shard (or its slot) of `var` holding `rows` rows.
Shape shard_shape(const ManifestVariable& var, int64_t rows) {
  Shape shape = var.shape;
  if (!shape.empty()) shape[0] = rows;
  return shape;
}

// The first shard or slot tensor that is missing from its file or does not
// have the dtype and shape the manifest gives it, described; nullopt if all
// match. `files` holds a reader for every file a shard names.
std::optional<std::string> find_tensor_mismatch(
    const Manifest& manifest, const std::map<std::string, const SafetensorsReader*>& files) {
  for (const auto& var : manifest.variables) {
    for (const auto& shard : var.shards) {
      const SafetensorsReader* reader = files.at(shard.file);
      std::vector<std::string> names = {shard.name};
      for (const auto& slot : var.slots) names.push_back(slot_tensor_name(shard.name, slot));
      for (const auto& name : names) {
        auto info = reader->info(name);
        if (!info.ok()) {
          return "file " + shard.file + " has no tensor " + in_quotes(name) + " (variable " +
                 in_quotes(var.name) + ")";
        }
        const Shape expected = shard_shape(var, shard.rows);
        if (info->dtype != var.dtype || info->shape != expected) {
          std::string dtype = info->dtype == DType::kInvalid ? info->safetensors_dtype
                                                             : std::string(dtype_name(info->dtype));
          return "tensor " + in_quotes(name) + " in file " + shard.file + " is " + dtype + " " +
                 shape_string(info->shape) + "; the manifest says " +
                 std::string(dtype_name(var.dtype)) + " " + shape_string(expected);
        }
      }
    }
  }
  return std::nullopt;
}

std::string format_double(double value) {
  char buf[64];
  auto [end, error] = std::to_chars(buf, buf + sizeof(buf), value);
  (void)error;  // 64 bytes hold any double
  return std::string(buf, end);
}

}  // namespace

std::string checkpoint_name(int64_t step) {
  return std::string(kCheckpointPrefix) + std::to_string(step);
}

// ---------------------------------------------------------------- writing

CheckpointWriter::CheckpointWriter(io::FileSystem& fs, std::string dir, int64_t step, int max_to_keep)
    : fs_(fs),
      dir_(std::move(dir)),
      step_(step),
      max_to_keep_(max_to_keep),
      tmp_path_(join(dir_, checkpoint_name(step) + std::string(kTmpSuffix))),
      final_path_(join(dir_, checkpoint_name(step))) {}

Result<std::unique_ptr<CheckpointWriter>> CheckpointWriter::begin(const std::string& dir,
                                                                  int64_t step, int max_to_keep,
                                                                  io::FileSystem& fs) {
  if (step < 0) {
    return Status::InvalidArgument("checkpoint step must be >= 0, got " + std::to_string(step));
  }
  std::unique_ptr<CheckpointWriter> writer(
      new CheckpointWriter(fs, strip_trailing_slashes(dir), step, max_to_keep));
  CAPSTAN_RETURN_IF_ERROR(io::create_dirs(fs, writer->dir_, /*sync=*/false)
                              .with_context("cannot create checkpoint directory '" + dir + "'"));
  if (fs.stat(writer->final_path_).ok()) {
    return Status::AlreadyExists("checkpoint '" + writer->final_path_ + "' already exists");
  }
  // What a crashed save of this step left.
  CAPSTAN_RETURN_IF_ERROR(fs.remove_all(writer->tmp_path_));
  CAPSTAN_RETURN_IF_ERROR(fs.create_dir(writer->tmp_path_));
  return writer;
}

CheckpointWriter::~CheckpointWriter() {
  // Nothing is left there once commit() renamed it.
  (void)fs_.remove_all(tmp_path_);
}

Status CheckpointWriter::add_file(const std::string& name,
                                  const std::vector<std::pair<std::string, Tensor>>& tensors,
                                  const std::map<std::string, std::string>& metadata) {
  if (done_) {
    return Status::FailedPrecondition("checkpoint '" + final_path_ + "' was already committed");
  }
  if (!is_plain_file_name(name) || name == kManifestFileName || name.ends_with(kTmpSuffix)) {
    return Status::InvalidArgument("bad checkpoint file name " + in_quotes(name) +
                                   " (a plain name, not manifest.json nor *.tmp)");
  }
  if (std::find(added_.begin(), added_.end(), name) != added_.end()) {
    return Status::InvalidArgument("checkpoint file " + in_quotes(name) + " was already added");
  }
  CAPSTAN_RETURN_IF_ERROR(write_safetensors(join(tmp_path_, name), tensors, metadata, fs_));
  added_.push_back(name);
  return Status::Ok();
}

Status CheckpointWriter::commit(Manifest manifest) { return commit(std::move(manifest), {}); }

Status CheckpointWriter::commit(Manifest manifest, const std::vector<ManifestFile>& written) {
  if (done_) {
    return Status::FailedPrecondition("checkpoint '" + final_path_ + "' was already committed");
  }
  const std::string context = "cannot commit checkpoint '" + final_path_ + "'";

  // Every data file in the directory, however it got there.
  std::vector<std::string> names;
  Result<std::vector<std::string>> listed = fs_.list_dir(tmp_path_);
  if (!listed.ok()) return listed.status().with_context(context);
  for (const std::string& name : *listed) {
    if (name == kManifestFileName || name.ends_with(kTmpSuffix)) continue;
    Result<io::FileInfo> info = fs_.stat(join(tmp_path_, name));
    if (!info.ok()) return info.status().with_context(context);
    if (!info->is_regular_file) {
      return Status::FailedPrecondition(context + ": " + in_quotes(name) +
                                        " is not a regular file");
    }
    names.push_back(name);
  }
  std::sort(names.begin(), names.end());
  manifest.step = step_;
  manifest.files.clear();
  for (const auto& name : names) {
    auto given = std::find_if(written.begin(), written.end(), [&](const ManifestFile& f) { return f.name == name; });
    if (given != written.end()) {
      CAPSTAN_ASSIGN_OR_RETURN(io::FileInfo info, fs_.stat(join(tmp_path_, name)));
      if (info.size != given->size) {
        return Status::DataLoss(context + ": " + in_quotes(name) + " has " + std::to_string(info.size) +
                                " bytes; its writer reported " + std::to_string(given->size));
      }
      manifest.files.push_back(*given);
      continue;
    }
    CAPSTAN_ASSIGN_OR_RETURN(SizeAndCrc sum, checksum_file(fs_, join(tmp_path_, name)));
    manifest.files.push_back(ManifestFile{name, sum.size, sum.crc});
  }
  for (const auto& f : written) {
    if (std::find(names.begin(), names.end(), f.name) == names.end()) {
      return Status::DataLoss(context + ": " + in_quotes(f.name) + " was reported written but is not in " +
                              tmp_path_);
    }
  }
  CAPSTAN_RETURN_IF_ERROR(validate_manifest(manifest).with_context(context));

  // Refuse a manifest the files do not back, before anything is visible.
  std::map<std::string, std::unique_ptr<SafetensorsReader>> readers;
  std::map<std::string, const SafetensorsReader*> views;
  for (const auto& var : manifest.variables) {
    for (const auto& shard : var.shards) {
      if (readers.count(shard.file) != 0) continue;
      auto reader = SafetensorsReader::open(join(tmp_path_, shard.file), fs_);
      if (!reader.ok()) return reader.status().with_context(context);
      views[shard.file] = reader->get();
      readers[shard.file] = std::move(*reader);
    }
  }
  if (auto mismatch = find_tensor_mismatch(manifest, views)) {
    return Status::InvalidArgument(context + ": " + *mismatch);
  }
  readers.clear();

  done_ = true;
  for (const auto& name : names) CAPSTAN_RETURN_IF_ERROR(fs_.sync_file(join(tmp_path_, name)));
  const std::string json = to_json_with_checksum(manifest);
  CAPSTAN_RETURN_IF_ERROR(io::write_file_durably(fs_, join(tmp_path_, kManifestFileName), json));
  if (Status renamed = fs_.rename_no_replace(tmp_path_, final_path_); !renamed.ok()) {
    if (renamed.code() == StatusCode::kAlreadyExists) return Status::AlreadyExists(context + ": it already exists");
    return renamed.with_context(context);
  }
  CAPSTAN_RETURN_IF_ERROR(fs_.sync_dir(dir_));
  return apply_retention();
}

Status CheckpointWriter::apply_retention() {
  CAPSTAN_ASSIGN_OR_RETURN(std::vector<std::string> all, list_checkpoints(dir_, fs_));
  size_t drop = 0;
  if (max_to_keep_ > 0 && all.size() > static_cast<size_t>(max_to_keep_)) {
    drop = all.size() - static_cast<size_t>(max_to_keep_);
  }
  CheckpointIndex index;
  for (size_t i = drop; i < all.size(); ++i) {
    index.kept.push_back(base_name(all[i]));
  }
  if (index.kept.empty()) {
    return Status::Internal("checkpoint '" + final_path_ + "' vanished right after its commit");
  }
  index.latest = index.kept.back();
  // The index first: a crash before the deletions leaves extra checkpoints
  // (deleted by the next commit), never an index naming deleted ones.
  const std::string json = to_json(index);
  CAPSTAN_RETURN_IF_ERROR(io::write_file_durably(fs_, join(dir_, kIndexFileName), json));
  for (size_t i = 0; i < drop; ++i) {
    CAPSTAN_RETURN_IF_ERROR(fs_.remove_all(all[i]).with_context("cannot delete old checkpoint '" + all[i] + "'"));
  }
  CAPSTAN_ASSIGN_OR_RETURN(std::vector<std::string> names, fs_.list_dir(dir_));
  for (const auto& name : names) {
    if (!is_stale_tmp(name)) continue;
    const std::string path = join(dir_, name);
    CAPSTAN_RETURN_IF_ERROR(fs_.remove_all(path).with_context("cannot delete '" + path + "'"));
  }
  return fs_.sync_dir(dir_);
}

Result<ManifestFile> describe_file(const std::string& directory, const std::string& name, io::FileSystem& fs) {
  CAPSTAN_ASSIGN_OR_RETURN(SizeAndCrc sum, checksum_file(fs, join(directory, name)));
  return ManifestFile{name, sum.size, sum.crc};
}

Result<std::vector<std::string>> list_checkpoints(const std::string& dir, io::FileSystem& fs) {
  const std::string root = strip_trailing_slashes(dir);
  Result<std::vector<std::string>> names = fs.list_dir(root);
  if (!names.ok()) {
    if (names.status().code() == StatusCode::kNotFound) {
      return Status::NotFound("no checkpoint directory '" + root + "'");
    }
    return names.status().with_context("cannot list checkpoint directory '" + root + "'");
  }
  std::vector<std::pair<int64_t, std::string>> found;
  for (const std::string& name : *names) {
    auto step = checkpoint_step(name);
    if (!step) continue;
    const std::string path = join(root, name);
    Result<io::FileInfo> info = fs.stat(path);
    if (info.ok() && info->is_directory) found.emplace_back(*step, path);
  }
  std::sort(found.begin(), found.end());
  std::vector<std::string> paths;
  for (auto& [step, path] : found) paths.push_back(std::move(path));
  return paths;
}

Result<std::string> latest_checkpoint(const std::string& dir, io::FileSystem& fs) {
  CAPSTAN_ASSIGN_OR_RETURN(std::vector<std::string> all, list_checkpoints(dir, fs));
  if (all.empty()) return Status::NotFound("no checkpoint in '" + dir + "'");
  return all.back();
}

Result<CheckpointIndex> read_checkpoint_index(const std::string& dir, io::FileSystem& fs) {
  const std::string path = join(strip_trailing_slashes(dir), kIndexFileName);
  CAPSTAN_ASSIGN_OR_RETURN(std::string json, io::read_file(fs, path));
  return parse_checkpoint_index(json, path);
}

// ---------------------------------------------------------------- reading

Status CheckpointReader::damaged(const std::string& why) const {
  return Status::DataLoss("checkpoint " + path_ + " is damaged: " + why);
}

Result<std::unique_ptr<CheckpointReader>> CheckpointReader::open(const std::string& checkpoint_dir,
                                                                 CheckpointReaderOptions options,
                                                                 io::FileSystem& fs) {
  std::unique_ptr<CheckpointReader> reader(new CheckpointReader(fs));
  reader->path_ = strip_trailing_slashes(checkpoint_dir);
  Result<io::FileInfo> dir_info = fs.stat(reader->path_);
  if (!dir_info.ok()) {
    if (dir_info.status().code() == StatusCode::kNotFound) {
      return Status::NotFound("no checkpoint at '" + reader->path_ + "'");
    }
    return dir_info.status().with_context("cannot open checkpoint '" + reader->path_ + "'");
  }
  if (!dir_info->is_directory) {
    return Status::FailedPrecondition("checkpoint '" + reader->path_ + "' is not a directory");
  }

  const std::string manifest_path = join(reader->path_, kManifestFileName);
  auto json = io::read_file(fs, manifest_path);
  if (!json.ok()) {
    if (json.status().code() == StatusCode::kNotFound) {
      return reader->damaged(std::string(kManifestFileName) + " is missing");
    }
    return json.status();
  }
  auto manifest = parse_manifest(*json, manifest_path);
  if (!manifest.ok()) {
    if (manifest.status().code() == StatusCode::kDataLoss) {
      return reader->damaged(manifest.status().message());
    }
    return manifest.status();
  }
  reader->manifest_ = std::move(*manifest);

  for (const auto& entry : reader->manifest_.files) {
    const std::string path = join(reader->path_, entry.name);
    Result<io::FileInfo> info = fs.stat(path);
    if (!info.ok()) {
      if (info.status().code() == StatusCode::kNotFound) return reader->damaged("file " + entry.name + " is missing");
      return info.status().with_context("cannot open '" + path + "'");
    }
    if (!info->is_regular_file)
      return reader->damaged("file " + entry.name + " is not a regular file");
    if (info->size != entry.size) {
      return reader->damaged("file " + entry.name + " has " + std::to_string(info->size) +
                             " bytes; the manifest says " + std::to_string(entry.size));
    }
    auto file = std::make_unique<File>();
    file->entry = entry;
    if (options.verify_checksums_on_open) {
      // Marks the lazy check done (and passed).
      std::call_once(file->verify_once, [] {});
      CAPSTAN_ASSIGN_OR_RETURN(SizeAndCrc sum, checksum_file(fs, path));
      if (sum.size != entry.size || sum.crc != entry.crc32c) {
        return reader->damaged("file " + entry.name + " has crc32c " + hex32(sum.crc) + " (" +
                               std::to_string(sum.size) + " bytes); the manifest says " +
                               hex32(entry.crc32c) + " (" + std::to_string(entry.size) + " bytes)");
      }
    }
    reader->files_[entry.name] = std::move(file);
  }

  std::map<std::string, const SafetensorsReader*> views;
  for (const auto& var : reader->manifest_.variables) {
    for (const auto& shard : var.shards) {
      File& file = *reader->files_.at(shard.file);
      if (file.reader != nullptr) continue;
      auto opened = SafetensorsReader::open(join(reader->path_, shard.file), fs);
      if (!opened.ok()) {
        if (opened.status().code() == StatusCode::kDataLoss) {
          return reader->damaged("file " + shard.file + ": " + opened.status().message());
        }
        return opened.status();
      }
      file.reader = std::move(*opened);
      views[shard.file] = file.reader.get();
    }
  }
  if (auto mismatch = find_tensor_mismatch(reader->manifest_, views)) {
    return reader->damaged(*mismatch);
  }
  return reader;
}

Result<const SafetensorsReader*> CheckpointReader::file(const std::string& name) const {
  auto found = files_.find(name);
  if (found == files_.end()) return Status::NotFound("checkpoint " + path_ + " has no file " + in_quotes(name));
  File& entry = *found->second;
  std::call_once(entry.open_once, [this, &entry, &name] {
    if (entry.reader != nullptr) return;  // a shard's file: opened by open()
    auto opened = SafetensorsReader::open(join(path_, name), fs_);
    if (opened.ok()) {
      entry.reader = std::move(*opened);
    } else if (opened.status().code() == StatusCode::kDataLoss) {
      entry.opened = damaged("file " + name + ": " + opened.status().message());
    } else {
      entry.opened = opened.status();
    }
  });
  CAPSTAN_RETURN_IF_ERROR(entry.opened);
  return file_reader(name);
}

Result<const SafetensorsReader*> CheckpointReader::file_reader(const std::string& name) const {
  File& file = *files_.at(name);  // validate_manifest: shards name listed files
  std::call_once(file.verify_once, [this, &file] {
    auto sum = checksum_file(fs_, join(path_, file.entry.name));
    if (!sum.ok()) {
      file.verified = sum.status();
    } else if (sum->size != file.entry.size || sum->crc != file.entry.crc32c) {
      file.verified =
          damaged("file " + file.entry.name + " has crc32c " + hex32(sum->crc) + " (" +
                  std::to_string(sum->size) + " bytes); the manifest says " +
                  hex32(file.entry.crc32c) + " (" + std::to_string(file.entry.size) + " bytes)");
    }
  });
  if (!file.verified.ok()) return file.verified;
  return file.reader.get();
}

Result<const ManifestVariable*> CheckpointReader::find_variable(const std::string& name) const {
  const ManifestVariable* var = manifest_.find_variable(name);
  if (var == nullptr) {
    return Status::NotFound("checkpoint " + path_ + " has no variable " + in_quotes(name));
  }
  return var;
}

Result<Tensor> CheckpointReader::read_rows(const ManifestVariable& var, const std::string& slot,
                                           int64_t begin, int64_t end) const {
  auto tensor_name = [&slot](const ManifestShard& shard) {
    return slot.empty() ? shard.name : slot_tensor_name(shard.name, slot);
  };
  auto wrap = [this](const Status& status) {
    return status.code() == StatusCode::kDataLoss ? damaged(status.message()) : status;
  };
  if (var.shape.empty()) {  // a scalar: one shard of "one row"
    const ManifestShard& shard = var.shards[0];
    CAPSTAN_ASSIGN_OR_RETURN(const SafetensorsReader* reader, file_reader(shard.file));
    auto tensor = reader->read(tensor_name(shard));
    if (!tensor.ok()) return wrap(tensor.status());
    return tensor;
  }
  std::vector<Tensor> parts;
  for (const auto& shard : var.shards) {
    const int64_t lo = std::max(begin, shard.first_row);
    const int64_t hi = std::min(end, shard.first_row + shard.rows);
    if (lo >= hi) continue;
    CAPSTAN_ASSIGN_OR_RETURN(const SafetensorsReader* reader, file_reader(shard.file));
    auto part = reader->read_rows(tensor_name(shard), lo - shard.first_row, hi - shard.first_row);
    if (!part.ok()) return wrap(part.status());
    parts.push_back(std::move(*part));
  }
  if (parts.empty()) return Tensor::zeros(var.dtype, shard_shape(var, 0));
  std::vector<const Tensor*> pointers;
  for (const auto& part : parts) pointers.push_back(&part);
  return data::concat_rows(pointers);
}

Result<Tensor> CheckpointReader::read_variable(const std::string& name) const {
  CAPSTAN_ASSIGN_OR_RETURN(const ManifestVariable* var, find_variable(name));
  return read_rows(*var, "", 0, var->shape.empty() ? 1 : var->shape[0]);
}

Result<Tensor> CheckpointReader::read_slot(const std::string& variable,
                                           const std::string& slot) const {
  CAPSTAN_ASSIGN_OR_RETURN(const ManifestVariable* var, find_variable(variable));
  if (std::find(var->slots.begin(), var->slots.end(), slot) == var->slots.end()) {
    return Status::NotFound("variable " + in_quotes(variable) + " in checkpoint " + path_ +
                            " has no slot " + in_quotes(slot));
  }
  return read_rows(*var, slot, 0, var->shape.empty() ? 1 : var->shape[0]);
}

Result<Tensor> CheckpointReader::read_variable_rows(const std::string& name, int64_t begin,
                                                    int64_t end) const {
  return read_slot_rows(name, "", begin, end);
}

Result<Tensor> CheckpointReader::read_slot_rows(const std::string& variable,
                                                const std::string& slot, int64_t begin,
                                                int64_t end) const {
  CAPSTAN_ASSIGN_OR_RETURN(const ManifestVariable* var, find_variable(variable));
  if (!slot.empty() && std::find(var->slots.begin(), var->slots.end(), slot) == var->slots.end()) {
    return Status::NotFound("variable " + in_quotes(variable) + " in checkpoint " + path_ +
                            " has no slot " + in_quotes(slot));
  }
  if (var->shape.empty()) {
    return Status::InvalidArgument("variable " + in_quotes(variable) +
                                   " is a scalar; it has no rows to read");
  }
  if (begin < 0 || begin > end || end > var->shape[0]) {
    return Status::InvalidArgument("rows [" + std::to_string(begin) + ", " + std::to_string(end) +
                                   ") are not within the " + std::to_string(var->shape[0]) +
                                   " rows of variable " + in_quotes(variable));
  }
  return read_rows(*var, slot, begin, end);
}

// ---------------------------------------------------------------- describe

std::string describe(const CheckpointReader& reader) {
  const Manifest& m = reader.manifest();
  std::string out = "checkpoint " + reader.path() + "\n";
  out += "step: " + std::to_string(m.step) + "\n";
  out += "files:\n";
  for (const auto& file : m.files) {
    out += "  " + file.name + "  " + std::to_string(file.size) + " bytes  crc32c " +
           hex32(file.crc32c) + "\n";
  }
  out += "variables:\n";
  for (const auto& var : m.variables) {
    if (var.table) {
      const ManifestTable& t = *var.table;
      const EmbeddingTableOptions& o = t.options;
      out += "  " + var.name + "  embedding table " + std::string(dtype_name(var.dtype)) + "[*, " +
             std::to_string(t.dim) + "]  " + std::to_string(var.shape.empty() ? 0 : var.shape[0]) +
             " rows  generation " + std::to_string(t.generation) + "\n";
      out += "    initializer " + t.initializer.kind + "  min_count " + std::to_string(o.min_count) +
             "  admit_probability " + format_double(o.admit_probability) + "  ttl_steps " +
             std::to_string(o.ttl_steps) + "  ttl_seconds " + std::to_string(o.ttl_seconds) + "  max_rows " +
             std::to_string(o.max_rows) + "  max_bytes " + std::to_string(o.max_bytes) + "  eviction " + o.eviction +
             "\n";
      for (const auto& shard : var.shards) {
        out += "    " + shard.name + "  " + std::to_string(shard.rows) + " rows  in " + shard.file + "\n";
      }
    } else {
      out += "  " + var.name + "  " + std::string(dtype_name(var.dtype)) + " " +
             shape_string(var.shape) + "  partitioning " + shape_string(var.partitioning) + "\n";
      for (const auto& shard : var.shards) {
        out += "    " + shard.name + "  rows [" + std::to_string(shard.first_row) + ", " +
               std::to_string(shard.first_row + shard.rows) + ")  in " + shard.file + "\n";
      }
    }
    if (var.optimizer.kind == Optimizer::Kind::kNone) {
      out += "    optimizer: none\n";
    } else {
      out += "    optimizer: " + optimizer_name(var.optimizer.kind);
      for (const auto& field : rpc::optimizer_fields(var.optimizer.kind)) {
        out += " " + std::string(field.name) + "=" + format_double(var.optimizer.*field.value);
      }
      if (var.optimizer.nesterov) out += " nesterov";
      if (var.optimizer.schedule.kind != LearningRateSchedule::Kind::kConstant) {
        out += " schedule=" + rpc::schedule_debug_string(var.optimizer.schedule);
      }
      out += "  step " + std::to_string(var.optimizer_step) + "\n";
    }
    out += "    slots:";
    if (var.slots.empty()) out += " none";
    for (const auto& slot : var.slots) out += " " + slot;
    out += "\n";
  }
  return out;
}

}  // namespace capstan::checkpoint
