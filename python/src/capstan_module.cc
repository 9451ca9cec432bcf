// capstan._capstan: the Python bindings (pybind11) over the SDK's public
// API (libcapstan.so). The package `capstan` (python/capstan/__init__.py)
// re-exports it with Python names.
//
// Conventions:
//   - Tensors go in as numpy arrays (anything np.asarray takes), copied
//     once into a Tensor; they come out as read-only numpy arrays over the
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

namespace capstan::python {

PYBIND11_MODULE(_capstan, m) {
  m.doc() = "Capstan's C++ SDK for Python; use the `capstan` package.";
  remember_main_thread();
  init_errors(m);
  init_data(m);
  init_data_service(m);
  init_collectives(m);
  init_training(m);
}

}  // namespace capstan::python
