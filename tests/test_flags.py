"""What the command lines accept, checked in-process (no run starts): durations with units, defaults in --help,
--print-config, a Ctrl-C before a run starts, the parallel trainer's --num-envs, and the levels eval and in-training
evaluation pick."""

from __future__ import annotations

import dataclasses
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest
import yaml

from parallel_ppo.cli.bench import make_parser as bench_parser
from parallel_ppo.cli.evaluation import demo_parser
from parallel_ppo.cli.train import make_parser, request_of
from parallel_ppo.cli.train import run as run_trainer
from parallel_ppo.core.configure import build_config
from parallel_ppo.core.units import to_unit
from parallel_ppo.envs.batch import eval_levels, resolve_levels
from parallel_ppo.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
CARTPOLE = str(ROOT / "config" / "cartpole.yaml")


def resolved(argv: list[str], parallel: bool = False):
    request = request_of(make_parser("t", parallel).parse_args(argv), parallel)
    return build_config(request.config, request.flags, list(request.sets), parallel)


@pytest.mark.parametrize("text, unit, expected", [
    ("90m", "h", 1.5), ("1.5h", "h", 1.5), ("3600s", "h", 1.0), ("0.25", "h", 0.25), ("2d", "h", 48.0),
    ("90s", "m", 1.5), ("10", "m", 10.0), ("1e3 s", "s", 1000.0), (30, "s", 30.0), ("1:30:00", "h", 1.5),
    ("100:00:30", "s", 360030.0),
])
def test_a_duration_takes_a_unit_and_a_bare_number_is_the_flags_own(text, unit, expected):
    assert to_unit(text, unit) == pytest.approx(expected)


@pytest.mark.parametrize("text", ["5x", "m", "-3m", "1e400h", "", "ten minutes", "1:30", "1:60:00"])
def test_a_malformed_duration_is_refused(text):
    with pytest.raises(ValueError, match="duration"):
        to_unit(text, "h")


def test_every_time_flag_and_field_reads_units(capsys):
    assert resolved(["--config", CARTPOLE, "--duration", "90m"]).run.duration == pytest.approx(1.5)
    assert resolved(["--config", CARTPOLE, "--duration", "2"]).run.duration == 2.0
    cfg = resolved(["--config", CARTPOLE, "--set", "run.duration=30m", "--set", "eval.interval_seconds=2m"])
    assert (cfg.run.duration, cfg.eval.interval_seconds) == (pytest.approx(0.5), 120.0)
    # Slurm's H:MM:SS, not YAML 1.1's base-60 number (1:30:00 would be 5400 hours)
    assert resolved(["--config", CARTPOLE, "--set", "run.duration=1:30:00"]).run.duration == pytest.approx(1.5)
    with pytest.raises(ConfigError, match="run.duration: expected a duration"):
        resolved(["--config", CARTPOLE, "--set", "run.duration=soon"])
    assert bench_parser("bench").parse_args(["learning", "--minutes", "90s"]).minutes == pytest.approx(1.5)
    assert bench_parser("bench").parse_args(["scaling", "--seconds", "2m"]).seconds == 120.0
    assert demo_parser("demo").parse_args(["--checkpoint", "x", "--seconds", "1m"]).seconds == 60.0
    with pytest.raises(SystemExit) as exit_:
        make_parser("train", parallel=False).parse_args(["--duration", "0s"])
    assert exit_.value.code == 2 and "positive duration" in capsys.readouterr().err


def test_help_shows_the_built_in_defaults(monkeypatch):
    monkeypatch.setenv("COLUMNS", "1000")  # one line per flag: argparse wraps at hyphens
    text = make_parser("train", parallel=True).format_help()
    for shown in ("built-in: 1.0 h", "built-in: starpilot", "built-in: 256", "built-in: 2)", "built-in: 8)"):
        assert shown in text, shown


def test_every_other_commands_help_shows_its_flags_defaults():
    """bench's subcommands, eval, demo, export and compare: each flag with a default says it as `default X` (a path
    under the repository as the relative one)."""
    import argparse

    from parallel_ppo.cli.compare import make_parser as compare_parser
    from parallel_ppo.cli.evaluation import eval_parser
    from parallel_ppo.cli.export import export_parser

    bench = next(a for a in bench_parser("b")._actions if isinstance(a, argparse._SubParsersAction)).choices
    parsers = [*bench.values(), eval_parser("e"), demo_parser("d"), export_parser("x"), compare_parser("c")]
    unsaid, none = [], (None, False, [], argparse.SUPPRESS)
    for action in (a for p in parsers for a in p._actions if a.help and a.default not in none):
        shown = action.default
        if isinstance(shown, float) and shown.is_integer():
            shown = int(shown)
        elif isinstance(shown, str) and Path(shown).is_absolute():
            shown = Path(shown).relative_to(ROOT)
        if not re.search(rf"\bdefault:? {re.escape(str(shown))}(?![\w.])", action.help):  # not an example's 8
            unsaid.append(f"{action.option_strings}: {action.default!r}")
    assert not unsaid


def test_total_steps_takes_a_count_as_set_does(capsys):
    """--total-steps 1e6 is a million, as --set run.total_steps=1e6 is; a fraction or a word is one line, status 2."""
    for text, steps in (("1e6", 1_000_000), ("2.5e5", 250_000), ("1_000", 1000), ("64", 64)):
        assert run_trainer(["--config", CARTPOLE, "--total-steps", text, "--print-config"], parallel=False,
                           prog="t") == 0
        assert yaml.safe_load(capsys.readouterr().out)["run"]["total_steps"] == steps
    for bad in ("1.5", "many", "inf", "1e300"):
        with pytest.raises(SystemExit) as exit_:
            run_trainer(["--config", CARTPOLE, "--total-steps", bad, "--print-config"], parallel=False, prog="t")
        assert exit_.value.code == 2 and "expected a whole number" in capsys.readouterr().err, bad


def test_print_config_prints_what_the_command_resolves_to_and_starts_nothing(tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["--config", CARTPOLE, "--num-envs", "6", "--duration", "10m", "--batch-size", "64",
            "--output-dir", str(out), "--print-config"]
    assert run_trainer(argv, parallel=True, prog="t") == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed == resolved(argv[:-1], parallel=True).to_dict()
    assert printed["parallel"]["num_envs_per_worker"] == 3 and printed["run"]["duration"] == pytest.approx(1 / 6)
    assert not out.exists()
    assert run_trainer(["--config", CARTPOLE, "--batch-size", "7", "--print-config"], parallel=False, prog="t") == 2
    assert capsys.readouterr().err.count("\n") == 1
    with pytest.raises(SystemExit) as exit_:  # argparse's refusal: an empty path is not the default run directory
        run_trainer(["--config", CARTPOLE, "--output-dir", "", "--print-config"], parallel=False, prog="t")
    assert exit_.value.code == 2 and "--output-dir: an empty path" in capsys.readouterr().err
    for bad in ("training.precision=tf32", "parallel.learner_threads=5000", "logging.return_window=10000000"):
        assert run_trainer(["--config", CARTPOLE, "--set", bad, "--device", "cpu", "--print-config"], parallel=True,
                           prog="t") == 2, bad  # refused as a run refuses it (tf32 on a CPU learner), not later
        assert capsys.readouterr().err.count("\n") == 1
    out.mkdir()
    (out / "summary.json").write_text("{}")  # a run's files: the run would be refused, and so is its config
    assert run_trainer(argv, parallel=True, prog="t") == 2
    assert capsys.readouterr().err == (f"t: error: {out} already holds a run's files but no checkpoint.pt (nothing to "
                                       "resume); pass --overwrite to replace them or choose another --output-dir\n")
    assert run_trainer([*argv, "--overwrite"], parallel=True, prog="t") == 0
    assert sorted(p.name for p in out.iterdir()) == ["summary.json"]


def test_under_torchrun_rank_0_alone_prints_the_config_or_its_refusal(monkeypatch, capsys):
    """Every rank checks --print-config and --seeds as rank 0 does, with the same status; only rank 0 prints. A rank
    torchrun started without --distributed is refused, not trained as a run of its own."""
    for name, value in {"LOCAL_RANK": "1", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
                        "MASTER_PORT": "29500"}.items():
        monkeypatch.setenv(name, value)
    for rank, printed in (("1", False), ("0", True)):
        monkeypatch.setenv("RANK", rank)
        assert run_trainer(["--config", CARTPOLE, "--distributed", "--print-config"], parallel=False, prog="t") == 0
        assert bool(capsys.readouterr().out) is printed
        assert run_trainer(["--config", CARTPOLE, "--distributed", "--batch-size", "7", "--print-config"],
                           parallel=False, prog="t") == 2
        assert capsys.readouterr().err.count("batch size 7") == printed
        assert run_trainer(["--config", CARTPOLE, "--distributed", "--seeds", "1,2"], parallel=False, prog="t") == 2
        assert capsys.readouterr().err.count("--seeds trains seeds one after another") == printed
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job")  # torchrun's: one of two ranks, started without --distributed
    refusal = ("t: error: this process is one of 2 ranks torchrun started, without --distributed: each rank would "
               "train a run of its own; add --distributed\n")
    for rank, printed in (("1", ""), ("0", refusal)):
        monkeypatch.setenv("RANK", rank)
        for extra in ([], ["--print-config"]):
            assert run_trainer(["--config", CARTPOLE, "--output-dir", "/nonexistent/run", *extra], parallel=False,
                               prog="t") == 2
            assert capsys.readouterr().err == printed


def test_a_ctrl_c_while_a_run_is_checked_or_torch_loads_is_one_line_and_status_130(tmp_path, monkeypatch, capsys):
    """Ctrl-C before the run's own handler is set (its checks, the training modules loading; --seeds' checks;
    --print-config's): one line, the shell's status for SIGINT, nothing written, no traceback."""
    from parallel_ppo.cli import train

    class Loading(ModuleType):  # a module that is still loading when the Ctrl-C comes
        def __getattr__(self, name: str) -> None:
            raise KeyboardInterrupt

    def interrupt(*args, **kwargs) -> None:
        raise KeyboardInterrupt

    out = tmp_path / "run"
    not_trained = "\nt: interrupted before the first update; nothing was trained\n"
    for module in ("parallel_ppo.launch", "parallel_ppo.core.evaluate"):
        monkeypatch.setitem(sys.modules, module, Loading(module))
    for extra, said in (([], not_trained), (["--print-config"], "\nt: interrupted; no config was printed\n")):
        assert run_trainer(["--config", CARTPOLE, "--output-dir", str(out), *extra], parallel=False, prog="t") == 130
        assert capsys.readouterr().err == said
    monkeypatch.setattr(train, "check_new_run", interrupt)  # a seed's run checked (gymnasium loading)
    assert run_trainer(["--config", CARTPOLE, "--output-dir", str(out), "--seeds", "1,2"], parallel=True,
                       prog="t") == 130
    assert capsys.readouterr().err == not_trained and not out.exists()


def test_parallel_num_envs_is_split_over_the_workers():
    cfg = resolved(["--config", CARTPOLE, "--num-workers", "4", "--num-envs", "16"], parallel=True)
    assert (cfg.parallel.num_workers, cfg.parallel.num_envs_per_worker, cfg.env.num_envs) == (4, 4, 16)
    with pytest.raises(ConfigError, match="must split evenly over the 4 workers"):
        resolved(["--config", CARTPOLE, "--num-workers", "4", "--num-envs", "6"], parallel=True)
    with pytest.raises(ConfigError, match="conflicts with the parallel layout"):
        resolved(["--config", CARTPOLE, "--num-envs", "6", "--num-envs-per-worker", "4"], parallel=True)
    with pytest.raises(ConfigError, match="conflicts with the parallel layout"):  # only the flag is split
        resolved(["--config", CARTPOLE, "--set", "env.num_envs=16"], parallel=True)


def test_levels_default_to_the_held_out_ones_where_there_are_some():
    procgen = resolved(["--env", "starpilot", "--num-envs", "2", "--batch-size", "8"]).env
    assert resolve_levels(procgen, "auto") == "test"
    assert eval_levels(procgen, "auto").start_level == procgen.start_level + procgen.num_levels
    for env in (resolved(["--config", CARTPOLE]).env, dataclasses.replace(procgen, num_levels=0),
                dataclasses.replace(procgen, distribution_mode="exploration")):
        assert resolve_levels(env, "auto") == "train" and eval_levels(env, "auto") == env
    cfg = resolved(["--config", CARTPOLE, "--set", "eval.interval_seconds=60"])
    assert cfg.eval.levels == "auto", "a gymnasium run evaluates on its own distribution by default"
    with pytest.raises(ConfigError, match="eval.levels=train"):
        resolved(["--config", CARTPOLE, "--set", "eval.interval_seconds=60", "--set", "eval.levels=test"])
