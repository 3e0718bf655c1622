"""The package's shape holds by test, not by care: no import cycle, each layer imports only the layers below it
(the envs nothing of the training core, the training core nothing of the engines, the run analysis, the benchmarks
or the command lines), no module over 400 lines, no function over 50, entry scripts that stay thin."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "parallel_ppo"
LAYERS = {  # subpackage → the subpackages (besides itself and parallel_ppo.errors) it may import
    "envs": (),
    "core": ("envs",),
    "engines": ("envs", "core"),
    "runs": ("envs", "core"),
    "tuning": ("envs", "core", "runs"),
    "bench": ("envs", "core", "engines", "runs", "tuning"),
    "request": ("envs", "core", "runs"),
    "launch": ("envs", "core", "engines", "runs", "tuning", "request"),
    "api": ("envs", "core", "engines", "runs", "tuning", "request", "launch"),
    "cli": ("envs", "core", "engines", "runs", "tuning", "bench", "request", "launch", "api"),
}
"""The envs (their config section, spaces, families and simulators) are the lowest layer: the core trains on them
and they know nothing of it. Training (envs, core, engines, runs, tuning, request, launch, api) never imports the
benchmarks, and the run directory's code (runs) no engine: what a run measures before it starts is `tuning`,
below both launch and bench. A request and its first checks (`request`) load no torch."""


def _module_name(path: Path, package: Path) -> str:
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(package: Path = PACKAGE) -> dict[str, set[str]]:
    """Module → the package's modules it imports (anywhere in it, function-level imports too)."""
    modules = {_module_name(p, package): p for p in package.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found |= {node.module, *(f"{node.module}.{a.name}" for a in node.names)}
        graph[name] = {m for m in found if m in modules and m != name}
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of `graph` as a path (first module repeated at the end), or None."""
    state: dict[str, str] = {}

    def visit(module: str, path: list[str]) -> list[str] | None:
        state[module] = "open"
        for dep in sorted(graph[module]):
            if state.get(dep) == "open":
                return [*path, module, dep]
            if dep not in state and (found := visit(dep, [*path, module])):
                return found
        state[module] = "done"
        return None

    return next((c for m in sorted(graph) if m not in state and (c := visit(m, []))), None)


def test_the_import_graph_has_no_cycle():
    cycle = _cycle(_imports())
    assert cycle is None, "import cycle: " + " → ".join(cycle or [])


def _layer(module: str) -> str:
    return module.split(".")[1] if module.count(".") else ""


def test_each_layer_imports_only_the_layers_below_it():
    """The core trains (config, envs, model, buffer, PPO, collection, the loop) knowing nothing of processes,
    run directories, reports, benchmarks or flags; nothing below the command lines imports them."""
    bad = []
    for module, deps in _imports().items():
        layer = _layer(module)
        if layer not in LAYERS:
            continue
        allowed = {layer, "errors", *LAYERS[layer]}
        bad += [f"{module} → {d}" for d in sorted(deps) if _layer(d) not in allowed]
    assert not bad, bad


def test_training_imports_no_benchmark_and_runs_no_engine():
    """The two rules of the layers spelled out (issue 37), checked on the import graph itself."""
    graph = _imports()
    training = [m for m in graph if _layer(m) in ("envs", "core", "engines", "runs", "tuning", "request", "launch",
                                                  "api")]
    assert [f"{m} → {d}" for m in training for d in sorted(graph[m]) if _layer(d) == "bench"] == []
    runs = [m for m in graph if _layer(m) == "runs"]
    assert [f"{m} → {d}" for m in runs for d in sorted(graph[m]) if _layer(d) == "engines"] == []
    assert "parallel_ppo.bench.roofline" in graph["parallel_ppo.cli.bench"]  # the graph sees these imports at all


def test_no_module_is_longer_than_400_lines():
    long = [f"{p.relative_to(ROOT)} ({n} lines)" for p in sorted(PACKAGE.rglob("*.py"))
            if (n := len(p.read_text().splitlines())) > 400]
    assert not long, long


def test_a_cycle_would_be_found(tmp_path):
    """The check itself can fail: modules that import each other (one inside a function) are a cycle."""
    pkg = tmp_path / "parallel_ppo"
    pkg.mkdir()
    (pkg / "a.py").write_text("from parallel_ppo.b import x\n")
    (pkg / "b.py").write_text("def f():\n    from parallel_ppo import a\n")
    (pkg / "c.py").write_text("import parallel_ppo.a\n")
    assert _cycle(_imports(pkg)) == ["parallel_ppo.a", "parallel_ppo.b", "parallel_ppo.a"]


def test_no_function_is_longer_than_50_lines():
    long = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > 50:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({lines} lines)")
    assert not long, long


def test_entry_scripts_stay_thin():
    for path in sorted(ROOT.glob("*.py")):
        assert len(path.read_text().splitlines()) < 30, path.name


def test_reading_and_reporting_runs_needs_no_torch():
    """compare_results.py's modules and the atomic file helpers load without torch (fast errors, light imports)."""
    code = ("import sys, parallel_ppo.runs.report.numbers, parallel_ppo.runs.report.text, "
            "parallel_ppo.runs.report.plots, parallel_ppo.runs.report.make, parallel_ppo.runs.reading, "
            "parallel_ppo.core.files, parallel_ppo.cli.compare; "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "False"


def test_a_refused_command_says_so_before_torch_loads(tmp_path):
    """A trainer's refused setting or taken run directory, and a benchmark's refused flags, are one line and exit 2
    without importing torch (its import costs seconds: a typo should not)."""
    code = ("import sys\nfrom parallel_ppo.cli import main\ntry:\n    status = main(sys.argv[1:])\n"
            "except SystemExit as e:  # a flag argparse refused\n    status = e.code\n"
            "print(status, 'torch' in sys.modules, file=sys.stderr)")
    (tmp_path / "summary.json").write_text("{}")  # an earlier run's file: the directory is taken
    commands = [["train", "--env", "CartPole-v1", "--set", "training.batch_size=0"],
                ["train-parallel", "--env", "CartPole-v1", "--set", "parallel.num_workers=-1"],
                ["train", "--env", "CartPole-v1", "--output-dir", str(tmp_path)],
                ["bench", "learning", "--minutes", "8d"],
                ["bench", "learning", "--seeds", "1,1", "--minutes", "1s", "--output-dir", str(tmp_path / "bench")],
                ["bench", "scaling", "--config", "config/cartpole.yaml", "--set", "training.batch_size=0"],
                ["bench", "study", "--config", "config/cartpole.yaml", "--set", "training.batch_size=0"]]
    for argv in commands:
        out = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, cwd=ROOT,
                             timeout=60)
        *lines, last = out.stderr.strip().splitlines()
        assert last == "2 False" and len(lines) == 1 and ": error: " in lines[0], (argv, out.stderr)


def trainer_flags() -> set[str]:
    """The option strings of both trainers' parsers (but --help)."""
    from parallel_ppo.cli.train import make_parser

    return {option for parallel in (False, True) for option in make_parser("train", parallel)._option_string_actions
            if option.startswith("--") and option != "--help"}


def flags_in_strings(source: str, flags: set[str]) -> list[str]:
    """The flags that the string literals of `source` name, docstrings and comments aside (what is documented for
    a reader, not said to a user by the code)."""
    tree = ast.parse(source)
    docstrings = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            found += [flag for flag in sorted(flags) if re.search(rf"(?<![\w-]){flag}(?![\w-])", node.value)]
    return found


def test_the_core_names_no_flag_of_the_command_lines():
    """The core and the envs name config keys (`training.batch_size`); only the command lines know their flags and
    add them to the keys of an error (`cli.flags.with_flags`)."""
    flags = trainer_flags()
    assert {"--batch-size", "--env", "--track", "--set", "--distributed"} <= flags
    found = {f"{path.parent.name}/{path.name}": names
             for path in sorted([*(PACKAGE / "core").glob("*.py"), *(PACKAGE / "envs").glob("*.py")])
             if (names := flags_in_strings(path.read_text(), flags))}
    assert not found


def test_the_flag_search_finds_a_flag_in_a_message():
    """The search above can fail: it finds a flag in a message, f-strings too, but not in a comment or a
    docstring."""
    source = '''def f(batch):
    """Set --batch-size to fix it."""
    # --batch-size in a comment
    raise ValueError(f"batch size {batch}: set --batch-size to 8 or --env CartPole-v1")
'''
    assert flags_in_strings(source, trainer_flags()) == ["--batch-size", "--env"]
