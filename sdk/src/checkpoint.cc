// capstan/checkpoint.h over lib/checkpoint's reader (the one the
// coordinator restores with and capstanctl inspects with).
#include "capstan/checkpoint.h"

#include <filesystem>
#include <map>
#include <system_error>
#include <utility>

#include "checkpoint/checkpoint.h"

namespace capstan {

struct CheckpointReader::Impl {
  std::unique_ptr<checkpoint::CheckpointReader> reader;
  std::vector<CheckpointVariable> variables;
  std::map<std::string, size_t> index;  // name -> position in `variables`
};

Result<std::string> find_checkpoint(const std::string& path) {
  if (path.empty()) return Status::InvalidArgument("no checkpoint path given: name a ckpt-<step> directory or a checkpoint root");
  std::error_code error;
  if (std::filesystem::exists(std::filesystem::path(path) / checkpoint::kManifestFileName, error)) return path;
  if (!std::filesystem::is_directory(path, error)) {
    return Status::NotFound("no checkpoint at '" + path +
                            "': name a ckpt-<step> directory or a directory of them (save_checkpoint's)");
  }
  return checkpoint::latest_checkpoint(path);
}

CheckpointReader::CheckpointReader(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CheckpointReader::~CheckpointReader() = default;

Result<std::unique_ptr<CheckpointReader>> CheckpointReader::open(const std::string& path) {
  CAPSTAN_ASSIGN_OR_RETURN(std::string dir, find_checkpoint(path));
  auto impl = std::make_unique<Impl>();
  CAPSTAN_ASSIGN_OR_RETURN(impl->reader,
                           checkpoint::CheckpointReader::open(dir, {.verify_checksums_on_open = true}));
  for (const auto& variable : impl->reader->manifest().variables) {
    impl->index[variable.name] = impl->variables.size();
    impl->variables.push_back(CheckpointVariable{variable.name, variable.dtype, variable.shape,
                                                 static_cast<int64_t>(variable.shards.size()),
                                                 variable.table.has_value()});
  }
  return std::unique_ptr<CheckpointReader>(new CheckpointReader(std::move(impl)));
}

const std::string& CheckpointReader::path() const { return impl_->reader->path(); }
int64_t CheckpointReader::step() const { return impl_->reader->manifest().step; }
const std::vector<CheckpointVariable>& CheckpointReader::variables() const { return impl_->variables; }

const CheckpointVariable* CheckpointReader::find_variable(const std::string& name) const {
  auto it = impl_->index.find(name);
  return it == impl_->index.end() ? nullptr : &impl_->variables[it->second];
}

Result<Tensor> CheckpointReader::read_variable(const std::string& name) const {
  const CheckpointVariable* variable = find_variable(name);
  if (variable == nullptr) {
    return Status::NotFound("checkpoint " + path() + " has no variable '" + name + "'");
  }
  if (variable->embedding_table) {
    return Status::FailedPrecondition("variable '" + name + "' of checkpoint " + path() +
                                      " is a dynamic embedding table, whose rows are keyed by id: read them "
                                      "with their keys through ClusterCoordinator::export_embedding_table");
  }
  return impl_->reader->read_variable(name);
}

}  // namespace capstan
