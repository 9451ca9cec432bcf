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

// A CUDA tensor written behind autograd's back (NCCL, through its data
// pointer) counts as modified in place, as copy_ would: a backward that
// saved it then refuses, rather than using the new values.
void written_in_place(::torch::Tensor& tensor) { ::torch::autograd::impl::bump_version(tensor); }

int cuda_index(const ::torch::Tensor& tensor) { return tensor.device().has_index() ? tensor.device().index() : 0; }

// A CUDA tensor of a dtype NCCL lacks: `host_op` on a host copy, written
// back.
template <typename HostOp>
Status via_host(::torch::Tensor& tensor, HostOp host_op) {
  ::torch::Tensor host = tensor.cpu();
  CAPSTAN_RETURN_IF_ERROR(host_op(host));
  ::torch::NoGradGuard no_grad;
  tensor.copy_(host);
  return Status::Ok();
}

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
  if (tensor.is_cuda() && !Communicator::device_takes(dtype)) {
    return via_host(tensor, [&](::torch::Tensor& host) { return all_reduce(group, host, op); });
  }
  if (tensor.is_cuda()) {
    CAPSTAN_RETURN_IF_ERROR(group.all_reduce_device(tensor.data_ptr(), tensor.data_ptr(), tensor.numel(), dtype, op,
                                                    cuda_index(tensor), cuda_stream));
    written_in_place(tensor);
    return Status::Ok();
  }
  CAPSTAN_ASSIGN_OR_RETURN(Tensor mine, from_torch(tensor, "all_reduce: the tensor"));
  CAPSTAN_ASSIGN_OR_RETURN(Tensor reduced, group.all_reduce(mine, op));
  return write_back(tensor, reduced);
}

Status broadcast(Communicator& group, ::torch::Tensor& tensor, int root, void* cuda_stream) {
  CAPSTAN_ASSIGN_OR_RETURN(DType dtype, checked(tensor, "broadcast"));
  if (tensor.is_cuda() && !Communicator::device_takes(dtype)) {
    return via_host(tensor, [&](::torch::Tensor& host) { return broadcast(group, host, root); });
  }
  if (tensor.is_cuda()) {
    CAPSTAN_RETURN_IF_ERROR(
        group.broadcast_device(tensor.data_ptr(), tensor.numel(), dtype, root, cuda_index(tensor), cuda_stream));
    written_in_place(tensor);
    return Status::Ok();
  }
  CAPSTAN_ASSIGN_OR_RETURN(Tensor mine, from_torch(tensor, "broadcast: the tensor"));
  CAPSTAN_ASSIGN_OR_RETURN(Tensor root_value, group.broadcast(mine, root));
  if (group.rank() == root) return Status::Ok();
  return write_back(tensor, root_value);
}

Result<::torch::Tensor> all_gather(Communicator& group, const ::torch::Tensor& tensor, void* cuda_stream) {
  CAPSTAN_ASSIGN_OR_RETURN(DType dtype, checked(tensor, "all_gather"));
  if (tensor.is_cuda() && !Communicator::device_takes(dtype)) {
    CAPSTAN_ASSIGN_OR_RETURN(::torch::Tensor gathered, all_gather(group, tensor.cpu()));
    return gathered.to(tensor.device());
  }
  if (tensor.is_cuda()) {
    // NCCL's all-gather takes the same count from every rank: every rank
    // learns the others' first (over the host) and all refuse alike.
    CAPSTAN_ASSIGN_OR_RETURN(Tensor counts, group.all_gather(Tensor::scalar<int64_t>(tensor.numel())));
    for (int r = 0; r < group.size(); ++r) {
      const int64_t theirs = counts.flat<int64_t>()[static_cast<size_t>(r)];
      if (theirs != tensor.numel()) {
        return Status::InvalidArgument("all_gather: rank " + std::to_string(r) + "'s CUDA tensor has " +
                                       std::to_string(theirs) + " elements, rank " + std::to_string(group.rank()) +
                                       "'s " + std::to_string(tensor.numel()) +
                                       "; on CUDA every rank gathers a tensor of the same shape");
      }
    }
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
