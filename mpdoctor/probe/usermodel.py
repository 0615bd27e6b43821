"""The user's own model for the probe (child side: imports torch and the user's code).

`load(spec, ...)` turns a parsed --model SPEC (mpdoctor/probe/spec.py) into a workload
with the same interface as the built-in ones (mpdoctor/probe/models.py): the model,
training batches, a fixed evaluation batch, `forward`, `compute_loss`,
`output_tensor`, `make_batch(n)` (the batch at another size, for --max-batch) and a
`describe` dict that says which batch and which loss the probe used.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import sys
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

from ..redact import clip
from .spec import DEFAULT_FACTORIES


class ModelLoadError(Exception):
    """The SPEC named something that does not give a model: the parent exits 2 with this."""


# -- batches ------------------------------------------------------------------------

def _shape_words(batch: Any) -> str:
    def one(t: Any) -> str:
        if isinstance(t, torch.Tensor):
            return f"{str(t.dtype).replace('torch.', '')} {tuple(t.shape)}"
        return type(t).__name__

    if isinstance(batch, dict):
        return ", ".join(f"{k}: {one(v)}" for k, v in batch.items())
    if isinstance(batch, (tuple, list)):
        return ", ".join(one(v) for v in batch)
    return one(batch)


def _batch_size_of(batch: Any) -> int | None:
    for t in (batch.values() if isinstance(batch, dict) else batch if isinstance(batch, (tuple, list)) else [batch]):
        if isinstance(t, torch.Tensor) and t.dim() > 0:
            return int(t.shape[0])
    return None


def resize_batch(batch: Any, old: int, n: int) -> Any:
    """The batch at size n: every tensor whose first dimension is the batch size gets
    its rows repeated (or cut) to n; everything else is kept."""
    def one(t: Any) -> Any:
        if isinstance(t, torch.Tensor) and t.dim() > 0 and t.shape[0] == old:
            return t[torch.arange(n) % old]
        return t

    if isinstance(batch, dict):
        return {k: one(v) for k, v in batch.items()}
    if isinstance(batch, (tuple, list)):
        return type(batch)(one(v) for v in batch)
    return one(batch)


def to_device(batch: Any, device: Any) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.to(device)
    if isinstance(batch, dict):
        return {k: to_device(v, device) for k, v in batch.items()}
    if isinstance(batch, (tuple, list)):
        return type(batch)(to_device(v, device) for v in batch)
    return batch


def call_model(model: Any, batch: Any) -> Any:
    if isinstance(batch, dict):
        return model(**batch)
    if isinstance(batch, (tuple, list)):
        return model(*batch)
    return model(batch)


def first_float(out: Any) -> torch.Tensor | None:
    if isinstance(out, torch.Tensor):
        return out if out.is_floating_point() else None
    if isinstance(out, dict) or hasattr(out, "items"):
        for v in out.values():
            t = first_float(v)
            if t is not None:
                return t
        return None
    if isinstance(out, (tuple, list)):
        for v in out:
            t = first_float(v)
            if t is not None:
                return t
    return None


def _get(out: Any, key: str) -> Any:
    if isinstance(out, dict) or (hasattr(out, "keys") and hasattr(out, "get")):
        try:
            return out.get(key)
        except Exception:
            return None
    return getattr(out, key, None) if not isinstance(out, (torch.Tensor, tuple, list)) else None


# -- the workload -------------------------------------------------------------------

class UserWorkload:
    def __init__(self, model: nn.Module, batch_fn: Callable[[int, int], Any], batch_size: int,
                 loss_fn: Callable[..., Any] | None, describe: dict[str, Any]) -> None:
        self.model = model
        self._batch_fn = batch_fn
        self.batch_size = batch_size
        self._loss_fn = loss_fn
        self._loss_args = 1
        if loss_fn is not None:
            try:
                params = [p for p in inspect.signature(loss_fn).parameters.values()
                          if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
                self._loss_args = 2 if len(params) >= 2 or any(
                    p.kind == p.VAR_POSITIONAL for p in inspect.signature(loss_fn).parameters.values()) else 1
            except (TypeError, ValueError):
                self._loss_args = 2
        self.batches = [batch_fn(batch_size, 0)]
        self.eval_batch = self.batches[0]
        self.describe = describe
        self.loss_kind: str | None = None  # "loss_fn" | "output.loss" | "cross_entropy" | "mean_square"

    # the interface the child uses (the built-in Workload has the same)
    def forward(self, model: Any, batch: Any) -> Any:
        return call_model(model, batch)

    def compute_loss(self, out: Any, batch: Any) -> torch.Tensor:
        if self._loss_fn is not None:
            self.loss_kind = "loss_fn"
            loss = self._loss_fn(out, batch) if self._loss_args == 2 else self._loss_fn(out)
            return loss.float() if isinstance(loss, torch.Tensor) else loss
        loss = _get(out, "loss")
        if isinstance(loss, torch.Tensor) and loss.numel() == 1:
            self.loss_kind = "output.loss"
            return loss.float().reshape(())
        logits = _get(out, "logits")
        labels = batch.get("labels") if isinstance(batch, dict) else None
        if (isinstance(logits, torch.Tensor) and isinstance(labels, torch.Tensor) and not labels.is_floating_point()
                and logits.shape[:-1] == labels.shape):
            self.loss_kind = "cross_entropy"
            return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1))
        t = first_float(out)
        if t is None:
            raise ModelLoadError("the model's output has no floating-point tensor to make a loss from; "
                                 "return (model, batch, loss_fn) from the factory")
        self.loss_kind = "mean_square"
        return t.float().pow(2).mean()

    def output_tensor(self, out: Any) -> torch.Tensor | None:
        logits = _get(out, "logits")
        if isinstance(logits, torch.Tensor):
            return logits
        return first_float(out)

    def make_batch(self, n: int) -> Any:
        return self._batch_fn(n, 0)

    def loss_words(self) -> str:
        return {"loss_fn": "the factory's loss_fn",
                "output.loss": "the model output's .loss",
                "cross_entropy": "cross-entropy of the output's .logits against the batch's labels",
                "mean_square": "mean of squares of the output (the model gives no loss)"}.get(self.loss_kind or "", "?")


# -- loading ------------------------------------------------------------------------

def _import_file(path: str) -> Any:
    folder = os.path.dirname(path)
    if folder not in sys.path:
        sys.path.insert(0, folder)  # its sibling imports work, as when it is run as a script
    name = "_mpdoctor_user_model_" + os.path.splitext(os.path.basename(path))[0].replace("-", "_")
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ModelLoadError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _factory_from(spec: dict[str, Any]) -> tuple[Callable[[], Any], str]:
    if spec["kind"] == "file":
        module = _import_file(spec["path"])
        where = spec["path"]
    else:
        cwd = os.getcwd()
        if cwd not in sys.path:
            sys.path.insert(0, cwd)
        module = importlib.import_module(spec["module"])
        where = spec["module"]
    name = spec.get("factory")
    if name:
        if not hasattr(module, name):
            raise ModelLoadError(f"{where} has no {name!r}")
        return getattr(module, name), name
    for name in DEFAULT_FACTORIES:
        if callable(getattr(module, name, None)):
            return getattr(module, name), name
    raise ModelLoadError(f"{where} has none of {', '.join(DEFAULT_FACTORIES)}; name the factory: "
                         f"{os.path.basename(where)}:FUNCTION")


def _first_layer(model: nn.Module) -> nn.Module | None:
    for m in model.modules():
        if isinstance(m, (nn.Embedding, nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)):
            return m
    return None


def _signature_batch(model: nn.Module, seq_len: int, seed: int) -> tuple[Callable[[int, int], Any], str]:
    """A batch made from the model's first layer (and its forward's first argument)."""
    layer = _first_layer(model)
    try:
        first_arg = next(iter(inspect.signature(model.forward).parameters), "x")
    except (TypeError, ValueError):
        first_arg = "x"
    if layer is None:
        raise ModelLoadError("cannot make a batch for this model (no Embedding/Linear/Conv layer to read the input "
                             "shape from); return (model, batch) from the factory")
    if isinstance(layer, nn.Embedding):
        vocab = layer.num_embeddings

        def make(n: int, k: int) -> Any:
            g = torch.Generator().manual_seed(seed + 1 + k)
            return torch.randint(0, vocab, (n, seq_len), generator=g)
        how = f"token ids in [0, {vocab}) of shape (batch, {seq_len}) for {first_arg} (from the first Embedding)"
    else:
        if isinstance(layer, nn.Linear):
            shape: tuple[int, ...] = (layer.in_features,)
        elif isinstance(layer, nn.Conv1d):
            shape = (layer.in_channels, seq_len)
        elif isinstance(layer, nn.Conv2d):
            shape = (layer.in_channels, 32, 32)
        else:
            shape = (layer.in_channels, 16, 16, 16)

        def make(n: int, k: int) -> Any:
            g = torch.Generator().manual_seed(seed + 1 + k)
            return torch.randn((n, *shape), generator=g)
        how = (f"standard normal float32 of shape (batch, {', '.join(map(str, shape))}) for {first_arg} "
               f"(from the first {type(layer).__name__})")
    return make, how


def _from_factory(spec: dict[str, Any], batch_size: int | None, seq_len: int, seed: int) -> UserWorkload:
    fn, name = _factory_from(spec)
    torch.manual_seed(seed)
    try:
        made = fn()
    except ModelLoadError:
        raise
    except Exception as exc:
        raise ModelLoadError(f"the factory {name}() raised {type(exc).__name__}: {clip(str(exc), 300)}") from exc
    model, batch, loss_fn = made, None, None
    if isinstance(made, (tuple, list)) and made and isinstance(made[0], nn.Module):
        if len(made) > 3:
            raise ModelLoadError(f"{name}() returned {len(made)} values; expected model, (model, batch) or "
                                 "(model, batch, loss_fn)")
        model = made[0]
        batch = made[1] if len(made) > 1 else None
        loss_fn = made[2] if len(made) > 2 else None
    if not isinstance(model, nn.Module):
        raise ModelLoadError(f"{name}() returned {type(model).__name__}, not a torch.nn.Module "
                             "(or (model, batch[, loss_fn]))")
    if loss_fn is not None and not callable(loss_fn):
        raise ModelLoadError(f"{name}()'s third value is a {type(loss_fn).__name__}, not a loss function")
    describe: dict[str, Any] = {"model": type(model).__name__, "spec": spec["spec"], "factory": name}
    if batch is not None:
        old = _batch_size_of(batch)
        if old is None:
            raise ModelLoadError(f"{name}()'s batch has no tensor with a batch dimension")
        bs = batch_size or old

        def make(n: int, k: int, _b: Any = batch, _old: int = old) -> Any:
            return resize_batch(_b, _old, n) if n != _old else _b
        how = f"the factory's batch ({_shape_words(batch)})" + (f", resized to {bs}" if bs != old else "")
    else:
        bs = batch_size or 8
        make, how = _signature_batch(model, seq_len, seed)
    describe["batch_size"] = bs
    describe["batch"] = how
    return UserWorkload(model, make, bs, loss_fn, describe)


# transformers: the class that gives a loss, by the config's architectures, else by kind
_AUTO_ORDER = ("AutoModelForCausalLM", "AutoModelForSeq2SeqLM", "AutoModelForMaskedLM",
               "AutoModelForImageClassification", "AutoModelForSequenceClassification", "AutoModel")


def _from_config(spec: dict[str, Any], batch_size: int | None, seq_len: int, seed: int) -> UserWorkload:
    os.environ["HF_HUB_OFFLINE"] = "1"  # never download: a config is built, not fetched
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    import json

    import transformers

    with open(spec["path"], encoding="utf-8") as fh:
        data = json.load(fh)
    try:
        if data.get("model_type"):
            config = transformers.AutoConfig.for_model(data["model_type"], **{
                k: v for k, v in data.items() if k not in ("model_type", "transformers_version")})
        else:
            config = transformers.AutoConfig.from_pretrained(spec["path"])
    except Exception as exc:
        raise ModelLoadError(f"transformers cannot read this config: {type(exc).__name__}: {clip(str(exc), 300)}") from exc
    if getattr(config, "pad_token_id", None) is None:
        # sequence classification needs it to find the last token of each row
        eos = getattr(config, "eos_token_id", None)
        config.pad_token_id = (eos[0] if isinstance(eos, list) and eos else eos) or 0
    torch.manual_seed(seed)
    folder = spec.get("folder") if spec.get("kind") == "pretrained" else None

    def build(cls: Any) -> Any:
        if folder is None:
            return cls._from_config(config) if hasattr(cls, "_from_config") else cls.from_config(config)
        # the folder's own weights, in fp32: mixed precision keeps fp32 master weights
        # whatever dtype they were saved in
        return cls.from_pretrained(folder, config=config, local_files_only=True, **{_dtype_kw(transformers): torch.float32})

    model, tried = None, []
    for arch in data.get("architectures") or []:
        cls = getattr(transformers, str(arch), None)
        if cls is not None:
            try:
                model = build(cls)
                break
            except Exception as exc:
                tried.append(f"{arch}: {type(exc).__name__}: {clip(str(exc), 200)}")
    if model is None:
        for auto in _AUTO_ORDER:
            try:
                model = build(getattr(transformers, auto))
                break
            except (ValueError, KeyError, AttributeError, OSError) as exc:
                tried.append(f"{auto}: {clip(str(exc), 120)}")
    if model is None:
        raise ModelLoadError("transformers builds no model from this config (" + "; ".join(tried[-3:]) + ")")
    cls_name = type(model).__name__
    try:
        params = set(inspect.signature(model.forward).parameters)
    except (TypeError, ValueError):
        params = set()
    vocab = getattr(config, "vocab_size", None)
    max_pos = (getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
               or getattr(config, "max_seq_len", None))
    seq = min(seq_len, int(max_pos)) if isinstance(max_pos, int) and max_pos > 0 else seq_len
    num_labels = int(getattr(config, "num_labels", 2) or 2)
    lm = cls_name.endswith(("ForCausalLM", "LMHeadModel", "ForMaskedLM", "ForConditionalGeneration",
                            "ForPreTraining")) or "Seq2SeqLM" in cls_name
    classifier = cls_name.endswith(("ForSequenceClassification", "ForImageClassification"))
    vision = "pixel_values" in params and "input_ids" not in params
    if not vision and "input_ids" not in params:
        raise ModelLoadError(f"{cls_name} takes neither input_ids nor pixel_values; write a factory that returns "
                             "(model, batch)")
    if not vision and not isinstance(vocab, int):
        raise ModelLoadError(f"the config of {cls_name} has no vocab_size to make input_ids from")
    image = getattr(config, "image_size", 224)
    image = image[0] if isinstance(image, (list, tuple)) else int(image)
    channels = int(getattr(config, "num_channels", 3) or 3)

    def make(n: int, k: int) -> Any:
        g = torch.Generator().manual_seed(seed + 1 + k)
        if vision:
            batch: dict[str, Any] = {"pixel_values": torch.randn(n, channels, image, image, generator=g)}
        else:
            ids = torch.randint(0, vocab, (n, seq), generator=g)
            batch = {"input_ids": ids}
            if "attention_mask" in params:
                batch["attention_mask"] = torch.ones(n, seq, dtype=torch.long)
        if "labels" in params:
            if lm and not vision:
                batch["labels"] = batch["input_ids"]
            elif classifier:
                batch["labels"] = torch.randint(0, num_labels, (n,), generator=g)
        return batch

    bs = batch_size or 8
    if vision:
        how = f"random pixel_values ({bs}, {channels}, {image}, {image})"
    else:
        how = f"random input_ids ({bs}, {seq}) in [0, {vocab}) with an all-ones attention_mask"
    if "labels" in params and lm and not vision:
        how += ", labels = input_ids"
    elif "labels" in params and classifier:
        how += f", random labels in [0, {num_labels})"
    if folder is not None:
        how += f"; weights from {spec.get('weights')}"
    describe = {"model": cls_name, "spec": spec["spec"], "model_type": data.get("model_type"),
                "batch_size": bs, "batch": how, "seq_len": None if vision else seq}
    return UserWorkload(model, make, bs, None, describe)


def _dtype_kw(transformers: Any) -> str:
    """from_pretrained's dtype argument: `dtype` since transformers 4.56, `torch_dtype` before."""
    try:
        major, minor = (int(x) for x in transformers.__version__.split(".")[:2])
    except ValueError:
        return "dtype"
    return "dtype" if (major, minor) >= (4, 56) else "torch_dtype"


def load(spec: dict[str, Any], batch_size: int | None, seq_len: int, seed: int) -> UserWorkload:
    try:
        if spec["kind"] in ("config", "pretrained"):
            work = _from_config(spec, batch_size, seq_len, seed)
        else:
            work = _from_factory(spec, batch_size, seq_len, seed)
    except ModelLoadError:
        raise
    except Exception as exc:  # an import error in the user's file, a bad config value...
        raise ModelLoadError(f"{type(exc).__name__}: {clip(str(exc), 300)}") from exc
    work.describe["parameters"] = sum(p.numel() for p in work.model.parameters())
    work.model.train()
    return work
