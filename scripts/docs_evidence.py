"""Every measured figure in README.md and docs/ comes from a committed evidence file, and says what that file says.

An evidence file is a JSON file under `docs/results/<machine>/` with the `machine` it ran on, the `date`, the
`commit` and the `command` that produced it, then `figures` (name → a number or a list of numbers) and `tables`
(name → `columns` and `rows` of cells, as shown).

- A figure in the text is a link to its evidence: `[1,639 ± 66](amd-epyc-2c/mujoco.json#halfcheetah)`. The
  numbers in the link's text are the file's `figures.halfcheetah`, in order, each rounded as the text shows it.
- A results table sits between `<!-- table FILE NAME -->` and `<!-- /table -->` and is the markdown that
  `table_markdown` makes of the file's `tables.NAME`.
- A number with a unit of measurement (×, SPS, steps/s, ms, GFLOP/s, %, minutes) outside such links and tables,
  code and comments is a figure without evidence, and is reported.

Kept runs under a `runs/` folder (`scripts/keep_runs.py`) are what compare_results reads, not evidence files.

`python scripts/docs_evidence.py` checks every page (exit 1, one line per problem); `--write` regenerates the
tables from their files first.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from parallel_ppo.core.files import read_evidence  # noqa: E402

REQUIRED = ("machine", "date", "commit", "command")
KINDS = ("avx512", "bf16")
"""What tells our machine kinds apart beyond the CPU's name (`fingerprint.cpu_kind`); a results folder names them."""
FIGURE_LINK = re.compile(r"\[([^\]]+)\]\(([^)\s#]+\.json)#([\w.-]+)\)")
TABLE_BLOCK = re.compile(r"(<!-- table (\S+) (\S+) -->\n)(.*?)(<!-- /table -->)", re.S)
NUMBER = re.compile(r"(?<![\d.])[-−]?(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?[kM]?")
"""A number as shown: an optional minus (a hyphen right after a digit is a range's dash), thousands separators in
threes, decimals, and a `k` or `M` suffix that scales it."""
NEVER = re.compile(r"\bnever\b", re.IGNORECASE)
"""How a link's text shows a null in its list of figures: a seed that never got there."""
UNITS = (r"(?:×(?!\s?\d)|x\b|SPS\b|steps/s\b|steps per second|samples/s\b|ms\b|GFLOP|[MG]B\b"
         r"|s\b|seconds?\b|mins?\b|minutes?\b|h\b|hours?\b"
         r"|%(?!\s(?:of the best|of the way|percentile|bootstrap|interval|confidence)))")
"""Units of measured figures (`84×84` and `8 × 128` are sizes; `80% of the way to the best return` and a `95%
interval` are definitions). A setting's value with a unit is written as code (`` `10 s` ``, `` `1h` ``), which the
check skips."""
UNLINKED = re.compile(r"(?<![\w.])[-−+±]?\d[\d,]*(?:\.\d+)?\s?" + UNITS + r"|±\s?\d[\d,]*(?:\.\d+)?")
GENERATED = re.compile(r".*_comparison\.md|study(-[\w.-]+)?\.md")
"""Pages that a benchmark writes whole in a machine's results folder (compare_results' reports, the many-core
study's `study[-<config>][-<env>].md`): evidence themselves."""


def pages(root: Path = ROOT) -> list[Path]:
    """README.md and every page under docs/ that a person wrote."""
    return [root / "README.md", *sorted(p for p in (root / "docs").rglob("*.md")
                                        if not (p.parent.parent.name == "results" and GENERATED.fullmatch(p.name)))]


def load_evidence(path: Path) -> dict[str, Any]:
    """An evidence file, checked for the fields every one must have (ValueError naming what is missing)."""
    data = read_evidence(path)
    missing = [key for key in REQUIRED if data.get(key) in (None, "", "unknown")]
    if missing:
        raise ValueError(f"{path.name} has no {', '.join(missing)}")
    return data


def numbers_in(text: str) -> list[tuple[float, int]]:
    """Each number in `text` with the count of decimals it shows (`1,640` → (1640.0, 0); `−0.5` → (-0.5, 1); `60k` →
    (60000.0, -3))."""
    return [shown for _, shown in _numbers_at(text)]


def _numbers_at(text: str) -> list[tuple[int, tuple[float, int]]]:
    found = []
    for match in NUMBER.finditer(text):
        token = match.group(0)
        if token[0] == "-" and match.start() > 0 and text[match.start() - 1].isdigit():
            token = token[1:]  # `1.05-1.10`: a range, not a negative number
        shift = {"k": 3, "M": 6}.get(token[-1], 0)  # `60k`: 60,000 to the nearest thousand
        plain = token.rstrip("kM").replace(",", "").replace("−", "-")
        decimals = len(plain.split(".")[1]) if "." in plain else 0
        found.append((match.start(), (float(plain) * 10**shift, decimals - shift)))
    return found


def figure_problem(text: str, value: Any) -> str | None:
    """Why the link text `text` does not show `value` (a number or a list of numbers), or None. A null in a list
    (a seed that never got there) is shown, in its place, by the word `never`."""
    values = value if isinstance(value, list) else [value]
    if not all((v is None and isinstance(value, list)) or (isinstance(v, (int, float)) and not isinstance(v, bool))
               for v in values):
        return f"its evidence is not a number or a list of numbers: {value!r}"
    nevers = [(m.start(), None) for m in NEVER.finditer(text)] if isinstance(value, list) else []
    shown = [figure for _, figure in sorted(_numbers_at(text) + nevers, key=lambda item: item[0])]
    if len(shown) != len(values):
        return f"shows {len(shown)} numbers where its evidence has {len(values)}: {values}"
    for figure, true in zip(shown, values, strict=True):
        if (figure is None) != (true is None):
            return f"shows {'never' if figure is None else f'{figure[0]:g}'} where its evidence has {true}"
        if figure is not None and abs(true - figure[0]) > 0.5 * 10 ** -figure[1] + 1e-9:
            return f"shows {figure[0]:g} where its evidence has {true:g}"
    return None


def cell(value: Any) -> str:
    """A table cell as shown: numbers with thousands separators, the rest as written."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return f"{value:,}"
    return str(value)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) or bool(re.fullmatch(r"[-−]?[\d,]+(\.\d+)?", str(value)))


def table_markdown(table: dict[str, Any]) -> str:
    """A markdown table of `columns` and `rows`; a column whose cells are all numbers is right-aligned."""
    columns, rows = table["columns"], table["rows"]
    numeric = [all(_is_number(r[i]) for r in rows) for i in range(len(columns))]
    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---:" if n else "---" for n in numeric) + "|"]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def _evidence(page: Path, target: str, cache: dict[Path, dict[str, Any]]) -> dict[str, Any]:
    path = (page.parent / target).resolve()
    if path not in cache:
        if not path.is_file():
            raise ValueError(f"no evidence file {target}")
        cache[path] = load_evidence(path)
    return cache[path]


def _unlinked(text: str) -> list[str]:
    """The figures with a unit left once links to evidence, tables, code and comments are taken out."""
    text = TABLE_BLOCK.sub("", text)
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    text = re.sub(r"<!--.*?-->", "", text, flags=re.S)
    text = re.sub(r"`[^`\n]*`", "", text)
    text = FIGURE_LINK.sub("", text)
    return [m.group(0).strip() for m in UNLINKED.finditer(text)]


def check_page(page: Path, write: bool = False, root: Path = ROOT) -> list[str]:
    """The problems of one page: figures that differ from their evidence, stale tables, figures without evidence.
    With `write`, stale tables are regenerated in place first."""
    name = page.relative_to(root)
    text = page.read_text()
    cache: dict[Path, dict[str, Any]] = {}
    problems = []

    def regenerate(match: re.Match[str]) -> str:
        try:
            table = _evidence(page, match.group(2), cache).get("tables", {})[match.group(3)]
        except (ValueError, KeyError) as error:
            problems.append(f"{name}: table {match.group(2)} {match.group(3)}: {error}")
            return match.group(0)
        made = table_markdown(table)
        if made != match.group(4) and not write:
            problems.append(f"{name}: table {match.group(3)} differs from {match.group(2)} (run with --write)")
        return match.group(1) + made + match.group(5)

    new_text = TABLE_BLOCK.sub(regenerate, text)
    if write and new_text != text:
        page.write_text(new_text)
    for match in FIGURE_LINK.finditer(text):
        shown, target, key = match.groups()
        try:
            figures = _evidence(page, target, cache).get("figures", {})
        except ValueError as error:
            problems.append(f"{name}: [{shown}]: {error}")
            continue
        problem = figure_problem(shown, figures[key]) if key in figures else f"{target} has no figure {key}"
        if problem:
            problems.append(f"{name}: [{shown}]({target}#{key}) {problem}")
    problems += [f"{name}: '{figure}' has no evidence (link it to its file, or remove it)"
                 for figure in _unlinked(text)]
    return problems


def check_evidence_files(root: Path = ROOT) -> list[str]:
    """Every JSON file under docs/results/ has the fields every evidence file must have (the study's too), and the
    CPU kind it records (`cpu_kind`, as `fingerprint.cpu_kind` gives it) is the one its folder names
    (`amd-epyc-avx512-bf16-2c`: AVX-512 and native bf16; `amd-epyc-2c`: neither). Kept runs, under a `runs/`
    folder (`scripts/keep_runs.py`), are what compare_results reads, not evidence files."""
    problems = []
    results = root / "docs" / "results"
    for path in sorted(p for p in results.rglob("*.json") if "runs" not in p.relative_to(results).parts[:-1]):
        try:
            data = load_evidence(path)
        except ValueError as error:
            problems.append(f"{path.parent.relative_to(root)}/{error}")
            continue
        kind = data.get("cpu_kind", data.get("hardware", {}).get("cpu_kind"))
        folder = [part for part in path.parent.name.split("-") if part in KINDS]
        if kind != folder:
            problems.append(f"{path.relative_to(root)}: its cpu_kind is {kind}, its folder's {folder}")
    return problems


def main(argv: list[str]) -> int:
    write = "--write" in argv
    problems = check_evidence_files() + [p for page in pages() for p in check_page(page, write)]
    if write:
        problems = [p for p in problems if "(run with --write)" not in p]
    for problem in problems:
        print(problem)
    verdict = f"{len(problems)} problems" if problems else "every figure has its evidence"
    print(f"{len(pages())} pages checked: {verdict}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
