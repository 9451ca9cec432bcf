// Zero-copy views between capstan::Tensor and torch::Tensor.
#include "capstan/torch.h"
#include "errors.h"

#include <sstream>

namespace capstan::torch {

using internal::sizes_string;

Result<c10::ScalarType> torch_dtype(DType dtype) {
  switch (dtype) {
    case DType::kFloat16: return c10::ScalarType::Half;
    case DType::kBFloat16: return c10::ScalarType::BFloat16;
    case DType::kFloat32: return c10::ScalarType::Float;
    case DType::kFloat64: return c10::ScalarType::Double;
    case DType::kInt8: return c10::ScalarType::Char;
    case DType::kInt16: return c10::ScalarType::Short;
    case DType::kInt32: return c10::ScalarType::Int;
    case DType::kInt64: return c10::ScalarType::Long;
    case DType::kUInt8: return c10::ScalarType::Byte;
    case DType::kBool: return c10::ScalarType::Bool;
    case DType::kString:
    case DType::kInvalid: break;
  }
  return Status::InvalidArgument("dtype " + std::string(dtype_name(dtype)) +
                                 " has no torch counterpart (torch tensors hold numbers and bools only)");
}

Result<DType> capstan_dtype(c10::ScalarType type) {
  switch (type) {
    case c10::ScalarType::Half: return DType::kFloat16;
    case c10::ScalarType::BFloat16: return DType::kBFloat16;
    case c10::ScalarType::Float: return DType::kFloat32;
    case c10::ScalarType::Double: return DType::kFloat64;
    case c10::ScalarType::Char: return DType::kInt8;
    case c10::ScalarType::Short: return DType::kInt16;
    case c10::ScalarType::Int: return DType::kInt32;
    case c10::ScalarType::Long: return DType::kInt64;
    case c10::ScalarType::Byte: return DType::kUInt8;
    case c10::ScalarType::Bool: return DType::kBool;
    default: break;
  }
  return Status::InvalidArgument(std::string("torch dtype ") + c10::toString(type) +
                                 " has no Capstan counterpart; convert it first (e.g. .to(torch::kFloat32))");
}

Result<::torch::Tensor> to_torch(const Tensor& tensor) {
  if (!tensor.valid()) {
    return Status::InvalidArgument("to_torch: the tensor is invalid (default-constructed, no dtype)");
  }
  CAPSTAN_ASSIGN_OR_RETURN(c10::ScalarType type, torch_dtype(tensor.dtype()));
  // The deleter owns a copy of the handle: the buffer lives as long as the
  // torch tensor (or any view of it) does.
  auto* keep = new Tensor(tensor);
  return ::torch::from_blob(const_cast<std::byte*>(tensor.data()), tensor.shape(),
                            [keep](void*) { delete keep; }, ::torch::TensorOptions().dtype(type));
}

namespace internal {

Result<DType> dense_dtype(const ::torch::Tensor& tensor, const std::string& name, bool cuda_too) {
  if (!tensor.defined()) return Status::InvalidArgument(name + " is an undefined torch tensor");
  if (tensor.layout() != c10::kStrided) {
    std::ostringstream layout;
    layout << tensor.layout();
    return Status::InvalidArgument(name + " has layout " + layout.str() +
                                   "; only dense (strided) tensors convert: call .to_dense() first");
  }
  if (!tensor.device().is_cpu() && !(cuda_too && tensor.device().is_cuda())) {
    return Status::InvalidArgument(name + " is on " + tensor.device().str() +
                                   (cuda_too ? "; collectives take CPU tensors (host path) or CUDA tensors (NCCL)"
                                             : "; Capstan tensors are host memory: call .cpu() first"));
  }
  if (!tensor.is_contiguous()) {
    return Status::InvalidArgument(name + " (shape " + sizes_string(tensor.sizes()) + ", strides " +
                                   sizes_string(tensor.strides()) +
                                   ") is not contiguous: call .contiguous() first");
  }
  auto dtype = capstan_dtype(tensor.scalar_type());
  if (!dtype.ok()) return dtype.status().with_context(name);
  return *dtype;
}

}  // namespace internal

Result<Tensor> from_torch(const ::torch::Tensor& tensor, std::string_view what) {
  CAPSTAN_ASSIGN_OR_RETURN(DType dtype, internal::dense_dtype(tensor, std::string(what), /*cuda_too=*/false));
  // The owner holds a reference to the storage (detached: the view carries
  // no autograd history).
  std::shared_ptr<void> owner(new ::torch::Tensor(tensor.detach()),
                              [](void* p) { delete static_cast<::torch::Tensor*>(p); });
  size_t bytes = static_cast<size_t>(tensor.numel()) * tensor.element_size();
  Shape shape(tensor.sizes().begin(), tensor.sizes().end());
  return Tensor::from_buffer(dtype, std::move(shape), std::move(owner),
                             static_cast<std::byte*>(tensor.data_ptr()), bytes);
}

}  // namespace capstan::torch
