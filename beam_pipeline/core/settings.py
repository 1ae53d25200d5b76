"""Which settings decide a record's bytes, split and label: declared once, on the configs.

Each config field carries a :class:`Setting`; the resume key, ``imagerecords.json``'s
values and what the dry run and summary print derive from it. Pure.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Collection, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from beam_pipeline.core.text import printable

if TYPE_CHECKING:
    from beam_pipeline.core.flags import Flag

_KEY = "imagerecords.setting"


@dataclasses.dataclass(frozen=True)
class Setting:
    """How one config field (or one part of it) is treated.

    Attributes:
        decides: It decides a record's bytes, split or label: part of the
            resume key, compared for equality.
        flag: The flag that fills the field (its default and check are the field's).
        name: Its name in the resume key, in messages and on the command line:
            the flag's; where no flag fills it, the field's (or the part's).
        info: Where imagerecords.json records it (``"image.size"``,
            ``"config.min_shards"``, ``"seed"``), or None.
        value: Its value, from the config that holds the field (default: the
            flag's value, which is the field's unless the flag converts it).
        why: For a setting that does not decide: why a resumed run may change it.
        limit: A time limit that decides only which images are given up on
            (a transient rejection, retried on resume): part of the resume
            key, but a rerun may raise it; lowering it could keep records that
            the new limit would have rejected, so that is refused.
        nested: The field is itself a config (of this class) whose fields are declared.
        recorded: As declared: where imagerecords.json records it (False: not
            at all; True: in the config's own block, its class's ``recorded_in``
            or the top level; a name: in that block, inside the config's).
            :func:`declared` resolves it to ``info``.
        key: Its key in that block, where it is not the field's name (a part);
            a field that holds a conversion of its flag's value records the
            flag's value under the flag's name (``config.target_shard_mb``).
    """

    decides: bool
    flag: Flag | None = None
    name: str | None = None
    info: str | None = None
    value: Callable[[Any], object] | None = None
    why: str = ""
    limit: bool = False
    nested: type | None = None
    recorded: bool | str = False
    key: str | None = None

    def resolved(self, field_name: str, prefix: str = "") -> Setting:
        """The setting with its name and place filled in, for field ``field_name``
        of a config whose settings are recorded under ``prefix`` (``"image."``)."""
        if self.nested:
            return self
        flag = self.flag
        key = self.key or (flag.name if flag and flag.from_field else field_name)
        info = None
        if self.recorded is not False:
            block = "" if self.recorded is True else f"{self.recorded}."
            info = f"{prefix}{block}{key}"
        name = self.name or (flag.name if flag else self.key or field_name)
        return dataclasses.replace(self, name=name, info=info)

    def read(self, config, field_name: str):
        """Its value in ``config``."""
        if self.value:
            return self.value(config)
        value = getattr(config, field_name)
        if self.flag and self.flag.from_field:
            return self.flag.from_field(value)
        return value


def _field(setting: Setting, default) -> dataclasses.Field:
    """The dataclass field of ``setting``: its default ``default``, else its flag's
    (converted to the field's value); none for a required flag."""
    metadata = {_KEY: (setting,)}
    flag = setting.flag
    if default is dataclasses.MISSING and flag and not flag.required:
        default = flag.field_value(flag.default)
    if isinstance(default, (dict, list)):  # dataclasses refuse a shared mutable default
        return dataclasses.field(default_factory=lambda: copy.deepcopy(default), metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def decides(
    flag: Flag | None = None,
    *,
    recorded: bool | str = False,
    name: str | None = None,
    value=None,
    default=dataclasses.MISSING,
    key: str | None = None,
) -> dataclasses.Field:
    """A config field whose setting decides a record's bytes, split or label;
    filled by ``flag`` if given, which is then its name, default and check
    (``key``: its name and key where no flag names it and the field's name is not it)."""
    setting = Setting(True, flag, name, value=value, recorded=recorded, key=key)
    return _field(setting, default)


def does_not_decide(
    why: str,
    *,
    flag: Flag | None = None,
    recorded: bool | str = False,
    name: str | None = None,
    value=None,
    limit: bool = False,
    default=dataclasses.MISSING,
) -> dataclasses.Field:
    """A config field a rerun may change and still reuse the records."""
    if not why:
        raise ValueError("say why the setting does not decide the records")
    setting = Setting(False, flag, name, value=value, why=why, limit=limit, recorded=recorded)
    return _field(setting, default)


def part(name: str, *, value, recorded: bool | str, key: str | None = None) -> Setting:
    """One setting of a field that stands for several (the input's layout)."""
    return Setting(True, name=name, value=value, recorded=recorded, key=key or name)


def parts(*declared: Setting) -> dataclasses.Field:
    """A field that stands for several settings, each deciding the records; no default."""
    return dataclasses.field(metadata={_KEY: declared})


def nested(config_type: type) -> dataclasses.Field:
    """A field that is a ``config_type`` (its default one) with its own declared fields."""
    return dataclasses.field(
        default=config_type(), metadata={_KEY: (Setting(True, nested=config_type),)}
    )


def _prefix(config_type) -> str:
    """Where a config's recorded settings go: ``"image."`` for a config whose class
    says ``recorded_in = "image"``, else the top level."""
    block = getattr(config_type, "recorded_in", "")
    return f"{block}." if block else ""


def declaration(field: dataclasses.Field, config_type=None) -> tuple[Setting, ...]:
    """The settings declared on ``field`` (of ``config_type``), resolved; () when it
    has none."""
    prefix = _prefix(config_type)
    return tuple(s.resolved(field.name, prefix) for s in field.metadata.get(_KEY, ()))


def declared(config_type) -> Iterator[tuple[dataclasses.Field, Setting]]:
    """``(field, setting)`` of every setting a config class declares, nested ones
    included (with the field they are declared on), in field order."""
    for field in dataclasses.fields(config_type):
        for setting in declaration(field, config_type):
            if setting.nested:
                yield from declared(setting.nested)
            else:
                yield field, setting


def _walk(config) -> Iterator[tuple[Setting, object]]:
    """``(setting, value)`` of every declared setting of ``config``, nested ones
    included, in field order."""
    for field in dataclasses.fields(config):
        for setting in declaration(field, type(config)):
            if setting.nested:
                yield from _walk(getattr(config, field.name))
            else:
                yield setting, setting.read(config, field.name)


def _declared(config_type) -> Iterator[Setting]:
    """Every setting a config class declares, nested ones included, in field order."""
    return (setting for _, setting in declared(config_type))


def flag_of(field: dataclasses.Field) -> Flag | None:
    """The flag that fills ``field``, or None."""
    return next((s.flag for s in field.metadata.get(_KEY, ()) if s.flag), None)


def flag_values(config_type, given: Mapping[str, object]) -> dict:
    """field name -> value of each field of ``config_type`` (not nested) that a flag
    fills, from ``given`` (flag name -> the flag's value); raises ValueError where
    the flag refuses the value (``Flag.field_value``)."""
    found = {}
    for field in dataclasses.fields(config_type):
        flag = flag_of(field)
        if flag is not None:
            found[field.name] = flag.field_value(given[flag.name])
    return found


def check_flags(config, skip: Collection[Flag] = ()) -> None:
    """Raises ValueError naming the first field of ``config`` whose flag's check
    refuses its value (a flag of ``skip`` is not checked)."""
    for field in dataclasses.fields(config):
        flag = flag_of(field)
        if flag is None or flag in skip or flag.checked_as_given:
            continue  # checked_as_given: by field_value, on its way in
        value = getattr(config, field.name)
        if flag.from_field is not None:
            value = flag.from_field(value)
        problem = flag.problem(value)
        if problem:
            raise ValueError(problem)


def resume_key(config) -> dict:
    """name -> value of the settings an unfinished run must share to be resumed."""
    return {s.name: v for s, v in _walk(config) if s.decides or s.limit}


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
