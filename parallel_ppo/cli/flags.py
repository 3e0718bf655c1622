"""The trainers' flags that set config fields, and the config keys of an error message named with them. A field
whose rules say the command line sets it (`Rules.command_line`) has the flag `--` + its key with `-` for `_`, but
for the few named in RENAMED; the core names config keys only."""

from __future__ import annotations

import re

from parallel_ppo.core.config import config_fields, rules_of

RENAMED = {"env.id": "--env", "tracking.wandb": "--track", "tracking.project": "--wandb-project",
           "tracking.entity": "--wandb-entity", "tracking.group": "--wandb-group", "tracking.tags": "--wandb-tags"}
"""The flags that are not `--` + their field's key."""


def flag_of(key: str) -> str:
    """The flag of config field `section.key` (whether the trainers have it or not)."""
    return RENAMED.get(key, "--" + key.partition(".")[2].replace("_", "-"))


FLAGS = {key: flag_of(key) for key, f in config_fields() if rules_of(f).command_line}
"""Config fields that the trainers' command lines also set, with their flags."""


def with_flags(message: str) -> str:
    """`message` with the flag of each config key it names added at the key's first mention, as
    `training.batch_size (--batch-size)`: what a command line's user fixes. A key already followed by a flag, or
    written as `key=value`, is left as it is."""
    for key, flag in FLAGS.items():
        mention = rf"(?<![\w./-]){re.escape(key)}(?![\w=]| \(--)"
        message = re.sub(mention, f"{key} ({flag})", message, count=1)
    return message
