// zip(datasets): elements of the inputs side by side, until the shortest
// ends.
#include <algorithm>

#include "data/op_kernel.h"
#include "data/ops/common.h"

namespace capstan::data::engine {

namespace {

class ZipIterator final : public IteratorBase {
 public:
  explicit ZipIterator(std::vector<IteratorPtr> inputs) : inputs_(std::move(inputs)) {}
  Status get_next(Element* out, bool* end) override {
    Element result;
    bool all_named = true;
    for (auto& input : inputs_) {
      Element e;
      CAPSTAN_RETURN_IF_ERROR(input->get_next(&e, end));
      if (*end) return Status::Ok();
      all_named = all_named && e.names.size() == e.components.size();
      for (size_t i = 0; i < e.components.size(); ++i) {
        result.components.push_back(std::move(e.components[i]));
        result.names.push_back(i < e.names.size() ? e.names[i] : "");
      }
    }
    if (!all_named) result.names.clear();
    *out = std::move(result);
    return Status::Ok();
  }
  Status save(StateWriter& writer) override {
    writer.begin("zip");
    for (auto& input : inputs_) CAPSTAN_RETURN_IF_ERROR(input->save(writer));
    return Status::Ok();
  }
  Status restore(StateReader& reader) override {
    CAPSTAN_RETURN_IF_ERROR(reader.begin("zip"));
    for (auto& input : inputs_) CAPSTAN_RETURN_IF_ERROR(input->restore(reader));
    return Status::Ok();
  }

 private:
  std::vector<IteratorPtr> inputs_;
};

}  // namespace

CAPSTAN_DATASET_OP(kZipKernel) = {
    .which = Op::ZIP,
    .name = "zip",
    .inputs = Inputs::kMany,
    .cardinality = [](Op::Reader op) -> int64_t {
      if (op.getInputs().size() == 0) return 0;
      int64_t result = kInf;
      bool unknown = false;
      for (auto in : op.getInputs()) {
        int64_t n = cardinality_of(in);
        if (n == kUnk) unknown = true;
        else if (n != kInf) result = result == kInf ? n : std::min(result, n);
      }
      if (unknown) return result == 0 ? 0 : kUnk;
      return result;
    },
    .validate = [](Op::Reader op, const FunctionRegistry*) -> Status {
      if (op.getInputs().size() == 0) return invalid_op(op, "needs at least one dataset");
      return Status::Ok();
    },
    .make = [](Op::Reader op, Pipeline& pipeline) -> Result<IteratorPtr> {
      std::vector<IteratorPtr> inputs;
      for (auto in : op.getInputs()) {
        CAPSTAN_ASSIGN_OR_RETURN(IteratorPtr it, make_iterator(in, pipeline));
        inputs.push_back(std::move(it));
      }
      return IteratorPtr(std::make_unique<ZipIterator>(std::move(inputs)));
    },
};

}  // namespace capstan::data::engine
