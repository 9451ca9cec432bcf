// from_tensor_slices(element): the rows of its components, one element each.
#include "data/op_kernel.h"
#include "data/ops/common.h"
#include "data/tensor_util.h"
#include "rpc/tensor_codec.h"

namespace capstan::data::engine {

namespace {

Result<IteratorPtr> make_from_tensor_slices(const Element& element) {
  if (element.components.empty()) return Status::InvalidArgument("needs at least one component");
  std::vector<std::vector<Tensor>> columns;
  for (size_t c = 0; c < element.components.size(); ++c) {
    const Tensor& t = element.components[c];
    if (t.rank() == 0) {
      return Status::InvalidArgument("component " + std::to_string(c) + " is a scalar; slicing needs rank >= 1");
    }
    if (t.shape()[0] != element.components[0].shape()[0]) {
      return Status::InvalidArgument("components have different first dimensions: " +
                                     std::to_string(element.components[0].shape()[0]) + " and " +
                                     std::to_string(t.shape()[0]) + " (component " + std::to_string(c) + ")");
    }
    CAPSTAN_ASSIGN_OR_RETURN(auto rows, unstack(t));
    columns.push_back(std::move(rows));
  }
  std::vector<Element> elements(static_cast<size_t>(element.components[0].shape()[0]));
  for (size_t i = 0; i < elements.size(); ++i) {
    elements[i].names = element.names;
    for (auto& column : columns) elements[i].components.push_back(std::move(column[i]));
  }
  return make_vector_iterator(std::move(elements), "from_tensor_slices");
}

}  // namespace

CAPSTAN_DATASET_OP(kFromTensorSlicesKernel) = {
    .which = Op::FROM_TENSOR_SLICES,
    .name = "from_tensor_slices",
    .inputs = Inputs::kNone,
    .describe_args = [](Op::Reader, std::ostream& out) { out << "..."; },
    .cardinality = [](Op::Reader op) -> int64_t {
      auto components = op.getFromTensorSlices().getComponents();
      if (components.size() == 0 || components[0].getShape().size() == 0) return kUnknownCardinality;
      return components[0].getShape()[0];
    },
    .make = [](Op::Reader op, Pipeline&) -> Result<IteratorPtr> {
      CAPSTAN_ASSIGN_OR_RETURN(Element e, rpc::read_element_inline(op.getFromTensorSlices()));
      auto it = make_from_tensor_slices(e);
      if (!it.ok()) return it.status().with_context("from_tensor_slices");
      return it;
    },
};

}  // namespace capstan::data::engine
