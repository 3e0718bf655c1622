"""A trained policy as one self-contained file for inference without this package: ONNX (onnxruntime, ...) or
TorchScript (`torch.jit.load`), with the run's observation normalization and the network's own preprocessing
(uint8 frames scaled to [0, 1]) inside the graph.

The exported function takes `obs`, a batch (any size) of observations as the env gives them: (batch, *obs_shape),
uint8 for image envs, float32 for vector ones; a dict-observation policy takes one input per key instead, in the
order of the metadata's `inputs`: uint8 (batch, H, W, C) for an image key, float32 (batch, size) for a vector key
(its values flattened), only the keys the actor reads where the critic reads more (`model.actor_keys`). ONNX names
each input by its key; TorchScript's `forward` takes one argument per key, by
position or by the name `argument_name` makes of the key (the key itself where it is a usable name), each input's
`argument` in the metadata. It returns, in this order (ONNX output names):

- discrete actions: `action` (batch,) int64, the most likely action (arg-max of the logits); `logits` (batch, A)
  float32, unnormalized log-probabilities; `value` (batch,) float32, the critic's estimate;
- continuous actions: `action` (batch, n) float32, the Gaussian's mean clipped to the action space's bounds;
  `mean` (batch, n) and `log_std` (batch, n) float32, the Gaussian before clipping; `value` (batch,) float32.

A policy whose critic reads keys its actor does not (privileged simulator state) has no `value` output: the file
takes what the robot observes.

To sample as the trainer does: a categorical over `logits` (softmax, then draw), or `mean + exp(log_std) * noise`
with standard normal noise, clipped to the bounds. Everything is computed in float32 (a bf16 run too). The file's
metadata (`parallel_ppo` key: ONNX metadata_props, TorchScript extra file `parallel_ppo.json`) holds the env id,
observation and action spaces, output names and the checkpoint's update and env steps, as JSON.
"""

from __future__ import annotations

import copy
import importlib.util
import inspect
import io
import json
import keyword
import re
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from parallel_ppo.core.files import atomic_write, new_folders, writing
from parallel_ppo.core.policy import Policy
from parallel_ppo.envs.observations import DictLayout
from parallel_ppo.envs.spaces import ActionSpace
from parallel_ppo.errors import ConfigError, ExportMismatch
from parallel_ppo.runs.directory import check_writable
from parallel_ppo.runs.summary import RUN_FILES

FORMATS = {"onnx": "policy.onnx", "torchscript": "policy.pt"}
"""Export format → the file it writes in the run directory by default."""
ONNX_PACKAGES = ("onnx", "onnxruntime")
OPSET = 17
METADATA_KEY = "parallel_ppo"
TOLERANCE = 1e-4
"""The most an exported file's outputs may differ from the policy's own on the check batch (absolutely below 1,
relatively above: float32 rounding grows with the values)."""
RESERVED = frozenset({"self", "torch", "math", "_", "aten", "attribute", "CONSTANTS", "fork", "getattr", "inf", "nan",
                      "infj", "nanj", "ops", "__torch__", "uninitialized", "unchecked_cast"})
"""Names a TorchScript argument cannot take as they are (besides Python's keywords): the module's own `self`, the
namespaces its saved code refers to, and the names TorchScript's code printer reserves (it would rename them)."""


def argument_name(key: str) -> str:
    """A dict observation key as the exported TorchScript `forward`'s argument name: the key with every character
    other than an ASCII letter, digit or `_` replaced by `_` (`object-state` → `object_state`), then `_` put in front
    while the name is empty, starts with a digit, or is a Python keyword or in `RESERVED` (`class` → `_class`)."""
    name = re.sub(r"[^A-Za-z0-9_]", "_", key)
    while not name or name[0].isdigit() or keyword.iskeyword(name) or name in RESERVED:
        name = "_" + name
    return name


class InferenceGraph(nn.Module):
    """The policy network as a pure function of a batch of observations: (action, logits, value) for discrete
    actions, (action, mean, log_std, value) for continuous ones (see the module's docstring)."""

    def __init__(self, model: nn.Module, actions: ActionSpace, layout: DictLayout | None = None,
                 keys: tuple[str, ...] | None = None, value: bool = True) -> None:
        super().__init__()
        self.model, self.layout, self.value = model, layout, value
        self.keys = keys if keys is not None or layout is None else tuple(p.key for p in layout.parts)
        self.continuous = actions.continuous
        if actions.continuous:
            self.register_buffer("low", torch.tensor(actions.low, dtype=torch.float32))
            self.register_buffer("high", torch.tensor(actions.high, dtype=torch.float32))

    def forward(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """One batch of observations (a dict observation's `keys`: one input each, in layout order; a vector key
        the actor does not read is zeros, an image key absent)."""
        if self.layout is None:
            params, value = self.model(inputs[0])
        else:
            by_key = dict(zip(self.keys, inputs, strict=True))
            images = {p.key: by_key[p.key] for p in self.layout.images if p.key in by_key}
            batch = inputs[0].shape[0]  # traced as the input's size: any batch
            vectors = [by_key[p.key].float().flatten(1) if p.key in by_key else inputs[0].new_zeros((batch, p.size),
                                                                                                  dtype=torch.float32)
                       for p in self.layout.vectors]
            vector = torch.cat(vectors, 1) if vectors else inputs[0].new_zeros((batch, 0), dtype=torch.float32)
            if self.value:
                params, value = self.model.forward_parts(images, vector)
            else:
                params, value = self.model.forward_actor(images, vector), None
        params = params.float()
        tail = (value.float(),) if value is not None else ()
        if not self.continuous:
            return params.argmax(-1), params, *tail
        mean, log_std = params.chunk(2, dim=-1)
        return torch.minimum(torch.maximum(mean, self.low), self.high), mean, log_std, *tail


class NamedInputs(nn.Module):
    """`graph` behind a `forward` of one parameter per input, named `names`: the TorchScript trace names the traced
    forward's arguments after the Python one's parameters (a `*inputs` forward's would be `argument_1`, ...)."""

    def __init__(self, graph: InferenceGraph, names: list[str]) -> None:
        super().__init__()
        self.graph = graph

        def forward(*inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
            return self.graph(*inputs)

        kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
        signature = inspect.Signature([inspect.Parameter(name, kind) for name in names])
        forward.__signature__ = signature  # type: ignore[attr-defined]
        self.forward = forward


def output_names(actions: ActionSpace, value: bool = True) -> tuple[str, ...]:
    """The exported function's outputs, in order (no `value` for a critic that reads more than the actor)."""
    names = ("action", "mean", "log_std", "value") if actions.continuous else ("action", "logits", "value")
    return names if value else names[:-1]


def exported_keys(policy: Policy) -> tuple[str, ...] | None:
    """The keys of a dict policy's inputs: the actor's, in layout order (None for an array observation)."""
    if policy.layout is None:
        return None
    needed = policy.needed_keys
    return tuple(p.key for p in policy.layout.parts if needed is None or p.key in needed)


def exports_value(policy: Policy) -> bool:
    """Whether the file has the critic's `value`: not where the critic reads keys the actor does not."""
    critic = getattr(policy.model, "critic_keys", ())
    return set(critic) <= set(exported_keys(policy) or ())


@dataclass
class Exported:
    """What `export_policy` wrote: the file, its format, how long the export took and how closely the file
    reproduced the policy on a check batch."""

    path: Path
    format: str
    bytes: int
    seconds: float
    max_difference: float
    metadata: dict[str, Any]


def require_onnx() -> None:
    """ConfigError naming what to install unless onnx and onnxruntime can be imported."""
    missing = [name for name in ONNX_PACKAGES if importlib.util.find_spec(name) is None]
    if missing:
        raise ConfigError(f"--format onnx needs {' and '.join(missing)}: pip install onnx onnxruntime (the "
                          f"project's `export` extra: pip install -e '.[export]')")


def output_path(policy: Policy, fmt: str, output: str | Path | None) -> Path:
    """Where the export goes (default RUN_DIR/policy.onnx or policy.pt), refused up front if it cannot be written."""
    path = Path(output) if output is not None else policy.run_dir / FORMATS[fmt]
    if path.is_dir():
        raise ConfigError(f"export file {path} is a directory")
    if path.name in RUN_FILES and path.name not in FORMATS.values() and path.exists():  # the checkpoint read, say
        raise ConfigError(f"export file {path} would replace a run's {path.name}; give another name")
    other = next((f for f, name in FORMATS.items() if f != fmt and path.suffix == Path(name).suffix), None)
    if other is not None:  # a file named for the other format (it would replace an export of that format)
        raise ConfigError(f"export file {path} is named as {other} is, and --format {fmt} writes {fmt}: name it "
                          f"{path.with_suffix(Path(FORMATS[fmt]).suffix).name}, or give --format {other}")
    check_writable(path.parent if str(path.parent) else Path("."), f"export file {path}")
    return path


def check_dict_export(policy: Policy) -> None:
    """A dict policy exports its network with one input per key: refuse (ConfigError) a policy without one
    (`model.kind: random`), or a key named as an output (the file's names must differ)."""
    if policy.layout is None:
        return
    if not hasattr(policy.model, "forward_parts"):
        raise ConfigError(f"model.kind {policy.cfg.model.kind} has no network to export for a dict observation")
    clash = sorted(set(exported_keys(policy) or ()) & set(output_names(policy.actions, exports_value(policy))))
    if clash:
        raise ConfigError(f"the observation key(s) {', '.join(clash)} would share the name of an output of the "
                          "exported file; rename them in the env")


def input_specs(policy: Policy) -> list[dict[str, Any]]:
    """The exported function's inputs: `obs`, or a dict observation's keys (name, shape past the batch, dtype)."""
    if policy.layout is None:
        return [{"name": "obs", "argument": "obs", "shape": list(policy.obs_shape), "dtype": str(policy.obs_dtype)}]
    keys = exported_keys(policy) or ()
    return [{"name": p.key, "argument": argument_name(p.key), "shape": list(p.shape),
             "dtype": "uint8" if p.image else "float32"} for p in policy.layout.parts if p.key in keys]


def check_arguments(specs: list[dict[str, Any]], taken: list[str] | None = None) -> None:
    """Refuse (ConfigError) keys whose TorchScript argument names (`argument_name`) coincide or, once the file is
    loaded back (`taken`: the names its `forward` takes), were renamed by TorchScript."""
    names = [spec["argument"] for spec in specs]
    same = sorted({spec["name"] for spec in specs if names.count(spec["argument"]) > 1})
    renamed = [spec["name"] for spec, name in zip(specs, taken or names, strict=True) if name != spec["argument"]]
    if same or renamed:
        raise ConfigError(f"the observation key(s) {', '.join(same or renamed)} cannot each be one argument of the "
                          f"TorchScript file ({'the same name' if same else 'a name TorchScript reserves'}); "
                          "rename them in the env")


def metadata(policy: Policy) -> dict[str, Any]:
    """What the file says about itself (JSON under `METADATA_KEY`)."""
    box = policy.layout is None  # a dict policy's inputs are its keys (`inputs`), not one `obs`
    return {"env_id": policy.cfg.env.id, "obs_shape": list(policy.obs_shape) if box else None,
            "obs_dtype": str(policy.obs_dtype) if box else None, "inputs": input_specs(policy),
            "actions": policy.actions.to_dict(), "outputs": list(output_names(policy.actions, exports_value(policy))),
            "normalize_obs": bool(policy.cfg.training.normalize_obs), "model": policy.cfg.model.kind,
            "checkpoint_update": policy.state.get("update"), "checkpoint_env_steps": policy.state.get("env_steps")}


def example_batch(policy: Policy, size: int, seed: int = 0) -> tuple[np.ndarray, ...]:
    """`size` made-up observations for each input (`input_specs`): random frames, or normal vectors."""
    rng = np.random.default_rng(seed)
    out = []
    for spec in input_specs(policy):
        shape = (size, *spec["shape"])
        if spec["dtype"] == "uint8":
            out.append(rng.integers(0, 256, size=shape, dtype=np.uint8))
        else:
            out.append((3.0 * rng.standard_normal(shape)).astype(spec["dtype"]))
    return tuple(out)


def onnx_bytes(graph: InferenceGraph, example: tuple[torch.Tensor, ...], names: tuple[str, ...],
               info: dict[str, Any]) -> bytes:
    """The graph as an ONNX model (the TorchScript-based exporter: fast, no onnxscript; torch < 2.14 has it), its
    batch dimension dynamic, `info` in its metadata."""
    import onnx

    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # the legacy exporter's notice
        inputs = [spec["name"] for spec in info["inputs"]]
        torch.onnx.export(graph, example, buffer, dynamo=False, input_names=inputs, output_names=list(names),
                          dynamic_axes={name: {0: "batch"} for name in (*inputs, *names)}, opset_version=OPSET)
    model = onnx.load_from_string(buffer.getvalue())
    with torch.no_grad():
        shapes = [t.shape for t in graph(*example)]
    for output, shape in zip(model.graph.output, shapes, strict=True):  # static sizes past the batch dimension
        for dim, size in zip(output.type.tensor_type.shape.dim[1:], shape[1:], strict=True):
            dim.dim_value = size
    onnx.helper.set_model_props(model, {METADATA_KEY: json.dumps(info)})
    onnx.checker.check_model(model)
    return model.SerializeToString()


def torchscript_bytes(graph: InferenceGraph, example: tuple[torch.Tensor, ...], info: dict[str, Any]) -> bytes:
    """The graph traced to TorchScript, its `forward` taking one argument per input named by the input's `argument`
    (`NamedInputs`), `info` in its extra file `parallel_ppo.json`."""
    check_arguments(info["inputs"])
    buffer = io.BytesIO()
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore", DeprecationWarning)  # torch.jit is deprecated upstream but still complete
        traced = torch.jit.trace(NamedInputs(graph, [spec["argument"] for spec in info["inputs"]]), example)
        torch.jit.save(traced, buffer, _extra_files={f"{METADATA_KEY}.json": json.dumps(info)})
    return buffer.getvalue()


def run_exported(data: bytes, fmt: str, obs: tuple[np.ndarray, ...], specs: list[dict[str, Any]]) -> list[np.ndarray]:
    """The outputs of an exported file (its bytes) on a batch of observations (one array per input of `specs`), each
    given by name: ONNX's input `name`, TorchScript's keyword `argument`."""
    if fmt == "onnx":
        import onnxruntime

        session = onnxruntime.InferenceSession(data, providers=["CPUExecutionProvider"])
        return session.run(None, {spec["name"]: x for spec, x in zip(specs, obs, strict=True)})
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore", DeprecationWarning)
        module = torch.jit.load(io.BytesIO(data))
        check_arguments(specs, [arg.name for arg in module.forward.schema.arguments[1:]])  # past `self`
        kwargs = {spec["argument"]: torch.from_numpy(x) for spec, x in zip(specs, obs, strict=True)}
        return [t.numpy() for t in module(**kwargs)]


def largest_difference(graph: InferenceGraph, data: bytes, fmt: str, obs: tuple[np.ndarray, ...],
                       specs: list[dict[str, Any]]) -> float:
    """The largest difference between the file's float outputs and the policy's own on `obs` (see `TOLERANCE`)."""
    with torch.no_grad():
        expected = [t.numpy() for t in graph(*map(torch.from_numpy, obs))]
    got = run_exported(data, fmt, obs, specs)
    pairs = [(e, g) for e, g in zip(expected, got, strict=True) if e.dtype.kind == "f"]
    return max(float(np.max(np.abs(e - g) / np.maximum(1.0, np.abs(e)))) for e, g in pairs)


def export_policy(where: str | Path | Policy, fmt: str, output: str | Path | None = None) -> Exported:
    """Write a run's policy (a run directory, a checkpoint file or a loaded `Policy`) as one ONNX or TorchScript
    file (default RUN_DIR/policy.onnx or RUN_DIR/policy.pt), atomically, after checking on a made-up batch that
    the file reproduces the policy's outputs. Bad input (no checkpoint, unknown format, an unwritable place,
    ONNX packages missing) raises a ParallelPPOError before anything is written (an unknown format before the
    policy is loaded); a file that would not reproduce it ExportMismatch, one the disk does not take WriteFailed,
    nothing written."""
    if fmt not in FORMATS:
        raise ConfigError(f"export format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    policy = where if isinstance(where, Policy) else Policy.load(where)
    check_dict_export(policy)
    path = output_path(policy, fmt, output)
    if fmt == "onnx":
        require_onnx()
    start = time.perf_counter()
    model = copy.deepcopy(policy.model).cpu().float()  # the policy's own model is left as it was
    graph = InferenceGraph(model, policy.actions, policy.layout, exported_keys(policy),
                           exports_value(policy)).eval().requires_grad_(False)
    info = metadata(policy)
    example = tuple(map(torch.from_numpy, example_batch(policy, 2)))
    if fmt == "onnx":
        data = onnx_bytes(graph, example, tuple(info["outputs"]), info)
    else:
        data = torchscript_bytes(graph, example, info)
    difference = largest_difference(graph, data, fmt, example_batch(policy, 3, seed=1), info["inputs"])
    if not difference <= TOLERANCE:
        raise ExportMismatch(f"the exported {fmt} file differs from the policy by {difference:.3g} (> {TOLERANCE})")
    with writing(path), new_folders(path.parent):  # checked writable before (`output_path`): a full disk now
        atomic_write(path, lambda f: f.write(data))
    return Exported(path, fmt, len(data), time.perf_counter() - start, difference, info)
