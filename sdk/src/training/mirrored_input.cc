// MirroredInput: a multi-client process's step input (capstan/mirrored.h),
// over the elements and shares a worker-server's strategy input uses
// (lib/data/step_input.h), so that both hand out the same positions.
#include <memory>
#include <string>
#include <vector>

#include "capstan/data/dataset.h"
#include "capstan/mirrored.h"
#include "capstan/phases.h"
#include "data/step_input.h"

namespace capstan {

struct MirroredInput::Impl {
  StepInputOptions options;
  std::shared_ptr<const data::StepInputElements> elements;
};

MirroredInput::MirroredInput(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
MirroredInput::~MirroredInput() = default;

std::vector<int64_t> step_input_indices(int64_t size, const StepInputOptions& options, int64_t start, int64_t count) {
  if (start < 0) return {};
  return data::position_indices(size, start, count, options.shuffle, [&](int64_t epoch) {
    return std::make_shared<const std::vector<int64_t>>(data::StepInputElements::permutation(size, options.seed, epoch));
  });
}

Result<std::unique_ptr<MirroredInput>> MirroredInput::read(const data::Dataset& examples, StepInputOptions options,
                                                           const FunctionRegistry* functions,
                                                           int64_t memory_budget_bytes) {
  if (options.global_batch < 0 || options.per_replica_batch < 0 ||
      (options.global_batch > 0) == (options.per_replica_batch > 0)) {
    return Status::InvalidArgument("MirroredInput: global_batch " + std::to_string(options.global_batch) +
                                   " and per_replica_batch " + std::to_string(options.per_replica_batch) +
                                   ": set exactly one of them > 0");
  }
  CAPSTAN_ASSIGN_OR_RETURN(auto iterator, examples.make_iterator(functions));
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  CAPSTAN_ASSIGN_OR_RETURN(impl->elements, data::StepInputElements::read(*iterator, memory_budget_bytes));
  return std::unique_ptr<MirroredInput>(new MirroredInput(std::move(impl)));
}

int64_t MirroredInput::size() const { return impl_->elements->size(); }

int64_t MirroredInput::global_batch(int replicas) const {
  const StepInputOptions& o = impl_->options;
  return o.global_batch > 0 ? o.global_batch : o.per_replica_batch * replicas;
}

Result<Element> MirroredInput::next(const Communicator& group, MirroredVariables& vars) {
  PhaseScope phase(Phase::kInput);
  const int64_t global = global_batch(group.size());
  CAPSTAN_ASSIGN_OR_RETURN(std::vector<training::StepInput> shares,
                           data::step_shares(vars.input_position(), global, group.size(), impl_->options.seed,
                                             impl_->options.shuffle));
  const training::StepInput& mine = shares.at(static_cast<size_t>(group.rank()));
  CAPSTAN_ASSIGN_OR_RETURN(Element batch, impl_->elements->batch(mine));
  CAPSTAN_RETURN_IF_ERROR(vars.set_gradient_weight(mine.weight));
  CAPSTAN_RETURN_IF_ERROR(vars.set_step_examples(global));
  return batch;
}

}  // namespace capstan
