// from_tensors(element): the one element, decoded once per pipeline.
#include "data/op_kernel.h"
#include "data/ops/common.h"
#include "rpc/tensor_codec.h"

namespace capstan::data::engine {

namespace {

// An op's tensors, decoded from the definition once for the pipeline.
// Nothing to save: they are the definition's.
struct DecodedElement : PipelineState {
  void save(StateWriter&) override {}
  Status restore(StateReader&) override { return Status::Ok(); }
  Mutex mutex;
  std::optional<Element> element GUARDED_BY(mutex);
};

}  // namespace

CAPSTAN_DATASET_OP(kFromTensorsKernel) = {
    .which = Op::FROM_TENSORS,
    .name = "from_tensors",
    .inputs = Inputs::kNone,
    .describe_args = [](Op::Reader, std::ostream& out) { out << "..."; },
    .cardinality = [](Op::Reader) -> int64_t { return 1; },
    .make = [](Op::Reader op, Pipeline& pipeline) -> Result<IteratorPtr> {
      // Decoded once per pipeline; every iterator (repeat() makes one per
      // epoch) yields the same tensors, as TF's dataset holds its tensors.
      auto decoded = pipeline.state<DecodedElement>(op_key(op));
      MutexLock lock(decoded->mutex);
      if (!decoded->element) {
        CAPSTAN_ASSIGN_OR_RETURN(Element e, rpc::read_element_inline(op.getFromTensors()));
        decoded->element = std::move(e);
      }
      return make_vector_iterator({*decoded->element}, "from_tensors");
    },
};

}  // namespace capstan::data::engine
