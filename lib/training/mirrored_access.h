// What Capstan's own worker-servers need of MirroredVariables beyond the
// public API: a replica's whole state out (checkpoints, reads through the
// coordinator), and a group seeded from a state (initial values, a restored
// checkpoint). Not installed.
#ifndef CAPSTAN_LIB_TRAINING_MIRRORED_ACCESS_H_
#define CAPSTAN_LIB_TRAINING_MIRRORED_ACCESS_H_

#include <memory>
#include <vector>

#include "capstan/mirrored.h"
#include "types/replica.h"

namespace capstan {

struct MirroredVariables::Access {
  // Copies of every value and slot (by the parameter servers' slot names)
  // and the step.
  static training::MirroredState state(const MirroredVariables& vars);
  // The variables' specs, in creation order.
  static std::vector<training::MirroredSpec> specs(const MirroredVariables& vars);
  // Collective on `group`: every member gets the variables of `specs`; rank
  // `source` passes `seed` (values for every variable; slots it lacks start
  // afresh) and the others nullptr; everyone ends with the seed's values,
  // slots and step. InvalidArgument when the seed does not fit the specs.
  static Result<std::unique_ptr<MirroredVariables>> seeded(Communicator& group,
                                                           const std::vector<training::MirroredSpec>& specs,
                                                           const training::MirroredState* seed, int source);
};

}  // namespace capstan

#endif  // CAPSTAN_LIB_TRAINING_MIRRORED_ACCESS_H_
