"""The model moved to the GPU but one submodule created later stays behind: 'Expected
all tensors to be on the same device'. Expected: tensors-on-different-devices (or
input-weight-device). On the CPU the submodule is left on the meta device instead."""
import torch
from _kit import DEVICE
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU()).to(DEVICE)
model.add_module("head", nn.Linear(16, 2).to("cpu" if DEVICE == "cuda" else "meta"))  # added after .to()
for step in range(2):
    out = model(torch.randn(4, 8, device=DEVICE))
    out.sum().backward()
    print(f"step {step}")
