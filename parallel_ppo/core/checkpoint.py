"""Checkpoints: written atomically, loaded as tensors and plain data only, and checked against the learner they are
loaded into before anything of them is used."""

from __future__ import annotations

import math
import pickle
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from parallel_ppo.core.files import atomic_write
from parallel_ppo.errors import RunDataError

if TYPE_CHECKING:
    from parallel_ppo.envs.observations import DictLayout

FORMAT_VERSION = 1
JOB_ID = "torchrun_run_id"
"""The key that records the job (torchrun's run id) that wrote a checkpoint: a restarted group resumes only its own
run's."""
ENDED = "stop_reason"
"""The key that records how the session that wrote a run's last checkpoint ended (None in those written during it,
absent from older ones): a run resumed at its budget that had stopped there on an error or a signal finishes, where
a finished one (its summary.json written for this checkpoint) is left as it is."""


def save_checkpoint(path: Path, state: dict[str, Any]) -> None:
    atomic_write(path, lambda f: torch.save({"format_version": FORMAT_VERSION, **state}, f))


REQUIRED_KEYS = ("format_version", "config", "model", "optimizer", "update", "env_steps", "elapsed", "episodes",
                 "episode_returns", "episode_lengths", "generator", "torch_rng")
"""What `TrainState.from_checkpoint` reads without a default."""
COUNTS = ("update", "env_steps", "episodes", "resumes", "restarts")
"""Counters that are whole numbers ≥ 0 (the last two are absent from older checkpoints)."""
ADAM_STATE = ("step", "exp_avg", "exp_avg_sq")
"""What torch's Adam keeps per parameter (and `max_exp_avg_sq` with amsgrad)."""


def load_checkpoint(path: Path) -> dict[str, Any]:
    """Load a checkpoint and check its format; any problem is a RunDataError naming the file."""
    path = Path(path)
    if not path.is_file():
        raise RunDataError(f"checkpoint {path} is a directory, not a file" if path.is_dir()
                           else f"checkpoint not found: {path}")
    if not zipfile.is_zipfile(path):  # torch.save writes a zip archive
        raise RunDataError(f"{path} is not a checkpoint: it is corrupt, truncated or another kind of file (not "
                           "an archive written by torch.save)")
    if is_torchscript(path):  # which torch.load would hand to torch.jit.load, with a warning
        raise RunDataError(f"{path} is a TorchScript file (`export --format torchscript`), not a checkpoint: give the "
                           "run directory or its checkpoint.pt, or load it with torch.jit.load")
    try:  # tensors and plain data only: a checkpoint from elsewhere must not be able to run code
        state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        if "unsupported global" in str(e).lower():
            raise RunDataError(f"checkpoint {path} holds objects other than tensors and plain data; "
                               "refusing to load it (unpickling them could run code)") from None
        raise RunDataError(f"checkpoint {path} is corrupt or unreadable (UnpicklingError)") from None
    except Exception as e:  # a damaged archive, ...
        raise RunDataError(f"checkpoint {path} is corrupt or unreadable ({type(e).__name__})") from None
    if not isinstance(state, dict):
        raise RunDataError(f"checkpoint {path} is not a parallel_ppo checkpoint")
    if missing := [key for key in REQUIRED_KEYS if key not in state]:
        raise RunDataError(f"checkpoint {path} is not a parallel_ppo checkpoint (it lacks {', '.join(missing)})")
    if state["format_version"] != FORMAT_VERSION:
        raise RunDataError(f"checkpoint {path} has format version {state['format_version']}, expected {FORMAT_VERSION}")
    return state


def is_torchscript(path: Path) -> bool:
    """Whether the zip archive `path` is a TorchScript module's (its code's constants, as torch itself tells)."""
    try:
        with zipfile.ZipFile(path) as archive:
            return any(name.endswith("/constants.pkl") for name in archive.namelist())
    except (OSError, zipfile.BadZipFile):
        return False


def next_resume_count(checkpoint: dict[str, Any] | None) -> int:
    """How many times a run continuing from `checkpoint` has been resumed (0 for a new run)."""
    return 0 if checkpoint is None else checkpoint.get("resumes", 0) + 1


LAYOUT = "observation_layout"
"""The key that records a dict observation's layout (`DictLayout.to_dict`; None for a Box)."""


def layout_entry(layout: DictLayout | None) -> dict[str, Any] | None:
    """What a checkpoint records under LAYOUT of a dict observation's layout (None for a Box)."""
    return None if layout is None else layout.to_dict()


def check_layout(state: Mapping[str, Any], path: Path, layout: DictLayout | None) -> None:
    """Refuse (RunDataError) a checkpoint made for other dict observation keys than the env has now (renamed or
    reordered keys of the same sizes would load, their features mixed up). Checkpoints that predate it pass."""
    current = layout_entry(layout)
    stored = state.get(LAYOUT, current)
    if stored != current:
        raise RunDataError(f"checkpoint {path} was made for the observation {stored}, but the env now gives {current}")


def check_checkpoint(state: dict[str, Any], path: Path, model: nn.Module,
                     optimizer: torch.optim.Optimizer | None = None,
                     statistics: Mapping[str, dict[str, Any] | None] | None = None) -> None:
    """Refuse, with a RunDataError naming what differs, a loaded checkpoint that does not fit a fresh learner of
    its config: always its counters, episode windows and the network `model` (keys, shapes, dtypes); given the
    learner's Adam `optimizer` (what a resumed run loads besides), also the optimizer's state, the RNG states and the
    running `statistics` by checkpoint key (a fresh run's state dict; None: not used). Nothing is loaded: a wrong
    shape loads into the optimizer without complaint, and its fused step then crashes the process."""
    check_counts(state, path)
    problem = differs(state["model"], model.state_dict(), "model")
    if optimizer is not None and not problem:
        problem = (optimizer_differs(state["optimizer"], optimizer, model)
                   or rng_differs(state["generator"], "generator") or rng_differs(state["torch_rng"], "torch_rng")
                   or next((p for key, fresh in (statistics or {}).items()
                            if fresh is not None and state.get(key) is not None
                            and (p := differs(state[key], fresh, key))), None))
    if problem:
        raise RunDataError(f"checkpoint {path} does not match the learner its config describes: {problem}; was it "
                           "edited, or made by another version?")


def check_counts(state: Mapping[str, Any], path: Path) -> None:
    """Refuse (RunDataError) a checkpoint whose counters or episode windows are not numbers of the right kind."""
    if problem := _counts_differ(state):
        raise RunDataError(f"checkpoint {path} is corrupt: {problem}")


def _counts_differ(state: Mapping[str, Any]) -> str | None:
    """What in the counters and episode windows of `state` is not a number of the right kind (None: nothing)."""
    for key in COUNTS:
        if key in state and not _is_count(state[key]):
            return f"{key} is {_shown(state[key])}, not a whole number ≥ 0"
    if "world_size" in state and not (_is_count(state["world_size"]) and state["world_size"] > 0):
        return f"world_size is {_shown(state['world_size'])}, not a whole number ≥ 1"
    if not (_is_number(state["elapsed"]) and state["elapsed"] >= 0):
        return f"elapsed is {_shown(state['elapsed'])}, not a number of seconds ≥ 0"
    windows = state.get("episode_info", {})  # absent from older checkpoints (their success window: episode_successes)
    if not isinstance(windows, Mapping) or not all(isinstance(key, str) for key in windows):
        return f"episode_info is {_shown(windows)}, not a dict of final-info entries"
    for key, values, fits, what in (
            ("episode_returns", state.get("episode_returns", []), _is_real, "a number"),
            ("episode_lengths", state.get("episode_lengths", []), _is_count, "a whole number ≥ 0"),
            ("episode_successes", state.get("episode_successes", []), _is_real, "a number"),
            *((f"episode_info[{name!r}]", window, _is_real, "a number") for name, window in windows.items())):
        if not isinstance(values, (list, tuple)):
            return f"{key} is {_shown(values)}, not a list"
        if (bad := next((i for i, v in enumerate(values) if not fits(v)), None)) is not None:
            return f"{key}[{bad}] is {_shown(values[bad])}, not {what}"
    return None


def differs(found: Any, fresh: Any, where: str) -> str | None:
    """How `found` differs in structure from `fresh`, what a fresh learner holds there (None: it does not): the
    same keys, tensors of the same shape and dtype, numbers where it has numbers, flags where it has flags."""
    if isinstance(fresh, torch.Tensor):
        if not isinstance(found, torch.Tensor):
            return f"{where} is {_shown(found)}, not a tensor"
        if found.shape != fresh.shape:
            return f"{where} has shape {tuple(found.shape)}, expected {tuple(fresh.shape)}"
        if found.dtype != fresh.dtype:
            return f"{where} is {found.dtype}, expected {fresh.dtype}"
        return None
    if isinstance(fresh, Mapping):
        if not isinstance(found, Mapping):
            return f"{where} is {_shown(found)}, not a dict"
        if missing := [k for k in fresh if k not in found]:
            return f"{where} lacks {_keys(missing)}"
        if extra := [k for k in found if k not in fresh]:
            return f"{where} has keys a fresh learner lacks: {_keys(extra)}"
        return next((p for k in fresh if (p := differs(found[k], fresh[k], f"{where}[{k!r}]"))), None)
    if isinstance(fresh, (list, tuple)):
        if not isinstance(found, (list, tuple)) or len(found) != len(fresh):
            return f"{where} is {_shown(found)}, not a list of {len(fresh)}"
        pairs = enumerate(zip(found, fresh, strict=True))
        return next((p for i, (a, b) in pairs if (p := differs(a, b, f"{where}[{i}]"))), None)
    if isinstance(fresh, bool):
        return None if isinstance(found, bool) else f"{where} is {_shown(found)}, not true or false"
    if _is_number(fresh):
        return None if _is_number(found) else f"{where} is {_shown(found)}, not a number"
    return None


def optimizer_differs(found: Any, optimizer: torch.optim.Optimizer, model: nn.Module) -> str | None:
    """How the optimizer state `found` does not fit `optimizer`, Adam over the parameters of `model`: its groups
    over the same parameters with hyperparameters of the same kinds, and per parameter the step and moments."""
    fresh = optimizer.state_dict()
    if not isinstance(found, Mapping) or not isinstance(found.get("state"), Mapping) \
            or not isinstance(found.get("param_groups"), list):
        return "optimizer is not an optimizer's state (state and param_groups)"
    if len(found["param_groups"]) != len(fresh["param_groups"]):
        return f"optimizer has {len(found['param_groups'])} parameter groups, expected {len(fresh['param_groups'])}"
    names = {id(p): name for name, p in model.named_parameters()}
    params: dict[Any, tuple[str, torch.Tensor, tuple[str, ...]]] = {}
    groups = zip(found["param_groups"], fresh["param_groups"], optimizer.param_groups, strict=True)
    for i, (group, ours, live) in enumerate(groups):
        where = f"optimizer parameter group {i}"
        if not isinstance(group, Mapping) or not isinstance(group.get("params"), list) \
                or group["params"] != ours["params"]:
            return f"{where} is not over the network's {len(ours['params'])} parameters"
        shared = [k for k in ours if k in group and k != "params"]  # torch adds hyperparameters over versions
        if problem := differs({k: group[k] for k in shared}, {k: ours[k] for k in shared}, where):
            return problem
        keys = (*ADAM_STATE, "max_exp_avg_sq") if group.get("amsgrad") else ADAM_STATE  # the group loaded decides
        params |= {index: (names[id(p)], p, keys) for index, p in zip(ours["params"], live["params"], strict=True)}
    for index, entry in found["state"].items():
        if index not in params:
            return f"optimizer has state for parameter {index!r}, which the network lacks"
        name, param, keys = params[index]
        if problem := _adam_state_differs(entry, param, keys, f"optimizer state of {name}"):
            return problem
    return None


def _adam_state_differs(entry: Any, param: torch.Tensor, keys: tuple[str, ...], where: str) -> str | None:
    if not isinstance(entry, Mapping) or set(entry) != set(keys):
        held = _keys(list(entry)) if isinstance(entry, Mapping) else _shown(entry)
        return f"{where} holds {held}, expected {_keys(list(keys))}"
    step = entry["step"]
    if not (_is_number(step) or isinstance(step, torch.Tensor) and step.numel() == 1 and step.is_floating_point()):
        return f"{where}: step is {_shown(step)}, not a number"
    return next((p for key in keys[1:] if (p := differs(entry[key], param.detach(), f"{where}: {key}"))), None)


def rng_differs(found: Any, key: str) -> str | None:
    """Why `found` is not the state of a CPU random generator (None: it is), found by setting a throwaway one."""
    try:
        torch.Generator().set_state(found)
    except (RuntimeError, TypeError, ValueError) as e:
        return f"{key} is not a random generator's state ({str(e).strip().splitlines()[0][:120]})"
    return None


def _is_real(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return _is_real(value) and math.isfinite(value)


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _shown(value: Any) -> str:
    """A short description of a value for a message: its repr when short, else its type."""
    text = repr(value)
    return text if len(text) <= 40 else f"a {type(value).__name__}"


def _keys(keys: list[Any]) -> str:
    shown = ", ".join(repr(k) for k in keys[:4])
    return shown + (f" and {len(keys) - 4} more" if len(keys) > 4 else "")
