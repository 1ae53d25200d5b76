"""Which settings decide a record's bytes, split and label: declared once, on the configs.

Each config field carries a :class:`Setting`; the resume key, ``imagerecords.json``'s
values and what the dry run and summary print derive from it. Pure.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from beam_pipeline.core.text import printable

_KEY = "imagerecords.setting"


@dataclasses.dataclass(frozen=True)
class Setting:
    """How one config field (or one part of it) is treated.

    Attributes:
        decides: It decides a record's bytes, split or label: part of the
            resume key, compared for equality.
        name: Its name in the resume key, in messages and on the command line
            (``--name``); None for a field that has no name of its own.
        info: Where imagerecords.json records it (``"image.size"``,
            ``"config.min_shards"``, ``"seed"``), or None.
        value: Its value, from the config that holds the field (default: the
            field's value).
        why: For a setting that does not decide: why a resumed run may change it.
        limit: A time limit that decides only which images are given up on
            (a transient rejection, retried on resume): part of the resume
            key, but a rerun may raise it; lowering it could keep records that
            the new limit would have rejected, so that is refused.
        nested: The field is itself a config (of this class) whose fields are declared.
    """

    decides: bool
    name: str | None = None
    info: str | None = None
    value: Callable[[Any], object] | None = None
    why: str = ""
    limit: bool = False
    nested: type | None = None


def decides(name: str, *, info: str | None = None, value=None) -> dict:
    """Field metadata: this setting decides a record's bytes, split or label."""
    return {_KEY: (Setting(True, name, info, value),)}


def does_not_decide(why: str, *, name=None, info=None, value=None, limit=False) -> dict:
    """Field metadata: a rerun may change this setting and still reuse the records."""
    if not why:
        raise ValueError("say why the setting does not decide the records")
    return {_KEY: (Setting(False, name, info, value, why, limit),)}


def parts(*declared: dict) -> dict:
    """Field metadata for a field that stands for several settings (the input's layout)."""
    return {_KEY: tuple(s for d in declared for s in d[_KEY])}


def nested(config_type: type) -> dict:
    """Field metadata: the field is a ``config_type`` with its own declared fields."""
    return {_KEY: (Setting(True, nested=config_type),)}


def declaration(field: dataclasses.Field) -> tuple[Setting, ...]:
    """The settings declared on ``field``; () when it has none."""
    return field.metadata.get(_KEY, ())


def _walk(config) -> Iterator[tuple[Setting, object]]:
    """``(setting, value)`` of every declared setting of ``config``, nested ones
    included, in field order."""
    for field in dataclasses.fields(config):
        for setting in declaration(field):
            value = setting.value(config) if setting.value else getattr(config, field.name)
            if setting.nested:
                yield from _walk(value)
            else:
                yield setting, value


def resume_key(config) -> dict:
    """name -> value of the settings an unfinished run must share to be resumed."""
    return {s.name: v for s, v in _walk(config) if s.decides or s.limit}


def _declared(config_type) -> Iterator[Setting]:
    """Every setting a config class declares, nested ones included, in field order."""
    for field in dataclasses.fields(config_type):
        for setting in declaration(field):
            if setting.nested:
                yield from _declared(setting.nested)
            else:
                yield setting


def _is_lower(old, new) -> bool:
    """A time limit lowered (0 or None: no limit)."""
    if not new:
        return False
    return not old or new < old


def resume_conflict(old: Mapping[str, object], new: Mapping[str, object], config_type) -> str:
    """What stops a run with settings ``new`` from resuming one with ``old``; "" if nothing.

    ``"resample lanczos -> bicubic, image_size 32 -> 24"``: every setting that
    differs, except a limit the rerun raised.
    """
    limit_names = {s.name for s in _declared(config_type) if s.limit}
    changed = []
    for name in sorted(set(old) | set(new)):
        before, after = old.get(name), new.get(name)
        if before == after or (name in limit_names and not _is_lower(before, after)):
            continue
        if isinstance(before, (list, dict)) or isinstance(after, (list, dict)):
            changed.append(f"{name} changed")
        elif name in limit_names:
            changed.append(f"{name} lowered from {show(before)} to {show(after)}")
        else:
            changed.append(f"{name} {show(before)} -> {show(after)}")
    return ", ".join(changed)


def info_values(config) -> dict:
    """The values imagerecords.json records, nested by their :attr:`Setting.info` place.

    ``{"source": ..., "seed": 42, "image": {"resize": ..., ...}, "config": {...}}``,
    each block in field order.
    """
    found: dict = {}
    for setting, value in _walk(config):
        if setting.info:
            *blocks, last = setting.info.split(".")
            target = found
            for block in blocks:
                target = target.setdefault(block, {})
            target[last] = value
    return found


def _recorded(info: Mapping, place: str):
    value = info
    for part in place.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return None
        value = value[part]
    return value


def image_settings(spec) -> dict:
    """name -> value of the settings of an :class:`images.ImageSpec` that decide its bytes."""
    return {s.name: v for s, v in _walk(spec) if s.decides}


def image_settings_from_info(info: Mapping, spec_type) -> dict:
    """The same, read back from a imagerecords.json (absent ones, from older files, left out)."""
    found = {}
    for setting in _declared(spec_type):
        if setting.decides and setting.info:
            value = _recorded(info, setting.info)
            if value is not None:
                found[setting.name] = value
    return found


def show(value) -> str:
    """A setting's value as messages print it."""
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float):
        return f"{value:g}"
    return printable(str(value))  # a pattern, or what an old dataset's metadata says


def describe(values: Mapping[str, object]) -> str:
    """``"resize shorter, image_size 256, upscale off, jpeg_quality 90, resample bicubic"``."""
    return ", ".join(f"{name} {show(value)}" for name, value in values.items())
