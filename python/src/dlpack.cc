// DLPack, the array interchange protocol (dmlc/dlpack 0.6, Debian's
// libdlpack-dev): capstan.Array.__dlpack__ hands its buffer to torch, JAX
// or numpy with no copy. numpy's own __dlpack__ refuses read-only arrays
// (DLPack cannot say "read-only"), and every array Capstan gives out is
// read-only, since it shares a received buffer; so Capstan exports them
// itself. The consumer holds the array (and through its base, the
// Tensor) until it calls the deleter.
#include <dlpack/dlpack.h>

#include <string>
#include <vector>

#include "common.h"

namespace capstan::python {
namespace {

constexpr const char* kCapsuleName = "dltensor";

struct Exported {
  DLManagedTensor managed{};
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;  // in elements, as DLPack counts them
  PyObject* owner = nullptr;     // the array, one reference
};

// Called by the consumer, from any thread, with or without the GIL.
void delete_exported(DLManagedTensor* managed) {
  auto* exported = static_cast<Exported*>(managed->manager_ctx);
  release_from_any_thread(exported->owner);
  delete exported;
}

// A capsule no consumer took still owns its tensor.
void delete_unused_capsule(PyObject* capsule) {
  if (!PyCapsule_IsValid(capsule, kCapsuleName)) return;  // consumed: renamed "used_dltensor"
  auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, kCapsuleName));
  if (managed != nullptr && managed->deleter != nullptr) managed->deleter(managed);
}

DLDataType dl_dtype(const py::dtype& dtype) {
  const char kind = dtype.kind();
  const auto bits = static_cast<uint8_t>(dtype.itemsize() * 8);
  if (kind == 'f') return {kDLFloat, bits, 1};
  if (kind == 'i') return {kDLInt, bits, 1};
  if (kind == 'u') return {kDLUInt, bits, 1};
  const std::string name = py::str(static_cast<const py::handle&>(dtype)).cast<std::string>();
  if (kind == 'b') {
    raise(Status::InvalidArgument("a bool array has no DLPack 0.6 type: export array.view(numpy.uint8) instead"));
  }
  raise(Status::InvalidArgument("a " + name + " array has no DLPack type (numbers only: float, int, uint)"));
}

py::capsule to_dlpack(const py::array& array) {
  const auto itemsize = array.itemsize();
  auto exported = std::make_unique<Exported>();
  const DLDataType dtype = dl_dtype(array.dtype());
  for (py::ssize_t i = 0; i < array.ndim(); ++i) {
    exported->shape.push_back(array.shape(i));
    if (array.strides(i) % itemsize != 0) {
      raise(Status::InvalidArgument("array stride " + std::to_string(array.strides(i)) + " B on axis " +
                                    std::to_string(i) + " is not a multiple of its item size " +
                                    std::to_string(itemsize) + " B (DLPack counts strides in items): export a copy"));
    }
    exported->strides.push_back(array.strides(i) / itemsize);
  }
  DLTensor& t = exported->managed.dl_tensor;
  t.data = const_cast<void*>(array.data());
  t.device = {kDLCPU, 0};
  t.ndim = static_cast<int32_t>(array.ndim());
  t.dtype = dtype;
  t.shape = exported->shape.data();
  t.strides = exported->strides.data();
  t.byte_offset = 0;
  exported->owner = array.ptr();
  Py_INCREF(exported->owner);
  exported->managed.manager_ctx = exported.get();
  exported->managed.deleter = delete_exported;
  PyObject* capsule = PyCapsule_New(&exported->managed, kCapsuleName, delete_unused_capsule);
  if (capsule == nullptr) {
    Py_DECREF(exported->owner);
    throw py::error_already_set();
  }
  exported.release();
  return py::reinterpret_steal<py::capsule>(capsule);
}

}  // namespace

void init_dlpack(py::module_& m) {
  m.def("_to_dlpack", &to_dlpack, py::arg("array"),
        "A DLPack capsule over the array's memory (no copy); the capsule's consumer keeps the array alive.");
}

}  // namespace capstan::python
