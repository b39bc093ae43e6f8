#include "engine/UnitPartition.h"

#include <algorithm>
#include <functional>
#include <numeric>
#include <set>
#include <typeinfo>
#include <unordered_map>
#include <utility>

#include <torch/nn/modules/container/moduledict.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/container/parameterdict.h>
#include <torch/nn/modules/container/parameterlist.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>

#include "common/Error.h"

namespace zeroshard {
namespace {

constexpr int kNone = -1;

class UnionFind {
 public:
  int add() {
    parent_.push_back(static_cast<int>(parent_.size()));
    return parent_.back();
  }
  int find(int x) {
    while (parent_[x] != x) x = parent_[x] = parent_[parent_[x]];
    return x;
  }
  void unite(int a, int b) {
    a = find(a), b = find(b);
    if (a != b) parent_[std::max(a, b)] = std::min(a, b);
  }

 private:
  std::vector<int> parent_;
};

// A would-be unit: where it was made (for ordering) and the modules its gather hangs at.
struct Candidate {
  size_t anchor = 0;
  std::set<size_t> hooks;
};

class Partition {
 public:
  Partition(const std::vector<ModuleNode>& tree, size_t param_count)
      : tree_(tree), param_owner_(param_count, kNone) {
    if (tree_.empty()) fail("partition_units: the module tree has no root");
    number(0);
    subtree_has_params_.assign(tree_.size(), -1);
    subtree_has_block_.assign(tree_.size(), -1);
  }

  void default_blocks() {
    std::vector<bool> seen(tree_.size(), false);
    find_blocks(0, seen);
  }

  void declare(const std::vector<size_t>& blocks) {
    for (size_t b : blocks) {
      if (b >= tree_.size()) fail("partition_units: declared node {} does not exist", b);
      block_.insert(b);
    }
  }

  std::vector<UnitNodes> units() {
    std::set<std::pair<size_t, int>> visited;
    assign(0, kNone, kNone, visited);
    std::unordered_map<int, size_t> unit_of_root;
    std::vector<UnitNodes> out;
    std::vector<size_t> anchor;
    for (size_t p = 0; p < param_owner_.size(); ++p) {
      if (param_owner_[p] == kNone) continue;  // not reachable from the root
      const int root = owners_.find(param_owner_[p]);
      auto [it, fresh] = unit_of_root.emplace(root, out.size());
      if (fresh) out.emplace_back(), anchor.push_back(tree_.size());
      out[it->second].params.push_back(p);
    }
    for (size_t c = 0; c < candidates_.size(); ++c) {
      const auto it = unit_of_root.find(owners_.find(static_cast<int>(c)));
      if (it == unit_of_root.end()) continue;
      UnitNodes& u = out[it->second];
      u.modules.insert(u.modules.end(), candidates_[c].hooks.begin(), candidates_[c].hooks.end());
      anchor[it->second] = std::min(anchor[it->second], order_[candidates_[c].anchor]);
    }
    for (auto& u : out) {
      std::sort(u.modules.begin(), u.modules.end(),
                [this](size_t a, size_t b) { return order_[a] < order_[b]; });
      u.modules.erase(std::unique(u.modules.begin(), u.modules.end()), u.modules.end());
    }
    std::vector<size_t> by_anchor(out.size());
    std::iota(by_anchor.begin(), by_anchor.end(), 0);
    std::stable_sort(by_anchor.begin(), by_anchor.end(),
                     [&](size_t a, size_t b) { return anchor[a] < anchor[b]; });
    std::vector<UnitNodes> sorted;
    for (size_t i : by_anchor) sorted.push_back(std::move(out[i]));
    return sorted;
  }

 private:
  // Pre-order position of every node reachable from `n` (first visit counts).
  void number(size_t n) {
    order_.assign(tree_.size(), tree_.size());
    size_t next = 0;
    std::vector<size_t> stack{n};
    while (!stack.empty()) {
      const size_t m = stack.back();
      stack.pop_back();
      if (order_[m] != tree_.size()) continue;
      order_[m] = next++;
      const auto& kids = tree_[m].children;
      for (auto it = kids.rbegin(); it != kids.rend(); ++it) {
        if (*it >= tree_.size())
          fail("partition_units: child {} of node {} does not exist", *it, m);
        stack.push_back(*it);
      }
    }
  }

  bool has_params(size_t n) {
    int& memo = subtree_has_params_[n];
    if (memo < 0) {
      memo = tree_[n].params.empty() ? 0 : 1;
      for (size_t c : tree_[n].children) memo = memo || has_params(c);
    }
    return memo == 1;
  }

  bool has_block(size_t n) {
    int& memo = subtree_has_block_[n];
    if (memo < 0) {
      memo = block_.count(n) ? 1 : 0;
      for (size_t c : tree_[n].children) memo = memo || has_block(c);
    }
    return memo == 1;
  }

  // Children of a stack are blocks, but for a container without a forward of its own (a
  // ModuleList in a ModuleList): that is a stack in turn. Nothing inside a block is looked at.
  void find_blocks(size_t n, std::vector<bool>& seen) {
    if (seen[n]) return;
    seen[n] = true;
    for (size_t c : tree_[n].children) {
      if (!has_params(c)) continue;
      const bool container = tree_[c].stack && !tree_[c].callable;
      if (tree_[n].stack && !container) {
        block_.insert(c);
      } else {
        find_blocks(c, seen);
      }
    }
  }

  int candidate(std::unordered_map<size_t, int>& memo, size_t anchor, int hook) {
    auto [it, fresh] = memo.emplace(anchor, kNone);
    if (fresh) {
      it->second = owners_.add();
      candidates_.push_back({anchor, {}});
    }
    if (hook != kNone) candidates_[it->second].hooks.insert(static_cast<size_t>(hook));
    return it->second;
  }

  void own(size_t param, int owner) {
    if (param >= param_owner_.size()) fail("partition_units: parameter {} does not exist", param);
    if (param_owner_[param] == kNone) {
      param_owner_[param] = owner;
    } else {
      owners_.unite(param_owner_[param], owner);
    }
  }

  // `owner`: the unit everything under `n` belongs to so far (a block, or a subtree
  // without blocks); `callable_above`: the nearest ancestor with a forward of its own.
  void assign(size_t n, int owner, int callable_above, std::set<std::pair<size_t, int>>& visited) {
    if (!visited.insert({n, owner}).second) return;
    const int hook = tree_[n].callable ? static_cast<int>(n) : callable_above;
    if (block_.count(n)) {
      owner = candidate(block_units_, n, hook);
    } else if (owner == kNone && has_params(n) && !has_block(n)) {
      owner = candidate(subtree_units_, n, hook);
    }
    for (size_t p : tree_[n].params)
      own(p, owner != kNone ? owner : candidate(direct_units_, n, hook));
    for (size_t c : tree_[n].children) assign(c, owner, hook, visited);
  }

  const std::vector<ModuleNode>& tree_;
  std::vector<size_t> order_;
  std::vector<int> subtree_has_params_, subtree_has_block_;
  std::set<size_t> block_;
  std::vector<Candidate> candidates_;
  std::unordered_map<size_t, int> block_units_, subtree_units_, direct_units_;
  std::vector<int> param_owner_;
  UnionFind owners_;
};

bool is_stack(const torch::nn::Module& m) {
  return dynamic_cast<const torch::nn::ModuleListImpl*>(&m) != nullptr ||
         dynamic_cast<const torch::nn::ModuleDictImpl*>(&m) != nullptr ||
         dynamic_cast<const torch::nn::SequentialImpl*>(&m) != nullptr;
}

// DeepSpeed quantizes the weight of exactly these classes (subclasses are not matched).
bool quantizes_weight(const torch::nn::Module& m) {
  return typeid(m) == typeid(torch::nn::LinearImpl) ||
         typeid(m) == typeid(torch::nn::EmbeddingImpl);
}

bool is_callable(const torch::nn::Module& m) {
  return dynamic_cast<const torch::nn::ModuleListImpl*>(&m) == nullptr &&
         dynamic_cast<const torch::nn::ModuleDictImpl*>(&m) == nullptr &&
         dynamic_cast<const torch::nn::ParameterListImpl*>(&m) == nullptr &&
         dynamic_cast<const torch::nn::ParameterDictImpl*>(&m) == nullptr;
}

}  // namespace

std::vector<UnitNodes> partition_units(const std::vector<ModuleNode>& tree, size_t param_count,
                                       const std::vector<size_t>& declared) {
  Partition partition(tree, param_count);
  if (declared.empty()) {
    partition.default_blocks();
  } else {
    partition.declare(declared);
  }
  return partition.units();
}

ModuleTree module_tree(const torch::nn::Module& root) {
  ModuleTree t;
  std::unordered_map<const torch::nn::Module*, size_t> node_of;
  std::unordered_map<const void*, size_t> param_of;
  for (const auto& item : root.named_parameters(/*recurse=*/true)) {
    if (param_of.emplace(item.value().unsafeGetTensorImpl(), t.params.size()).second)
      t.params.push_back({item.key(), item.value()});
  }
  // Depth first, so that a node's index is known before its parent lists it.
  std::function<size_t(const torch::nn::Module&)> visit = [&](const torch::nn::Module& m) {
    const auto found = node_of.find(&m);
    if (found != node_of.end()) return found->second;
    const size_t n = t.nodes.size();
    node_of.emplace(&m, n);
    t.nodes.emplace_back();
    t.modules.push_back(&m);
    t.nodes[n].stack = is_stack(m);
    t.nodes[n].callable = is_callable(m);
    for (const auto& p : m.named_parameters(/*recurse=*/false)) {
      const size_t index = param_of.at(p.value().unsafeGetTensorImpl());
      t.nodes[n].params.push_back(index);
      if (p.key() == "weight" && quantizes_weight(m)) t.params[index].quantizable = true;
    }
    for (const auto& child : m.children()) {
      const size_t c = visit(*child);
      t.nodes[n].children.push_back(c);
    }
    return n;
  };
  visit(root);
  return t;
}

}  // namespace zeroshard
