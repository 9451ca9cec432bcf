// See common.h.
#include "common.h"

#include <algorithm>
#include <cstring>
#include <string_view>
#include <vector>

namespace capstan::python {
namespace {

py::dtype numpy_dtype(DType dtype) {
  switch (dtype) {
    case DType::kFloat16: return py::dtype("float16");
    case DType::kBFloat16: return py::dtype("uint16");  // numpy has no bfloat16: its bits
    case DType::kFloat32: return py::dtype("float32");
    case DType::kFloat64: return py::dtype("float64");
    case DType::kInt8: return py::dtype("int8");
    case DType::kInt16: return py::dtype("int16");
    case DType::kInt32: return py::dtype("int32");
    case DType::kInt64: return py::dtype("int64");
    case DType::kUInt8: return py::dtype("uint8");
    case DType::kBool: return py::dtype("bool");
    default: raise(Status::InvalidArgument("no numpy dtype for " + std::string(dtype_name(dtype))));
  }
}

// The interpreter's main thread: the only one Python runs signal handlers on.
unsigned long main_thread_ident = 0;

}  // namespace

DType capstan_dtype(const py::dtype& dtype) {
  const char kind = dtype.kind();
  const auto size = dtype.itemsize();
  if (kind == 'f' && size == 2) return DType::kFloat16;
  if (kind == 'f' && size == 4) return DType::kFloat32;
  if (kind == 'f' && size == 8) return DType::kFloat64;
  if (kind == 'i' && size == 1) return DType::kInt8;
  if (kind == 'i' && size == 2) return DType::kInt16;
  if (kind == 'i' && size == 4) return DType::kInt32;
  if (kind == 'i' && size == 8) return DType::kInt64;
  if (kind == 'u' && size == 1) return DType::kUInt8;
  if (kind == 'b') return DType::kBool;
  if (kind == 'S' || kind == 'U' || kind == 'O') return DType::kString;  // bytes / str: a string tensor
  raise(Status::InvalidArgument("numpy dtype " + py::str(static_cast<const py::handle&>(dtype)).cast<std::string>() +
                                " has no Capstan dtype (use float16/32/64, int8/16/32/64, uint8, bool or bytes)"));
}

py::object to_numpy(const Tensor& t) {
  std::vector<py::ssize_t> shape(t.shape().begin(), t.shape().end());
  if (t.dtype() == DType::kString) {
    py::array out(py::dtype("O"), shape);
    auto** items = static_cast<PyObject**>(out.mutable_data());
    for (int64_t i = 0; i < t.num_elements(); ++i) {
      std::string_view s = t.string_at(i);
      PyObject* bytes = PyBytes_FromStringAndSize(s.data(), static_cast<py::ssize_t>(s.size()));
      if (bytes == nullptr) throw py::error_already_set();
      Py_XDECREF(items[i]);
      items[i] = bytes;
    }
    return out;
  }
  auto* keep = new Tensor(t);
  py::capsule base(keep, [](void* p) { delete static_cast<Tensor*>(p); });
  py::array out(numpy_dtype(t.dtype()), shape, {}, keep->data(), base);
  py::detail::array_proxy(out.ptr())->flags &= ~py::detail::npy_api::NPY_ARRAY_WRITEABLE_;
  // capstan.Array (python/capstan/_array.py): the same array, and DLPack.
  // Never destroyed, as numpy below.
  static py::object* array_type = new py::object(py::module_::import("capstan._array").attr("Array"));
  return out.attr("view")(*array_type);
}

namespace {

// numpy's own conversion: its errors (a ragged list, ...) propagate as they
// are; the result is C-contiguous (0-d stays 0-d). Any DLPack producer (a
// torch tensor, a JAX array) in host memory goes through numpy.from_dlpack:
// no copy.
py::array as_numpy(const py::handle& value) {
  // Never destroyed: a static py::object would be released after the
  // interpreter is gone.
  static py::object* numpy = new py::object(py::module_::import("numpy"));
  py::object input = py::reinterpret_borrow<py::object>(value);
  if (!py::isinstance<py::array>(input) && py::hasattr(input, "__dlpack__")) {
    input = numpy->attr("from_dlpack")(input);
  }
  return numpy->attr("asarray")(input, py::arg("order") = "C");
}

}  // namespace

void release_from_any_thread(PyObject* object) {
  if (!Py_IsInitialized() || _Py_IsFinalizing()) return;
  PyGILState_STATE gil = PyGILState_Ensure();
  Py_DECREF(object);
  PyGILState_Release(gil);
}

Tensor borrow_tensor(const py::handle& value) {
  py::array array = as_numpy(value);
  const char kind = array.dtype().kind();
  if (kind == 'S' || kind == 'U' || kind == 'O' || !array.dtype().attr("isnative").cast<bool>()) {
    return to_tensor(array);
  }
  const DType dtype = capstan_dtype(array.dtype());
  // The tensor holds a reference to the array, dropped under the GIL (the
  // last holder may be a collective's thread).
  std::shared_ptr<void> owner(array.inc_ref().ptr(),
                              [](void* p) { release_from_any_thread(static_cast<PyObject*>(p)); });
  Shape shape(array.shape(), array.shape() + array.ndim());
  auto* data = static_cast<std::byte*>(const_cast<void*>(array.data()));
  return value_or_raise(Tensor::from_buffer(dtype, std::move(shape), std::move(owner), data,
                                            static_cast<size_t>(array.nbytes())));
}

Tensor to_tensor(const py::handle& value) {
  py::array array = as_numpy(value);
  if (!array.dtype().attr("isnative").cast<bool>()) {
    array = array.attr("astype")(array.dtype().attr("newbyteorder")("="));  // big-endian input: native order
  }
  Shape shape(array.shape(), array.shape() + array.ndim());
  const char kind = array.dtype().kind();
  if (kind == 'S' || kind == 'U' || kind == 'O') {
    std::vector<std::string> strings;
    py::list flat = array.attr("ravel")().attr("tolist")();
    for (const py::handle& item : flat) {
      if (py::isinstance<py::bytes>(item)) {
        strings.push_back(item.cast<std::string>());
      } else if (py::isinstance<py::str>(item)) {
        strings.push_back(item.cast<std::string>());  // UTF-8
      } else {
        raise(Status::InvalidArgument("a string tensor takes bytes or str, got " +
                                      py::str(item.get_type()).cast<std::string>()));
      }
    }
    return value_or_raise(Tensor::from_strings(strings, shape));
  }
  DType dtype = capstan_dtype(array.dtype());
  Tensor out = value_or_raise(Tensor::uninitialized(dtype, shape));
  if (out.byte_size() > 0) std::memcpy(out.mutable_data(), array.data(), out.byte_size());
  return out;
}

py::tuple element_to_python(const Element& e) {
  py::tuple out(e.components.size());
  for (size_t i = 0; i < e.components.size(); ++i) out[i] = to_numpy(e.components[i]);
  return out;
}

Element element_from_python(const py::handle& value) {
  Element e;
  if (value.is_none()) return e;
  if (py::isinstance<py::tuple>(value) || py::isinstance<py::list>(value)) {
    for (const py::handle& item : value) e.components.push_back(to_tensor(item));
  } else {
    e.components.push_back(to_tensor(value));
  }
  return e;
}

void remember_main_thread() {
  main_thread_ident = py::module_::import("threading").attr("main_thread")().attr("ident").cast<unsigned long>();
}

void park_if_finalizing(py::gil_scoped_release& release) {
  if (_Py_IsFinalizing()) {
    release.disarm();
    while (true) std::this_thread::sleep_for(std::chrono::hours(1));
  }
}

bool interrupted(py::gil_scoped_release& release) {
  if (PyThread_get_thread_ident() != main_thread_ident) return false;
  park_if_finalizing(release);
  py::gil_scoped_acquire acquire;
  return PyErr_CheckSignals() != 0;
}

std::chrono::milliseconds seconds_arg(const char* what, double seconds) {
  if (!(seconds > 0 && seconds <= 86400.0 * 365)) {
    raise(Status::InvalidArgument(std::string(what) + " " + std::to_string(seconds) +
                                  " s: give a number of seconds in (0, one year]"));
  }
  return std::chrono::milliseconds(std::max<int64_t>(1, static_cast<int64_t>(seconds * 1000)));
}

ClientOptions client_options(const std::string& token, const std::string& client_name, double connect_timeout_s,
                             double call_timeout_s) {
  ClientOptions options;
  options.token = token.empty() ? value_or_raise(token_from_environment()) : token;
  options.client_name = client_name;
  options.connect_timeout = seconds_arg("connect_timeout", connect_timeout_s);
  options.call_timeout = seconds_arg("call_timeout", call_timeout_s);
  return options;
}

}  // namespace capstan::python
