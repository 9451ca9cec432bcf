// The op registry: every op the schema can carry has exactly one kernel, and
// an op this build does not know is refused with InvalidArgument everywhere
// a definition is read.
#include "data/op_kernel.h"

#include <capnp/any.h>
#include <capnp/schema.h>
#include <capnp/serialize.h>
#include <catch2/catch.hpp>

#include <set>

#include "capstan/data/dataset.h"
#include "data/definition.h"
#include "data/sharding.h"

namespace capstan::data::engine {
namespace {

// `dataset` with its root op's union tag replaced by `tag`.
Dataset with_root_tag(const Dataset& dataset, uint16_t tag) {
  capnp::MallocMessageBuilder message;
  message.setRoot(dataset.impl()->def());
  auto root = message.getRoot<wire::DatasetDef>().getRoot();
  auto offset = capnp::Schema::from<wire::Op>().getProto().getStruct().getDiscriminantOffset();
  auto data = capnp::AnyStruct::Builder(kj::cp(root)).getDataSection();
  REQUIRE(data.size() >= (offset + 1) * sizeof(uint16_t));
  reinterpret_cast<uint16_t*>(data.begin())[offset] = tag;
  auto words = capnp::messageToFlatArray(message);
  auto bytes = words.asBytes();
  auto back = Dataset::deserialize(std::string(reinterpret_cast<const char*>(bytes.begin()), bytes.size()));
  REQUIRE(back.ok());
  return *back;
}

}  // namespace

TEST_CASE("every op in the schema has exactly one kernel", "[data][kernels]") {
  auto fields = capnp::Schema::from<wire::Op>().getUnionFields();
  REQUIRE(fields.size() > 0);
  std::set<std::string> names;
  for (auto field : fields) {
    auto which = static_cast<wire::Op::Which>(field.getProto().getDiscriminantValue());
    INFO("schema op " << field.getProto().getName().cStr());
    const OpKernel* kernel = find_op_kernel(which);
    REQUIRE(kernel != nullptr);
    CHECK(kernel->which == which);
    CHECK(kernel->make != nullptr);
    CHECK(names.insert(kernel->name).second);  // names are unique
    if (kernel->file_source != nullptr) {
      CHECK(kernel->inputs == OpKernel::Inputs::kNone);
      CHECK(kernel->file_source->files != nullptr);
      CHECK(kernel->file_source->keep_share != nullptr);
      CHECK(kernel->file_source->read_splits != nullptr);
    }
    CHECK((kernel->split_provider == nullptr) == (kernel->read_splits == nullptr));
  }
  CHECK(op_kernels().size() == fields.size());
}

TEST_CASE("an op this build does not know is refused, not run", "[data][kernels]") {
  Dataset unknown = with_root_tag(Dataset::range(5).batch(2), 63);
  REQUIRE(find_op_kernel(static_cast<wire::Op::Which>(63)) == nullptr);

  auto it = unknown.make_iterator();
  REQUIRE_FALSE(it.ok());
  CHECK(it.status().code() == StatusCode::kInvalidArgument);
  CHECK_THAT(it.status().message(), Catch::Contains("tag 63") && Catch::Contains("unknown"));

  CHECK(unknown.cardinality() == kUnknownCardinality);
  CHECK(unknown.debug_string() == "range(0, 5, 1).unknown_op_63(...)");
  CHECK(unknown.make_split_provider().status().code() == StatusCode::kInvalidArgument);
  // Static sharding walks the definition too; the unknown op stays in place
  // and the pipeline is still refused when it is built.
  auto sharded = apply_sharding(unknown, ShardingPolicy::kData, 2, 0);
  REQUIRE(sharded.ok());
  CHECK(sharded->make_iterator().status().code() == StatusCode::kInvalidArgument);

  // Also as an input of a known op.
  Dataset nested = with_root_tag(Dataset::range(5), 63);
  auto zipped = Dataset::zip({Dataset::range(3), nested});
  CHECK(zipped.make_iterator().status().code() == StatusCode::kInvalidArgument);
  CHECK(zipped.debug_string() == "zip(range(0, 3, 1), unknown_op_63(...))");
}

TEST_CASE("debug strings come from each op's kernel", "[data][kernels]") {
  auto ds = Dataset::zip({Dataset::range(3), Dataset::range(0, 8, 2).repeat(2)})
                .concatenate(Dataset::range(1).take(1))
                .shard(2, 1)
                .skip(1);
  CHECK(ds.debug_string() ==
        "concatenate(zip(range(0, 3, 1), range(0, 8, 2).repeat(2)), range(0, 1, 1).take(1)).shard(2, 1).skip(1)");
}

}  // namespace capstan::data::engine
