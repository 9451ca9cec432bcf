// snapshot(path, compression): the input's elements kept under
// path/<fingerprint of the input> after the first complete pass (the format
// is data/saved_dataset.h's).
#include <cstdio>

#include "data/op_kernel.h"
#include "data/ops/common.h"
#include "data/saved_dataset.h"

namespace capstan::data::engine {

CAPSTAN_DATASET_OP(kSnapshotKernel) = {
    .which = Op::SNAPSHOT,
    .name = "snapshot",
    .inputs = Inputs::kOne,
    .describe_args = [](Op::Reader op, std::ostream& out) { out << op.getSnapshot().getPath().cStr(); },
    .cardinality = input_cardinality,
    .validate = [](Op::Reader op, const FunctionRegistry*) -> Status {
      if (op.getSnapshot().getPath().size() == 0) return invalid_op(op, "the path is empty");
      return Status::Ok();
    },
    .make = [](Op::Reader op, Pipeline& pipeline) -> Result<IteratorPtr> {
      char name[24];
      std::snprintf(name, sizeof(name), "%016llx",
                    static_cast<unsigned long long>(op_fingerprint(op.getInput())));
      std::string dir = std::string(op.getSnapshot().getPath().cStr()) + "/" + name;
      return make_snapshot(input_factory(op.getInput(), pipeline), std::move(dir),
                           from_wire(op.getSnapshot().getCompression()));
    },
};

}  // namespace capstan::data::engine
