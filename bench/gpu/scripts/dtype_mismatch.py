"""One submodule cast to half, fed float32 without autocast: 'mat1 and mat2 must have
the same dtype'. Expected: matmul-operands-dtype (or input-weight-dtype)."""
import torch
from _kit import DEVICE
from torch import nn

torch.manual_seed(0)
model = nn.Sequential()
model.add_module("embed", nn.Linear(8, 16))
model.add_module("act", nn.ReLU())
model.add_module("head", nn.Linear(16, 2).half())   # someone halved the head to save memory
model.to(DEVICE)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
for step in range(2):
    out = model(torch.randn(4, 8, device=DEVICE))
    out.float().sum().backward()
    opt.step()
    print(f"step {step}")
