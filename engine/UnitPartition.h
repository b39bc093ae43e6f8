#pragma once
// Stage 3's units: which parameters are gathered together, and at which modules. One rule
// for both languages: the C++ Engine describes a torch::nn::Module with module_tree(), the
// Python package describes an nn.Module the same way (bindings/zeroshard/_engine/units.py), and
// both call partition_units(). docs/architecture.md "Units" says why the rule is this one.
//
// The rule. Blocks are the declared units, or by default every child (with parameters) of
// every stack: a ModuleList, ModuleDict or Sequential, a container met inside a stack
// being a stack too (nested blocks stay inside their block). Each block is a unit of all
// the parameters under it; a block inside a declared block is its own unit (the innermost
// wins). Every parameter outside the blocks is sharded too: the top-most module whose
// subtree holds parameters and no block is a unit (an embedding, a final norm, a head, a
// projector), and a module above blocks that registers parameters itself (a class token on
// a model) makes a unit of those. Units that register the same parameter (a head tied to
// the embedding) are one unit, gathered wherever any of its modules runs.
#include <cstddef>
#include <memory>
#include <vector>

#include <torch/nn/module.h>

#include "sharding/FlatParamGroup.h"

namespace zeroshard {

// A module as the rule sees it. A module reachable under two names is one node, the
// child of both parents; node 0 is the root.
struct ModuleNode {
  std::vector<size_t> children;  // node indices, in registration order
  std::vector<size_t> params;    // the parameters it registers itself: indices into the
                                 // model's parameter list (a tied parameter: one index)
  bool stack = false;            // its children are blocks (ModuleList, ModuleDict, Sequential)
  bool callable = true;          // has a forward of its own (not a ModuleList, ModuleDict,
                                 // ParameterList or ParameterDict)
};

struct UnitNodes {
  std::vector<size_t> modules;  // where its gather hangs: callable modules, pre-order
  std::vector<size_t> params;   // ascending; every parameter is in exactly one unit
};

// Units in the order their first module appears in pre-order. `declared`: node indices
// of user-declared blocks (empty: the default blocks above).
std::vector<UnitNodes> partition_units(const std::vector<ModuleNode>& tree, size_t param_count,
                                       const std::vector<size_t>& declared = {});

// A LibTorch module as the rule's tree: its nodes, the module of each node, and the
// parameters the indices refer to (named_parameters() order, a tied one once).
struct ModuleTree {
  std::vector<ModuleNode> nodes;
  std::vector<const torch::nn::Module*> modules;
  std::vector<NamedParam> params;
};
ModuleTree module_tree(const torch::nn::Module& root);

}  // namespace zeroshard
