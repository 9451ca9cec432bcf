// A group's collectives on torch tensors: CPU tensors through the host
// collectives (viewed, not copied), CUDA tensors through NCCL on their own
// device.
#include "capstan/torch.h"
#include "errors.h"

namespace capstan::torch {
namespace {

// What a collective needs of `tensor`, or why it cannot take it.
Result<DType> checked(const ::torch::Tensor& tensor, const char* call) {
  return internal::dense_dtype(tensor, std::string(call) + ": the tensor", /*cuda_too=*/true);
}

int cuda_index(const ::torch::Tensor& tensor) { return tensor.device().has_index() ? tensor.device().index() : 0; }

// The host path's result written back into `tensor`.
Status write_back(::torch::Tensor& tensor, const Tensor& result) {
  CAPSTAN_ASSIGN_OR_RETURN(::torch::Tensor view, to_torch(result));
  ::torch::NoGradGuard no_grad;
  tensor.copy_(view.view(tensor.sizes()));
  return Status::Ok();
}

}  // namespace

Status all_reduce(Communicator& group, ::torch::Tensor& tensor, ReduceOp op, void* cuda_stream) {
  CAPSTAN_ASSIGN_OR_RETURN(DType dtype, checked(tensor, "all_reduce"));
  if (tensor.is_cuda()) {
    return group.all_reduce_device(tensor.data_ptr(), tensor.data_ptr(), tensor.numel(), dtype, op,
                                   cuda_index(tensor), cuda_stream);
  }
  CAPSTAN_ASSIGN_OR_RETURN(Tensor mine, from_torch(tensor, "all_reduce: the tensor"));
  CAPSTAN_ASSIGN_OR_RETURN(Tensor reduced, group.all_reduce(mine, op));
  return write_back(tensor, reduced);
}

Status broadcast(Communicator& group, ::torch::Tensor& tensor, int root, void* cuda_stream) {
  CAPSTAN_ASSIGN_OR_RETURN(DType dtype, checked(tensor, "broadcast"));
  if (tensor.is_cuda()) {
    return group.broadcast_device(tensor.data_ptr(), tensor.numel(), dtype, root, cuda_index(tensor), cuda_stream);
  }
  CAPSTAN_ASSIGN_OR_RETURN(Tensor mine, from_torch(tensor, "broadcast: the tensor"));
  CAPSTAN_ASSIGN_OR_RETURN(Tensor root_value, group.broadcast(mine, root));
  if (group.rank() == root) return Status::Ok();
  return write_back(tensor, root_value);
}

Result<::torch::Tensor> all_gather(Communicator& group, const ::torch::Tensor& tensor, void* cuda_stream) {
  CAPSTAN_ASSIGN_OR_RETURN(DType dtype, checked(tensor, "all_gather"));
  if (tensor.is_cuda()) {
    std::vector<int64_t> shape(tensor.sizes().begin(), tensor.sizes().end());
    if (shape.empty()) shape.push_back(1);
    shape[0] *= group.size();
    ::torch::Tensor gathered = ::torch::empty(shape, tensor.options().requires_grad(false));
    CAPSTAN_RETURN_IF_ERROR(group.all_gather_device(tensor.data_ptr(), gathered.data_ptr(), tensor.numel(), dtype,
                                                    cuda_index(tensor), cuda_stream));
    return gathered;
  }
  CAPSTAN_ASSIGN_OR_RETURN(Tensor mine, from_torch(tensor, "all_gather: the tensor"));
  CAPSTAN_ASSIGN_OR_RETURN(Tensor gathered, group.all_gather(mine));
  return to_torch(gathered);
}

}  // namespace capstan::torch
