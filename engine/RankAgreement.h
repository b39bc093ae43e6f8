#pragma once
// Before the first collective, the ranks check through the rendezvous store that they built
// alike: the same resolved config, parameters (names, shapes, dtypes, trainable or frozen),
// stage-3 units, optimizer parameter groups and buffers. A rank that built something else
// would issue other collectives than the rest and leave them waiting; instead every rank
// fails at once, naming the ranks that differ and the first difference
// (docs/reliability.md).
//
// Only hashes travel when the ranks agree (one store write on rank 0, one read on the
// others, a counter); the texts go through the store only to describe a difference.
#include <string>
#include <vector>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include "config/Config.h"
#include "engine/ModuleBuffers.h"
#include "zeroshard/Types.h"

namespace zeroshard {

struct BuildSection {
  std::string name;    // "parameters"
  std::string advice;  // what to do when it differs
  std::vector<std::string> lines;
};

class BuildDescription {
 public:
  // What the engine is given, before anything is planned or moved.
  BuildDescription(const std::vector<NamedParam>& params,
                   const std::vector<std::vector<NamedParam>>& unit_params,
                   const std::vector<ParamGroup>& groups, const std::vector<NamedBuffer>& buffers);
  // A config alone (pipeline stages: what each was given).
  BuildDescription() = default;
  // The resolved config (after planning), or as given; its paths (nvme_path) left out:
  // they may be each host's own.
  void add_config(const Config& config, const char* what = "config (as resolved)",
                  const char* advice =
                      "give every rank the same config (and the same hardware "
                      "where a key is auto)");

  const std::vector<BuildSection>& sections() const { return sections_; }
  std::string hashes() const;     // one per section, comma-separated
  std::string serialize() const;  // every section's lines, for the store
  static std::vector<BuildSection> parse(const std::string& text);

 private:
  std::vector<BuildSection> sections_;
};

// Every rank calls it once per engine, after the store is made and before any process
// group: returns when every rank built alike, fails on every rank otherwise.
void agree_on_build(c10d::Store& store, int rank, int world, const BuildDescription& mine);

}  // namespace zeroshard
