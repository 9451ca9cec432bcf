#include "daemons/coordinator/model_checkpoints.h"

#include <chrono>
#include <optional>
#include <utility>

#include "async/pool.h"
#include "capstan/trace.h"

namespace capstan::coordinator {
namespace {

double ms_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

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
  struct Saving {
    std::unique_ptr<checkpoint::CheckpointWriter> writer;
    std::shared_ptr<void> pause;  // dispatch resumes when it goes
    std::map<std::string, std::string> iterators;
    PsVariables::ServerSave servers;
    Strategies::MirroredSave mirrored;
    std::chrono::steady_clock::time_point started = std::chrono::steady_clock::now();
    std::chrono::steady_clock::time_point paused;
    double pause_ms = 0;
    // The save and its phases as spans (capstan/trace.h), on the loop
    // among its other work.
    std::optional<trace::Span> whole, phase;
    void next_phase(const char* name) {
      phase.reset();
      phase.emplace(trace::Kind::kCheckpoint, name, whole->detail());
      phase->set_async();
    }
  };
  auto saving = std::make_shared<Saving>();
  saving->whole.emplace(trace::Kind::kCheckpoint, "save checkpoint",
                        "step " + std::to_string(step) + " in " + directory);
  saving->whole->set_async();
  saving->next_phase(datasets_.empty() ? "begin" : "begin, pause dispatch, iterator states");
  // The .tmp directory is made while dispatch pauses.
  auto begun = async::run_on_pool(pool_, [directory = std::move(directory), step, max_to_keep, saving]() -> Status {
    CAPSTAN_ASSIGN_OR_RETURN(saving->writer, checkpoint::CheckpointWriter::begin(directory, step, max_to_keep));
    return Status::Ok();
  });
  // Without per-worker datasets there is nothing to keep in step with the
  // variables: closures go on running meanwhile, as in TF.
  kj::Promise<void> paused = kj::READY_NOW;
  if (!datasets_.empty()) {
    paused = pause_dispatch_()
                 .then([this, saving](std::shared_ptr<void> pause) {
                   saving->pause = std::move(pause);
                   saving->paused = std::chrono::steady_clock::now();
                   return datasets_.iterator_states(workers_.targets());
                 })
                 .then([saving](std::map<std::string, std::string> iterators) {
                   saving->iterators = std::move(iterators);
                 });
  }
  return begun
      .then([paused = kj::mv(paused)](Status status) mutable {
        return paused.then([status]() { return status; });
      })
      .then([this, saving](Status status) -> kj::Promise<Status> {
        if (!status.ok()) return status;
        saving->next_phase("snapshot");
        return snapshot(saving->writer->path()).then([saving](Result<Snapshot> taken) -> Status {
          CAPSTAN_RETURN_IF_ERROR(taken.status());
          saving->servers = std::move(taken->servers);
          saving->mirrored = std::move(taken->mirrored);
          return Status::Ok();
        });
      })
      .then([this, saving](Status status) -> kj::Promise<Path> {
        // Every snapshot is taken: dispatch resumes while the files are
        // written (the parameter servers' in the background on each).
        if (saving->pause != nullptr) {
          saving->pause_ms = ms_since(saving->paused);
          saving->pause = nullptr;
        }
        if (!status.ok()) return Path(status);
        saving->next_phase("write files, commit");
        return variables_.finish_save(saving->servers)
            .then([this, saving](Result<std::vector<checkpoint::ManifestFile>> written) -> kj::Promise<Path> {
              if (!written.ok()) return Path(written.status());
              return async::run_on_pool(pool_, [saving, written = std::move(*written)]() -> Path {
                checkpoint::Manifest manifest;
                manifest.variables = std::move(saving->servers.variables);
                for (auto& v : saving->mirrored.variables) manifest.variables.push_back(std::move(v));
                CAPSTAN_RETURN_IF_ERROR(add_files(*saving->writer, {}, saving->iterators, &manifest));
                std::vector<checkpoint::ManifestFile> all = std::move(written);
                all.insert(all.end(), saving->mirrored.written.begin(), saving->mirrored.written.end());
                std::string path = saving->writer->checkpoint_path();
                CAPSTAN_RETURN_IF_ERROR(saving->writer->commit(std::move(manifest), all));
                return path;
              });
            });
      })
      .then([this, saving](Path path) {
        if (path.ok()) last_save_ = {saving->pause_ms, ms_since(saving->started)};
        saving->phase.reset();
        if (!path.ok()) saving->whole->fail(path.status().to_string());
        saving->whole.reset();
        // The writer goes on the pool (it removes the .tmp directory of a
        // save that failed).
        return async::run_on_pool(pool_, [saving]() { saving->writer.reset(); }).then([path = std::move(path)]() mutable {
          return std::move(path);
        });
      });
}

kj::Promise<Result<ModelCheckpoints::Snapshot>> ModelCheckpoints::snapshot(std::string directory) {
  using Out = Result<Snapshot>;
  auto taken = std::make_shared<Snapshot>();
  kj::Promise<Status> mirrored = Status::Ok();
  if (!strategies_.empty()) {
    // The strategies' replicas write their files into the same checkpoint.
    mirrored = strategies_.save(directory).then([taken](Result<Strategies::MirroredSave> saved) -> Status {
      CAPSTAN_RETURN_IF_ERROR(saved.status());
      taken->mirrored = std::move(*saved);
      return Status::Ok();
    });
  }
  return variables_.begin_save(std::move(directory))
      .then([this, taken, mirrored = kj::mv(mirrored)](Result<PsVariables::ServerSave> servers) mutable {
        if (servers.ok()) taken->servers = std::move(*servers);
        return mirrored.then([this, taken, begun = servers.status()](Status status) -> kj::Promise<Out> {
          if (begun.ok() && status.ok()) return Out(std::move(*taken));
          // The servers that started writing are let finish first.
          Status failed = begun.ok() ? status : begun;
          if (!begun.ok()) return Out(failed);
          return variables_.finish_save(taken->servers).then([failed](auto) -> Out { return failed; });
        });
      });
}

kj::Promise<Result<RestoredCheckpoint>> ModelCheckpoints::restore(std::string path, bool strict) {
  using Restored = Result<RestoredCheckpoint>;
  return async::run_on_pool(pool_,
                            [path = std::move(path)]() -> Result<Opened> {
                              CAPSTAN_ASSIGN_OR_RETURN(std::string resolved, resolve_checkpoint(path));
                              // The manifest and headers only: each parameter
                              // server checks the files it reads.
                              checkpoint::CheckpointReaderOptions options;
                              options.verify_checksums_on_open = false;
                              CAPSTAN_ASSIGN_OR_RETURN(auto reader,
                                                       checkpoint::CheckpointReader::open(resolved, options));
                              return Opened{std::move(resolved), Reader(std::move(reader))};
                            })
      .then([this, strict](Result<Opened> opened) -> kj::Promise<Restored> {
        if (!opened.ok()) return Restored(opened.status());
        // Variables the program has not created (again) get the
        // checkpoint's number of shards on the current parameter servers;
        // the servers create them with the checkpoint's values.
        auto is_mirrored = [this](const std::string& name) { return strategies_.is_mirrored(name); };
        auto absent = variables_.place_absent(opened->reader->manifest(), is_mirrored);
        if (!absent.ok()) return Restored(absent.status());
        return read(std::move(*opened), strict, *absent)
            .then([this, absent = std::move(*absent)](Result<Read> read) mutable -> kj::Promise<Restored> {
              if (!read.ok()) return Restored(read.status());
              return apply(std::move(*read), std::move(absent));
            });
      });
}

kj::Promise<Result<ModelCheckpoints::Read>> ModelCheckpoints::read(Opened opened, bool strict,
                                                                    const std::vector<PlacedVariable>& absent) {
  std::vector<VariableState> states = variables_.layout();
  for (const auto& v : absent) states.push_back(PsVariables::layout_of(v));
  return async::run_on_pool(pool_, [opened = std::move(opened), states = std::move(states), strict,
                                    mirrored = strategies_.specs()]() mutable -> Result<Read> {
    const checkpoint::CheckpointReader& reader = *opened.reader;
    std::vector<std::string> missing;
    CAPSTAN_RETURN_IF_ERROR(match_checkpoint(reader.manifest(), &states, strict, &missing));
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

kj::Promise<Result<RestoredCheckpoint>> ModelCheckpoints::apply(Read read, std::vector<PlacedVariable> absent) {
  auto out = std::make_shared<RestoredCheckpoint>();
  out->path = std::move(read.path);
  out->step = read.step;
  out->not_in_checkpoint = std::move(read.missing);
  // Every parameter server reads its shards itself (creating those it
  // lacks: a server that restarted, or a variable placed just now).
  return variables_.restore_from(out->path, read.states)
      .then([this, absent = std::move(absent)](Status status) mutable -> Status {
        if (!status.ok()) return status;
        for (auto& v : absent) CAPSTAN_RETURN_IF_ERROR(variables_.record(std::move(v)));
        return Status::Ok();
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
