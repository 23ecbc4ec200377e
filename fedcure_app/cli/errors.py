"""User errors of the ``fedcure`` commands, in the words the user wrote.

The configuration schema (:mod:`fedcure_app.config`) checks every knob, but it names fields as
the schema does (``run.global_rounds``). This module is the one place that maps a schema field to
what the user typed:

- :data:`FLAGS`: flat configuration key (``global-rounds``) → the command-line option that sets it
  (``--rounds``), shared by every ``fedcure`` sub-command that has the option;
- a configuration file's keys are shown as ``FILE: [section] key`` with the hyphenated spelling
  the documentation uses (the spelling written in the file when the file itself is at fault);
- a field nobody set is shown as ``key (default V)``, with the option that would set it.

:class:`Origin` records where one command line's values came from; :func:`explain` turns a
:class:`~fedcure_app.config.ConfigError` into one line in those words, and :func:`checked_config`
applies a command's options to the schema and raises :class:`UsageError` (exit code 2) with that
line. :class:`HelpFormatter` makes every ``--help`` page show the defaults.
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedcure_app.config import ConfigError, FedCureConfig, apply_flat, flat_keys
from fedcure_app.errors import ArgumentParser, HelpFormatter, UsageError  # shared with the roles

#: Flat configuration key -> the ``fedcure`` option that sets it (every command that has the
#: option spells it this way).
FLAGS: dict[str, str] = {
    "dataset": "--dataset",
    "data-dir": "--data-dir",
    "partition": "--partition",
    "dirichlet-alpha": "--alpha",
    "shards-per-client": "--shards-per-client",
    "classes-per-edge": "--classes-per-edge",
    "global-rounds": "--rounds",
    "num-clients": "--clients",
    "num-edges": "--edges",
    "num-classes": "--classes",
    "executor": "--executor",
    "seed": "--seed",
    "eval-every": "--eval-every",
    "tau-c": "--tau-c",
    "tau-e": "--tau-e",
    "max-concurrent": "--max-concurrent",
    "lr": "--lr",
    "batch-size": "--batch-size",
    "momentum": "--momentum",
    "tau-c-unit": "--tau-c-unit",
    "ell": "--ell",
    "beta": "--beta",
    "formation": "--formation",
    "scheduler": "--scheduler",
    "deadline-min-s": "--deadline-min",
    "max-client-weight": "--max-client-weight",
}


def flag_of(dest: str) -> str:
    """The option string of an argparse ``dest`` (``data_dir`` → ``--data-dir``)."""
    return "--" + dest.replace("_", "-")


@dataclass
class Origin:
    """Where the values of one command line came from.

    ``flags``: flat key → option the user gave it with; ``file``: the ``--config`` file (None
    without one) and ``file_keys`` the flat keys it sets; ``command_flags``: flat key → option
    of this command that could set it (to say how to change a default).
    """

    flags: dict[str, str] = field(default_factory=dict)
    file: str | None = None
    file_keys: set[str] = field(default_factory=set)
    command_flags: dict[str, str] = field(default_factory=dict)
    defaults: FedCureConfig = field(default_factory=FedCureConfig)

    def name(self, key: str) -> str:
        """How to call flat key ``key`` in a message to this user."""
        key = key.replace("_", "-")
        if key in self.flags:
            return self.flags[key]
        section = flat_keys().get(key, ("", ""))[0]
        if self.file and key in self.file_keys:
            return f"{self.file}: [{section}] {key}"
        how = self.command_flags.get(key)
        value = _default(self.defaults, key)
        shown = f"default {value}" if value is not None else "default"
        return f"{key} ({shown}{'; set it with ' + how if how else ''})"


def _default(cfg: FedCureConfig, key: str) -> Any:
    try:
        section, name = flat_keys()[key]
    except KeyError:
        return None
    return getattr(getattr(cfg, section), name)


def _what(issue: dict[str, Any]) -> str:
    """Pydantic's complaint as a short predicate (``must be >= 1``)."""
    kind, ctx = issue.get("type", ""), issue.get("ctx") or {}
    if kind == "greater_than_equal":
        return f"must be >= {ctx.get('ge')}"
    if kind == "greater_than":
        return f"must be > {ctx.get('gt')}"
    if kind == "less_than_equal":
        return f"must be <= {ctx.get('le')}"
    if kind == "less_than":
        return f"must be < {ctx.get('lt')}"
    if kind == "literal_error":
        return f"must be one of {ctx.get('expected')}"
    if kind.startswith("int_"):
        return "must be a whole number"
    if kind.startswith("float_"):
        return "must be a number"
    if kind.startswith("bool_"):
        return "must be true or false"
    if kind.startswith("string_"):
        return "must be a string"
    if kind == "extra_forbidden":
        return "is not a configuration key"
    msg = str(issue.get("msg", "is invalid"))
    return msg[:1].lower() + msg[1:]


_SNAKE_FIELDS = sorted({name for _, name in flat_keys().values() if "_" in name},
                       key=len, reverse=True)
_FIELD_RE = re.compile(r"\b(" + "|".join(map(re.escape, _SNAKE_FIELDS)) + r")\b")


def _rename_fields(text: str, origin: Origin) -> str:
    """Replace schema field names (``num_edges``) in a validator's message by the user's."""
    return _FIELD_RE.sub(lambda m: origin.name(m.group(1)), text)


def _suggest(word: str, choices: list[str]) -> str:
    near = difflib.get_close_matches(word.replace("_", "-"), choices, n=1)
    return f" (did you mean {near[0]}?)" if near else ""


def _not_a_section(path: str, word: str, sections: list[str]) -> str:
    """``[word] is not a section``: a key of some section written at the top level is told
    where it belongs, anything else gets the nearest section's name and the list."""
    home = flat_keys().get(word.replace("_", "-"))
    if home is not None:
        key = word.replace("_", "-")
        return (f"{path}: {word} is a key of [{home[0]}], not a section: write it under "
                f"[{home[0]}] ([{home[0]}] {key} = ...)")
    return (f"{path}: [{word}] is not a section{_suggest(word, sections)}; "
            f"sections: {', '.join(sections)}")


def _not_a_key(path: str, section: str, word: str) -> str:
    """``[section] word`` is not a key there: the section it belongs to when it has one, else
    the nearest key of ``section``."""
    keys = flat_keys()
    home = keys.get(word.replace("_", "-"))
    if home is not None and home[0] != section:
        return (f"{path}: [{section}] {word} is not a key of [{section}] but of [{home[0]}]: "
                f"move it under [{home[0]}]")
    known = [k for k, (s, _) in keys.items() if s == section]
    return f"{path}: [{section}] {word} is not a key of [{section}]{_suggest(word, known)}"


def _got(issue: dict[str, Any]) -> str:
    value = issue.get("input")
    if isinstance(value, (dict, list)) or value is None:
        return ""
    return f" (got {value!r})"


def explain(err: ConfigError, origin: Origin) -> str:
    """``err`` as one line naming each field the way ``origin`` says the user wrote it."""
    if not err.issues:
        return _rename_fields(str(err).splitlines()[0] if str(err) else "invalid input", origin)
    sections = list(FedCureConfig.model_fields)
    parts = []
    for issue in err.issues:
        loc = [str(x) for x in issue.get("loc", ())]
        kind = issue.get("type", "")
        if len(loc) == 2:
            key = loc[1].replace("_", "-")
            parts.append(f"{origin.name(key)} {_what(issue)}{_got(issue)}")
        elif len(loc) == 1 and kind == "extra_forbidden":
            parts.append(_not_a_section(origin.file or "configuration", loc[0], sections))
        else:  # a check across fields: its message names them
            msg = str(issue.get("msg", "invalid configuration")).removeprefix("Value error, ")
            parts.append(_rename_fields(msg, origin))
    return "; ".join(parts)


def explain_file(err: ConfigError, path: str) -> str:
    """An error in configuration file ``path`` itself: ``FILE: [section] key must be ...``."""
    if not err.issues:
        return str(err)
    sections = list(FedCureConfig.model_fields)
    parts = []
    for issue in err.issues:
        loc = [str(x) for x in issue.get("loc", ())]
        kind = issue.get("type", "")
        if len(loc) == 2 and kind == "extra_forbidden":
            parts.append(_not_a_key(path, loc[0], loc[1]))
        elif len(loc) == 2:
            parts.append(f"{path}: [{loc[0]}] {loc[1]} {_what(issue)}{_got(issue)}")
        elif len(loc) == 1 and kind == "extra_forbidden":
            parts.append(_not_a_section(path, loc[0], sections))
        else:
            msg = str(issue.get("msg", "invalid configuration")).removeprefix("Value error, ")
            renamed = _FIELD_RE.sub(lambda m: m.group(1).replace("_", "-"), msg)
            parts.append(f"{path}: {renamed}")
    return "; ".join(parts)


def load_file(path: str) -> FedCureConfig:
    """``--config`` file ``path`` as a configuration; :class:`UsageError` in its own words."""
    from fedcure_app.config import load_config

    try:
        return load_config(path)
    except ConfigError as err:
        if not err.issues:
            raise UsageError(f"--config {path}: {err}") from None
        raise UsageError(explain_file(err, path)) from None


def checked_config(
    args: argparse.Namespace,
    options: dict[str, str],
    extra: dict[str, Any] | None = None,
    extra_flags: dict[str, str] | None = None,
) -> FedCureConfig:
    """The configuration of a command line: ``--config`` file (if any), then the ``--method``
    preset, then the options given (``options``: argparse dest → flat key) and ``extra`` (flat
    key → value, named by ``extra_flags`` in errors); ``formation``/``scheduler`` go last so
    that they override the preset's. Raises :class:`UsageError` naming what the user wrote."""
    path = getattr(args, "config", None)
    cfg = load_file(path) if path else FedCureConfig()
    origin = Origin(file=path, command_flags={k: flag_of(d) for d, k in options.items()})
    if path:
        origin.file_keys = {k for k, (s, n) in flat_keys().items()
                            if n in getattr(cfg, s).model_fields_set}
    flat: dict[str, Any] = {}
    for key, value in (extra or {}).items():
        flat[key] = value
        if extra_flags and key in extra_flags:
            origin.flags[key] = extra_flags[key]
    for dest, key in options.items():
        value = getattr(args, dest, None)
        if value is not None:
            flat[key] = value
            origin.flags[key] = flag_of(dest)
    late = {k: flat.pop(k) for k in ("formation", "scheduler") if k in flat}
    if getattr(args, "method", None):
        flat["method"] = args.method
    try:
        cfg = apply_flat(cfg, flat)
        return apply_flat(cfg, late) if late else cfg
    except ConfigError as err:
        raise UsageError(explain(err, origin)) from None


def check_dataset(name: str, data_dir: str | None, flag: str = "--data-dir") -> None:
    """Raise :class:`UsageError` when dataset ``name``'s files are not under ``data_dir``
    (cheap: locates the files, reads none). The bundled ``digits`` always passes; with a
    ``data_dir`` it prints one warning line saying the folder is not used."""
    from fedcure_app.data.errors import DatasetError
    from fedcure_app.data.loader import locate_source, unused_data_dir
    from fedcure_app.data.specs import canonical_name

    if canonical_name(name) == "digits":
        note = unused_data_dir(name, data_dir, flag)
        if note:
            print(f"fedcure: warning: {note}", file=sys.stderr)
        return
    try:
        locate_source(name, data_dir)
    except DatasetError as err:
        where = f"{flag} {data_dir}" if data_dir else f"{flag} (not given)"
        raise UsageError(f"{where}: {err}") from None


def check_new_file(path: str | Path, flag: str) -> None:
    """Raise :class:`UsageError` when output ``path`` cannot be created (its folder is a file,
    or it is a folder itself); creates nothing."""
    p = Path(path)
    if p.is_dir():
        raise UsageError(f"{flag} {p}: is a folder, expected a file name")
    for parent in p.parents:
        if parent.exists():
            if not parent.is_dir():
                raise UsageError(f"{flag} {p}: {parent} is a file, not a folder")
            break


def check_out_dir(path: str | Path, flag: str = "--out") -> None:
    """Raise :class:`UsageError` when folder ``path`` cannot be created; creates nothing."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise UsageError(f"{flag} {p}: is a file, expected a folder")
    for parent in p.parents:
        if parent.exists():
            if not parent.is_dir():
                raise UsageError(f"{flag} {p}: {parent} is a file, not a folder")
            break


def at_least(args: argparse.Namespace, dest: str, low: float, *, strict: bool = False,
             none_ok: bool = True) -> None:
    """Raise :class:`UsageError` unless option ``dest`` is >= ``low`` (> with ``strict``)."""
    value = getattr(args, dest, None)
    if value is None and none_ok:
        return
    bad = value is None or (value <= low if strict else value < low)
    if bad:
        raise UsageError(f"{flag_of(dest)} must be {'>' if strict else '>='} {low:g}"
                         f" (got {value!r})")


class Parser(ArgumentParser):
    """The ``fedcure`` parser: :class:`HelpFormatter` and one-line errors naming the option,
    with a pointer to ``--help`` (its sub-command parsers inherit both)."""


def config_defaults_help(parser: argparse.ArgumentParser, options: dict[str, str]) -> None:
    """Append the schema's default to the help of every option in ``options`` (dest → flat key)
    whose own default is None (the value then comes from the configuration)."""
    defaults = FedCureConfig()
    for action in parser._actions:
        key = options.get(action.dest)
        if key is None or action.default is not None or action.required:
            continue
        value = _default(defaults, key)
        if key == "max-concurrent" and value is None:
            value = "⌈M/2⌉"
        if value is None:
            continue
        text = action.help or ""
        if "default" not in text.lower():
            action.help = f"{text} (default: {value})".lstrip().replace("%", "%%")


__all__ = [
    "FLAGS", "HelpFormatter", "Origin", "Parser", "UsageError", "at_least", "check_dataset",
    "check_new_file", "check_out_dir", "checked_config", "config_defaults_help", "explain",
    "explain_file", "flag_of", "load_file",
]
