// checkpoint_program: a model made on the parameter servers, saved and
// restored, for tests/scripts/netns_checkpoint_test.sh (which counts the
// bytes on the coordinator's link meanwhile). It never reads a value: the
// program's own traffic is control only too.
//
//   checkpoint_program --coordinator ADDR --mib N --dir DIR
//   created ballast (N MiB, 2 shards) in MS ms
//   saved DIR/ckpt-1 in MS ms
//   restored step 1 in MS ms
#include <capstan/training.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace {

double ms_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
}

int fail(const char* what, const capstan::Status& status) {
  std::fprintf(stderr, "checkpoint_program: %s: %s\n", what, status.to_string().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  std::string coordinator, dir;
  int64_t mib = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--coordinator") == 0) coordinator = argv[i + 1];
    else if (std::strcmp(argv[i], "--mib") == 0) mib = std::atoll(argv[i + 1]);
    else if (std::strcmp(argv[i], "--dir") == 0) dir = argv[i + 1];
  }
  if (coordinator.empty() || dir.empty() || mib < 1 || argc != 7) {
    std::fprintf(stderr, "usage: checkpoint_program --coordinator ADDR --mib N --dir DIR\n");
    return 2;
  }
  auto cluster = capstan::ClusterCoordinator::connect(coordinator);
  if (!cluster.ok()) return fail("connecting", cluster.status());
  const int64_t columns = 1024;
  capstan::VariableSpec ballast;
  ballast.name = "ballast";
  ballast.optimizer = capstan::Optimizer::adam(0.001);  // slots: three times the bytes saved
  ballast.partitioner = capstan::Partitioner::fixed_shards(2);
  ballast.initializer = capstan::Initializer::random_uniform(-1, 1, 7);
  ballast.dtype = capstan::DType::kFloat32;
  ballast.shape = {mib * (1 << 20) / (columns * 4), columns};
  auto start = std::chrono::steady_clock::now();
  auto created = (*cluster)->create_variable(ballast);
  if (!created.ok()) return fail("creating ballast", created.status());
  std::printf("created ballast (%lld MiB, 2 shards) in %.0f ms\n", static_cast<long long>(mib), ms_since(start));
  start = std::chrono::steady_clock::now();
  auto saved = (*cluster)->save_checkpoint(dir, 1);
  if (!saved.ok()) return fail("saving", saved.status());
  std::printf("saved %s in %.0f ms\n", saved->c_str(), ms_since(start));
  start = std::chrono::steady_clock::now();
  auto restored = (*cluster)->restore_checkpoint(*saved);
  if (!restored.ok()) return fail("restoring", restored.status());
  std::printf("restored step %lld in %.0f ms\n", static_cast<long long>(*restored), ms_since(start));
  return 0;
}
