#include "engine/Checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <utility>

#include <c10/core/ScalarType.h>
#include <fmt/ranges.h>

#include "common/Error.h"
#include "common/Files.h"

namespace zeroshard {

namespace {

// Every option of a group with its manifest key (`Options`: const or not).
template <typename Options, typename Fn>
void for_each_option(Options& o, Fn&& fn) {
  fn("lr", o.lr);
  fn("beta1", o.beta1);
  fn("beta2", o.beta2);
  fn("eps", o.eps);
  fn("weight_decay", o.weight_decay);
  fn("decoupled", o.decoupled);
}

}  // namespace

nlohmann::json param_group_json(const ParamGroupOptions& o) {
  nlohmann::json j = nlohmann::json::object();
  for_each_option(o, [&j](const char* key, const auto& value) {
    if (value) j[key] = *value;
  });
  return j;
}

ParamGroupOptions param_group_from_json(const nlohmann::json& j) {
  ParamGroupOptions o;
  for_each_option(o, [&j](const char* key, auto& value) {
    using T = typename std::decay_t<decltype(value)>::value_type;
    if (j.contains(key)) value = j.at(key).get<T>();
  });
  return o;
}

int64_t saved_element_size(const std::string& dtype) {
  if (dtype == "fp32") return 4;
  if (dtype == "bf16" || dtype == "fp16") return 2;
  fail("checkpoint: unknown dtype '{}'; allowed: fp32, bf16, fp16", dtype);
}

int64_t saved_numel(const std::vector<int64_t>& shape) {
  constexpr int64_t kMost = int64_t{1} << 42;
  int64_t numel = 1;
  for (int64_t d : shape) {
    if (d < 0 || (d > 0 && numel > kMost / d)) return -1;  // checked before it can overflow
    numel *= d;
  }
  return numel;
}

namespace {

// Each dtype a buffer may have: torch's name and its element size (written out, since
// c10's elementSize is not header-only and the fuzzers link no LibTorch).
struct TorchDtype {
  c10::ScalarType type;
  const char* name;
  int64_t size;
};
constexpr std::array<TorchDtype, 13> kTorchDtypes{{
    {c10::kFloat, "float32", 4},
    {c10::kDouble, "float64", 8},
    {c10::kHalf, "float16", 2},
    {c10::kBFloat16, "bfloat16", 2},
    {c10::kLong, "int64", 8},
    {c10::kInt, "int32", 4},
    {c10::kShort, "int16", 2},
    {c10::kChar, "int8", 1},
    {c10::kByte, "uint8", 1},
    {c10::kBool, "bool", 1},
    {c10::kComplexHalf, "complex32", 4},
    {c10::kComplexFloat, "complex64", 8},
    {c10::kComplexDouble, "complex128", 16},
}};

std::string torch_dtype_names() {
  std::string out;
  for (const auto& d : kTorchDtypes) out += (out.empty() ? "" : ", ") + std::string(d.name);
  return out;
}

const TorchDtype& torch_dtype_named(const std::string& name) {
  for (const auto& d : kTorchDtypes)
    if (name == d.name) return d;
  fail("dtype '{}' is not allowed; allowed: {}", name, torch_dtype_names());
}

// Buffers lie one after the other in rank0.bin from `begin`, each its dtype's bytes.
void check_buffers(const Manifest& m, int64_t begin, const std::string& origin) {
  int64_t at = begin;
  for (const auto& b : m.buffers) {
    const int64_t numel = saved_numel(b.shape);
    const int64_t size = torch_dtype_named(b.dtype).size;
    if (numel < 0 || b.offset != at || b.bytes != numel * size) {
      fail(
          "checkpoint manifest '{}': buffer '{}' ({} bytes of {} at byte {}) does not fit its "
          "shape or the buffers before it (expected at byte {})",
          origin, b.name, b.bytes, b.dtype, b.offset, at);
    }
    at += b.bytes;
  }
}

// A manifest's numbers must describe files that can exist: every read the loader
// does is then inside a rank file (whose size the manifest also states).
void check_consistent(const Manifest& m, const std::string& origin) {
  int64_t end = 0;
  for (size_t g = 0; g < m.groups.size(); ++g) {
    const SavedGroup& sg = m.groups[g];
    // Another ep coordinate's copy of the group before it: the same bytes in other files.
    const SavedGroup* before = g > 0 ? &m.groups[g - 1] : nullptr;
    const bool copy = before != nullptr && !sg.ranks.empty() && !before->ranks.empty() &&
                      sg.file_offset == before->file_offset && sg.bytes() == before->bytes();
    if (sg.shard_numel <= 0 || sg.shard_numel > (int64_t{1} << 40) ||
        (!copy && sg.file_offset != end)) {
      fail("checkpoint manifest '{}': group {} has shard_numel {} at byte {} (expected {})", origin,
           g, sg.shard_numel, sg.file_offset, end);
    }
    for (const int r : sg.ranks) {
      if (r < 0 || r >= m.world_size)
        fail("checkpoint manifest '{}': group {} names rank file {} of {}", origin, g, r,
             m.world_size);
    }
    if (!copy) end += sg.bytes();
    for (const auto& p : sg.params) {
      if (p.tensor_parallel_dim < -1 || p.tensor_parallel_dim >= static_cast<int>(p.shape.size())) {
        fail("checkpoint manifest '{}': parameter '{}' of {} dimensions is split along {}", origin,
             p.name, p.shape.size(), p.tensor_parallel_dim);
      }
      if (saved_numel(p.shape) != p.numel || p.offset < 0 ||
          p.offset + p.numel > sg.shard_numel * sg.slices(m.world_size)) {
        fail(
            "checkpoint manifest '{}': parameter '{}' (offset {}, numel {}) does not fit its "
            "group or its shape",
            origin, p.name, p.offset, p.numel);
      }
      if (p.part() && (p.tensor_parallel_dim >= 0 || p.whole_offset < 0 ||
                       p.whole_offset + p.numel > saved_numel(p.whole_shape))) {
        fail(
            "checkpoint manifest '{}': part of parameter '{}' (elements {} to {}) does not fit "
            "its whole shape [{}]",
            origin, p.name, p.whole_offset, p.whole_offset + p.numel,
            fmt::join(p.whole_shape, ", "));
      }
    }
  }
  if (m.rng_offset != end || m.rng_bytes < 0 || m.rng_bytes > (1 << 20) || m.device_rng_bytes < 0 ||
      m.device_rng_bytes > m.rng_bytes) {
    fail("checkpoint manifest '{}': RNG state at byte {} ({} bytes), expected at byte {}", origin,
         m.rng_offset, m.rng_bytes, end);
  }
  check_buffers(m, end + m.rng_bytes, origin);
  for (size_t r = 0; r < m.files.size(); ++r) {
    const SavedFile& f = m.files[r];
    const int64_t needed = end + m.rng_bytes + (r == 0 ? m.buffer_bytes() : 0);
    if (f.bytes != needed) {
      fail("checkpoint manifest '{}': file '{}' of {} bytes, the layout needs {}", origin, f.name,
           f.bytes, needed);
    }
  }
}

}  // namespace

std::string torch_dtype_name(c10::ScalarType type) {
  for (const auto& d : kTorchDtypes)
    if (d.type == type) return d.name;
  fail("dtype {} cannot be saved; allowed: {}", c10::toString(type), torch_dtype_names());
}

c10::ScalarType torch_dtype(const std::string& name) {
  return torch_dtype_named(name).type;
}

int64_t Manifest::buffer_bytes() const {
  int64_t total = 0;
  for (const auto& b : buffers) total += b.bytes;
  return total;
}

int64_t SavedGroup::bytes() const {
  return trainable ? int64_t{4} * arrays * shard_numel : saved_element_size(dtype) * shard_numel;
}

nlohmann::json Manifest::to_json() const {
  nlohmann::json groups_json = nlohmann::json::array();
  for (const auto& g : groups) {
    nlohmann::json params_json = nlohmann::json::array();
    for (const auto& p : g.params) {
      params_json.push_back(
          {{"name", p.name}, {"shape", p.shape}, {"offset", p.offset}, {"numel", p.numel}});
      if (p.tensor_parallel_dim >= 0)
        params_json.back()["tensor_parallel_dim"] = p.tensor_parallel_dim;
      if (p.part()) {
        params_json.back()["whole_shape"] = p.whole_shape;
        params_json.back()["whole_offset"] = p.whole_offset;
      }
    }
    groups_json.push_back({{"shard_numel", g.shard_numel},
                           {"trainable", g.trainable},
                           {"dtype", g.dtype},
                           {"file_offset", g.file_offset},
                           {"params", params_json}});
    if (!g.ranks.empty()) groups_json.back()["ranks"] = g.ranks;
  }
  nlohmann::json buffers_json;  // null: none saved (has_buffers false)
  if (has_buffers) buffers_json = nlohmann::json::array();
  for (const auto& b : buffers) {
    buffers_json.push_back({{"name", b.name},
                            {"dtype", b.dtype},
                            {"shape", b.shape},
                            {"offset", b.offset},
                            {"bytes", b.bytes}});
  }
  nlohmann::json files_json = nlohmann::json::array();
  for (const auto& f : files) {
    files_json.push_back({{"name", f.name}, {"bytes", f.bytes}, {"crc32", f.crc32}});
  }
  return {{"format", format},
          {"tag", tag},
          {"world_size", world_size},
          {"stage", stage},
          {"optimizer_steps", optimizer_steps},
          {"global_steps", global_steps},
          {"schedule_steps", schedule_steps},
          {"skipped_steps", skipped_steps},
          {"micro_steps", micro_steps},
          {"loss_scale", loss_scale},
          {"client_state", client_state},
          {"param_groups", param_groups},
          {"lr_scheduler", lr_scheduler},
          {"optimizer_state", optimizer_state},
          {"optimizer_scalars", optimizer_scalars},
          {"config_yaml", config_yaml},
          {"rng_offset", rng_offset},
          {"rng_bytes", rng_bytes},
          {"device_rng_bytes", device_rng_bytes},
          {"groups", groups_json},
          {"buffers", buffers_json},
          {"files", files_json},
          {"aliases", aliases}};
}

Manifest Manifest::from_json(const nlohmann::json& j, const std::string& origin) {
  try {
    Manifest m;
    m.format = j.at("format").get<int>();
    if (m.format != kCheckpointFormat) {
      fail("checkpoint manifest '{}': format {} is not allowed; this zeroshard reads format {}",
           origin, m.format, kCheckpointFormat);
    }
    m.tag = j.at("tag").get<std::string>();
    m.world_size = j.at("world_size").get<int>();
    m.stage = j.at("stage").get<int>();
    m.optimizer_steps = j.at("optimizer_steps").get<int64_t>();
    m.global_steps = j.value("global_steps", m.optimizer_steps);  // (older: the same)
    m.schedule_steps = j.value("schedule_steps", m.optimizer_steps);
    m.skipped_steps = j.value("skipped_steps", int64_t{0});
    m.micro_steps = j.at("micro_steps").get<int64_t>();
    m.loss_scale = j.at("loss_scale");
    m.client_state = j.at("client_state");
    m.param_groups = j.value("param_groups", nlohmann::json());
    m.lr_scheduler = j.value("lr_scheduler", nlohmann::json());
    if (j.contains("optimizer_state"))
      m.optimizer_state = j.at("optimizer_state").get<std::vector<std::string>>();
    if (m.optimizer_state.size() > 64) {
      fail("checkpoint manifest '{}': {} optimizer state arrays; at most 64", origin,
           m.optimizer_state.size());
    }
    m.optimizer_scalars = j.value("optimizer_scalars", nlohmann::json());
    m.config_yaml = j.at("config_yaml").get<std::string>();
    m.rng_offset = j.at("rng_offset").get<int64_t>();
    m.rng_bytes = j.at("rng_bytes").get<int64_t>();
    m.device_rng_bytes = j.value("device_rng_bytes", int64_t{0});  // (older: the CPU's alone)
    for (const auto& g : j.at("groups")) {
      SavedGroup sg;
      sg.shard_numel = g.at("shard_numel").get<int64_t>();
      sg.trainable = g.at("trainable").get<bool>();
      sg.dtype = g.at("dtype").get<std::string>();
      sg.file_offset = g.at("file_offset").get<int64_t>();
      sg.arrays = 1 + static_cast<int>(m.optimizer_state.size());
      sg.ranks = g.value("ranks", std::vector<int>{});
      for (const auto& p : g.at("params")) {
        sg.params.push_back(
            {p.at("name").get<std::string>(), p.at("shape").get<std::vector<int64_t>>(),
             p.at("offset").get<int64_t>(), p.at("numel").get<int64_t>(),
             p.value("tensor_parallel_dim", -1), p.value("whole_shape", std::vector<int64_t>{}),
             p.value("whole_offset", int64_t{0})});
      }
      m.groups.push_back(std::move(sg));
    }
    if (j.contains("buffers") && !j.at("buffers").is_null()) {
      m.has_buffers = true;
      for (const auto& b : j.at("buffers")) {
        m.buffers.push_back({b.at("name").get<std::string>(), b.at("dtype").get<std::string>(),
                             b.at("shape").get<std::vector<int64_t>>(),
                             b.at("offset").get<int64_t>(), b.at("bytes").get<int64_t>()});
      }
    }
    if (j.contains("aliases")) {
      m.aliases = j.at("aliases").get<std::vector<std::pair<std::string, std::string>>>();
    }
    for (const auto& f : j.at("files")) {
      m.files.push_back({f.at("name").get<std::string>(), f.at("bytes").get<int64_t>(),
                         f.at("crc32").get<uint32_t>()});
    }
    if (m.world_size < 1 || static_cast<int>(m.files.size()) != m.world_size) {
      fail("checkpoint manifest '{}': {} rank files for world size {}", origin, m.files.size(),
           m.world_size);
    }
    check_consistent(m, origin);
    return m;
  } catch (const nlohmann::json::exception& e) {
    fail("checkpoint manifest '{}' is not valid: {}", origin, e.what());
  }
}

uint32_t file_crc32(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("checkpoint: cannot open '{}': {}", path, std::strerror(errno));
  std::vector<unsigned char> buf(4 << 20);
  uLong crc = crc32(0L, Z_NULL, 0);
  for (;;) {
    const ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n < 0) {
      ::close(fd);
      fail("checkpoint: cannot read '{}': {}", path, std::strerror(errno));
    }
    if (n == 0) break;
    crc = crc32(crc, buf.data(), static_cast<uInt>(n));
  }
  ::close(fd);
  return static_cast<uint32_t>(crc);
}

std::string tensor_parallel_part(int coordinate) {
  return fmt::format("tp_rank_{:02d}", coordinate);
}

std::string pipeline_stage_part(int stage) {
  return fmt::format("pipeline_stage_{:02d}", stage);
}

std::string latest_tag(const std::string& dir) {
  const std::string latest = dir + "/latest";
  struct stat st {};
  if (::stat(latest.c_str(), &st) != 0) {
    fail("checkpoint: '{}' has no 'latest' file; give a tag, or save a checkpoint there first",
         dir);
  }
  std::string tag = read_whole_file(latest, "checkpoint");
  while (!tag.empty() && (tag.back() == '\n' || tag.back() == ' ')) tag.pop_back();
  return tag;
}

Manifest read_manifest(const std::string& dir, std::string tag) {
  if (tag.empty()) tag = latest_tag(dir);
  const std::string path = dir + "/" + tag + "/manifest.json";
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(read_whole_file(path, "checkpoint"));
  } catch (const nlohmann::json::exception& e) {
    fail("checkpoint manifest '{}' is not valid JSON: {}", path, e.what());
  }
  Manifest m = Manifest::from_json(j, path);
  for (const auto& f : m.files) {
    const std::string file = dir + "/" + tag + "/" + f.name;
    struct stat st {};
    if (::stat(file.c_str(), &st) != 0) fail("checkpoint file '{}' is missing", file);
    if (st.st_size != f.bytes) {
      fail("checkpoint file '{}' has {} bytes, the manifest says {} (truncated?)", file,
           static_cast<int64_t>(st.st_size), f.bytes);
    }
    const uint32_t crc = file_crc32(file);
    if (crc != f.crc32) {
      fail("checkpoint file '{}' does not match its checksum (CRC-32 {:08x}, manifest {:08x})",
           file, crc, f.crc32);
    }
  }
  return m;
}

}  // namespace zeroshard
