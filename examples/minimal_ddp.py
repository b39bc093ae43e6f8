"""A plain torch DDP training loop (the starting point of ddp_to_zeroshard.diff).
Run: torchrun --nproc_per_node 2 --redirects 1 --tee 1 --log_dir /tmp/l examples/minimal_ddp.py"""
import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64))
    model = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    for step in range(100):
        x = torch.randn(32, 64)
        loss = torch.nn.functional.mse_loss(model(x), x)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if dist.get_rank() == 0 and step % 20 == 0:
            print(f"step {step} loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
