// The inside of Dataset and Fn: a pipeline definition is a flat Cap'n Proto
// message (schemas/dataset.capnp) that every Dataset call copies and extends.
// Definitions are small (except from_tensors data), so copying keeps them
// immutable and shareable without bookkeeping.
#ifndef CAPSTAN_LIB_DATA_DEFINITION_H_
#define CAPSTAN_LIB_DATA_DEFINITION_H_

#include <capnp/message.h>
#include <capnp/serialize.h>

#include <memory>
#include <string>

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

wire::Compression to_wire(Compression compression);
Compression from_wire(wire::Compression compression);

}  // namespace capstan::data

#endif  // CAPSTAN_LIB_DATA_DEFINITION_H_
