// capstan.Error and one subclass per status code (capstan.<Code>Error, with
// .code), and the translator that raises them for a StatusError.
#include "common.h"

#include <map>
#include <string>
#include <utility>

namespace capstan::python {
namespace {

std::map<StatusCode, PyObject*>& error_classes() {
  static auto* classes = new std::map<StatusCode, PyObject*>();
  return *classes;
}

}  // namespace

void init_errors(py::module_& m) {
  py::object runtime_error = py::reinterpret_borrow<py::object>(PyExc_RuntimeError);
  PyObject* base = PyErr_NewExceptionWithDoc("capstan._capstan.Error", "A Capstan call failed; .code names why.",
                                             runtime_error.ptr(), nullptr);
  m.add_object("Error", py::handle(base));
  const std::pair<StatusCode, const char*> kCodes[] = {
      {StatusCode::kCancelled, "Cancelled"},
      {StatusCode::kUnknown, "Unknown"},
      {StatusCode::kInvalidArgument, "InvalidArgument"},
      {StatusCode::kDeadlineExceeded, "DeadlineExceeded"},
      {StatusCode::kNotFound, "NotFound"},
      {StatusCode::kAlreadyExists, "AlreadyExists"},
      {StatusCode::kPermissionDenied, "PermissionDenied"},
      {StatusCode::kResourceExhausted, "ResourceExhausted"},
      {StatusCode::kFailedPrecondition, "FailedPrecondition"},
      {StatusCode::kAborted, "Aborted"},
      {StatusCode::kOutOfRange, "OutOfRange"},
      {StatusCode::kUnimplemented, "Unimplemented"},
      {StatusCode::kInternal, "Internal"},
      {StatusCode::kUnavailable, "Unavailable"},
      {StatusCode::kDataLoss, "DataLoss"},
      {StatusCode::kUnauthenticated, "Unauthenticated"},
  };
  for (const auto& [code, name] : kCodes) {
    std::string cls = std::string(name) + "Error";
    PyObject* type = PyErr_NewException(("capstan._capstan." + cls).c_str(), base, nullptr);
    PyObject_SetAttrString(type, "code", py::str(name).ptr());
    m.add_object(cls.c_str(), py::handle(type));
    error_classes()[code] = type;
  }
  PyObject_SetAttrString(base, "code", py::str("Unknown").ptr());
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const StatusError& e) {
      auto it = error_classes().find(e.status.code());
      PyObject* type = it != error_classes().end() ? it->second : error_classes()[StatusCode::kUnknown];
      PyErr_SetString(type, e.status.message().c_str());
    }
  });
}

}  // namespace capstan::python
