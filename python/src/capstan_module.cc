// capstan._capstan: the Python bindings (pybind11) over the SDK's public
// API (libcapstan.so). The package `capstan` (python/capstan/__init__.py)
// re-exports it with Python names.
//
// Conventions:
//   - Tensors go in as numpy arrays (anything np.asarray takes, or any
//     DLPack producer), copied once into a Tensor; they come out as
//     read-only capstan.Array (numpy arrays that export DLPack) over the
//     Tensor's own buffer (no copy): the array's base holds the Tensor, so
//     the bytes live as long as the array.
//   - An Element is a tuple of arrays.
//   - A Status that is not OK raises capstan.<Code>Error (a subclass of
//     capstan.Error with .code), e.g. capstan.UnavailableError.
//   - Every call that can block releases the GIL; join, fetch, done and
//     iteration (get_next) wait in slices of 50 ms and check for signals in
//     between, so Ctrl-C interrupts them (KeyboardInterrupt). An interrupted
//     get_next keeps its element for the next call.
//
// One file per area, each with its init_<area>(m) (common.h); the module
// calls them in an order where a type is registered before a signature uses
// it (the docstrings name it).
#include "common.h"

#include <cstdlib>
#include <string>

namespace capstan::python {
namespace {

// pybind11 before 2.12 reads numpy's arrays through numpy 1.x's layout: under
// numpy 2 every dtype would look wrong ("numpy dtype float64 has no Capstan
// dtype"). Refuse to load instead, naming both sides and the fix.
void check_numpy() {
  py::module_ numpy = py::module_::import("numpy");
  const std::string found = numpy.attr("__version__").cast<std::string>();
  const bool numpy2 = std::atoi(found.c_str()) >= 2;  // "2.1.0": major 2
  constexpr bool pybind11_reads_numpy2 =
      PYBIND11_VERSION_MAJOR > 2 || (PYBIND11_VERSION_MAJOR == 2 && PYBIND11_VERSION_MINOR >= 12);
  if (numpy2 && !pybind11_reads_numpy2) {
    py::module_ sys = py::module_::import("sys");
    throw py::import_error(
        "capstan._capstan was built for " CAPSTAN_PYTHON_BUILT_FOR " (numpy " CAPSTAN_NUMPY_BUILT_WITH
        ") with pybind11 " + std::to_string(PYBIND11_VERSION_MAJOR) + "." +
        std::to_string(PYBIND11_VERSION_MINOR) + ", which reads numpy 1.x arrays only; this interpreter (" +
        py::str(sys.attr("executable")).cast<std::string>() + ") has numpy " + found + " (" +
        py::str(numpy.attr("__file__")).cast<std::string>() +
        "). Run it with " CAPSTAN_PYTHON_BUILT_FOR ", or build Capstan for this interpreter: configure with "
        "-DPython3_EXECUTABLE=" + py::str(sys.attr("executable")).cast<std::string>() +
        " (or `pip install .` from it, which builds with a pybind11 that reads numpy 2)");
  }
}

}  // namespace

PYBIND11_MODULE(_capstan, m) {
  m.doc() = "Capstan's C++ SDK for Python; use the `capstan` package.";
  check_numpy();
  remember_main_thread();
  init_errors(m);
  init_dlpack(m);
  init_data(m);
  init_data_service(m);
  init_collectives(m);
  init_training(m);
}

}  // namespace capstan::python
