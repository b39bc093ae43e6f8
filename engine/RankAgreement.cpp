#include "engine/RankAgreement.h"

#include <algorithm>
#include <sstream>
#include <unordered_map>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <yaml-cpp/yaml.h>

#include "common/Error.h"
#include "common/Hash.h"
#include "sharding/CollectiveWatch.h"  // describe_ranks
#include "sharding/StoreNotes.h"

namespace zeroshard {
namespace {

uint64_t hash_lines(const std::vector<std::string>& lines) {
  uint64_t h = kFnvOffset;
  for (const auto& line : lines) h = fnv1a("\n", fnv1a(line, h));
  return h;
}

std::string shape_of(const at::Tensor& t) {
  return fmt::format("[{}]", fmt::join(t.sizes(), ", "));
}

std::string tensor_line(const std::string& name, const at::Tensor& t) {
  // The device's type only: each rank has its own GPU.
  return fmt::format("{} {} {} {}", name, shape_of(t), c10::toString(t.scalar_type()),
                     c10::DeviceTypeName(t.device().type(), /*lower_case=*/true));
}

// "zero_optimization.stage: 3", one line per scalar, so that a difference names its key.
void flatten(const YAML::Node& node, const std::string& path, std::vector<std::string>& out) {
  if (node.IsMap()) {
    for (const auto& item : node)
      flatten(
          item.second,
          path.empty() ? item.first.as<std::string>() : path + "." + item.first.as<std::string>(),
          out);
  } else if (node.IsSequence()) {
    std::vector<std::string> items;
    for (const auto& item : node) items.push_back(item.IsScalar() ? item.as<std::string>() : "...");
    out.push_back(fmt::format("{}: [{}]", path, fmt::join(items, ", ")));
  } else if (path.find("nvme_path") == std::string::npos) {
    out.push_back(fmt::format("{}: {}", path, node.IsNull() ? "null" : node.as<std::string>()));
  }
}

std::string value_of(const std::vector<std::string>& lines, size_t i) {
  return i < lines.size() ? fmt::format("'{}'", lines[i]) : std::string("nothing");
}

// The first section where `theirs` differs from `ref`, said with its first differing line.
std::string first_difference(const std::vector<BuildSection>& ref,
                             const std::vector<BuildSection>& theirs, int rank) {
  std::vector<std::string> also;
  std::string first;
  for (size_t s = 0; s < std::min(ref.size(), theirs.size()); ++s) {
    const auto& a = ref[s].lines;
    const auto& b = theirs[s].lines;
    if (a == b) continue;
    if (!first.empty()) {
      also.push_back(ref[s].name);
      continue;
    }
    size_t i = 0;
    while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
    first = fmt::format(
        "in the {}: at entry {}, rank 0 has {} and rank {} has {} (rank 0: {} entries, rank "
        "{}: {}); {}",
        ref[s].name, i + 1, value_of(a, i), rank, value_of(b, i), a.size(), rank, b.size(),
        ref[s].advice);
  }
  if (first.empty()) return "in what they built";
  if (!also.empty()) first += fmt::format("; they also differ in the {}", fmt::join(also, ", "));
  return first;
}

}  // namespace

BuildDescription::BuildDescription(const std::vector<NamedParam>& params,
                                   const std::vector<std::vector<NamedParam>>& unit_params,
                                   const std::vector<ParamGroup>& groups,
                                   const std::vector<NamedBuffer>& buffers) {
  BuildSection p{"parameters",
                 "build the same model on every rank: the same classes, sizes, dtypes and "
                 "frozen parameters (load weights into it, or let rank 0's be broadcast)",
                 {}};
  std::unordered_map<const void*, std::string> names;
  for (const auto& param : params) {
    names.emplace(param.param.unsafeGetTensorImpl(), param.name);
    p.lines.push_back(tensor_line(param.name, param.param) +
                      (param.param.requires_grad() ? " trainable" : " frozen"));
  }
  sections_.push_back(std::move(p));
  BuildSection u{"stage-3 units", "pass the same units (or none) to initialize on every rank", {}};
  for (size_t i = 0; i < unit_params.size(); ++i) {
    std::vector<std::string> members;
    for (const auto& param : unit_params[i]) members.push_back(param.name);
    u.lines.push_back(fmt::format("unit {}: {}", i, fmt::join(members, ", ")));
  }
  sections_.push_back(std::move(u));
  BuildSection g{"optimizer parameter groups",
                 "pass the same parameter groups, in the same order, on every rank",
                 {}};
  for (size_t i = 0; i < groups.size(); ++i) {
    std::vector<std::string> members;
    for (const auto& t : groups[i].params) {
      const auto it = names.find(t.unsafeGetTensorImpl());
      members.push_back(it == names.end() ? "(not a parameter)" : it->second);
    }
    const auto& o = groups[i].options;
    auto opt = [](const std::optional<double>& v) {
      return v ? fmt::format("{}", *v) : std::string("default");
    };
    g.lines.push_back(fmt::format("group {}: lr {}, weight_decay {}, betas ({}, {}), eps {}: {}", i,
                                  opt(o.lr), opt(o.weight_decay), opt(o.beta1), opt(o.beta2),
                                  opt(o.eps), fmt::join(members, ", ")));
  }
  sections_.push_back(std::move(g));
  BuildSection b{"buffers", "build the same model on every rank", {}};
  for (const auto& buffer : buffers)
    b.lines.push_back(tensor_line(buffer.name, buffer.tensor) +
                      (buffer.persistent ? " persistent" : " not persistent"));
  sections_.push_back(std::move(b));
}

void BuildDescription::add_config(const Config& config, const char* what, const char* advice) {
  BuildSection c{what, advice, {}};
  flatten(YAML::Load(emit_config_yaml(config)), "", c.lines);
  sections_.push_back(std::move(c));
}

std::string BuildDescription::hashes() const {
  std::vector<std::string> out;
  for (const auto& s : sections_) out.push_back(fmt::format("{:016x}", hash_lines(s.lines)));
  return fmt::format("{}", fmt::join(out, ","));
}

std::string BuildDescription::serialize() const {
  std::string out;
  for (const auto& s : sections_) {
    out += fmt::format("{}\n{}\n{}\n", s.name, s.advice, s.lines.size());
    for (const auto& line : s.lines) out += line + "\n";
  }
  return out;
}

std::vector<BuildSection> BuildDescription::parse(const std::string& text) {
  std::vector<BuildSection> out;
  std::istringstream in(text);
  BuildSection s;
  std::string count;
  while (std::getline(in, s.name) && std::getline(in, s.advice) && std::getline(in, count)) {
    s.lines.assign(std::stoul(count), "");
    for (auto& line : s.lines) std::getline(in, line);
    out.push_back(s);
  }
  return out;
}

void agree_on_build(c10d::Store& store, int rank, int world, const BuildDescription& mine) {
  if (world <= 1) return;
  const std::string hashes = mine.hashes();
  std::vector<int> differing;
  int first = -1;
  try {
    if (rank == 0) write_note(store, "build/0", hashes);
    const bool differs = rank != 0 && read_note(store, "build/0") != hashes;
    if (differs) {
      write_note(store, fmt::format("build/text/{}", rank), mine.serialize());
      const int64_t n = store.add("build/differing", 1);
      write_note(store, fmt::format("build/differ/{}", n), std::to_string(rank));
    }
    if (store.add("build/arrived", 1) == world) write_note(store, "build/done", "1");
    store.wait({"build/done"});
    const int64_t count = store.add("build/differing", 0);
    if (count == 0) return;
    if (rank == 0) write_note(store, "build/text/0", mine.serialize());
    for (int64_t i = 1; i <= count; ++i)
      differing.push_back(std::stoi(read_note(store, fmt::format("build/differ/{}", i))));
    first = *std::min_element(differing.begin(), differing.end());
    const auto ref =
        rank == 0 ? mine.sections() : BuildDescription::parse(read_note(store, "build/text/0"));
    const auto theirs =
        rank == first
            ? mine.sections()
            : BuildDescription::parse(read_note(store, fmt::format("build/text/{}", first)));
    const std::string difference = first_difference(ref, theirs, first);
    // Rank 0 may serve the store: it stays until every rank has read what it needs.
    done_reading(store, "build/read", world, /*stay=*/rank == 0);
    fail(
        "rank {}: the ranks did not build the same engine, so their collectives would not "
        "match (checked before the first one): rank(s) {} differ from rank 0 {}",
        rank, describe_ranks(differing), difference);
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    fail(
        "rank {}: checking that every rank built the same engine failed before any collective "
        "(a rank never arrived, or the store is gone): {}",
        rank, without_backtrace(e.what()));
  }
}

}  // namespace zeroshard
