#include "data/op_kernel.h"

#include <array>
#include <cstdio>
#include <cstdlib>

#include "data/definition.h"

namespace capstan::data::engine {

// Every op file's kernel (CAPSTAN_DATASET_OP), as the build found them:
// lib/CMakeLists.txt writes one CAPSTAN_OP_KERNEL(name) line per op file.
#define CAPSTAN_OP_KERNEL(name) extern const OpKernel name;
#include "data/op_kernel_list.inc"
#undef CAPSTAN_OP_KERNEL

namespace {

const OpKernel* const kAllKernels[] = {
#define CAPSTAN_OP_KERNEL(name) &name,
#include "data/op_kernel_list.inc"
#undef CAPSTAN_OP_KERNEL
};

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
    for (const OpKernel* kernel : kAllKernels) {
      auto index = static_cast<size_t>(kernel->which);
      // Programming errors, found by the first test that builds a pipeline.
      if (index >= kMaxOps || r.by_which[index] != nullptr) {
        std::fprintf(stderr, "capstan: dataset op kernel '%s' (tag %zu) is registered twice or out of range\n",
                     kernel->name, index);
        std::abort();
      }
      r.by_which[index] = kernel;
    }
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

Result<IteratorPtr> make_input(wire::Op::Reader op, Pipeline& pipeline) {
  return make_iterator(op.getInput(), pipeline);
}

IteratorFactory input_factory(wire::Op::Reader in, Pipeline& pipeline) {
  return [in, &pipeline]() { return make_iterator(in, pipeline); };
}

int64_t input_cardinality(wire::Op::Reader op) { return cardinality_of(op.getInput()); }

bool resolve_deterministic(wire::Tri tri, const Pipeline& pipeline) {
  if (tri == wire::Tri::YES) return true;
  if (tri == wire::Tri::NO) return false;
  return pipeline.deterministic_default();
}

Status with_op(wire::Op::Reader op, Status status) {
  return status.ok() ? status : status.with_context(op_name(op.which()));
}

int64_t batched_cardinality(int64_t n, int64_t batch_size, bool drop_remainder) {
  if (n < 0 || batch_size <= 0) return n < 0 ? n : kUnknownCardinality;
  // n / b rounded up without n + b - 1, which overflows near INT64_MAX (found
  // by fuzz/definition_fuzz under UBSan).
  return drop_remainder ? n / batch_size : n / batch_size + (n % batch_size != 0 ? 1 : 0);
}

std::vector<std::string> share_of(capnp::List<capnp::Text>::Reader files, int64_t num_workers,
                                  int64_t index) {
  std::vector<std::string> mine;
  for (unsigned k = 0; k < files.size(); ++k) {
    if (static_cast<int64_t>(k) % num_workers == index) mine.emplace_back(files[k].cStr());
  }
  return mine;
}

void describe_files(capnp::List<capnp::Text>::Reader files, std::ostream& out) {
  out << files.size() << " files";
}

}  // namespace capstan::data::engine
