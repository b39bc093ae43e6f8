#pragma once
// Hugging Face config.json → ModelSpec, with the exact parameter count derived
// from the architecture of each supported model family.
#include <string>
#include <vector>

#include "plan/ModelSpec.h"

namespace zeroshard {

std::vector<std::string> supported_model_types();
// `tensor_parallel`: one rank's slices as transformers' tp_plan splits a decoder family
// (TransformerArch::tensor_parallel); other families are refused at more than 1.
// `pipeline_stages`, `pipeline_held`: those stages' share of a decoder family
// (TransformerArch::pipeline_stages); other families are refused at more than 1 stage.
// `expert_parallel`: a mixture of experts' experts split over that many ranks
// (TransformerArch::expert_parallel).
ModelSpec spec_from_hf_json(const std::string& json_text, const std::string& origin,
                            int64_t tensor_parallel = 1, int64_t pipeline_stages = 1,
                            const std::vector<int64_t>& pipeline_held = {0},
                            int64_t expert_parallel = 1);
ModelSpec spec_from_hf_file(const std::string& path, int64_t tensor_parallel = 1,
                            int64_t pipeline_stages = 1,
                            const std::vector<int64_t>& pipeline_held = {0},
                            int64_t expert_parallel = 1);
// A live model's (the Python package's): its config as JSON and the attention it was
// built with (transformers' attn_implementation, which decides whether scores are kept).
ModelSpec spec_from_hf_model(const std::string& json_text, const std::string& attn_implementation,
                             int64_t tensor_parallel = 1);

}  // namespace zeroshard
