#include "data/definition.h"

#include <capnp/any.h>
#include <capnp/dynamic.h>

#include <cstring>
#include <sstream>

#include "data/op_kernel.h"
#include "rpc/tensor_codec.h"

namespace capstan::data {
namespace {

using Op = wire::Op;

void describe(Op::Reader op, std::ostream& out) {
  const engine::OpKernel* kernel = engine::find_op_kernel(op.which());
  if (kernel == nullptr) {
    if (op.hasInput()) {
      describe(op.getInput(), out);
      out << ".";
    }
    out << "unknown_op_" << static_cast<unsigned>(op.which()) << "(...)";
    return;
  }
  auto args = [&]() {
    if (kernel->describe_args != nullptr) kernel->describe_args(op, out);
  };
  switch (kernel->inputs) {
    case engine::OpKernel::Inputs::kNone:
      out << kernel->name << "(";
      args();
      break;
    case engine::OpKernel::Inputs::kOne:
      if (op.hasInput()) describe(op.getInput(), out);
      out << "." << kernel->name << "(";
      args();
      break;
    case engine::OpKernel::Inputs::kMany: {
      out << kernel->name << "(";
      bool first = true;
      for (auto input : op.getInputs()) {
        if (!first) out << ", ";
        first = false;
        describe(input, out);
      }
      break;
    }
  }
  out << ")";
}

void resolve_hints(Op::Builder op, int64_t num_shards, int64_t index) {
  if (op.isShard()) {
    auto shard = op.getShard();
    if (shard.getNumShards() == kShardHint) shard.setNumShards(num_shards);
    if (shard.getIndex() == kShardHint) shard.setIndex(index);
  }
  if (op.hasInput()) resolve_hints(op.getInput(), num_shards, index);
  for (auto input : op.getInputs()) resolve_hints(input, num_shards, index);
}

}  // namespace

// ---- Impl ---------------------------------------------------------------------

capnp::ReaderOptions definition_reader_options() {
  capnp::ReaderOptions options;
  options.traversalLimitInWords = uint64_t{1} << 60;
  options.nestingLimit = 256;
  return options;
}

Dataset::Impl::Impl(capnp::MessageBuilder& message)
    : Impl(capnp::messageToFlatArray(message)) {}

Dataset::Impl::Impl(kj::Array<capnp::word> words_in) : words(kj::mv(words_in)) {
  reader = std::make_unique<capnp::FlatArrayMessageReader>(words.asPtr(),
                                                          definition_reader_options());
}

bool Dataset::Impl::contains(const void* address) const {
  auto* p = static_cast<const capnp::word*>(address);
  return p >= words.begin() && p < words.end();
}

void set_texts(capnp::List<capnp::Text>::Builder list, const std::vector<std::string>& values) {
  for (size_t i = 0; i < values.size(); ++i) list.set(static_cast<unsigned>(i), values[i]);
}

const void* op_key(wire::Op::Reader op) {
  return capnp::AnyStruct::Reader(op).getDataSection().begin();
}

const char* op_name(wire::Op::Which which) {
  const engine::OpKernel* kernel = engine::find_op_kernel(which);
  return kernel != nullptr ? kernel->name : "unknown op";
}

std::string fn_name(wire::Fn::Reader fn) {
  switch (fn.which()) {
    case wire::Fn::NAMED: return fn.getNamed().cStr();
    case wire::Fn::DECODE_CSV: return "decode_csv";
    case wire::Fn::PARSE_EXAMPLE: return "parse_example";
    case wire::Fn::CAST: return "cast";
    case wire::Fn::TFRECORD_DATASET: return "tfrecord_dataset";
    case wire::Fn::TEXT_LINE_DATASET: return "text_line_dataset";
  }
  return "unknown function";
}

wire::Compression to_wire(Compression compression) {
  return compression == Compression::kGzip ? wire::Compression::GZIP : wire::Compression::NONE;
}

Compression from_wire(wire::Compression compression) {
  return compression == wire::Compression::GZIP ? Compression::kGzip : Compression::kNone;
}

void Fn::Impl::write(wire::Fn::Builder builder) const {
  switch (kind) {
    case Kind::kNamed: builder.setNamed(name); break;
    case Kind::kDecodeCsv: {
      auto spec = builder.initDecodeCsv();
      auto defaults = spec.initRecordDefaults(static_cast<unsigned>(csv.record_defaults.size()));
      for (size_t i = 0; i < csv.record_defaults.size(); ++i) {
        rpc::write_tensor_inline(defaults[static_cast<unsigned>(i)], csv.record_defaults[i]);
      }
      spec.setFieldDelim(csv.field_delim);
      spec.setUseQuoteDelim(csv.use_quote_delim);
      spec.setNaValue(csv.na_value);
      auto cols = spec.initSelectCols(static_cast<unsigned>(csv.select_cols.size()));
      for (size_t i = 0; i < csv.select_cols.size(); ++i) cols.set(static_cast<unsigned>(i), csv.select_cols[i]);
      spec.setTrimWhitespace(csv.trim_whitespace);
      break;
    }
    case Kind::kParseExample: {
      auto list = builder.initParseExample(static_cast<unsigned>(features.size()));
      unsigned i = 0;
      for (const auto& [key, feature] : features) {
        auto f = list[i++];
        f.setKey(key);
        if (const auto* fixed = std::get_if<FixedLenFeature>(&feature)) {
          f.setDtype(rpc::to_wire(fixed->dtype));
          auto group = f.initFixedLen();
          auto shape = group.initShape(static_cast<unsigned>(fixed->shape.size()));
          for (size_t d = 0; d < fixed->shape.size(); ++d) shape.set(static_cast<unsigned>(d), fixed->shape[d]);
          if (fixed->default_value) {
            group.setHasDefault(true);
            rpc::write_tensor_inline(group.initDefaultValue(), *fixed->default_value);
          }
        } else {
          f.setDtype(rpc::to_wire(std::get<VarLenFeature>(feature).dtype));
          f.setVarLen();
        }
      }
      break;
    }
    case Kind::kCast: builder.setCast(rpc::to_wire(dtype)); break;
    case Kind::kTfRecordDataset: builder.setTfrecordDataset(data::to_wire(compression)); break;
    case Kind::kTextLineDataset: builder.setTextLineDataset(data::to_wire(compression)); break;
  }
}

// ---- Cardinality ------------------------------------------------------------------------

int64_t cardinality_of(wire::Op::Reader op) {
  const engine::OpKernel* kernel = engine::find_op_kernel(op.which());
  if (kernel == nullptr || kernel->cardinality == nullptr) return kUnknownCardinality;
  if (kernel->inputs == engine::OpKernel::Inputs::kOne && !op.hasInput()) return kUnknownCardinality;
  return kernel->cardinality(op);
}

// ---- Serialization ----------------------------------------------------------------------

namespace {

// Reads every field the schema names, recursively, so that a pointer of the
// wrong kind (a list where a struct belongs, found by fuzzing) fails here
// rather than in a later typed read. totalSize() alone walks pointers
// without the schema and accepts such a message.
void check_value(capnp::DynamicValue::Reader value, int depth);

void check_struct(capnp::DynamicStruct::Reader s, int depth) {
  if (depth > 512) KJ_FAIL_REQUIRE("dataset definition nested too deeply");
  auto visit = [&](capnp::StructSchema::Field field) {
    auto type = field.getType();
    if (type.isInterface() || type.isAnyPointer()) return;  // capabilities are not read here
    if (!s.has(field)) return;
    check_value(s.get(field), depth + 1);
  };
  for (auto field : s.getSchema().getNonUnionFields()) visit(field);
  KJ_IF_MAYBE(field, s.which()) { visit(*field); }
}

void check_value(capnp::DynamicValue::Reader value, int depth) {
  switch (value.getType()) {
    case capnp::DynamicValue::STRUCT:
      check_struct(value.as<capnp::DynamicStruct>(), depth);
      break;
    case capnp::DynamicValue::LIST:
      for (auto element : value.as<capnp::DynamicList>()) check_value(element, depth + 1);
      break;
    default:
      break;  // leaves (numbers, text, data) were checked by get()
  }
}

}  // namespace

Result<Dataset> parse_definition(const std::string& bytes) {
  if (bytes.empty() || bytes.size() % sizeof(capnp::word) != 0) {
    return Status::InvalidArgument("dataset definition of " + std::to_string(bytes.size()) +
                                   " bytes is not a Cap'n Proto message");
  }
  auto words = kj::heapArray<capnp::word>(bytes.size() / sizeof(capnp::word));
  std::memcpy(words.begin(), bytes.data(), bytes.size());
  try {
    {
      // Touch the whole tree so structural damage shows up here, not later,
      // through a reader whose traversal limit is a small multiple of the
      // message: a definition built by a client reads each word once per
      // pass, while one whose pointers share targets (amplification, found
      // by fuzzing: 120 bytes that took minutes) runs out of budget.
      capnp::ReaderOptions options = definition_reader_options();
      options.traversalLimitInWords = 4 * words.size() + 1024;
      capnp::FlatArrayMessageReader check(words.asPtr(), options);
      auto def = check.getRoot<wire::DatasetDef>();
      (void)def.totalSize();
      check_struct(capnp::toDynamic(def), 0);
    }
    return Dataset(std::make_shared<const Dataset::Impl>(kj::mv(words)));
  } catch (const kj::Exception& e) {
    return Status::InvalidArgument(std::string("malformed dataset definition: ") +
                                   e.getDescription().cStr());
  }
}

std::string describe_definition(wire::Op::Reader root) {
  std::ostringstream out;
  describe(root, out);
  return out.str();
}

Dataset resolve_shard_hints(const Dataset& dataset, int64_t num_shards, int64_t index) {
  capnp::MallocMessageBuilder message;
  message.setRoot(dataset.impl()->def());
  resolve_hints(message.getRoot<wire::DatasetDef>().getRoot(), num_shards, index);
  return Dataset(std::make_shared<const Dataset::Impl>(message));
}

}  // namespace capstan::data
