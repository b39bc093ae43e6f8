"""DeepSpeed checkpoints written in its own layouts (as its zero_to_fp32 reads them) without
DeepSpeed: for the converter's tests, the security tests and the converter's fuzzer.
`extra` adds keys to rank 0's model-states file (client_state, as DeepSpeed keeps it)."""
import torch


def _latest(folder):
    folder.mkdir(parents=True)
    (folder.parent / "latest").write_text(folder.name)


def _piece(t, rank, world):
    piece = -(-t.numel() // world)
    part = t.reshape(-1)[rank * piece:(rank + 1) * piece]
    return torch.cat([part, torch.zeros(piece - part.numel(), dtype=t.dtype)])


def stage3(folder, world, params, frozen, buffers, extra=None):
    """Stage 3: each rank's fp32_flat_groups hold its ceil(numel / world) piece of every
    parameter of a group, one after the other, with Adam's moments (2 x and 3 x the
    master here) in the same layout; frozen parameters as per-rank fragments; buffers
    whole."""
    _latest(folder)
    for rank in range(world):
        flats = [torch.cat([_piece(t, rank, world) for t in group.values()]) for group in params]
        state = {g: {"step": 2, "exp_avg": 2 * f, "exp_avg_sq": 3 * f}
                 for g, f in enumerate(flats)}
        torch.save({"optimizer_state_dict": {
            "zero_stage": 3, "fp32_flat_groups": flats,
            "optimizer_state_dict": {"state": state, "param_groups": [{}] * len(flats)}}},
            folder / f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt")
        model = {"module": dict(buffers), "buffer_names": list(buffers),
                 "param_shapes": [{n: t.shape for n, t in g.items()} for g in params],
                 "frozen_param_shapes": {n: t.shape for n, t in frozen.items()},
                 "frozen_param_fragments": {n: _piece(t, rank, world) for n, t in frozen.items()},
                 "global_steps": 2, "ds_config": {}}
        if rank == 0:
            model.update(extra or {})
        torch.save(model, folder / f"zero_pp_rank_{rank}_mp_rank_00_model_states.pt")


def stage12(folder, world, params, buffers, stage=2, extra=None, param_groups=None):
    """Stages 1-2: per group one flat fp32 vector padded to a multiple of world and cut
    into one partition per rank, Adam's moments (2 x and 3 x) likewise; the model file
    holds the whole (fp32 here) parameters and buffers. param_groups: the optimizer's
    (DeepSpeed's MoE layer marks its experts' `moe`)."""
    _latest(folder)
    flats = []
    for group in params:
        flat = torch.cat([t.reshape(-1).float() for t in group.values()])
        flats.append(torch.cat([flat, torch.zeros(-flat.numel() % world)]).chunk(world))
    for rank in range(world):
        mine = [f[rank].clone() for f in flats]
        state = {g: {"step": 2, "exp_avg": 2 * f, "exp_avg_sq": 3 * f} for g, f in enumerate(mine)}
        torch.save({"optimizer_state_dict": {
            "zero_stage": stage, "loss_scaler": None, "dynamic_loss_scale": False,
            "single_partition_of_fp32_groups": mine, "partition_count": [world] * len(mine),
            "base_optimizer_state": {"state": state,
                                     "param_groups": param_groups or [{}] * len(mine)}}},
            folder / f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt")
    module = {n: t for g in params for n, t in g.items()}
    module.update(buffers)
    model = {"module": module, "buffer_names": list(buffers),
             "param_shapes": [{n: t.shape for n, t in g.items()} for g in params],
             "global_steps": 2, "ds_config": {}}
    model.update(extra or {})
    torch.save(model, folder / "mp_rank_00_model_states.pt")
