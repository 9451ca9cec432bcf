// prefetch(buffer_size): the input read ahead on a background thread.
#include "data/op_kernel.h"
#include "data/ops/common.h"

namespace capstan::data::engine {

namespace {

class PrefetchIterator final : public IteratorBase {
 public:
  PrefetchIterator(IteratorPtr input, int64_t buffer_size, Pipeline& pipeline) {
    std::shared_ptr<Knob> knob;
    int64_t ram = pipeline.autotuner().ram_budget();
    if (buffer_size == kAutotune) {
      knob = pipeline.autotuner().add(Knob::Kind::kBufferSize, 2, 1, std::max<int64_t>(2, ram));
    } else {
      knob = std::make_shared<Knob>(Knob::Kind::kBufferSize, buffer_size, buffer_size, buffer_size);
      ram = 0;  // a fixed size is the user's call
    }
    prefetcher_ = std::make_unique<Prefetcher>(std::move(input), std::move(knob), ram, pipeline.memory());
  }
  Status get_next(Element* out, bool* end) override {
    Item item = prefetcher_->take();
    *end = item.end;
    if (!item.status.ok()) return item.status;
    if (!item.end) *out = std::move(item.element);
    return Status::Ok();
  }
  Status save(StateWriter& writer) override {
    writer.begin("prefetch");
    return prefetcher_->save(writer);
  }
  Status restore(StateReader& reader) override {
    CAPSTAN_RETURN_IF_ERROR(reader.begin("prefetch"));
    return prefetcher_->restore(reader);
  }

 private:
  std::unique_ptr<Prefetcher> prefetcher_;
};

}  // namespace

CAPSTAN_DATASET_OP(kPrefetchKernel) = {
    .which = Op::PREFETCH,
    .name = "prefetch",
    .inputs = Inputs::kOne,
    .describe_args = [](Op::Reader op, std::ostream& out) { out << op.getPrefetch().getBufferSize(); },
    .cardinality = input_cardinality,
    .validate = [](Op::Reader op, const FunctionRegistry*) -> Status {
      // A count of elements, not threads: any size, held to the memory budget.
      int64_t size = op.getPrefetch().getBufferSize();
      if (size >= 0 || size == kAutotune) return Status::Ok();
      return invalid_op(op, "buffer_size must be >= 0 or AUTOTUNE, got " + std::to_string(size));
    },
    .make = [](Op::Reader op, Pipeline& pipeline) -> Result<IteratorPtr> {
      CAPSTAN_ASSIGN_OR_RETURN(IteratorPtr in, make_input(op, pipeline));
      if (op.getPrefetch().getBufferSize() == 0) return in;
      return IteratorPtr(std::make_unique<PrefetchIterator>(std::move(in), op.getPrefetch().getBufferSize(), pipeline));
    },
};

}  // namespace capstan::data::engine
