"""DeepSpeed's AutoEP in its ZeRO 1-2 checkpoints, as the converter (deepspeed_checkpoint.py)
reads them, written under the Hugging Face model's own names so that zeroshard's AutoEP
(_experts/hf_expert_parallel.py) loads them at any autoep_size.

AutoEP replaces each MoE block (ds_autoep_layers[i]["module_path"]) by its own layer: the
router's linear becomes `router.gate` (the model's `gate`, or the config's router_pattern),
a shared expert and its gate `shared_experts` and `shared_experts_gate` (Qwen's
`shared_expert` and `shared_expert_gate`: the presets that have the gate; DeepSeek's keep
their name; or the config's shared_experts_pattern and shared_experts_gate_pattern), and
each rank of an expert-parallel group keeps its experts (the placement's list for its
ep rank) as three grouped weights cut from the model's fused ones: w1 = gate_up_proj's
first I rows of each expert [L, I, H], w3 its last I rows, w2 = down_proj [L, H, I]. They
form an expert parameter group of their own, cut per ep coordinate as DeepSpeed's MoE
layer's groups are (deepspeed_experts.py). Converted, each coordinate's w1 and w3 go back
into the rows of its experts in the whole gate_up_proj [E, 2I, H], w2 into down_proj
[E, H, I]; everything else keeps its name."""
import math

from .deepspeed_files import error

_FUSED = {"expert_w1": "gate_up_proj", "expert_w2": "down_proj", "expert_w3": None}


class AutoEpNames:
    """The model's names and places of what DeepSpeed's AutoEP layers hold."""

    def __init__(self, model_state, shapes):
        """`shapes`: param_shapes (rank 0's, one {name: shape} per group)."""
        config = (model_state.get("ds_config") or {}).get("expert_parallel") or {}
        for key, fused in _FUSED.items():
            if config.get(key, fused) != fused:
                raise error(f"AutoEP's expert_parallel.{key} is {config[key]!r}: not converted; "
                            f"allowed: {fused!r} (the fused 3-D experts of transformers 5)")
        router = config.get("router_pattern") or "gate"
        experts = config.get("expert_pattern") or "experts"
        known = {name: shape for group in shapes for name, shape in group.items()}
        self.prefixes, self.experts, self.whole = [], {}, {}
        for layer in model_state["ds_autoep_layers"]:
            path, total = str(layer["module_path"]), int(layer["num_experts"])
            placement = {int(r["rank"]): [int(e) for e in r["experts"]]
                         for r in layer["expert_placement"]["ranks"]}
            listed = sorted(e for held in placement.values() for e in held)
            if len(listed) != total or listed != list(range(total)):
                raise error(f"AutoEP layer {path}: its placement {placement} does not hold each "
                            f"of its {total} experts once")
            gated = any(n.startswith(f"{path}.shared_experts_gate.") for n in known)
            shared = config.get("shared_experts_pattern") or (
                "shared_expert" if gated else "shared_experts")
            shared_gate = config.get("shared_experts_gate_pattern") or "shared_expert_gate"
            self.prefixes += [(f"{path}.router.gate.", f"{path}.{router}."),
                              (f"{path}.router.", f"{path}.{router}."),
                              (f"{path}.shared_experts_gate.", f"{path}.{shared_gate}."),
                              (f"{path}.shared_experts.", f"{path}.{shared}.")]
            prefix = f"{path}.{experts}."
            local, inner, hidden = _expert_shape(known, f"{path}.experts", path)
            self.whole[prefix + "gate_up_proj"] = [total, 2 * inner, hidden]
            self.whole[prefix + "down_proj"] = [total, hidden, inner]
            block = inner * hidden  # one expert's elements of each of w1, w3, w2
            for w, target, shift, stride in (("w1", "gate_up_proj", 0, 2 * block),
                                             ("w3", "gate_up_proj", block, 2 * block),
                                             ("w2", "down_proj", 0, block)):
                self.experts[f"{path}.experts.{w}"] = (prefix + target, shift, stride, block,
                                                       placement, local)

    def rename(self, name):
        """The model's name of what DeepSpeed's AutoEP layer holds as `name` (not an expert)."""
        for ds, model in self.prefixes:
            if name.startswith(ds):
                return model + name[len(ds):]
        return name

    def trainable(self, shapes):
        """{name: shape} of the converted checkpoint's trainable parameters."""
        out = {}
        for name, shape in shapes.items():
            if name in self.experts:
                whole = self.experts[name][0]
                out[whole] = self.whole[whole]
            else:
                out[self.rename(name)] = shape
        return out

    def write(self, out, place, name, begin, columns):
        """Elements [begin, begin + n) of DeepSpeed's parameter `name` as the ep rank at
        `place` holds it, to where they belong in the model's parameter."""
        if name not in self.experts:
            out.trained(self.rename(name), begin, columns)
            return
        whole, shift, stride, block, placement, local = self.experts[name]
        held = placement.get(place)
        if held is None or len(held) != local:
            raise error(f"'{name}': ep rank {place} holds {local} experts, its placement "
                        f"{held}")
        n, done = columns[0].numel(), 0
        while done < n:
            expert, within = divmod(begin + done, block)
            count = min(block - within, n - done)
            out.trained(whole, held[expert] * stride + shift + within,
                        [c.narrow(0, done, count) for c in columns])
            done += count


def _expert_shape(known, prefix, path):
    """(local experts, I, H) of an AutoEP layer from its w1, w2 and w3 in param_shapes."""
    shapes = [list(known.get(f"{prefix}.{w}") or []) for w in ("w1", "w3", "w2")]
    if any(len(s) != 3 for s in shapes) or shapes[0] != shapes[1] or \
            shapes[2] != [shapes[0][0], shapes[0][2], shapes[0][1]] or math.prod(shapes[0]) == 0:
        raise error(f"AutoEP layer {path}: experts.w1, w3, w2 of shapes {shapes}; allowed: "
                    "[L, I, H], [L, I, H], [L, H, I]")
    return shapes[0]


def deepspeed_names(model_name, whole, layers):
    """DeepSpeed's AutoEP names and tensors for the model's parameter `model_name` (`whole`:
    the whole tensor) in one of the AutoEP `layers` (their module paths): the fused experts
    as w1 and w3 (gate_up_proj's halves) and w2, marked for DeepSpeed's universal loader
    (is_expert_param, ep_num_experts); the router and a shared expert under the layer's
    names. [(name, {"param": tensor, ...})]; a parameter outside the layers keeps its name."""
    for path in layers:
        if not model_name.startswith(path + "."):
            continue
        rest = model_name[len(path) + 1:]
        marks = {"is_expert_param": True, "ep_num_experts": whole.shape[0]}
        if rest == "experts.gate_up_proj":
            inner = whole.shape[1] // 2
            return [(f"{path}.experts.w1", dict(marks, param=whole[:, :inner].contiguous())),
                    (f"{path}.experts.w3", dict(marks, param=whole[:, inner:].contiguous()))]
        if rest == "experts.down_proj":
            return [(f"{path}.experts.w2", dict(marks, param=whole))]
        for model, ds in (("gate.", "router.gate."),
                          ("shared_expert_gate.", "shared_experts_gate."),
                          ("shared_expert.", "shared_experts.")):
            if rest.startswith(model):
                return [(f"{path}.{ds}{rest[len(model):]}", {"param": whole})]
    return [(model_name, {"param": whole})]
