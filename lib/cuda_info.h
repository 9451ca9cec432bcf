// What the machine offers in GPUs; 0 without CUDA (built or present).
#ifndef CAPSTAN_LIB_CUDA_INFO_H_
#define CAPSTAN_LIB_CUDA_INFO_H_

namespace capstan {

// Number of CUDA devices visible to this process. 0 when Capstan was built
// without CUDA, when no driver is loaded, or when no device is present.
int cuda_device_count();

}  // namespace capstan

#endif  // CAPSTAN_LIB_CUDA_INFO_H_
