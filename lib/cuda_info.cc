#include "cuda_info.h"

#ifdef CAPSTAN_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace capstan {

int cuda_device_count() {
#ifdef CAPSTAN_WITH_CUDA
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky error of a machine without a driver
    return 0;
  }
  return count;
#else
  return 0;
#endif
}

}  // namespace capstan
