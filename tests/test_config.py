"""build_config: YAML, flags and --set precedence, validation errors, and the shipped config files."""

from __future__ import annotations

import ast
import dataclasses
import re
import types
from pathlib import Path
from typing import Any

import pytest
import yaml

from parallel_ppo.cli.flags import FLAGS, with_flags
from parallel_ppo.core.config import Config, EnvConfig, Rules, config_fields, rules_of
from parallel_ppo.core.config_yaml import config_env
from parallel_ppo.core.configure import build_config, config_from_dict, get_value, resume_mismatch
from parallel_ppo.errors import ConfigError

ROOT = Path(__file__).resolve().parent.parent


def write_yaml(tmp_path: Path, text: str, name: str = "cfg.yaml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def small_sets(*extra: str) -> list[str]:
    """--set items for a tiny, valid CartPole config, plus `extra`."""
    return ["env.id=CartPole-v1", "env.num_envs=2", "training.n_steps=8", "training.batch_size=4", *extra]


def test_defaults_are_valid():
    """The dataclass defaults pass validation on their own."""
    cfg = build_config(None, {}, [], parallel=False)
    assert cfg.to_dict() == Config().to_dict()


def test_precedence_yaml_then_flags_then_set(tmp_path):
    """Defaults < YAML < CLI flags < --set; a flag left as None does not override the YAML."""
    path = write_yaml(tmp_path, """
env: {id: CartPole-v1, num_envs: 4}
training: {n_steps: 64, batch_size: 64, n_epochs: 7, learning_rate: 0.01}
run: {seed: 5}
""")
    flags = {"env.num_envs": 8, "training.batch_size": 32, "run.seed": None, "training.n_epochs": 2}
    sets = ["training.n_epochs=5", "training.n_steps=16"]
    cfg = build_config(path, flags, sets, parallel=False)
    assert cfg.env.id == "CartPole-v1"  # YAML only
    assert cfg.run.seed == 5  # flag None: YAML kept
    assert cfg.env.num_envs == 8  # flag beats YAML
    assert cfg.training.batch_size == 32  # flag beats YAML
    assert cfg.training.n_epochs == 5  # --set beats flag and YAML
    assert cfg.training.n_steps == 16  # --set beats YAML
    assert cfg.training.learning_rate == 0.01  # YAML beats default
    assert cfg.training.gamma == Config().training.gamma  # default untouched
    assert cfg.rollout_size == 16 * 8


def test_later_set_wins_and_values_are_parsed_as_yaml():
    """Repeated --set items apply in order; values are typed by YAML (numbers, booleans, lists)."""
    cfg = build_config(None, {}, small_sets("training.n_epochs=2", "training.n_epochs=9",
                                            "training.anneal_lr=true", "training.learning_rate=3e-4",
                                            "model.mlp_hidden=[32, 16]", "training.gamma=1"), parallel=False)
    assert cfg.training.n_epochs == 9
    assert cfg.training.anneal_lr is True
    assert cfg.training.learning_rate == pytest.approx(3e-4)
    assert cfg.model.mlp_hidden == [32, 16]
    assert isinstance(cfg.training.gamma, float) and cfg.training.gamma == 1.0


def test_the_learning_rate_anneals_over_anneal_steps_wherever_the_run_stops():
    """A 1M-step run on a 10M-step schedule (a reference's) has 90% of its rate left at its end; without
    anneal_steps the schedule is the run's own step budget, else its duration."""
    from parallel_ppo.core.loop import learning_rate

    def rate(*extra: str, steps: int = 0, elapsed: float = 0.0) -> float:
        sets = small_sets("training.anneal_lr=true", "training.learning_rate=1e-3", *extra)
        return learning_rate(build_config(None, {}, sets, parallel=False), steps, elapsed)

    assert rate("run.total_steps=1000000", "training.anneal_steps=10000000", steps=10**6) == pytest.approx(9e-4)
    assert rate("run.total_steps=1000000", steps=500_000) == pytest.approx(5e-4)
    assert rate("run.duration=1", elapsed=2700.0) == pytest.approx(2.5e-4)
    assert rate("training.anneal_steps=100", steps=150) == 0.0
    with pytest.raises(ConfigError, match="training.anneal_steps must not be negative"):
        build_config(None, {}, small_sets("training.anneal_steps=-1"), parallel=False)
    with pytest.raises(ConfigError, match=r"anneal_steps \(100\) is below run.total_steps \(1,000\)"):
        sets = small_sets("training.anneal_lr=true", "training.anneal_steps=100", "run.total_steps=1000")
        build_config(None, {}, sets, parallel=False)


def test_a_run_takes_its_first_update_whatever_its_set_up_took():
    """The duration ends a run only after an update: a short budget its set-up outlasted (a benchmark's point of
    seconds, TensorBoard's import on a busy machine) still logs an update; a resumed run that met it before (with
    updates, or stopped in its first) stops at once."""
    from types import SimpleNamespace

    from parallel_ppo.core.loop import stop_reason

    cfg = build_config(None, {}, small_sets("run.duration=0.001"), parallel=False)
    asked, quiet = SimpleNamespace(signum=2), SimpleNamespace(signum=None)
    fresh = SimpleNamespace(update=0, env_steps=0, elapsed_before=0.0)
    resumed = SimpleNamespace(update=3, env_steps=96, elapsed_before=2.0)
    spent = SimpleNamespace(update=0, env_steps=0, elapsed_before=4.0)  # stopped in its first update, past its budget
    assert stop_reason(cfg, fresh, quiet, 60.0) == "" and stop_reason(cfg, resumed, quiet, 60.0) == "duration"
    assert stop_reason(cfg, spent, quiet, 60.0) == "duration"
    assert stop_reason(cfg, fresh, asked, 60.0) == "signal" and stop_reason(cfg, resumed, quiet, 1.0) == ""


def test_exponent_numbers_without_a_point(tmp_path):
    """3e-4 (a string to PyYAML's YAML 1.1) is read as a number in files and --set; 1e5 is an integer."""
    path = write_yaml(tmp_path, "training:\n  learning_rate: 3e-4\n")
    sets = small_sets("run.total_steps=1e5", "training.max_grad_norm=5E-1")
    cfg = build_config(path, {}, sets, parallel=False)
    assert cfg.training.learning_rate == pytest.approx(3e-4)
    assert cfg.run.total_steps == 100_000 and isinstance(cfg.run.total_steps, int)
    assert cfg.training.max_grad_norm == 0.5
    with pytest.raises(ConfigError, match="training.n_steps must be an integer"):
        build_config(None, {}, small_sets("training.n_steps=1e-1"), parallel=False)


def test_integers_with_leading_zeros_are_decimal_as_in_yaml_1_2(tmp_path):
    """010 is ten in files and --set (as --seed 010 is), not YAML 1.1's octal eight; 08 is eight, not a string; 0o10
    is octal; a tagged integer that is none is one line."""
    from parallel_ppo.core.config_yaml import parse_yaml

    path = write_yaml(tmp_path, "run:\n  seed: 0777\n")
    cfg = build_config(path, {}, small_sets("training.n_epochs=08", "model.mlp_hidden=[016, 0o10]"), parallel=False)
    assert (cfg.run.seed, cfg.training.n_epochs, cfg.model.mlp_hidden) == (777, 8, [16, 8])
    assert [parse_yaml(t) for t in ("-010", "0x1F", "1_000", "0b_", "1:30:00")] == [-10, 31, 1000, "0b_", "1:30:00"]
    with pytest.raises(ConfigError, match="not valid YAML at line 2"):
        build_config(write_yaml(tmp_path, "run:\n  seed: !!int abc\n"), {}, [], parallel=False)


def test_a_config_written_is_read_back_as_it_was_and_text_fields_keep_their_digits():
    """config.yaml and --print-config quote every string the loader would read as something else (a run in a folder
    named 08 can be resumed); a text field given digits by --set keeps them as text."""
    from parallel_ppo.core.config_yaml import dump_yaml, parse_yaml

    data = {"a": "08", "b": "1e5", "c": "TRUE", "d": 8, "e": "1:30:00", "f": "off", "g": "0o17", "h": [16, 32]}
    assert parse_yaml(dump_yaml(data)) == data == yaml.safe_load(dump_yaml(data))  # and by YAML 1.1's tools
    cfg = build_config(None, {}, small_sets("tracking.group=0815", "run.output_dir=08", "training.n_epochs=08"),
                       parallel=False)
    assert (cfg.tracking.group, cfg.run.output_dir, cfg.training.n_epochs) == ("0815", "08", 8)
    assert config_from_dict(parse_yaml(dump_yaml(cfg.to_dict()))) == cfg


def test_on_off_stay_strings(tmp_path):
    """`progress: off` / `--set logging.progress=on` are the strings the field expects (YAML 1.2 booleans)."""
    cfg = build_config(write_yaml(tmp_path, "logging:\n  progress: off\n"), {}, small_sets(), parallel=False)
    assert cfg.logging.progress == "off"
    cfg = build_config(None, {}, small_sets("logging.progress=on"), parallel=False)
    assert cfg.logging.progress == "on"
    sets = small_sets("training.anneal_lr=True", "training.norm_adv=false")
    cfg = build_config(None, {}, sets, parallel=False)
    assert cfg.training.anneal_lr is True and cfg.training.norm_adv is False
    with pytest.raises(ConfigError, match="training.anneal_lr must be true or false, got 'yes'"):
        build_config(None, {}, small_sets("training.anneal_lr=yes"), parallel=False)


def test_integral_float_accepted_for_int():
    """64.0 is accepted for an integer field and stored as the int 64."""
    cfg = build_config(None, {}, small_sets("training.n_steps=64.0"), parallel=False)
    assert cfg.training.n_steps == 64 and isinstance(cfg.training.n_steps, int)


@pytest.mark.parametrize("item,needle", [
    ("bogus.key=1", "bogus"),
    ("training.nope=1", "training.nope"),
    ("training=1", "training"),
    ("training.n_steps", "section.key=value"),
    ("training.n_steps=abc", "training.n_steps"),
    ("training.n_steps=true", "training.n_steps"),
    ("training.n_steps=2.5", "training.n_steps"),
    ("training.learning_rate=fast", "training.learning_rate"),
    ("training.learning_rate=.nan", "training.learning_rate"),
    ("training.anneal_lr=1", "training.anneal_lr"),
    ("env.id=42", "unknown game or env id '42'"),  # a text field takes digits as text
    ("model.mlp_hidden=[32, true]", "model.mlp_hidden"),
])
def test_bad_set_items(item, needle):
    """Unknown sections/keys, malformed items and wrong types are ConfigErrors naming the key."""
    with pytest.raises(ConfigError, match=needle.replace(".", r"\.").replace("[", r"\[")):
        build_config(None, {}, small_sets(item), parallel=False)


@pytest.mark.parametrize("text,needle", [
    ("bogus:\n  x: 1\n", "unknown section 'bogus'"),
    ("training:\n  n_stepz: 8\n", "training.n_stepz"),
    ("training:\n  n_steps: eight\n", "training.n_steps"),
    ("training:\n  n_steps: true\n", "training.n_steps"),
    ("training:\n  n_epochs: 1.5\n", "training.n_epochs"),
    ("training: 5\n", "section 'training' must be a mapping"),
    ("", "is empty"),
    ("# only a comment\n", "is empty"),
    ("training: {n_steps: [1, 2\n", "not valid YAML"),
    ("env:\n  id: starpilot\n   num_envs: 2\n", "not valid YAML"),
    ("- env\n- training\n", "must be a mapping"),
    ("just a string\n", "must be a mapping"),
])
def test_bad_yaml_files(tmp_path, text, needle):
    """Unknown sections and keys, wrong types, empty, malformed and non-mapping files are ConfigErrors."""
    path = write_yaml(tmp_path, text)
    with pytest.raises(ConfigError, match=needle) as info:
        build_config(path, {}, [], parallel=False)
    assert "\n" not in str(info.value)


def test_missing_config_file(tmp_path):
    """A config path that does not exist is a ConfigError naming it."""
    with pytest.raises(ConfigError, match="not found"):
        build_config(str(tmp_path / "nope.yaml"), {}, [], parallel=False)


def test_empty_section_keeps_defaults(tmp_path):
    """A section header with nothing under it changes nothing."""
    cfg = build_config(write_yaml(tmp_path, "training:\nenv:\n  id: CartPole-v1\n"), {}, [], parallel=False)
    assert cfg.training == Config().training
    assert cfg.env.id == "CartPole-v1"


@pytest.mark.parametrize("item", [
    "training.n_steps=0", "training.batch_size=-4", "env.num_envs=0", "training.n_epochs=0",
    "parallel.num_workers=0", "parallel.num_envs_per_worker=-1", "model.hidden_size=0",
    "training.learning_rate=0", "training.clip_coef=-0.1", "run.total_steps=-1", "run.duration=0",
    "training.gamma=1.5", "training.gae_lambda=-0.1", "model.mlp_hidden=[]",
    "model.impala_depths=[16, 0, 32]",
])
def test_non_positive_or_out_of_range_values(item):
    """Sizes must be positive and rates within range."""
    with pytest.raises(ConfigError, match=item.split("=")[0].replace(".", r"\.")):
        build_config(None, {}, small_sets(item), parallel=False)


@pytest.mark.parametrize("item", [
    "env.start_level=3000000000", "env.num_levels=2147483648", "model.hidden_size=1000000000",
    "distributed.timeout_seconds=1e300", "run.checkpoint_interval=1e300", "run.limit_seconds=1e300",
    "eval.episodes=10000000000", "eval.num_envs=100000",
])
def test_values_past_what_the_libraries_take_are_refused(item):
    """Numbers that would overflow Procgen's 31-bit levels, torch's timeouts or memory, or hang a run silently (its
    compute limit measured for ages, evaluations of countless episodes), are refused up front."""
    with pytest.raises(ConfigError, match=item.split("=")[0].replace(".", r"\.") + ".*supported maximum"):
        build_config(None, {}, small_sets(item), parallel=False)


@pytest.mark.parametrize("item", ["training.clip_coef=1e39", "training.obs_clip=-1e39", "training.learning_rate=4e38"])
def test_numbers_no_float32_holds_are_refused(item):
    """Every float setting meets float32 tensors, where a number past float32's largest overflows in the update
    (clip_coef, obs_clip): refused up front; the largest float32 is taken."""
    with pytest.raises(ConfigError, match=item.split("=")[0].replace(".", r"\.") + " = .* larger than a float32 holds"):
        build_config(None, {}, small_sets(item), parallel=False)
    assert build_config(None, {}, small_sets("training.clip_coef=3.4e38"), parallel=False).training.clip_coef == 3.4e38


def test_procgen_levels_past_the_last_one_are_refused():
    with pytest.raises(ConfigError, match="go past Procgen's last level 2147483646"):
        build_config(None, {"env.id": "starpilot"}, ["env.start_level=2147483000", "env.num_levels=1000"], False)


@pytest.mark.parametrize("item", [
    "training.precision=fp16", "model.kind=transformer", "logging.progress=maybe",
    "parallel.start_method=fork", "env.distribution_mode=impossible",
])
def test_unknown_choices(item):
    """String settings with a fixed set of choices reject anything else."""
    with pytest.raises(ConfigError, match="must be one of"):
        build_config(None, {}, small_sets(item), parallel=False)


def test_an_empty_choice_is_named_in_the_refusal():
    """run.preempt_signal's empty choice (no signal) reads as '' in the list of choices, not as a blank."""
    with pytest.raises(ConfigError, match=r"must be one of '', SIGUSR1, SIGUSR2; got 'SIGTERM'"):
        build_config(None, {}, small_sets("run.preempt_signal=SIGTERM"), parallel=False)


def test_a_config_files_unknown_key_or_bad_value_names_the_file(tmp_path):
    """A typo in a config file's key names the file, as an unknown section does; the same typo in --set does not."""
    path = write_yaml(tmp_path, "training:\n  nsteps: 64\n")
    with pytest.raises(ConfigError, match=r"^\S*cfg.yaml: unknown config key 'training.nsteps' \(keys of training:"):
        build_config(path, {}, [], parallel=False)
    with pytest.raises(ConfigError, match=r"^\S*cfg.yaml: training.gamma must be a number, got 'high'"):
        build_config(write_yaml(tmp_path, "training:\n  gamma: high\n"), {}, [], parallel=False)
    with pytest.raises(ConfigError, match=r"^unknown config key 'training.nsteps'"):
        build_config(None, {}, ["training.nsteps=64"], parallel=False)


def test_minibatch_must_divide_rollout():
    """A minibatch size that does not divide n_steps × num_envs is refused, naming both."""
    with pytest.raises(ConfigError, match=r"batch size 6 does not divide the rollout.*= 16"):
        build_config(None, {"training.batch_size": 6}, small_sets()[:-1], parallel=False)


def test_minibatch_larger_than_rollout():
    """A minibatch larger than the rollout is refused."""
    with pytest.raises(ConfigError, match=r"batch size 32 is larger than the rollout"):
        build_config(None, {"training.batch_size": 32}, small_sets()[:-1], parallel=False)


def test_minibatch_equal_to_rollout_is_fine():
    """One minibatch per rollout is allowed."""
    cfg = build_config(None, {"training.batch_size": 16}, small_sets()[:-1], parallel=False)
    assert cfg.training.batch_size == cfg.rollout_size == 16


@pytest.mark.parametrize("env_id", ["notagame", "starpilot2", "CartPole-v99"])
def test_unknown_env_id(env_id):
    """An id that is neither a Procgen game nor a registered gymnasium id is refused."""
    with pytest.raises(ConfigError, match=f"unknown game or env id '{env_id}'"):
        build_config(None, {"env.id": env_id}, [], parallel=False)


@pytest.mark.parametrize("env_id", ["starpilot", "coinrun", "CartPole-v1", "Acrobot-v1"])
def test_known_env_ids(env_id):
    """Procgen games and registered gymnasium ids pass."""
    assert build_config(None, {"env.id": env_id}, [], parallel=False).env.id == env_id


def test_parallel_mode_derives_num_envs():
    """In parallel mode env.num_envs = workers × envs per worker; sequential mode keeps the number given."""
    flags = {"parallel.num_workers": 3, "parallel.num_envs_per_worker": 5}
    cfg = build_config(None, flags, ["training.batch_size=64"], parallel=True)
    assert cfg.env.num_envs == 15
    assert cfg.rollout_size == 15 * cfg.training.n_steps
    cfg = build_config(None, {**flags, "env.num_envs": 15}, ["training.batch_size=64"], parallel=True)
    assert cfg.env.num_envs == 15  # the same number, given: fine
    cfg = build_config(None, {**flags, "env.num_envs": 2}, ["training.batch_size=64"], parallel=False)
    assert cfg.env.num_envs == 2


@pytest.mark.parametrize("sets", [[], ["parallel.num_envs_per_worker=4"]])
def test_a_layout_on_the_command_line_wins_over_the_config_files_total(sets):
    """config/cartpole.yaml sets env.num_envs 8 for its 2 × 4 workers; `--num-workers 1` then means 1 × 4."""
    cfg = build_config(ROOT / "config/cartpole.yaml", {"parallel.num_workers": 1}, ["training.batch_size=128", *sets],
                       parallel=True)
    assert cfg.env.num_envs == 4
    with pytest.raises(ConfigError, match="batch size 256 is larger .* set training.batch_size to at most 128"):
        build_config(ROOT / "config/cartpole.yaml", {"parallel.num_workers": 1}, [], parallel=True)


@pytest.mark.parametrize("where", ["flag", "set", "yaml"])
def test_parallel_mode_refuses_a_conflicting_num_envs(tmp_path, where):
    """A total that differs from the layout is refused wherever it was given, not silently replaced (unless the
    file gave it and the command line the layout)."""
    flags = {"parallel.num_workers": 3, "parallel.num_envs_per_worker": 5}
    sets = ["training.batch_size=64"]
    path = None
    if where == "flag":
        flags["env.num_envs"] = 2
    elif where == "set":
        sets.append("env.num_envs=2")
    else:
        flags = {}
        path = write_yaml(tmp_path, "env:\n  num_envs: 2\nparallel:\n  num_workers: 3\n  num_envs_per_worker: 5\n")
    with pytest.raises(ConfigError, match=r"env.num_envs = 2 conflicts .*\(3 workers × 5 envs per worker = 15\)"):
        build_config(path, flags, sets, parallel=True)


@pytest.mark.parametrize("key,value,flag", [("parallel.num_workers", -1, "--num-workers"),
                                            ("parallel.num_envs_per_worker", 0, "--num-envs-per-worker")])
def test_parallel_layout_errors_name_what_was_given(key, value, flag):
    """A bad layout names the setting the user gave, not the env.num_envs derived from it; a command line adds
    its flag."""
    with pytest.raises(ConfigError) as err:
        build_config(None, {key: value}, [], parallel=True)
    assert f"{key} must be positive, got {value}" in str(err.value)
    assert f"{key} ({flag}) must be positive, got {value}" in with_flags(str(err.value))
    assert "env.num_envs" not in str(err.value)


def test_exploration_mode_only_for_games_that_have_it():
    """Procgen's exploration mode exists for some games only; the others are refused up front."""
    cfg = build_config(None, {"env.id": "maze"}, ["env.distribution_mode=exploration"], parallel=False)
    assert cfg.env.distribution_mode == "exploration"
    with pytest.raises(ConfigError, match="starpilot has no exploration mode"):
        build_config(None, {"env.id": "starpilot"}, ["env.distribution_mode=exploration"], parallel=False)


def test_parallel_mode_validates_the_derived_rollout():
    """The batch-size checks use the derived num_envs: 3 × 5 envs × 128 steps is not a multiple of 256."""
    flags = {"parallel.num_workers": 3, "parallel.num_envs_per_worker": 5}
    with pytest.raises(ConfigError, match="does not divide the rollout"):
        build_config(None, flags, [], parallel=True)


@pytest.mark.parametrize("workers, fraction, waited", [(2, 0.5, 1), (3, 0.666, 2), (50, 0.14, 7), (16, 0.6, 10),
                                                    (2, 1.0, 2), (2, 1e-10, 1)])
def test_sync_fraction_waits_for_that_share_of_the_workers_rounded_up(workers, fraction, waited):
    """0.14 × 50 is 7.000000000000001 in floats: still 7 workers; the smallest share waits for one."""
    flags = {"parallel.num_workers": workers, "parallel.num_envs_per_worker": 4, "parallel.sync_fraction": fraction}
    cfg = build_config(None, flags, ["training.batch_size=64"], parallel=True)
    assert cfg.parallel.workers_waited_for == waited


def test_a_sync_fraction_that_would_wait_for_every_worker_is_refused():
    """0.6 of 2 workers rounds up to both: nothing would ever be cut. One worker has none to cut, as the sequential
    trainer, whatever the share (a study's one-worker point)."""
    with pytest.raises(ConfigError, match=r"0.6 of 2 workers waits for all of them: set it to at most 0.5, or to 1"):
        build_config(None, {"parallel.num_workers": 2, "parallel.sync_fraction": 0.6}, [], parallel=True)
    build_config(None, {"parallel.num_workers": 1, "parallel.sync_fraction": 0.5}, [], parallel=True)  # none to cut
    build_config(None, {"parallel.num_workers": 2, "parallel.sync_fraction": 0.6}, [], parallel=False)  # ignored


def test_dropping_lagged_steps_needs_workers_that_refresh_and_one_process():
    """Without `refresh_params` every overlapped step lags, and distributed ranks would not agree on the share timing
    sets."""
    sets = ["parallel.overlap=true", "parallel.drop_lagged=true"]
    with pytest.raises(ConfigError, match=r"without parallel.refresh_params every step is taken with older ones"):
        build_config(None, {}, [*sets, "parallel.refresh_params=false"], parallel=True)
    with pytest.raises(ConfigError, match=r"which 2 distributed ranks do not agree on: set it to false"):
        build_config(None, {}, sets, parallel=True, world_size=2)
    assert build_config(None, {}, sets, parallel=True).parallel.drop_lagged


def test_a_cap_on_the_lagged_share_needs_workers_that_refresh():
    """Workers wait for an update's parameters mid-rollout only where they take them there (`refresh_params`)."""
    sets = ["parallel.overlap=true", "parallel.max_lagged_share=0.25"]
    with pytest.raises(ConfigError, match=r"max_lagged_share 0.25 has workers wait .* set it to true, or this to 1"):
        build_config(None, {}, [*sets, "parallel.refresh_params=false"], parallel=True)
    with pytest.raises(ConfigError, match=r"parallel.max_lagged_share"):
        build_config(None, {}, ["parallel.max_lagged_share=0"], parallel=True)
    assert build_config(None, {}, sets, parallel=True, world_size=2).parallel.max_lagged_share == 0.25


def test_an_early_start_is_refused_beside_a_cut_of_the_slowest_rollouts_or_without_refreshed_parameters():
    """`early_start` keeps the workers that ended their rollout stepping, `sync_fraction` ends the slowest ones':
    one answer to stragglers at a time (both are ignored without overlap). It publishes each update's parameters
    before the rollout in flight ends, which only workers that refresh them may meet."""
    sets = ["parallel.early_start=true", "parallel.sync_fraction=0.5"]
    with pytest.raises(ConfigError, match=r"^parallel.early_start has a worker .*sync_fraction 0.5 .* set one of"):
        build_config(None, {}, [*sets, "parallel.overlap=true"], parallel=True)
    assert build_config(None, {}, sets, parallel=True).parallel.early_start  # synchronous: no rollout to start early
    with pytest.raises(ConfigError, match=r"^parallel.early_start publishes .* without parallel.refresh_params"):
        build_config(None, {}, [sets[0], "parallel.overlap=true", "parallel.refresh_params=false"], parallel=True)
    assert build_config(None, {}, sets[:1] + ["parallel.overlap=true"], parallel=True).parallel.early_start


def test_dict_round_trip():
    """config_from_dict(cfg.to_dict()) rebuilds an equal config."""
    cfg = build_config(None, {}, small_sets("model.mlp_hidden=[8, 8, 8]", "run.seed=9"), parallel=False)
    assert config_from_dict(cfg.to_dict()) == cfg


SHIPPED = sorted((ROOT / "config").glob("*.yaml"))


def test_shipped_config_files_exist():
    """The repository ships the sequential and CartPole configs."""
    names = {p.name for p in SHIPPED}
    assert {"ppo_sequential.yaml", "cartpole.yaml"} <= names


@pytest.mark.parametrize("path", SHIPPED, ids=[p.name for p in SHIPPED])
def test_shipped_configs_load_and_validate(path, genesis_taken_as_installed):
    """Every config/*.yaml builds a valid config (in the mode its name says), applying every key it sets; a family
    whose extra is outside dev (Genesis) is taken as installed, which a config's checks never import."""
    parallel = "parallel" in path.name
    cfg = build_config(str(path), {}, [], parallel=parallel)
    data = yaml.safe_load(path.read_text())
    resolved = cfg.to_dict()
    for section, values in data.items():
        for key, value in (values or {}).items():
            if parallel and (section, key) == ("env", "num_envs"):
                continue
            assert resolved[section][key] == value, f"{section}.{key}"
    if parallel:
        assert cfg.env.num_envs == cfg.parallel.num_workers * cfg.parallel.num_envs_per_worker


OLD_TABLES = ("POSITIVE", "MAXIMUM", "NON_NEGATIVE", "UNIT_INTERVAL", "DURATIONS", "STRING_LISTS", "AUTO_INTS",
              "CHOICES", "LAYER_WIDTHS", "DEVICES", "FLAGS", "TRACKING_FLAGS", "field_name")


def _breaking_value(key: str, rules: Rules) -> Any:
    """A value of field `key` that its rules refuse (None for a field with no bound, choice or width rule)."""
    if rules.choices:
        return "no-such-choice"
    if rules.widths:
        return []
    if rules.maximum is not None:
        return rules.maximum + 1 if isinstance(get_value(Config(), key), int) else rules.maximum * 2
    if rules.positive:
        return 0
    if rules.non_negative:
        return -1
    if rules.unit_interval:
        return 1.5
    return None


BOUNDED = [(key, value) for key, f in config_fields() if (value := _breaking_value(key, rules_of(f))) is not None]


def test_the_rules_live_on_the_fields_only():
    """The rule tables of old are gone (from core.configure, and the resume list from launch.py): each field's
    rules are its metadata, a `Rules`, and nothing else is."""
    from parallel_ppo.core import configure

    assert not [name for name in OLD_TABLES if hasattr(configure, name)]
    launch = ast.parse((ROOT / "parallel_ppo/launch.py").read_text())
    assert "MUST_MATCH_ON_RESUME" not in {n.id for n in ast.walk(launch) if isinstance(n, ast.Name)}
    for key, f in config_fields():
        assert set(f.metadata) <= {"rules"} and isinstance(rules_of(f), Rules), key
    assert len(BOUNDED) > 40  # the fields with a bound, a choice or widths (all but flags, names and free text)


@pytest.mark.parametrize("key, value", BOUNDED, ids=[key for key, _ in BOUNDED])
def test_every_rule_on_a_field_is_enforced(key, value):
    """The one validator applies each field's rules: a value that breaks one is a ConfigError naming the key."""
    with pytest.raises(ConfigError, match=re.escape(key)) as err:
        build_config(None, {}, [f"{key}={value}"], parallel=False)
    assert "\n" not in str(err.value) and "--" not in str(err.value)


def test_a_rule_added_as_metadata_is_enforced(monkeypatch):
    """A rule written on a field is all it takes: no table to add it to."""
    field = {f.name: f for f in dataclasses.fields(EnvConfig)}["num_levels"]
    assert build_config(None, {}, ["env.num_levels=200"], parallel=False).env.num_levels == 200
    rules = dataclasses.replace(rules_of(field), maximum=100)
    monkeypatch.setattr(field, "metadata", types.MappingProxyType({"rules": rules}))
    with pytest.raises(ConfigError, match=r"env\.num_levels = 200 is larger than the supported maximum 100"):
        build_config(None, {}, ["env.num_levels=200"], parallel=False)


def test_a_resume_must_keep_the_envs_the_network_and_the_observation_statistics():
    """What a checkpoint is tied to: every field of env and model, training.normalize_obs and training.obs_clip
    (`Rules.resume`); any other field may change on resume."""
    must_match = {key for key, f in config_fields() if rules_of(f).resume}
    sections = {key for key, _ in config_fields() if key.split(".")[0] in ("env", "model")}
    assert must_match == sections | {"training.normalize_obs", "training.obs_clip"}
    stored = Config()
    assert resume_mismatch(stored, Config()) is None
    changed = Config()
    changed.training.learning_rate = 1e-3
    changed.run.seed = 7
    assert resume_mismatch(stored, changed) is None
    changed.training.obs_clip = 5.0
    assert resume_mismatch(stored, changed) == "training.obs_clip=10.0, not 5.0"
    changed = Config()
    changed.model.mlp_hidden = [32]
    assert resume_mismatch(stored, changed) == "model.mlp_hidden=[64, 64], not [32]"


def test_a_command_line_names_a_key_with_its_flag():
    """The one error line of a command line adds the flag to each key that has one, once, and leaves keys without
    a flag, keys already named with theirs and `key=value` settings as they are."""
    assert FLAGS["env.id"] == "--env" and FLAGS["tracking.tags"] == "--wandb-tags"
    assert FLAGS["parallel.num_envs_per_worker"] == "--num-envs-per-worker" and "training.n_steps" not in FLAGS
    assert with_flags("set training.batch_size to 8 (training.batch_size, training.n_steps)") == \
        "set training.batch_size (--batch-size) to 8 (training.batch_size, training.n_steps)"
    assert with_flags("tracking.tags (--wandb-tags) = 'x'; env.id='a', not 'b'") == \
        "tracking.tags (--wandb-tags) = 'x'; env.id='a', not 'b'"
    assert with_flags("eval.num_envs and distributed.num_envs_total") == \
        "eval.num_envs and distributed.num_envs_total (--num-envs-total)"


def test_config_env_is_the_env_a_run_trains_read_without_checking_the_rest(tmp_path):
    """The env a benchmark's runs train (`config_env`): the last `env.id` of the `--set` items, else `--env`'s, else
    the file's, else the default env; a setting the run would refuse does not stop it (the run's check names that)."""
    bad = write_yaml(tmp_path, "env:\n  id: Acrobot-v1\ntraining:\n  n_steps: -1\n")
    assert config_env(bad) == "Acrobot-v1"
    assert config_env(bad, ["env.id=CartPole-v1", "training.n_steps=8", "env.id=robosuite/Lift"]) == "robosuite/Lift"
    assert config_env(bad, [], "bigfish") == "bigfish" and config_env(bad, ["env.id=miner"], "bigfish") == "miner"
    assert config_env(write_yaml(tmp_path, "training:\n  n_steps: 8\n", "none.yaml")) == EnvConfig().id
    assert config_env(write_yaml(tmp_path, "env: CartPole-v1\n", "flat.yaml")) == EnvConfig().id
