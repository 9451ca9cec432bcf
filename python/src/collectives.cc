// Collectives: Communicator (a group's all_reduce, broadcast, ...); groups
// are formed by ClusterCoordinator.join_group (training.cc).
#include "common.h"

#include <capstan/collectives.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>

namespace capstan::python {
namespace {

ReduceOp reduce_op(const std::string& name) {
  static const std::map<std::string, ReduceOp> kOps = {
      {"sum", ReduceOp::kSum}, {"mean", ReduceOp::kMean}, {"min", ReduceOp::kMin},
      {"max", ReduceOp::kMax}, {"prod", ReduceOp::kProd}};
  auto it = kOps.find(name);
  if (it == kOps.end()) raise(Status::InvalidArgument("reduce op '" + name + "': use sum, mean, min, max or prod"));
  return it->second;
}

// A collective that Ctrl-C interrupted cannot be taken back (the peers run
// it): the group is aborted, so that every rank's next operation fails at
// once (FailedPrecondition here, Unavailable there) and a new group can form.
template <typename F>
auto collective(const std::shared_ptr<Communicator>& c, F fn) -> decltype(fn()) {
  try {
    return run_interruptibly(std::move(fn));
  } catch (py::error_already_set&) {
    c->abort(Status::Cancelled("a rank's collective was interrupted (KeyboardInterrupt)"));
    throw;
  }
}

DType device_dtype(const std::string& name) {
  std::optional<DType> dtype = dtype_from_name(name);
  if (!dtype || *dtype == DType::kString) {
    raise(Status::InvalidArgument("dtype '" + name + "': device collectives take a numeric Capstan dtype "
                                  "(float32, bfloat16, int64, ...)"));
  }
  return *dtype;
}

// The arguments every device collective shares, checked before the call
// (what NCCL would take on trust; the memory itself is the caller's:
// capstan.torch passes a CUDA tensor's own).
void check_device_args(uintptr_t address, int64_t count, int device) {
  if (count < 0) raise(Status::InvalidArgument("count " + std::to_string(count) + " is negative"));
  if (address == 0 && count > 0) raise(Status::InvalidArgument("address 0 for " + std::to_string(count) + " elements"));
  if (device < 0) raise(Status::InvalidArgument("CUDA device " + std::to_string(device) + " is negative"));
}

void* as_pointer(uintptr_t address) { return reinterpret_cast<void*>(address); }  // NOLINT(performance-no-int-to-ptr)

}  // namespace

void init_collectives(py::module_& m) {
  py::class_<Communicator, std::shared_ptr<Communicator>>(m, "Communicator")
      .def_property_readonly("rank", &Communicator::rank)
      .def_property_readonly("size", &Communicator::size)
      .def("all_reduce", [](const std::shared_ptr<Communicator>& c, const py::object& array, const std::string& op) {
             Tensor t = borrow_tensor(array);  // read in place while the call runs
             ReduceOp r = reduce_op(op);
             return to_numpy(value_or_raise(collective(c, [c, t, r]() { return c->all_reduce(t, r); })));
           }, py::arg("array"), py::arg("op") = "sum")
      .def("broadcast", [](const std::shared_ptr<Communicator>& c, const py::object& array, int root) {
             Tensor t = borrow_tensor(array);  // read in place while the call runs
             return to_numpy(value_or_raise(collective(c, [c, t, root]() { return c->broadcast(t, root); })));
           }, py::arg("array"), py::arg("root") = 0)
      .def("all_gather", [](const std::shared_ptr<Communicator>& c, const py::object& array) {
             Tensor t = borrow_tensor(array);  // read in place while the call runs
             return to_numpy(value_or_raise(collective(c, [c, t]() { return c->all_gather(t); })));
           }, py::arg("array"))
      .def("reduce_scatter", [](const std::shared_ptr<Communicator>& c, const py::object& array, const std::string& op) {
             Tensor t = borrow_tensor(array);  // read in place while the call runs
             ReduceOp r = reduce_op(op);
             return to_numpy(value_or_raise(collective(c, [c, t, r]() { return c->reduce_scatter(t, r); })));
           }, py::arg("array"), py::arg("op") = "sum")
      // CUDA memory (NCCL), by address: capstan.torch's all_reduce_ and
      // broadcast_ pass a CUDA tensor's data_ptr(), its CUDA device and
      // torch's current stream there (0: the default stream); in place.
      // Private: an address is taken on trust, so capstan.torch is the way in.
      .def("_all_reduce_device", [](const std::shared_ptr<Communicator>& c, uintptr_t address, int64_t count,
                                   const std::string& dtype, const std::string& op, int device, uintptr_t stream) {
             check_device_args(address, count, device);
             DType d = device_dtype(dtype);
             ReduceOp r = reduce_op(op);
             check(collective(c, [=]() {
               return c->all_reduce_device(as_pointer(address), as_pointer(address), count, d, r, device,
                                           as_pointer(stream));
             }));
           }, py::arg("address"), py::arg("count"), py::arg("dtype"), py::arg("op") = "sum", py::arg("device") = 0,
           py::arg("stream") = 0)
      .def("_broadcast_device", [](const std::shared_ptr<Communicator>& c, uintptr_t address, int64_t count,
                                  const std::string& dtype, int root, int device, uintptr_t stream) {
             check_device_args(address, count, device);
             DType d = device_dtype(dtype);
             check(collective(c, [=]() {
               return c->broadcast_device(as_pointer(address), count, d, root, device, as_pointer(stream));
             }));
           }, py::arg("address"), py::arg("count"), py::arg("dtype"), py::arg("root") = 0, py::arg("device") = 0,
           py::arg("stream") = 0)
      .def_static("device_collectives", []() -> py::object {
             Status s = Communicator::device_collectives();
             if (s.ok()) return py::none();
             return py::str(s.to_string());
           }, "None when CUDA collectives (NCCL) can run in this process; else why not")
      .def_static("_device_takes", [](const std::string& name) {
             std::optional<DType> dtype = dtype_from_name(name);
             return dtype.has_value() && Communicator::device_takes(*dtype);
           }, py::arg("dtype"), "Whether the device collectives take this dtype (else: through the host)")
      .def("barrier", [](const std::shared_ptr<Communicator>& c) {
             check(collective(c, [c]() { return c->barrier(); }));
           })
      .def("abort", [](const std::shared_ptr<Communicator>& c, const std::string& reason) {
             c->abort(Status::Aborted(reason));
           }, py::arg("reason") = "aborted from Python")
      .def_property_readonly("aborted", &Communicator::aborted);
}

}  // namespace capstan::python
