// What libcapstan_torch's sources say about torch values in their errors.
#ifndef CAPSTAN_TORCH_SRC_ERRORS_H_
#define CAPSTAN_TORCH_SRC_ERRORS_H_

#include <torch/torch.h>

#include <exception>
#include <sstream>
#include <string>

#include "capstan/status.h"
#include "capstan/tensor.h"

namespace capstan::torch::internal {

// "[2, 3]": a tensor's sizes or strides.
inline std::string sizes_string(c10::IntArrayRef sizes) {
  std::ostringstream out;
  out << sizes;
  return out.str();
}

// An exception's message; a torch error's without its C++ backtrace.
inline std::string torch_error(const std::exception& e) {
  if (const auto* error = dynamic_cast<const c10::Error*>(&e)) return error->what_without_backtrace();
  return e.what();
}

// The Capstan dtype of a dense, contiguous tensor on the CPU (or CUDA, with
// `cuda_too`); else InvalidArgument naming `name` and the fix.
Result<DType> dense_dtype(const ::torch::Tensor& tensor, const std::string& name, bool cuda_too);

}  // namespace capstan::torch::internal

#endif  // CAPSTAN_TORCH_SRC_ERRORS_H_
