#include "daemons/coordinator/model_checkpoints.h"

#include <utility>

#include "async/pool.h"

namespace capstan::coordinator {

ModelCheckpoints::ModelCheckpoints(PsVariables& variables, Strategies& strategies, PerWorkerDatasets& datasets,
                                   const Workers& workers, boost::asio::thread_pool& pool,
                                   PauseDispatch pause_dispatch)
    : variables_(variables),
      strategies_(strategies),
      datasets_(datasets),
      workers_(workers),
      pool_(pool),
      pause_dispatch_(std::move(pause_dispatch)) {}

kj::Promise<Result<std::string>> ModelCheckpoints::save(std::string directory, int64_t step, int max_to_keep) {
  using Path = Result<std::string>;
  struct Saved {
    std::shared_ptr<void> pause;  // dispatch resumes when it goes
    std::map<std::string, std::string> iterators;
  };
  auto saved = std::make_shared<Saved>();
  // Without per-worker datasets there is nothing to keep in step with the
  // variables: closures go on running meanwhile, as in TF.
  kj::Promise<void> ready = kj::READY_NOW;
  if (!datasets_.empty()) {
    ready = pause_dispatch_()
                .then([this, saved](std::shared_ptr<void> pause) {
                  saved->pause = std::move(pause);
                  return datasets_.iterator_states(workers_.targets());
                })
                .then([saved](std::map<std::string, std::string> iterators) {
                  saved->iterators = std::move(iterators);
                });
  }
  return ready.then([this]() { return snapshot(); })
      .then([this, directory = std::move(directory), step, max_to_keep,
             saved](Result<std::vector<VariableState>> states) -> kj::Promise<Path> {
        saved->pause = nullptr;  // everything is read: dispatch resumes while the files are written
        if (!states.ok()) return Path(states.status());
        return async::run_on_pool(pool_, [directory, step, max_to_keep, states = std::move(*states),
                                          iterators = std::move(saved->iterators)]() {
          return write_checkpoint(directory, step, max_to_keep, states, iterators);
        });
      });
}

kj::Promise<Result<std::vector<VariableState>>> ModelCheckpoints::snapshot() {
  return variables_.snapshot().then(
      [this](Result<std::vector<VariableState>> states) -> kj::Promise<Result<std::vector<VariableState>>> {
        // The strategies' mirrored variables go into the same checkpoint.
        if (!states.ok() || strategies_.empty()) return kj::mv(states);
        return strategies_.snapshot().then(
            [states = std::move(*states)](
                Result<std::vector<VariableState>> mirrored) mutable -> Result<std::vector<VariableState>> {
              CAPSTAN_RETURN_IF_ERROR(mirrored.status());
              for (auto& m : *mirrored) states.push_back(std::move(m));
              return std::move(states);
            });
      });
}

kj::Promise<Result<RestoredCheckpoint>> ModelCheckpoints::restore(std::string path, bool strict) {
  using Restored = Result<RestoredCheckpoint>;
  return async::run_on_pool(pool_,
                            [path = std::move(path)]() -> Result<Opened> {
                              CAPSTAN_ASSIGN_OR_RETURN(std::string resolved, resolve_checkpoint(path));
                              CAPSTAN_ASSIGN_OR_RETURN(auto reader, checkpoint::CheckpointReader::open(resolved));
                              return Opened{std::move(resolved), Reader(std::move(reader))};
                            })
      .then([this](Result<Opened> opened) -> kj::Promise<Result<Opened>> {
        if (!opened.ok()) return kj::mv(opened);
        // Variables the program has not created (again) get the
        // checkpoint's number of shards on the current parameter servers.
        auto is_mirrored = [this](const std::string& name) { return strategies_.is_mirrored(name); };
        return variables_.create_absent(opened->reader->manifest(), is_mirrored)
            .then([opened = std::move(*opened)](Status status) mutable -> Result<Opened> {
              CAPSTAN_RETURN_IF_ERROR(status);
              return std::move(opened);
            });
      })
      .then([this, strict](Result<Opened> opened) -> kj::Promise<Result<Read>> {
        if (!opened.ok()) return Result<Read>(opened.status());
        return read(std::move(*opened), strict);
      })
      .then([this](Result<Read> read) -> kj::Promise<Restored> {
        if (!read.ok()) return Restored(read.status());
        return apply(std::move(*read));
      });
}

kj::Promise<Result<ModelCheckpoints::Read>> ModelCheckpoints::read(Opened opened, bool strict) {
  return async::run_on_pool(pool_, [opened = std::move(opened), states = variables_.layout(), strict,
                                    mirrored = strategies_.specs()]() mutable -> Result<Read> {
    const checkpoint::CheckpointReader& reader = *opened.reader;
    std::vector<std::string> missing;
    CAPSTAN_RETURN_IF_ERROR(read_into(reader, &states, strict, &missing));
    CAPSTAN_ASSIGN_OR_RETURN(Strategies::Restore from, Strategies::read_checkpoint(reader, mirrored));
    if (strict && !from.missing.empty()) {
      std::string names;
      for (const auto& n : from.missing) names += (names.empty() ? "'" : ", '") + n + "'";
      return Status::NotFound("the checkpoint has no mirrored variable " + names +
                              " (strict restore; the default restores the variables it has and leaves these "
                              "as they are)");
    }
    missing.insert(missing.end(), from.missing.begin(), from.missing.end());
    CAPSTAN_ASSIGN_OR_RETURN(auto iterators, read_iterator_states(reader));
    return Read{std::move(opened.path), reader.manifest().step, std::move(states), std::move(missing),
                std::move(from), std::move(iterators)};
  });
}

kj::Promise<Result<RestoredCheckpoint>> ModelCheckpoints::apply(Read read) {
  auto out = std::make_shared<RestoredCheckpoint>();
  out->path = std::move(read.path);
  out->step = read.step;
  out->not_in_checkpoint = std::move(read.missing);
  auto states = std::make_shared<std::vector<VariableState>>(std::move(read.states));
  // A parameter server that restarted gets its shards back first.
  return variables_.recreate_missing(states.get())
      .then([this, states](Status status) -> kj::Promise<Status> {
        if (!status.ok()) return status;
        return variables_.write_shards(std::move(*states));
      })
      .then([this, mirrored = std::move(read.mirrored)](Status status) mutable -> kj::Promise<Status> {
        if (!status.ok()) return status;
        return strategies_.seed(std::move(mirrored));
      })
      .then([this, iterators = std::move(read.iterators), out](Status status) mutable -> kj::Promise<Status> {
        if (!status.ok()) return status;
        return datasets_.restore_iterators(std::move(iterators), workers_.targets()).then([out](Result<int> restored) {
          if (restored.ok()) out->iterators = *restored;
          return restored.status();
        });
      })
      .then([out](Status status) mutable -> Result<RestoredCheckpoint> {
        CAPSTAN_RETURN_IF_ERROR(status);
        return std::move(*out);
      });
}

}  // namespace capstan::coordinator
