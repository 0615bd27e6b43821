"""The probe's built-in models and their synthetic data (child side: imports torch).

Each model contains the operations that break in half precision, so a mode that
"works" here has met them: embedding, attention with a softmax under a mask,
LayerNorm, a GELU MLP and cross-entropy (the transformer); LayerNorm, GELU and
cross-entropy (the MLP); convolutions, GroupNorm and pooling (the conv net).

`stress` multiplies the input of the widest Linear by a gain calibrated in fp32 at
the seed's weights, so that its output peaks at 1.5x fp16's largest finite value
(65504) while staying tiny next to bf16's and fp32's (3.4e38): fp16 overflows, bf16
does not. The calibration is deterministic, so every mode gets the same gain.

When `record` is on, every Linear/Conv output's absolute maximum is kept (only
during the fixed-batch evaluation, never in the timed steps), so the report can
say how close the activations came to the fp16 limit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

FP16_MAX = 65504.0
STRESS_TARGET = 1.5 * FP16_MAX


class _Recorder(nn.Module):
    """Mixin-ish base: keeps the running |max| of chosen activations when asked."""

    def __init__(self) -> None:
        super().__init__()
        self.record = False
        self.peak_abs = 0.0
        self.stressed_peak = 0.0
        self.stress_gain = 1.0

    def _seen(self, t: torch.Tensor, stressed: bool = False) -> torch.Tensor:
        if self.record:
            peak = float(t.detach().float().abs().max())
            self.peak_abs = max(self.peak_abs, peak)
            if stressed:
                self.stressed_peak = max(self.stressed_peak, peak)
        return t


class Block(nn.Module):
    def __init__(self, d: int, heads: int, owner: _Recorder) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)
        # Not a submodule (that would be a cycle): only for the recorder.
        object.__setattr__(self, "_owner", owner)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(d // self.heads)
        # The dtype's own minimum, not -1e9: -1e9 does not fit in fp16.
        scores = scores.masked_fill(mask, torch.finfo(scores.dtype).min)
        att = F.softmax(scores, dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, d)
        x = x + self._owner._seen(self.proj(y))
        h = self._owner._seen(self.fc1(self.ln2(x) * self._owner.stress_gain), stressed=True)
        return x + self._owner._seen(self.fc2(F.gelu(h)))


class TinyTransformer(_Recorder):
    def __init__(self, vocab: int = 256, d: int = 128, heads: int = 4, layers: int = 2, seq: int = 64) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(seq, d)
        self.blocks = nn.ModuleList(Block(d, heads, self) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab)
        self.register_buffer("mask", torch.triu(torch.ones(seq, seq, dtype=torch.bool), diagonal=1), persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        t = tokens.shape[1]
        x = self.tok(tokens) + self.pos(torch.arange(t, device=tokens.device))
        mask = self.mask[:t, :t]
        for block in self.blocks:
            x = block(x, mask)
        return self._seen(self.head(self.ln(x)))


class TinyMLP(_Recorder):
    def __init__(self, features: int = 256, hidden: int = 512, classes: int = 16) -> None:
        super().__init__()
        self.fc_in = nn.Linear(features, hidden)
        self.ln = nn.LayerNorm(hidden)
        self.fc1 = nn.Linear(hidden, 4 * hidden)
        self.fc2 = nn.Linear(4 * hidden, hidden)
        self.out = nn.Linear(hidden, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self._seen(self.fc_in(x))
        h = self._seen(self.fc1(self.ln(h) * self.stress_gain), stressed=True)
        h = self._seen(self.fc2(F.gelu(h)))
        return self._seen(self.out(F.gelu(h)))


class TinyConvNet(_Recorder):
    def __init__(self, channels: int = 32, classes: int = 16) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(3, channels, 3, padding=1)
        self.n1 = nn.GroupNorm(8, channels)
        self.c2 = nn.Conv2d(channels, 2 * channels, 3, padding=1, stride=2)
        self.n2 = nn.GroupNorm(8, 2 * channels)
        self.fc = nn.Linear(2 * channels, 4 * channels)
        self.out = nn.Linear(4 * channels, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.gelu(self.n1(self._seen(self.c1(x))))
        h = F.gelu(self.n2(self._seen(self.c2(h))))
        h = F.adaptive_avg_pool2d(h, 1).flatten(1)
        h = self._seen(self.fc(F.layer_norm(h, h.shape[1:]) * self.stress_gain), stressed=True)
        return self._seen(self.out(F.gelu(h)))


def stress_gain(model: _Recorder, x: torch.Tensor) -> float:
    """The gain that puts the stressed Linear's peak output at STRESS_TARGET (fp32)."""
    model.record, model.peak_abs, model.stressed_peak = True, 0.0, 0.0
    with torch.no_grad():
        model(x)
    model.record = False
    peak, model.peak_abs, model.stressed_peak = model.stressed_peak, 0.0, 0.0
    # Linear in its input up to the bias, which LayerNorm-ed inputs make negligible.
    return STRESS_TARGET / peak if peak > 0 else 1.0


@dataclass
class Workload:
    """A model, a few fixed training batches and one fixed evaluation batch."""

    model: _Recorder
    batches: list[tuple[torch.Tensor, torch.Tensor]]
    eval_batch: tuple[torch.Tensor, torch.Tensor]
    describe: dict[str, Any]

    make: Any = None  # batch size -> a fresh (x, y) batch (for --max-batch)

    def loss(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), target.reshape(-1))

    # the interface the child uses, shared with the user's models (usermodel.UserWorkload)
    def forward(self, model: Any, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        return model(batch[0])

    def compute_loss(self, out: torch.Tensor, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        return self.loss(out, batch[1])

    def output_tensor(self, out: torch.Tensor) -> torch.Tensor:
        return out

    def make_batch(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.make(n)

    def loss_words(self) -> str:
        return "cross-entropy"


DEFAULT_BATCH = {"transformer": 16, "mlp": 64, "conv": 32}


def build(name: str, batch_size: int | None, stress: bool, seed: int = 0, n_batches: int = 4) -> Workload:
    """The same weights and data for every mode, from `seed` alone."""
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed + 1)
    bs0 = bs = batch_size or DEFAULT_BATCH[name]
    if name == "transformer":
        vocab, seq = 256, 64
        model: _Recorder = TinyTransformer(vocab=vocab, seq=seq)

        def batch() -> tuple[torch.Tensor, torch.Tensor]:
            # Arithmetic sequences with a per-row step: the next token is learnable
            # from context through the attention, so the loss really falls.
            start = torch.randint(0, vocab, (bs, 1), generator=gen)
            step = torch.randint(1, 8, (bs, 1), generator=gen)
            seq_ = (start + step * torch.arange(seq + 1)) % vocab
            return seq_[:, :-1].contiguous(), seq_[:, 1:].contiguous()
        shape = {"vocab": vocab, "seq": seq, "d_model": 128, "layers": 2, "heads": 4}
    elif name == "mlp":
        features, classes = 256, 16
        model = TinyMLP(features=features, classes=classes)
        proto = torch.randn(classes, features, generator=gen)

        def batch() -> tuple[torch.Tensor, torch.Tensor]:
            y = torch.randint(0, classes, (bs,), generator=gen)
            x = proto[y] + 3.0 * torch.randn(bs, features, generator=gen)
            # A third of the labels are noise: the loss stays well above zero, so the
            # relative loss difference between modes means something.
            noisy = torch.rand(bs, generator=gen) < 0.33
            return x, torch.where(noisy, torch.randint(0, classes, (bs,), generator=gen), y)
        shape = {"features": features, "hidden": 512, "classes": classes}
    elif name == "conv":
        classes = 16
        model = TinyConvNet(classes=classes)
        proto = torch.randn(classes, 3, 16, 16, generator=gen)

        def batch() -> tuple[torch.Tensor, torch.Tensor]:
            y = torch.randint(0, classes, (bs,), generator=gen)
            return proto[y] + 0.5 * torch.randn(bs, 3, 16, 16, generator=gen), y
        shape = {"image": [3, 16, 16], "channels": 32, "classes": classes}
    else:
        raise ValueError(f"unknown model {name!r}")
    batches = [batch() for _ in range(n_batches)]
    eval_batch = batch()
    if stress:
        model.stress_gain = stress_gain(model, eval_batch[0])
    params = sum(p.numel() for p in model.parameters())

    def make(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        nonlocal bs
        bs = n
        try:
            return batch()
        finally:
            bs = bs0
    return Workload(model, batches, eval_batch,
                    {"model": name, "batch_size": bs, "parameters": params, **shape}, make)
