#include "collectives/reduce.h"

#include <algorithm>
#include <cstring>
#include <string>

#if defined(__x86_64__)
#include <emmintrin.h>
#define CAPSTAN_STREAMING_STORES 1
#endif

namespace capstan::collectives {
namespace {

template <typename T>
void reduce_to_typed(ReduceOp op, T* out, const T* a, const T* b, int64_t count) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kMean:
      for (int64_t i = 0; i < count; ++i) out[i] = a[i] + b[i];
      return;
    case ReduceOp::kProd:
      for (int64_t i = 0; i < count; ++i) out[i] = a[i] * b[i];
      return;
    case ReduceOp::kMin:
      for (int64_t i = 0; i < count; ++i) out[i] = std::min(a[i], b[i]);
      return;
    case ReduceOp::kMax:
      for (int64_t i = 0; i < count; ++i) out[i] = std::max(a[i], b[i]);
      return;
  }
}

template <typename T>
void divide_typed(T* data, int64_t count, int ranks) {
  for (int64_t i = 0; i < count; ++i) data[i] = static_cast<T>(data[i] / static_cast<T>(ranks));
}

#ifdef CAPSTAN_STREAMING_STORES

// Scalar up to a 16-byte boundary of `out`, then four floats a store.
void add_streaming(float* out, const float* a, const float* b, int64_t count) {
  int64_t i = 0;
  for (; i < count && (reinterpret_cast<uintptr_t>(out + i) & 15) != 0; ++i) out[i] = a[i] + b[i];
  for (; i + 4 <= count; i += 4) _mm_stream_ps(out + i, _mm_add_ps(_mm_loadu_ps(a + i), _mm_loadu_ps(b + i)));
  for (; i < count; ++i) out[i] = a[i] + b[i];
  _mm_sfence();
}

// Bytes up to a 16-byte boundary of `out`, then sixteen a store.
void copy_streaming(std::byte* out, const std::byte* in, size_t bytes) {
  const size_t head = std::min(bytes, (16 - (reinterpret_cast<uintptr_t>(out) & 15)) & 15);
  std::memcpy(out, in, head);
  size_t i = head;
  for (; i + 16 <= bytes; i += 16) {
    _mm_stream_si128(reinterpret_cast<__m128i*>(out + i), _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i)));
  }
  std::memcpy(out + i, in + i, bytes - i);
  _mm_sfence();
}

#endif  // CAPSTAN_STREAMING_STORES

template <typename Half>
Result<Tensor> widen_typed(const Tensor& tensor) {
  CAPSTAN_ASSIGN_OR_RETURN(Tensor out, Tensor::uninitialized(DType::kFloat32, tensor.shape()));
  auto in = tensor.flat<Half>();
  auto wide = out.mutable_flat<float>();
  for (size_t i = 0; i < in.size(); ++i) wide[i] = in[i].to_float();
  return out;
}

template <typename Half>
Result<Tensor> narrow_typed(const Tensor& wide) {
  CAPSTAN_ASSIGN_OR_RETURN(Tensor out, Tensor::uninitialized(DTypeOf<Half>::value, wide.shape()));
  auto in = wide.flat<float>();
  auto half = out.mutable_flat<Half>();
  for (size_t i = 0; i < in.size(); ++i) half[i] = Half::from_float(in[i]);
  return out;
}

}  // namespace

bool reduces_natively(DType dtype) {
  return dtype == DType::kFloat32 || dtype == DType::kFloat64 || dtype == DType::kInt32 || dtype == DType::kInt64;
}

bool reduces_widened(DType dtype) { return dtype == DType::kFloat16 || dtype == DType::kBFloat16; }

Status check_reducible(DType dtype, std::string_view operation) {
  if (reduces_natively(dtype) || reduces_widened(dtype)) return Status::Ok();
  return Status::InvalidArgument(std::string(operation) + ": cannot reduce " + std::string(dtype_name(dtype)) +
                                 " tensors; use float32, float64, int32, int64, float16 or bfloat16");
}

void reduce_to(DType dtype, ReduceOp op, std::byte* out, const std::byte* a, const std::byte* b, int64_t count,
               Stores stores) {
#ifdef CAPSTAN_STREAMING_STORES
  if (stores == Stores::kStreaming && dtype == DType::kFloat32 && (op == ReduceOp::kSum || op == ReduceOp::kMean)) {
    return add_streaming(reinterpret_cast<float*>(out), reinterpret_cast<const float*>(a),
                         reinterpret_cast<const float*>(b), count);
  }
#endif
  (void)stores;
  switch (dtype) {
    case DType::kFloat32:
      return reduce_to_typed(op, reinterpret_cast<float*>(out), reinterpret_cast<const float*>(a),
                             reinterpret_cast<const float*>(b), count);
    case DType::kFloat64:
      return reduce_to_typed(op, reinterpret_cast<double*>(out), reinterpret_cast<const double*>(a),
                             reinterpret_cast<const double*>(b), count);
    case DType::kInt32:
      return reduce_to_typed(op, reinterpret_cast<int32_t*>(out), reinterpret_cast<const int32_t*>(a),
                             reinterpret_cast<const int32_t*>(b), count);
    case DType::kInt64:
      return reduce_to_typed(op, reinterpret_cast<int64_t*>(out), reinterpret_cast<const int64_t*>(a),
                             reinterpret_cast<const int64_t*>(b), count);
    default:
      return;
  }
}


void copy_to(std::byte* out, const std::byte* in, size_t bytes, Stores stores) {
  if (bytes == 0) return;
#ifdef CAPSTAN_STREAMING_STORES
  if (stores == Stores::kStreaming) return copy_streaming(out, in, bytes);
#endif
  (void)stores;
  std::memcpy(out, in, bytes);
}

void reduce_into(DType dtype, ReduceOp op, std::byte* acc, const std::byte* in, int64_t count) {
  reduce_to(dtype, op, acc, acc, in, count);
}

void finish_mean(DType dtype, std::byte* data, int64_t count, int ranks) {
  switch (dtype) {
    case DType::kFloat32: return divide_typed(reinterpret_cast<float*>(data), count, ranks);
    case DType::kFloat64: return divide_typed(reinterpret_cast<double*>(data), count, ranks);
    case DType::kInt32: return divide_typed(reinterpret_cast<int32_t*>(data), count, ranks);
    case DType::kInt64: return divide_typed(reinterpret_cast<int64_t*>(data), count, ranks);
    default: return;
  }
}

Result<Tensor> widen(const Tensor& tensor) {
  if (tensor.dtype() == DType::kFloat16) return widen_typed<Float16>(tensor);
  if (tensor.dtype() == DType::kBFloat16) return widen_typed<BFloat16>(tensor);
  return Status::InvalidArgument("widen: " + std::string(dtype_name(tensor.dtype())) + " is not float16/bfloat16");
}

Result<Tensor> narrow(const Tensor& wide, DType dtype) {
  if (dtype == DType::kFloat16) return narrow_typed<Float16>(wide);
  if (dtype == DType::kBFloat16) return narrow_typed<BFloat16>(wide);
  return Status::InvalidArgument("narrow: " + std::string(dtype_name(dtype)) + " is not float16/bfloat16");
}

std::string_view reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "SUM";
    case ReduceOp::kMean: return "MEAN";
    case ReduceOp::kMin: return "MIN";
    case ReduceOp::kMax: return "MAX";
    case ReduceOp::kProd: return "PROD";
  }
  return "?";
}

}  // namespace capstan::collectives
