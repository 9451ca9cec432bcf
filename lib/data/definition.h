// The inside of Dataset and Fn: a pipeline definition is a flat Cap'n Proto
// message (schemas/dataset.capnp) that every Dataset call copies and extends.
// Definitions are small (except from_tensors data), so copying keeps them
// immutable and shareable without bookkeeping. The Dataset methods
// themselves are the SDK's (sdk/src/data/dataset.cc); they write ops with
// build_dataset() and derive_dataset() and ask the functions here.
#ifndef CAPSTAN_LIB_DATA_DEFINITION_H_
#define CAPSTAN_LIB_DATA_DEFINITION_H_

#include <capnp/message.h>
#include <capnp/serialize.h>

#include <memory>
#include <string>
#include <vector>

#include "capstan/data/dataset.h"
#include "capstan_schemas/dataset.capnp.h"

namespace capstan::data {

struct Dataset::Impl {
  // Copies the finished message.
  explicit Impl(capnp::MessageBuilder& message);
  // Adopts serialized words (checked by the caller).
  explicit Impl(kj::Array<capnp::word> words);

  wire::DatasetDef::Reader def() const { return reader->getRoot<wire::DatasetDef>(); }
  wire::Op::Reader root() const { return def().getRoot(); }
  // True when `op` lies inside this definition's message.
  bool contains(const void* address) const;

  kj::Array<capnp::word> words;
  std::unique_ptr<capnp::FlatArrayMessageReader> reader;
};

struct Fn::Impl {
  enum class Kind { kNamed, kDecodeCsv, kParseExample, kCast, kTfRecordDataset, kTextLineDataset };
  Kind kind = Kind::kNamed;
  std::string name;
  CsvSpec csv;
  FeatureSpec features;
  DType dtype = DType::kInvalid;
  Compression compression = Compression::kNone;

  void write(wire::Fn::Builder builder) const;
};

// Reader options for definitions: no practical traversal limit (a
// from_tensors op may hold a large tensor), bounded nesting.
capnp::ReaderOptions definition_reader_options();

// A stable key for an op (the address of its data), used to keep per-op
// state (shuffle epochs, caches) across re-created iterators.
const void* op_key(wire::Op::Reader op);

// "range", "map", ... for messages ("unknown op" for a kind this build does
// not know).
const char* op_name(wire::Op::Which which);
// "decode_csv", a registered function's name, ... for messages.
std::string fn_name(wire::Fn::Reader fn);

int64_t cardinality_of(wire::Op::Reader op);

// A new definition whose root op `fill` writes (fill(wire::Op::Builder)),
// with the options of `options_from` (or defaults).
template <typename Fill>
Dataset build_dataset(const Dataset* options_from, Fill fill) {
  capnp::MallocMessageBuilder message;
  auto def = message.initRoot<wire::DatasetDef>();
  if (options_from != nullptr) def.setOptions(options_from->impl()->def().getOptions());
  fill(def.initRoot());
  return Dataset(std::make_shared<const Dataset::Impl>(message));
}

// A transformation of `input`: `fill` writes the op, then `input`'s
// definition becomes its input.
template <typename Fill>
Dataset derive_dataset(const Dataset& input, Fill fill) {
  return build_dataset(&input, [&input, &fill](wire::Op::Builder op) {
    fill(op);
    op.setInput(input.impl()->root());
  });
}

void set_texts(capnp::List<capnp::Text>::Builder list, const std::vector<std::string>& values);

// Definitions the library builds itself: static sharding (DATA), the file
// functions of interleave and tfrecord's parallel reads. The Dataset methods
// of these ops call them, so each op is written in one place (its file in
// data/ops/).
Dataset shard_definition(const Dataset& input, int64_t num_shards, int64_t index);
Dataset text_line_definition(const std::vector<std::string>& files, Compression compression);
Dataset tfrecord_definition(const std::vector<std::string>& files, Compression compression,
                            int64_t num_parallel_reads);

// Dataset::debug_string: "range(0, 10, 1).map(f).batch(2)".
std::string describe_definition(wire::Op::Reader root);
// Dataset::resolve_shard_hint: kShardHint arguments of shard() replaced.
Dataset resolve_shard_hints(const Dataset& dataset, int64_t num_shards, int64_t index);
// Dataset::deserialize: InvalidArgument for bytes that are not a
// well-formed definition (every field the schema names is read once).
Result<Dataset> parse_definition(const std::string& bytes);

wire::Compression to_wire(Compression compression);
Compression from_wire(wire::Compression compression);

}  // namespace capstan::data

#endif  // CAPSTAN_LIB_DATA_DEFINITION_H_
