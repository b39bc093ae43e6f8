// libFuzzer targets for everything zeroshard parses from users or from disk. Each
// input must end in the project's Error (a clear message) or succeed; any other
// exception, crash, leak or hang is a bug (the fuzzer reports it and keeps the input).
// One binary per target: ZS_FUZZ_TARGET selects the body at compile time.
#include <cstddef>
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "common/Bytes.h"
#include "common/Error.h"
#include "config/Config.h"
#include "engine/Checkpoint.h"
#include "plan/HfConfig.h"

using namespace zeroshard;

namespace {

void run(const std::string& text) {
#if ZS_FUZZ_TARGET == 1
  load_config_string(text, "fuzz");
#elif ZS_FUZZ_TARGET == 2
  spec_from_hf_json(text, "fuzz");
#elif ZS_FUZZ_TARGET == 3
  parse_bytes(text, "--size");
#elif ZS_FUZZ_TARGET == 4
  const auto j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_discarded()) Manifest::from_json(j, "fuzz");
#endif
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    run(std::string(reinterpret_cast<const char*>(data), size));
  } catch (const Error&) {
    // the clear error bad input must end in
  }
  return 0;
}
