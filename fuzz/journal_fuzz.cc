// The data dispatcher's journal records (Cap'n Proto) and their replay.
#include "daemons/data_dispatcher/dispatcher_state.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace capstan::data_dispatcher;
  auto update = decode(capstan::fuzz::as_string(data, size));
  if (!update.ok()) return 0;
  // A decoded record must apply or be refused, never crash the state.
  DispatcherState state;
  (void)state.apply(RegisterDataset{"ds", 1});
  (void)state.apply(RegisterWorker{"w", "w", {}});
  (void)state.apply(*update);
  (void)state.debug_string();
  (void)encode(*update);
  return 0;
}
