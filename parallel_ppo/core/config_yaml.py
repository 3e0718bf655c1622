"""Config files as YAML: plain data only, YAML 1.2's scalars (010 is ten), and a key given twice refused (YAML would
keep the last silently); `--set` items, their values read as YAML; and the env a config file and its items train, read
without building the config. No torch."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import yaml

from parallel_ppo.envs.config import EnvConfig
from parallel_ppo.errors import ConfigError


class DuplicateKey(yaml.constructor.ConstructorError):
    """A mapping that gives a key twice."""


class _YamlLoader(yaml.SafeLoader):
    """SafeLoader with YAML 1.2 scalars: only true/false are booleans (`progress: off` stays the string
    "off") and numbers with an exponent but no point (`3e-4`, `1e5`) are numbers, not strings. A mapping that
    gives a key twice is a DuplicateKey (keys a merge `<<` brings in may be overridden, as YAML means them)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node)
            if key in seen:
                raise DuplicateKey(None, None, f"the key {key!r} is given twice (lines {seen[key]} and "
                                               f"{key_node.start_mark.line + 1})", key_node.start_mark)
            seen[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep)


_NUMBERS_AND_BOOLS = ("tag:yaml.org,2002:bool", "tag:yaml.org,2002:int", "tag:yaml.org,2002:float")
_YamlLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag not in _NUMBERS_AND_BOOLS]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
# YAML 1.2's integers: decimal with or without leading zeros (010 is ten, as --seed 010 is, not YAML 1.1's octal
# eight), 0o octal, 0x hex (and 0b binary); no base-60 ones, so that a Slurm time such as 1:30:00 stays text (a
# duration), not 5400
_YamlLoader.add_implicit_resolver(
    "tag:yaml.org,2002:int",
    re.compile(r"^[-+]?(?:0b[01][01_]*|0o[0-7][0-7_]*|[0-9][0-9_]*|0x[0-9a-fA-F][0-9a-fA-F_]*)$"),
    list("-+0123456789"))


def _construct_int(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> int:
    """An integer the resolver above matched, read as YAML 1.2 reads it."""
    text = str(loader.construct_scalar(node)).replace("_", "")
    digits = text.lstrip("+-")
    base = {"0b": 2, "0o": 8, "0x": 16}.get(digits[:2].lower(), 10)
    try:
        return (-1 if text.startswith("-") else 1) * int(digits[2:] if base != 10 else digits, base)
    except ValueError:  # a tagged one (!!int abc)
        raise yaml.constructor.ConstructorError(None, None, f"{text!r} is not an integer", node.start_mark) from None


_YamlLoader.add_constructor("tag:yaml.org,2002:int", _construct_int)
_YamlLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+][0-9]+)?|\.[0-9][0-9_]*(?:[eE][-+][0-9]+)?"
               r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"), list("-+0123456789."))
_YamlLoader.add_implicit_resolver("tag:yaml.org,2002:bool",
                                  re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF"))
_YamlLoader.add_implicit_resolver("tag:yaml.org,2002:float",
                                  re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
                                  list("-+0123456789."))


class _YamlDumper(yaml.SafeDumper):
    """SafeDumper that quotes every string the loader above or YAML 1.1's (PyYAML's `safe_load`) would read as
    something else (08, 1e5, TRUE, off), so that a config written is read back as it was, here and by other tools."""


_OURS, _YAML_1_1 = _YamlLoader.yaml_implicit_resolvers, yaml.SafeLoader.yaml_implicit_resolvers
_YamlDumper.yaml_implicit_resolvers = {first: [*_OURS.get(first, []), *_YAML_1_1.get(first, [])]
                                       for first in {*_OURS, *_YAML_1_1}}


def dump_yaml(data: Any) -> str:
    """`data` as YAML text that `parse_yaml` reads back the same (keys in their order)."""
    return yaml.dump(data, Dumper=_YamlDumper, sort_keys=False)


def parse_yaml(text: str) -> Any:
    """`text` as YAML data (the loader above: a SafeLoader subclass, plain data only)."""
    return yaml.load(text, Loader=_YamlLoader)


def load_yaml(path: str | os.PathLike) -> dict[str, Any]:
    """Read a config file into nested dicts; missing, unreadable or malformed files are ConfigErrors."""
    p = Path(path)
    if p.is_dir():
        raise ConfigError(f"config file {p} is a directory; give the YAML file in it")
    if not p.is_file():
        raise ConfigError(f"config file {p} is not a regular file" if p.exists() else f"config file not found: {p}")
    try:
        data = parse_yaml(p.read_text())
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"cannot read config file {p}: {e}") from None
    except DuplicateKey as e:
        raise ConfigError(f"config file {p}: {e.problem}") from None
    except yaml.YAMLError as e:
        where = getattr(e, "problem_mark", None)
        at = f" at line {where.line + 1}" if where is not None else ""
        raise ConfigError(f"config file {p} is not valid YAML{at}") from None
    except RecursionError:
        raise ConfigError(f"config file {p} is nested too deeply to be a config") from None
    if data is None:
        raise ConfigError(f"config file {p} is empty")
    if not isinstance(data, dict):
        raise ConfigError(f"config file {p} must be a mapping of sections (env, parallel, training, ...)")
    return data


def parse_set(item: str) -> tuple[str, Any]:
    """Split `section.key=value`; the value is read as YAML (so 64, 3e-4, true and [16, 32] work)."""
    key, eq, raw = item.partition("=")
    if not eq or not key.strip():
        raise ConfigError(f"a setting must be given as section.key=value, got {item!r}")
    return key.strip(), yaml_value(raw) if raw.strip() else ""


def yaml_value(text: str) -> Any:
    """`text` read as YAML, or `text` itself where it is not valid YAML (`[a,b`)."""
    try:
        return parse_yaml(text)
    except (yaml.YAMLError, RecursionError):
        return text


def set_keys(sets: Iterable[str]) -> set[str]:
    """The keys that `section.key=value` items set."""
    return {item.partition("=")[0].strip() for item in sets}


def given_env(env: str | None, sets: Sequence[str]) -> str | None:
    """The env id an `--env` flag and `--set` items give (the last `env.id` item, which overrides the flag, as in
    build_config); None where they give none."""
    ids = [str(value) for key, value in map(parse_set, sets) if key == "env.id"]
    return ids[-1] if ids else env


def config_env(config: str | os.PathLike, sets: Sequence[str] = (), env: str | None = None) -> str:
    """The env id config file `config` trains with `--env env` and `--set` items `sets`, read without checking the
    rest (a run's own check does that): theirs (`given_env`), else the file's `env.id`, else the default env."""
    if given := given_env(env, sets):
        return given
    section = load_yaml(config).get("env")
    return str((section.get("id") if isinstance(section, dict) else None) or EnvConfig().id)
