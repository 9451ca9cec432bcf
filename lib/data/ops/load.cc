// load(path): the elements a save() wrote, in the saved order (the format
// is data/saved_dataset.h's, shared with save and snapshot).
#include "data/op_kernel.h"
#include "data/ops/common.h"
#include "data/saved_dataset.h"

namespace capstan::data::engine {

namespace {

constexpr OpKernel::FileSource kLoadSource{
    .files = [](Op::Reader op) -> Result<std::vector<std::string>> { return texts(op.getLoad().getShards()); },
    .keep_share =
        [](Op::Builder op, int64_t num_workers, int64_t index) {
          auto mine = share_of(op.asReader().getLoad().getShards(), num_workers, index);
          set_texts(op.getLoad().initShards(static_cast<unsigned>(mine.size())), mine);
          op.getLoad().setNumElements(kUnknownCardinality);  // a share of them
        },
    .read_splits =
        [](Op::Reader op, SplitProvider* splits) {
          return make_split_saved(splits, from_wire(op.getLoad().getCompression()));
        },
};

}  // namespace

CAPSTAN_DATASET_OP(kLoadKernel) = {
    .which = Op::LOAD,
    .name = "load",
    .inputs = Inputs::kNone,
    .describe_args = [](Op::Reader op, std::ostream& out) { out << op.getLoad().getPath().cStr(); },
    .cardinality = [](Op::Reader op) -> int64_t {
      int64_t n = op.getLoad().getNumElements();
      return n >= 0 ? n : kUnknownCardinality;
    },
    .validate = [](Op::Reader op, const FunctionRegistry*) -> Status {
      if (op.getLoad().getShards().size() == 0) return invalid_op(op, "no shard files");
      return Status::Ok();
    },
    .make = [](Op::Reader op, Pipeline&) -> Result<IteratorPtr> {
      return make_saved_reader(texts(op.getLoad().getShards()), from_wire(op.getLoad().getCompression()));
    },
    .file_source = &kLoadSource,
};

}  // namespace capstan::data::engine
