// Collectives: Communicator (a group's all_reduce, broadcast, ...); groups
// are formed by ClusterCoordinator.join_group (training.cc).
#include "common.h"

#include <capstan/collectives.h>

#include <map>
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
      .def("barrier", [](const std::shared_ptr<Communicator>& c) {
             check(collective(c, [c]() { return c->barrier(); }));
           })
      .def("abort", [](const std::shared_ptr<Communicator>& c, const std::string& reason) {
             c->abort(Status::Aborted(reason));
           }, py::arg("reason") = "aborted from Python")
      .def_property_readonly("aborted", &Communicator::aborted);
}

}  // namespace capstan::python
