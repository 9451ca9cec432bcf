#include "data/saved_dataset.h"

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "data/definition.h"
#include "data/iterator_state.h"
#include "io/durable_file.h"
#include "rpc/tensor_codec.h"

namespace capstan::data::engine {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;

constexpr char kFormat[] = "capstan-saved-dataset-1";
// More shards than any saved dataset needs: a bound on what a spec or a
// caller can make a reader or writer open.
constexpr int64_t kMaxShards = 4096;

io::Compression io_compression(Compression c) {
  return c == Compression::kGzip ? io::Compression::kGzip : io::Compression::kNone;
}

std::string shard_name(int64_t index) {
  char name[32];
  std::snprintf(name, sizeof(name), "shard_%05lld.tfrecord", static_cast<long long>(index));
  return name;
}

// A name beside `path` no other writer uses.
std::string temporary_name(const std::string& path) {
  std::random_device random;
  return path + ".tmp-" + std::to_string(::getpid()) + "-" + std::to_string(random());
}

void remove_quietly(const std::string& dir) {
  std::error_code ignored;
  fs::remove_all(dir, ignored);
}

// Elements of saved shards, one shard after the other in turn.
class SavedReader final : public IteratorBase {
 public:
  SavedReader(std::vector<std::string> shards, Compression compression)
      : shards_(std::move(shards)), compression_(compression) {}

  Status get_next(Element* out, bool* end) override {
    CAPSTAN_RETURN_IF_ERROR(open_shards());
    for (size_t tried = 0; tried < readers_.size(); ++tried) {
      size_t k = next_;
      next_ = (next_ + 1) % readers_.size();
      if (!open_[k]) continue;
      std::string record;
      CAPSTAN_ASSIGN_OR_RETURN(bool more, readers_[k]->read(&record));
      if (!more) {
        open_[k] = false;
        continue;
      }
      ++records_[k];
      auto element = rpc::element_from_bytes(record);
      if (!element.ok()) {
        return Status::DataLoss("saved dataset shard " + shards_[k] + " holds a malformed element: " +
                                element.status().message());
      }
      *out = std::move(*element);
      *end = false;
      return Status::Ok();
    }
    *end = true;
    return Status::Ok();
  }

  // Which shard is next, and the records read from each.
  Status save(StateWriter& writer) override {
    writer.begin("load");
    writer.write_int(static_cast<int64_t>(next_));
    writer.write_int(static_cast<int64_t>(records_.size()));
    for (size_t k = 0; k < records_.size(); ++k) {
      writer.write_int(records_[k]);
      writer.write_bool(open_[k]);
    }
    return Status::Ok();
  }

  Status restore(StateReader& reader) override {
    CAPSTAN_RETURN_IF_ERROR(reader.begin("load"));
    int64_t next = 0;
    int64_t shards = 0;
    CAPSTAN_RETURN_IF_ERROR(reader.read_int_in(&next, 0, std::max<int64_t>(0, std::ssize(shards_) - 1), "the next shard"));
    CAPSTAN_RETURN_IF_ERROR(reader.read_int_in(&shards, 0, std::ssize(shards_), "the number of shards"));
    if (shards == 0) return Status::Ok();  // saved before the first element
    if (shards != std::ssize(shards_)) {
      return Status::InvalidArgument("load: the saved state reads " + std::to_string(shards) + " shards, the dataset has " +
                                     std::to_string(shards_.size()));
    }
    CAPSTAN_RETURN_IF_ERROR(open_shards());
    next_ = static_cast<size_t>(next);
    for (size_t k = 0; k < shards_.size(); ++k) {
      int64_t records = 0;
      bool open = false;
      CAPSTAN_RETURN_IF_ERROR(reader.read_int_in(&records, 0, INT64_MAX, "a record count"));
      CAPSTAN_RETURN_IF_ERROR(reader.read_bool(&open));
      open_[k] = open;
      std::string skipped;
      for (records_[k] = 0; records_[k] < records; ++records_[k]) {
        CAPSTAN_ASSIGN_OR_RETURN(bool more, readers_[k]->read(&skipped));
        if (!more) {
          return Status::DataLoss("saved dataset shard " + shards_[k] + " has " + std::to_string(records_[k]) +
                                  " elements, fewer than the saved position " + std::to_string(records));
        }
      }
    }
    return Status::Ok();
  }

 private:
  Status open_shards() {
    if (!readers_.empty() || shards_.empty()) return Status::Ok();
    for (const auto& shard : shards_) {
      auto reader = io::TFRecordReader::open(shard, io_compression(compression_));
      if (!reader.ok()) return reader.status().with_context("saved dataset shard " + shard);
      readers_.push_back(std::move(*reader));
    }
    open_.assign(readers_.size(), true);
    records_.assign(readers_.size(), 0);
    return Status::Ok();
  }

  const std::vector<std::string> shards_;
  const Compression compression_;
  std::vector<std::unique_ptr<io::TFRecordReader>> readers_;
  std::vector<bool> open_;
  std::vector<int64_t> records_;  // read from each shard
  size_t next_ = 0;
};

class SnapshotIterator final : public IteratorBase {
 public:
  SnapshotIterator(IteratorFactory input, std::string dir, Compression compression)
      : input_factory_(std::move(input)), dir_(std::move(dir)), compression_(compression) {}

  Status get_next(Element* out, bool* end) override {
    if (!started_) {
      started_ = true;
      auto spec = read_saved_spec(dir_);
      if (spec.ok()) {
        reader_ = make_saved_reader(spec->shards, spec->compression);
      } else if (spec.status().code() == StatusCode::kNotFound) {
        CAPSTAN_ASSIGN_OR_RETURN(input_, input_factory_());
        std::error_code error;
        fs::create_directories(capstan::io::parent_dir(dir_), error);
        if (error) return Status::Unknown("snapshot " + dir_ + ": creating its parent: " + error.message());
        temp_ = temporary_name(dir_);
        CAPSTAN_ASSIGN_OR_RETURN(writer_, SavedDatasetWriter::create(temp_, 1, compression_));
      } else {
        return spec.status().with_context("snapshot");
      }
    }
    if (reader_ != nullptr) return reader_->get_next(out, end);
    if (input_ != nullptr && writer_ == nullptr) return input_->get_next(out, end);  // restored mid-write
    if (writer_ == nullptr) {  // the snapshot was written: the input ended
      *end = true;
      return Status::Ok();
    }
    CAPSTAN_RETURN_IF_ERROR(input_->get_next(out, end));
    if (!*end) return writer_->write(*out).with_context("snapshot " + dir_);
    Status finished = writer_->finish();
    writer_ = nullptr;
    input_ = nullptr;
    if (finished.ok()) {
      Status committed = commit_directory(temp_, dir_);
      // Another reader finished the same snapshot first: theirs stands.
      if (committed.code() == StatusCode::kAlreadyExists) committed = Status::Ok();
      finished = committed;
    }
    remove_quietly(temp_);
    return finished.with_context("snapshot " + dir_);
  }

  // Reading the snapshot: its reader's position. Writing it: the input's;
  // the restored iterator reads on without writing (the elements before the
  // save are not in a file of this process), and a later pass writes it.
  Status save(StateWriter& writer) override {
    writer.begin("snapshot");
    int64_t mode = !started_ ? 0 : reader_ != nullptr ? 1 : input_ != nullptr ? 2 : 3;
    writer.write_int(mode);
    if (mode == 1) return reader_->save(writer);
    if (mode == 2) return input_->save(writer);
    return Status::Ok();
  }

  Status restore(StateReader& reader) override {
    CAPSTAN_RETURN_IF_ERROR(reader.begin("snapshot"));
    int64_t mode = 0;
    CAPSTAN_RETURN_IF_ERROR(reader.read_int_in(&mode, 0, 3, "the snapshot's mode"));
    started_ = mode != 0;
    if (mode == 1) {
      auto spec = read_saved_spec(dir_);
      if (!spec.ok()) return spec.status().with_context("restoring snapshot");
      reader_ = make_saved_reader(spec->shards, spec->compression);
      return reader_->restore(reader);
    }
    if (mode == 2) {
      CAPSTAN_ASSIGN_OR_RETURN(input_, input_factory_());
      return input_->restore(reader);
    }
    return Status::Ok();
  }

 private:
  const IteratorFactory input_factory_;
  const std::string dir_;
  const Compression compression_;
  bool started_ = false;
  IteratorPtr reader_;
  IteratorPtr input_;
  std::unique_ptr<SavedDatasetWriter> writer_;  // removes its directory unless finished
  std::string temp_;
};

Json element_spec_of(const Element& element) {
  Json spec = Json::array();
  for (size_t c = 0; c < element.components.size(); ++c) {
    const Tensor& t = element.components[c];
    Json shape = Json::array();
    for (int64_t d : t.shape()) shape.push_back(d);
    spec.push_back({{"name", c < element.names.size() ? element.names[c] : std::string()},
                    {"dtype", std::string(dtype_name(t.dtype()))},
                    {"shape", shape}});
  }
  return spec;
}

}  // namespace

Result<SavedSpec> read_saved_spec(const std::string& dir) {
  const std::string path = dir + "/" + kSavedSpecFile;
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    if (!fs::exists(dir)) return Status::NotFound("no saved dataset at " + dir + " (the directory does not exist)");
    return Status::NotFound("no saved dataset at " + dir + " (no " + kSavedSpecFile +
                            "; a save or snapshot that did not finish leaves none)");
  }
  std::stringstream text;
  text << in.rdbuf();
  Json spec = Json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  auto damaged = [&path](const std::string& why) { return Status::DataLoss(path + " is damaged: " + why); };
  if (spec.is_discarded() || !spec.is_object()) return damaged("not a JSON object");
  if (!spec.contains("format") || spec["format"] != kFormat) {
    return damaged(std::string("format is not \"") + kFormat + "\"");
  }
  if (!spec.contains("num_elements") || !spec["num_elements"].is_number_integer() ||
      spec["num_elements"].get<int64_t>() < 0) {
    return damaged("num_elements is not a non-negative integer");
  }
  if (!spec.contains("compression") || !spec["compression"].is_string() ||
      (spec["compression"] != "NONE" && spec["compression"] != "GZIP")) {
    return damaged("compression is not \"NONE\" or \"GZIP\"");
  }
  if (!spec.contains("shards") || !spec["shards"].is_array() || spec["shards"].empty() ||
      static_cast<int64_t>(spec["shards"].size()) > kMaxShards) {
    return damaged("shards is not a list of 1 to " + std::to_string(kMaxShards) + " file names");
  }
  SavedSpec out;
  out.num_elements = spec["num_elements"].get<int64_t>();
  out.compression = spec["compression"] == "GZIP" ? Compression::kGzip : Compression::kNone;
  for (const auto& shard : spec["shards"]) {
    if (!shard.is_string()) return damaged("a shard name is not a string");
    std::string name = shard.get<std::string>();
    // Names inside the directory only.
    if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..") {
      return damaged("shard name '" + name + "' is not a file name");
    }
    out.shards.push_back(dir + "/" + name);
  }
  return out;
}

Result<std::unique_ptr<SavedDatasetWriter>> SavedDatasetWriter::create(const std::string& dir, int64_t num_shards,
                                                                       Compression compression) {
  if (num_shards < 1 || num_shards > kMaxShards) {
    return Status::InvalidArgument("num_shards must be in [1, " + std::to_string(kMaxShards) + "], got " +
                                   std::to_string(num_shards));
  }
  std::error_code error;
  if (!fs::create_directory(dir, error)) {
    if (error) return Status::Unknown("creating " + dir + ": " + error.message());
    return Status::AlreadyExists(dir + " exists");
  }
  std::unique_ptr<SavedDatasetWriter> writer(new SavedDatasetWriter(dir, compression));
  for (int64_t k = 0; k < num_shards; ++k) {
    writer->names_.push_back(shard_name(k));
    // Written under a temporary name, committed durably by finish().
    auto shard = io::TFRecordWriter::open(dir + "/" + writer->names_.back() + ".part", io_compression(compression));
    if (!shard.ok()) return shard.status().with_context("saved dataset " + dir);
    writer->shards_.push_back(std::move(*shard));
  }
  return writer;
}

SavedDatasetWriter::~SavedDatasetWriter() {
  if (finished_) return;
  for (auto& shard : shards_) (void)shard->close();
  remove_quietly(dir_);
}

Status SavedDatasetWriter::write(const Element& element) {
  if (finished_) return Status::FailedPrecondition("the saved dataset " + dir_ + " is finished");
  if (written_ == 0) element_spec_ = element_spec_of(element).dump();
  auto& shard = shards_[static_cast<size_t>(written_ % static_cast<int64_t>(shards_.size()))];
  CAPSTAN_RETURN_IF_ERROR(shard->write(rpc::element_to_bytes(element)));
  ++written_;
  return Status::Ok();
}

Status SavedDatasetWriter::finish() {
  if (finished_) return Status::Ok();
  for (size_t k = 0; k < shards_.size(); ++k) {
    CAPSTAN_RETURN_IF_ERROR(shards_[k]->close());
    std::string path = dir_ + "/" + names_[k];
    CAPSTAN_RETURN_IF_ERROR(capstan::io::commit_file_durably(path + ".part", path));
  }
  Json spec = {{"format", kFormat},
               {"num_elements", written_},
               {"compression", compression_ == Compression::kGzip ? "GZIP" : "NONE"},
               {"shards", names_},
               {"element_spec", element_spec_.empty() ? Json::array() : Json::parse(element_spec_)}};
  CAPSTAN_RETURN_IF_ERROR(capstan::io::write_file_durably(dir_ + "/" + kSavedSpecFile, spec.dump(2) + "\n"));
  finished_ = true;
  return Status::Ok();
}

IteratorPtr make_saved_reader(std::vector<std::string> shards, Compression compression) {
  return std::make_unique<SavedReader>(std::move(shards), compression);
}

namespace {

Status on_splits() {
  return Status::FailedPrecondition(
      "load: reads splits handed out by a data service dispatcher, which holds its position; an iterator "
      "reading splits cannot save or restore one");
}

// The shards named by splits, one after the other.
class SplitSavedReader final : public IteratorBase {
 public:
  SplitSavedReader(SplitProvider* splits, Compression compression) : splits_(splits), compression_(compression) {}
  Status get_next(Element* out, bool* end) override {
    while (true) {
      if (current_ == nullptr) {
        CAPSTAN_ASSIGN_OR_RETURN(std::optional<Element> split, splits_->get_next());
        if (!split) {
          *end = true;
          return Status::Ok();
        }
        if (split->components.empty() || split->components[0].dtype() != DType::kString) {
          return Status::InvalidArgument("a split of a saved dataset is not a file name");
        }
        current_ = make_saved_reader({std::string(split->components[0].string_at(0))}, compression_);
      }
      CAPSTAN_RETURN_IF_ERROR(current_->get_next(out, end));
      if (!*end) return Status::Ok();
      current_ = nullptr;
    }
  }
  Status save(StateWriter&) override { return on_splits(); }
  Status restore(StateReader&) override { return on_splits(); }

 private:
  SplitProvider* const splits_;
  const Compression compression_;
  IteratorPtr current_;
};

}  // namespace

IteratorPtr make_split_saved(SplitProvider* splits, Compression compression) {
  return std::make_unique<SplitSavedReader>(splits, compression);
}

IteratorPtr make_snapshot(IteratorFactory input, std::string dir, Compression compression) {
  return std::make_unique<SnapshotIterator>(std::move(input), std::move(dir), compression);
}

uint64_t op_fingerprint(wire::Op::Reader op) {
  capnp::MallocMessageBuilder message;
  message.setRoot(op);
  auto words = capnp::messageToFlatArray(message);
  uint64_t hash = 14695981039346656037ull;
  for (kj::byte b : words.asBytes()) {
    hash ^= b;
    hash *= 1099511628211ull;
  }
  return hash;
}

Status commit_directory(const std::string& tmp_dir, const std::string& path) {
  if (::rename(tmp_dir.c_str(), path.c_str()) != 0) {
    int error = errno;
    if (error == EEXIST || error == ENOTEMPTY) return Status::AlreadyExists(path + " exists");
    return capstan::io::errno_to_status(error, "renaming " + tmp_dir + " to " + path);
  }
  return capstan::io::fsync_dir(capstan::io::parent_dir(path));
}

Status save_dataset(const std::shared_ptr<const Dataset::Impl>& definition, const std::string& path,
                    const SaveOptions& options) {
  if (path.empty()) return Status::InvalidArgument("save: the path is empty");
  std::error_code error;
  if (std::filesystem::exists(path, error)) {
    return Status::AlreadyExists("save: " + path + " exists; remove it or save to a new path");
  }
  CAPSTAN_ASSIGN_OR_RETURN(auto iterator, make_root_iterator(definition, options.functions, {}));
  std::string parent = capstan::io::parent_dir(path);
  std::filesystem::create_directories(parent, error);
  if (error) return Status::Unknown("save: creating " + parent + ": " + error.message());
  std::string temp = temporary_name(path);
  CAPSTAN_ASSIGN_OR_RETURN(auto writer, SavedDatasetWriter::create(temp, options.num_shards, options.compression));
  while (true) {
    CAPSTAN_ASSIGN_OR_RETURN(std::optional<Element> next, iterator->get_next());
    if (!next) break;
    CAPSTAN_RETURN_IF_ERROR(writer->write(*next).with_context("save " + path));
  }
  CAPSTAN_RETURN_IF_ERROR(writer->finish().with_context("save " + path));
  Status committed = commit_directory(temp, path);
  if (!committed.ok()) remove_quietly(temp);
  return committed.with_context("save");
}

}  // namespace capstan::data::engine
