#include "checkpoint/mirrored_files.h"

#include <algorithm>
#include <set>

#include "checkpoint/safetensors.h"
#include "checkpoint/shard_files.h"

namespace capstan::checkpoint {
namespace {

constexpr std::string_view kPrefix = "mirrored-";
constexpr std::string_view kSuffix = ".safetensors";

bool is_mirrored_file_name(const std::string& name) {
  return name.size() > kPrefix.size() + kSuffix.size() && name.starts_with(kPrefix) && name.ends_with(kSuffix) &&
         name.find('/') == std::string::npos && name.size() <= 255;
}

const training::MirroredSpec* find_spec(const std::vector<training::MirroredSpec>& specs, const std::string& name) {
  auto it = std::find_if(specs.begin(), specs.end(), [&](const auto& s) { return s.name == name; });
  return it == specs.end() ? nullptr : &*it;
}

}  // namespace

std::string mirrored_file_name(const std::string& strategy) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out(kPrefix);
  for (unsigned char c : strategy) {
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-') {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out + std::string(kSuffix);
}

Result<training::SavedReplica> write_mirrored_file(const std::string& directory, const std::string& file,
                                                   const training::MirroredState& state, io::FileSystem& fs) {
  if (!is_mirrored_file_name(file)) {
    return Status::InvalidArgument("saveReplica: a strategy's checkpoint file is named mirrored-<strategy>.safetensors "
                                   "(at most 255 characters), not '" + file + "'");
  }
  CAPSTAN_RETURN_IF_ERROR(check_save_directory(directory, "saveReplica", fs));
  const std::string path = io::join_path(directory, file);
  if (fs.stat(path).ok()) {
    return Status::AlreadyExists("checkpoint file '" + path + "' exists: another save of this step wrote it");
  }
  training::SavedReplica saved;
  saved.file = file;
  saved.step = state.step;
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const auto& v : state.variables) {
    ps::SavedShard entry;
    entry.name = v.name;
    entry.dtype = v.value.dtype();
    entry.shape = v.value.shape();
    entry.step = state.step;
    tensors.emplace_back(v.name, v.value);
    for (const auto& [slot, t] : v.slots) {
      tensors.emplace_back(slot_tensor_name(v.name, slot), t);
      entry.slots.push_back(slot);
    }
    saved.variables.push_back(std::move(entry));
  }
  // Checksummed as it is written: the file is not read back.
  CAPSTAN_RETURN_IF_ERROR(write_safetensors(path, tensors, {{"capstan.file", file}}, fs, &saved.crc32c));
  CAPSTAN_ASSIGN_OR_RETURN(io::FileInfo info, fs.stat(path));
  saved.size = info.size;
  return saved;
}

Result<std::vector<ManifestVariable>> mirrored_manifest_entries(const training::SavedReplica& saved,
                                                                const std::vector<training::MirroredSpec>& specs) {
  std::vector<ManifestVariable> out;
  for (const auto& v : saved.variables) {
    const training::MirroredSpec* spec = find_spec(specs, v.name);
    if (spec == nullptr || spec->dtype != v.dtype || spec->shape != v.shape) {
      return Status::InvalidArgument(
          "the replica wrote mirrored variable '" + v.name + "' " + std::string(dtype_name(v.dtype)) +
          shape_string(v.shape) +
          (spec == nullptr ? std::string(", which its strategy lacks")
                           : " but it is " + std::string(dtype_name(spec->dtype)) + shape_string(spec->shape)));
    }
    ManifestVariable mv;
    mv.name = v.name;
    mv.dtype = v.dtype;
    mv.shape = v.shape;
    const int64_t rows = v.shape.empty() ? 1 : v.shape[0];
    mv.partitioning = {rows};
    mv.shards.push_back({v.name, saved.file, 0, rows});
    mv.optimizer = spec->optimizer;
    mv.slots = v.slots;
    mv.optimizer_step = saved.step;
    out.push_back(std::move(mv));
  }
  return out;
}

Status check_mirrored(const Manifest& manifest, const std::vector<training::MirroredSpec>& specs,
                      const std::vector<std::string>& names) {
  for (const auto& name : names) {
    const training::MirroredSpec* spec = find_spec(specs, name);
    if (spec == nullptr) return Status::NotFound("no mirrored variable '" + name + "' in the strategy");
    const ManifestVariable* saved = manifest.find_variable(name);
    if (saved == nullptr) return Status::NotFound("the checkpoint has no variable '" + name + "'");
    if (saved->table || saved->dtype != spec->dtype || saved->shape != spec->shape) {
      return Status::InvalidArgument("mirrored variable '" + name + "' is " + std::string(dtype_name(spec->dtype)) +
                                     shape_string(spec->shape) + " but the checkpoint has " +
                                     std::string(dtype_name(saved->dtype)) + shape_string(saved->shape) +
                                     (saved->table ? " (an embedding table)" : ""));
    }
  }
  return Status::Ok();
}

Result<training::MirroredState> read_mirrored_state(const CheckpointReader& reader,
                                                    const std::vector<training::MirroredSpec>& specs,
                                                    const std::vector<std::string>& names) {
  CAPSTAN_RETURN_IF_ERROR(check_mirrored(reader.manifest(), specs, names).with_context("checkpoint " + reader.path()));
  training::MirroredState state;
  for (const auto& name : names) {
    const training::MirroredSpec& spec = *find_spec(specs, name);
    const ManifestVariable& saved = *reader.manifest().find_variable(name);
    training::MirroredValue value;
    value.name = name;
    CAPSTAN_ASSIGN_OR_RETURN(value.value, reader.read_variable(name));
    // Slots of the same optimizer kind carry over; another kind's start
    // afresh (as a parameter-server restore does).
    if (saved.optimizer.kind == spec.optimizer.kind) {
      for (const auto& slot : saved.slots) {
        CAPSTAN_ASSIGN_OR_RETURN(value.slots[slot], reader.read_slot(name, slot));
      }
    }
    state.step = std::max(state.step, saved.optimizer_step);
    state.variables.push_back(std::move(value));
  }
  return state;
}

Result<training::MirroredState> read_mirrored_seed(const std::string& path,
                                                   const std::vector<training::MirroredSpec>& specs,
                                                   const std::vector<std::string>& names,
                                                   const training::MirroredState* others, io::FileSystem& fs) {
  CheckpointReaderOptions options;
  options.verify_checksums_on_open = false;  // each file when first read: only the ones needed
  CAPSTAN_ASSIGN_OR_RETURN(auto reader, CheckpointReader::open(path, options, fs));
  CAPSTAN_ASSIGN_OR_RETURN(training::MirroredState state, read_mirrored_state(*reader, specs, names));
  if (others != nullptr) {
    for (const auto& v : others->variables) {
      if (std::find(names.begin(), names.end(), v.name) == names.end()) state.variables.push_back(v);
    }
    if (names.empty()) state.step = others->step;
  }
  return state;
}

}  // namespace capstan::checkpoint
