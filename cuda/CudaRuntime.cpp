#include "cuda/CudaRuntime.h"

#include <dlfcn.h>

#include <string>
#include <vector>

#include "common/Error.h"

namespace zeroshard {
namespace {

constexpr const char* kLibrary = "libzeroshard_cuda.so";

struct Loaded {
  CudaRuntime* runtime = nullptr;
  std::string why;
};

// The folder of the binary this code is linked into: the extension module of an installed
// wheel (whose folder holds libzeroshard_cuda.so too), libzeroshard.so, or a program.
std::string own_folder() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&cuda_runtime), &info) == 0 || info.dli_fname == nullptr) {
    return "";
  }
  const std::string path = info.dli_fname;
  const auto slash = path.rfind('/');
  return slash == std::string::npos ? "" : path.substr(0, slash);
}

Loaded load() {
  Loaded out;
  if (!cuda_built()) {
    out.why = "this build's LibTorch has no CUDA (build against a CUDA torch, e.g. PyPI's)";
    return out;
  }
  // Beside this binary first (an installed wheel, libzeroshard.so), then where this build
  // put it (the build tree's programs and Python package).
  std::vector<std::string> candidates;
  if (const std::string own = own_folder(); !own.empty())
    candidates.push_back(own + "/" + kLibrary);
#ifdef ZS_CUDA_LIBRARY_DIR
  candidates.push_back(std::string(ZS_CUDA_LIBRARY_DIR) + "/" + kLibrary);
#endif
  std::string errors;
  for (const std::string& path : candidates) {
    // RTLD_LOCAL: its symbols (torch's CUDA libraries') stay its own; RTLD_NOW: a missing
    // library is this call's failure, not a later crash.
    void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      const char* error = dlerror();
      if (!errors.empty()) errors += "; ";
      errors += error != nullptr ? error : path + ": unknown dlopen error";
      continue;
    }
    using Entry = CudaRuntime* (*)();
    auto entry = reinterpret_cast<Entry>(dlsym(handle, "zeroshard_cuda_runtime"));
    if (entry == nullptr) {
      out.why = path + " has no zeroshard_cuda_runtime: it is not this build's GPU half";
      return out;
    }
    out.runtime = entry();
    return out;
  }
  out.why =
      "this zeroshard was built with CUDA, but its GPU half does not load beside this "
      "process's torch (" +
      errors +
      "); a torch without CUDA cannot run it: install the CUDA torch zeroshard was built "
      "against, or keep the model on the CPU";
  return out;
}

const Loaded& loaded() {
  static const Loaded once = load();
  return once;
}

}  // namespace

bool cuda_built() {
#ifdef ZS_CUDA_BUILT
  return true;
#else
  return false;
#endif
}

CudaRuntime* cuda_runtime() {
  return loaded().runtime;
}

std::string cuda_unavailable() {
  return loaded().why;
}

}  // namespace zeroshard
