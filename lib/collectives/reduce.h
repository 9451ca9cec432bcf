// The arithmetic of the collectives, apart from any transport: element-wise
// reductions over raw buffers, and the float16/bfloat16 widening that lets
// them accumulate in float32.
#ifndef CAPSTAN_LIB_COLLECTIVES_REDUCE_H_
#define CAPSTAN_LIB_COLLECTIVES_REDUCE_H_

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "capstan/collectives.h"
#include "capstan/status.h"
#include "capstan/tensor.h"

namespace capstan::collectives {

// float32, float64, int32, int64: reduced as they are.
bool reduces_natively(DType dtype);
// float16 and bfloat16: widened to float32, reduced, narrowed once.
bool reduces_widened(DType dtype);
// InvalidArgument naming the dtype and what is supported, unless it is one
// of the above.
Status check_reducible(DType dtype, std::string_view operation);

// acc[i] = acc[i] (op) in[i] for `count` elements of `dtype` (one of the
// natively reduced ones). kMean accumulates as kSum (see finish_mean).
void reduce_into(DType dtype, ReduceOp op, std::byte* acc, const std::byte* in, int64_t count);
// out[i] = a[i] (op) b[i]; `out` may be `a`.
void reduce_to(DType dtype, ReduceOp op, std::byte* out, const std::byte* a, const std::byte* b, int64_t count);
// kMean's last step: divides `count` elements by `ranks` (integers round
// toward zero).
void finish_mean(DType dtype, std::byte* data, int64_t count, int ranks);

// float16/bfloat16 -> float32 and back (round to nearest even).
Result<Tensor> widen(const Tensor& tensor);
Result<Tensor> narrow(const Tensor& wide, DType dtype);

std::string_view reduce_op_name(ReduceOp op);

}  // namespace capstan::collectives

#endif  // CAPSTAN_LIB_COLLECTIVES_REDUCE_H_
