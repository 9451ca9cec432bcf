#include "collectives/device_backend.h"

#include <string>

namespace capstan::collectives {

Result<DeviceBackend*> DeviceCollectives::backend(int device) {
  // Held while the backend is made: a second caller waits for it rather
  // than making another (the making is collective across the ranks).
  MutexLock lock(mutex_);
  if (backend_ == nullptr) {
    CAPSTAN_ASSIGN_OR_RETURN(backend_, make_(device));
  } else if (backend_->device() != device) {
    return Status::InvalidArgument("this rank's device collectives use CUDA device " +
                                   std::to_string(backend_->device()) + ", not " + std::to_string(device));
  }
  return backend_.get();
}

void DeviceCollectives::interrupt(const Status& why) {
  MutexLock lock(mutex_);
  if (backend_ != nullptr) backend_->interrupt(why);
}

}  // namespace capstan::collectives
