"""Two ranks (torchrun, NCCL on two GPUs): rank 1 raises at step 2 while rank 0 waits
in an all_reduce. Expected: rank-summary / processes-did-not-join, the cause on rank 1."""
import os

import torch
import torch.distributed as dist
from torch import nn

rank = int(os.environ["RANK"])
torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
dist.init_process_group("nccl")
model = nn.parallel.DistributedDataParallel(nn.Linear(64, 64).cuda(), device_ids=[torch.cuda.current_device()])
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
for step in range(4):
    if rank == 1 and step == 2:
        raise RuntimeError("rank 1: a corrupt shard in the data loader")
    model(torch.randn(8, 64, device="cuda")).sum().backward()
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
