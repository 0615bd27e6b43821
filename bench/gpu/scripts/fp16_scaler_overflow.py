"""fp16 autocast with a real GradScaler: every fourth batch holds an outlier target whose
loss gradient overflows fp16 once scaled, so the scaler skips that step and halves the
scale, then grows it back. Expected: scaler-skipping-steps. Exits 0."""
import torch
from _kit import DEVICE, SMALL
from torch import nn

torch.manual_seed(0)
d = 64 if SMALL else 1024
model = nn.Sequential(nn.Linear(d, d), nn.Tanh(), nn.Linear(d, 1)).to(DEVICE)
opt = torch.optim.SGD(model.parameters(), lr=1e-4)
scaler = torch.amp.GradScaler(DEVICE, init_scale=1024.0, growth_interval=2)
for step in range(24 if SMALL else 40):  # the rule wants 20 updates or more
    x, y = torch.randn(32, d, device=DEVICE), torch.randn(32, 1, device=DEVICE)
    if step % 4 == 3:
        y = y * 3e4
    with torch.autocast(DEVICE, dtype=torch.float16):
        loss = nn.functional.mse_loss(model(x).float(), y)
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    opt.zero_grad()
print(f"done, final scale {scaler.get_scale()}")
