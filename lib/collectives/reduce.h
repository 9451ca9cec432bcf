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
// Where a result is written: through the cache (plain stores), or with
// non-temporal stores where the CPU has them (x86-64: SSE2), for outputs too
// large to stay in the cache: such a store skips reading each destination
// line first, a third of the memory traffic of a reduction and half of a
// copy's. Streaming covers float32 kSum/kMean reductions and copies; other
// dtypes and ops are written through the cache. Results are the same bit
// for bit either way, and visible to other threads and processes once the
// call returns (a streaming call ends with a store fence).
enum class Stores { kCached, kStreaming };
// out[i] = a[i] (op) b[i]; `out` may be `a`.
void reduce_to(DType dtype, ReduceOp op, std::byte* out, const std::byte* a, const std::byte* b, int64_t count,
               Stores stores = Stores::kCached);
// memcpy, written as `stores` says.
void copy_to(std::byte* out, const std::byte* in, size_t bytes, Stores stores);
// kMean's last step: divides `count` elements by `ranks` (integers round
// toward zero).
void finish_mean(DType dtype, std::byte* data, int64_t count, int ranks);

// float16/bfloat16 -> float32 and back (round to nearest even).
Result<Tensor> widen(const Tensor& tensor);
Result<Tensor> narrow(const Tensor& wide, DType dtype);

std::string_view reduce_op_name(ReduceOp op);

}  // namespace capstan::collectives

#endif  // CAPSTAN_LIB_COLLECTIVES_REDUCE_H_
