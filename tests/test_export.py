"""Export: the ONNX and TorchScript files of a policy give its outputs (normalization and frame scaling inside, any
batch size) when run by onnxruntime and torch.jit, and bad input is one line and exit status 2, nothing written."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

import parallel_ppo
from parallel_ppo.cli import main
from parallel_ppo.core.checkpoint import save_checkpoint
from parallel_ppo.core.configure import build_config
from parallel_ppo.core.model import network
from parallel_ppo.core.policy import Policy
from parallel_ppo.envs.batch import env_spaces
from parallel_ppo.runs import export

pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.load` is deprecated:DeprecationWarning")
RUNS = {  # a discrete MLP, a continuous MLP behind observation normalization, the IMPALA CNN over uint8 frames
    "cartpole": ("CartPole-v1", []),
    "pendulum": ("Pendulum-v1", ["training.normalize_obs=true", "training.obs_clip=3"]),
    "starpilot": ("starpilot", ["model.impala_depths=[4, 4, 4]", "model.hidden_size=16"]),
}


def _checkpoint(path: Path, env_id: str, sets: list[str]) -> Path:
    """A run directory holding only a checkpoint: an untrained network moved away from its initialization (logits
    and means of every size, some beyond the action bounds, a log-std that is not 0) and, with normalize_obs,
    statistics that are not (0, 1). (The continuous run here is an MLP behind normalization: `model.net.actor`.)"""
    cfg = build_config(None, {"env.id": env_id}, ["training.precision=fp32", *sets], False)
    spaces = env_spaces(cfg.env)
    obs_shape = spaces.obs_shape
    torch.manual_seed(0)
    model = network(cfg, spaces)
    with torch.no_grad():
        for p in model.parameters():  # less for the CNN, whose outputs would reach the hundreds
            p.add_((0.3 if len(obs_shape) == 1 else 0.03) * torch.randn_like(p))
        if spaces.actions.continuous:  # means beyond the bounds too, for the clipped action
            model.net.actor[-1].weight.mul_(8.0)
        if cfg.training.normalize_obs:
            model.obs_mean.copy_(torch.randn(obs_shape))
            model.obs_std.copy_(torch.rand(obs_shape) + 0.2)
    path.mkdir()
    save_checkpoint(path / "checkpoint.pt", {
        "config": cfg.to_dict(), "model": model.state_dict(), "optimizer": {}, "update": 3, "env_steps": 768,
        "elapsed": 1.0, "episodes": 0, "episode_returns": [], "episode_lengths": [], "generator": {},
        "torch_rng": torch.get_rng_state()})
    return path


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    """Tiny forward passes: torch's thread pool only spins against whatever else the (2-core) machine runs."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("export")
    return {name: _checkpoint(root / name, env_id, sets) for name, (env_id, sets) in RUNS.items()}


def _expected(policy: Policy, obs: np.ndarray) -> dict[str, np.ndarray]:
    """The policy's own outputs: the deterministic action `predict` takes, the distribution's parameters and value."""
    with torch.no_grad():
        params, value = policy.model(torch.from_numpy(obs))
    # predict's clipped continuous actions come back float64 (clipped against Python floats); the env's are float32
    out = {"action": policy.predict(obs, deterministic=True).astype(policy.actions.dtype), "value": value.numpy()}
    if policy.actions.continuous:
        out["mean"], out["log_std"] = (t.numpy() for t in params.chunk(2, dim=-1))
    else:
        out["logits"] = params.numpy()
    return out


def _run_file(path: Path, fmt: str, obs: np.ndarray) -> list[np.ndarray]:
    if fmt == "onnx":
        import onnxruntime

        return onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"obs": obs})
    return [t.numpy() for t in torch.jit.load(str(path))(torch.from_numpy(obs))]


@pytest.mark.parametrize("fmt", ["onnx", "torchscript"])
@pytest.mark.parametrize("name", list(RUNS))
def test_the_exported_file_gives_the_policys_outputs_for_any_batch(runs, name, fmt, capsys):
    run = runs[name]
    assert main(["export", "--format", fmt, str(run)]) == 0
    path = run / export.FORMATS[fmt]
    assert f"wrote {path}" in capsys.readouterr().out
    policy = Policy.load(run)
    names = export.output_names(policy.actions)
    rng = np.random.default_rng(7)
    for batch in (1, 5):  # the export traced a batch of 2
        if policy.obs_dtype == np.uint8:
            obs = rng.integers(0, 256, (batch, *policy.obs_shape), dtype=np.uint8)
        else:  # large enough that normalized observations reach the clip
            obs = (5.0 * rng.standard_normal((batch, *policy.obs_shape))).astype(np.float32)
        expected, got = _expected(policy, obs), dict(zip(names, _run_file(path, fmt, obs), strict=True))
        assert set(got) == set(expected)
        for key, value in expected.items():
            assert got[key].shape == value.shape and got[key].dtype == value.dtype, key
            np.testing.assert_allclose(got[key], value, rtol=1e-5, atol=1e-5, err_msg=f"{name} {fmt} {key}")
    if policy.actions.continuous:  # the deterministic action is the mean clipped to the bounds, and some were
        assert np.all(np.abs(got["action"]) <= 2.0) and np.any(np.abs(got["mean"]) > 2.0)


def test_normalization_is_inside_and_the_file_describes_itself(runs, tmp_path):
    """The exported values are those of the normalized observations, not the raw ones; the metadata says what the
    file takes and returns (ONNX metadata_props and the TorchScript extra file carry the same JSON)."""
    import onnx

    policy = Policy.load(runs["pendulum"])
    obs = np.array([[1.0, -2.0, 30.0]], dtype=np.float32)
    path = parallel_ppo.export(policy, "onnx", tmp_path / "sub" / "p.onnx")
    assert path == tmp_path / "sub" / "p.onnx"
    value = _run_file(path, "onnx", obs)[-1]
    with torch.no_grad():
        assert not np.allclose(policy.model.net(torch.from_numpy(obs))[1].numpy(), value, atol=1e-3)
    props = {p.key: p.value for p in onnx.load(str(path)).metadata_props}
    info = json.loads(props[export.METADATA_KEY])
    assert info["env_id"] == "Pendulum-v1" and info["normalize_obs"] and info["obs_shape"] == [3]
    assert info["outputs"] == ["action", "mean", "log_std", "value"] and info["actions"]["high"] == [2.0]
    script = parallel_ppo.export(runs["pendulum"], "torchscript", tmp_path / "p.pt")
    extra = {"parallel_ppo.json": ""}
    torch.jit.load(str(script), _extra_files=extra)
    assert json.loads(extra["parallel_ppo.json"]) == info
    with pytest.raises(parallel_ppo.ConfigError, match="export format must be one of onnx, torchscript"):
        parallel_ppo.export(policy, "tflite")


def test_an_exported_file_given_as_a_checkpoint_is_one_line(runs, tmp_path, capsys):
    """A TorchScript export is a zip archive as a checkpoint is (torch.load would hand it to torch.jit.load, with a
    warning): refused in one line, exit 2, naming what it is."""
    script = parallel_ppo.export(runs["cartpole"], "torchscript", tmp_path / "policy.pt")
    assert main(["eval", "--checkpoint", str(script)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{script} is a TorchScript file (`export --format torchscript`)" in err, err


def test_a_full_disk_is_a_runtime_failure_in_one_line_and_writes_nothing(runs, tmp_path, capsys, monkeypatch):
    """The place was checked writable before the export; the disk that then does not take the file is exit 1 (from
    Python WriteFailed), naming it, no part of it left, nor the folders made for it."""
    real = export.atomic_write

    def half(f) -> None:
        f.write(b"half a policy")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(export, "atomic_write", lambda path, write: real(path, half))
    out = tmp_path / "new" / "folders" / "policy.pt"
    assert main(["export", "--format", "torchscript", "--output", str(out), str(runs["cartpole"])]) == 1
    assert capsys.readouterr().err == (f"parallel-ppo export: error: could not write {out}: OSError: [Errno 28] No "
                                       "space left on device\n")
    assert not list(tmp_path.iterdir())  # nor the folders made for it
    with pytest.raises(parallel_ppo.WriteFailed, match="could not write"):
        parallel_ppo.export(runs["cartpole"], "torchscript", out)


def test_a_file_that_does_not_reproduce_the_policy_is_export_mismatch(runs, tmp_path, capsys, monkeypatch):
    """A defect of the export, not the user's input: `ppo.ExportMismatch` from Python, one line and exit 1 from the
    command, nothing written."""
    monkeypatch.setattr(export, "largest_difference", lambda *args: 1.0)
    out = tmp_path / "policy.pt"
    with pytest.raises(parallel_ppo.ExportMismatch, match="differs from the policy by 1"):
        parallel_ppo.export(runs["cartpole"], "torchscript", out)
    assert main(["export", "--format", "torchscript", "--output", str(out), str(runs["cartpole"])]) == 1
    err = capsys.readouterr().err
    assert err.startswith("parallel-ppo export: error: the exported torchscript file differs"), err
    assert err.count("\n") == 1
    assert not list(tmp_path.iterdir())


def test_a_ctrl_c_is_one_line_and_status_130_and_writes_nothing(runs, tmp_path, capsys, monkeypatch):
    """Ctrl-C while torch loads or the file is made: one line, the shell's status for SIGINT, no file."""

    def interrupt(*args, **kwargs) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(export, "export_policy", interrupt)
    assert main(["export", str(runs["cartpole"]), "--output", str(tmp_path / "p.onnx")]) == 130
    assert capsys.readouterr().err == "\nparallel-ppo export: interrupted; nothing was written\n"
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize(("args", "words"), [
    (["{missing}"], "checkpoint not found"),
    (["{empty}"], "checkpoint not found"),
    (["{nested}"], "checkpoint.pt is a directory, not a file"),
    (["--format", "tflite", "{run}"], "invalid choice: 'tflite'"),
    (["--output", "/proc/policy.onnx", "{run}"], "cannot write export file /proc/policy.onnx"),
    (["--output", "{empty}", "{run}"], "is a directory"),
    (["--format", "torchscript", "--output", "{run}/checkpoint.pt", "{run}"], "would replace a run's checkpoint.pt"),
    (["--format", "torchscript", "--output", "{empty}/p.onnx", "{run}"], "name it p.pt, or give --format onnx"),
    (["--format", "onnx", "{run}", "--onnx-missing"], "pip install onnx onnxruntime"),
])
def test_bad_input_is_one_line_and_exit_2_and_writes_nothing(runs, tmp_path, capsys, monkeypatch, args, words):
    (tmp_path / "empty").mkdir()
    (tmp_path / "nested" / "checkpoint.pt").mkdir(parents=True)
    places = {"missing": tmp_path / "missing", "empty": tmp_path / "empty", "run": runs["cartpole"],
              "nested": tmp_path / "nested"}
    if "--onnx-missing" in args:
        args = [a for a in args if a != "--onnx-missing"]
        monkeypatch.setattr(export, "ONNX_PACKAGES", ("onnx", "onnxruntime", "no_such_package_here"))
    before = {p: sorted(p.iterdir()) for p in (runs["cartpole"], tmp_path)}
    checkpoint = (runs["cartpole"] / "checkpoint.pt").read_bytes()
    try:
        status = main(["export", *(a.format(**places) for a in args)])
    except SystemExit as e:  # argparse's refusal of a flag: OneLineParser exits with status 2
        status = e.code
    err = capsys.readouterr().err
    assert status == 2 and err.count("\n") == 1 and words in err, err
    assert err.startswith("parallel-ppo export: error: ") and "Traceback" not in err
    assert {p: sorted(p.iterdir()) for p in before} == before
    assert (runs["cartpole"] / "checkpoint.pt").read_bytes() == checkpoint


def _dict_policy(tmp_path: Path, keys: dict[str, tuple[tuple[int, ...], bool]]) -> Policy:
    """An untrained dict-observation policy (the IMPALA CNN and the MLP side by side) over `keys` (a robosuite-like
    camera key, a key with a dash, one named as a Python keyword), four discrete actions."""
    from parallel_ppo.envs.observations import DictLayout
    from parallel_ppo.envs.spaces import ActionSpace, EnvSpaces

    cfg = build_config(None, {"env.id": "CartPole-v1"}, ["training.precision=fp32", "model.impala_depths=[4]",
                                                         "model.hidden_size=16"], False)
    layout = DictLayout.of(keys)
    spaces = EnvSpaces((layout.nbytes,), np.dtype(np.uint8), ActionSpace(4), layout)
    torch.manual_seed(0)
    return Policy(cfg, network(cfg, spaces), tmp_path / "checkpoint.pt", {}, spaces=spaces)


def test_a_dict_policys_files_take_each_key_by_name(tmp_path):
    """ONNX takes each key as the input of its name; TorchScript as the keyword argument `argument_name` makes of it
    (or by position, in the metadata's order), and both give the policy's own outputs."""
    import onnxruntime

    keys = {"robot0_eye_in_hand_image": ((6, 6, 3), True), "object-state": ((3,), False), "class": ((2,), False)}
    policy = _dict_policy(tmp_path, keys)
    rng = np.random.default_rng(5)
    obs = {"robot0_eye_in_hand_image": rng.integers(0, 256, (4, 6, 6, 3), dtype=np.uint8),
           "object-state": rng.normal(size=(4, 3)).astype(np.float32),
           "class": rng.normal(size=(4, 2)).astype(np.float32)}
    with torch.no_grad():
        params, value = policy.model(torch.from_numpy(policy.layout.pack(obs)))
    expected = [policy.predict(obs, deterministic=True), params.numpy(), value.numpy()]
    onnx_file = export.export_policy(policy, "onnx", tmp_path / "p.onnx")
    script = export.export_policy(policy, "torchscript", tmp_path / "p.pt")
    inputs = onnx_file.metadata["inputs"]
    assert inputs == script.metadata["inputs"]
    assert [(i["name"], i["argument"]) for i in inputs] == [
        ("class", "_class"), ("object-state", "object_state"), ("robot0_eye_in_hand_image", "robot0_eye_in_hand_image")]
    session = onnxruntime.InferenceSession(str(onnx_file.path), providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == [i["name"] for i in inputs]  # the keys, as before
    module = torch.jit.load(str(script.path))
    by_name = {i["argument"]: torch.from_numpy(obs[i["name"]]) for i in inputs}
    runs = {"onnx": session.run(None, obs), "torchscript": [t.numpy() for t in module(**by_name)],
            "positional": [t.numpy() for t in module(*(by_name[i["argument"]] for i in inputs))]}
    for fmt, got in runs.items():
        np.testing.assert_array_equal(got[0], expected[0], err_msg=fmt)
        for e, g in zip(expected[1:], got[1:], strict=True):
            assert float(np.max(np.abs(e - g) / np.maximum(1.0, np.abs(e)))) <= export.TOLERANCE, fmt
    clash = _dict_policy(tmp_path, {"a-b": ((2,), False), "a_b": ((2,), False)})
    with pytest.raises(parallel_ppo.ConfigError, match="key.s. a-b, a_b cannot each be one argument"):
        export.export_policy(clash, "torchscript", tmp_path / "clash.pt")
    assert not (tmp_path / "clash.pt").exists()
