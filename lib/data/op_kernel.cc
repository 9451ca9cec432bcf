#include "data/op_kernel.h"

#include <array>
#include <cstdio>
#include <cstdlib>

#include "data/definition.h"

namespace capstan::data::engine {
namespace {

// Larger than any discriminant of the Op union (checked when the table is
// built).
constexpr size_t kMaxOps = 64;

struct Registry {
  std::array<const OpKernel*, kMaxOps> by_which{};
  std::vector<const OpKernel*> all;
};

const Registry& registry() {
  static const Registry instance = []() {
    Registry r;
    auto add = [&r](std::span<const OpKernel> kernels) {
      for (const OpKernel& kernel : kernels) {
        auto index = static_cast<size_t>(kernel.which);
        // Programming errors, found by the first test that builds a pipeline.
        if (index >= kMaxOps || r.by_which[index] != nullptr) {
          std::fprintf(stderr, "capstan: dataset op kernel '%s' (tag %zu) is registered twice or out of range\n",
                       kernel.name, index);
          std::abort();
        }
        r.by_which[index] = &kernel;
      }
    };
    add(source_kernels());
    add(transform_kernels());
    for (const OpKernel* kernel : r.by_which) {
      if (kernel != nullptr) r.all.push_back(kernel);
    }
    return r;
  }();
  return instance;
}

}  // namespace

const OpKernel* find_op_kernel(wire::Op::Which which) {
  auto index = static_cast<size_t>(which);
  return index < kMaxOps ? registry().by_which[index] : nullptr;
}

std::span<const OpKernel* const> op_kernels() { return registry().all; }

Status invalid_op(wire::Op::Reader op, const std::string& message) {
  return Status::InvalidArgument(std::string(op_name(op.which())) + ": " + message);
}

std::vector<std::string> texts(capnp::List<capnp::Text>::Reader list) {
  std::vector<std::string> out;
  out.reserve(list.size());
  for (auto t : list) out.emplace_back(t.cStr(), t.size());
  return out;
}

Status check_positive(wire::Op::Reader op, int64_t value, const char* name) {
  if (value > 0) return Status::Ok();
  return invalid_op(op, std::string(name) + " must be positive, got " + std::to_string(value));
}

Status check_count(wire::Op::Reader op, int64_t value, const char* name) {
  if (value >= -1) return Status::Ok();
  return invalid_op(op, std::string(name) + " must be -1 or more, got " + std::to_string(value));
}

Status check_parallel(wire::Op::Reader op, int64_t value, const char* name) {
  if (value == kAutotune || (value >= 0 && value <= kMaxParallelCalls)) return Status::Ok();
  return invalid_op(op, std::string(name) + " must be in [0, " + std::to_string(kMaxParallelCalls) +
                            "] or AUTOTUNE, got " + std::to_string(value));
}

}  // namespace capstan::data::engine
