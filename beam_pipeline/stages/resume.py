"""A job's own leftovers in --output: recognised, so that the same command carries on.

The marker ``OUTPUT/.imagerecords-tmp/job.json`` holds the settings that decide the
records; what a rerun does with each kind of output folder, and why anything the job
did not write (or any link) is refused: docs/scale.md, "Resume".
"""

from __future__ import annotations

import dataclasses
import json
import os

from beam_pipeline.core import metadata, spill
from beam_pipeline.core import settings as declared
from beam_pipeline.core.errors import UsageError
from beam_pipeline.stages.job_config import JobConfig
from beam_pipeline.storage import listing, paths
from beam_pipeline.storage import output as output_files

MARKER = output_files.MARKER


def key(config: JobConfig) -> dict:
    """What decides each record's bytes, split and label: a change means no reuse.

    Derived from the declarations on JobConfig and ImageSpec (settings.py),
    with the spill files' format. The shard target, --min_shards,
    --max_reject_fraction and --dedupe are not in it: they act on the records
    once they are made, so a rerun with a new shard size reuses the records of
    an interrupted run. --image_timeout_s is, as a limit a rerun may raise
    (:func:`conflict`).
    """
    return {"spill_format": spill.FORMAT, **declared.resume_key(config)}


def conflict(old: dict, new: dict) -> str:
    """Why a run with settings ``new`` cannot resume one with ``old``; "" when it can."""
    if old.get("spill_format") != new.get("spill_format"):
        return (
            f"spill_format {old.get('spill_format')} -> {new.get('spill_format')}: "
            "written by another version of imagerecords"
        )
    return declared.resume_conflict(old, new, JobConfig)


@dataclasses.dataclass(frozen=True)
class Leftovers:
    """What an output folder holds before a run."""

    # "empty" | "finished" | "published" (finished, its temporary folder still
    # there) | "unfinished" | "stray" (the job's names, no marker) | "done"
    # (prepare finished the clean-up of this very command's dataset: nothing to run)
    kind: str
    ours: tuple[str, ...] = ()  # paths (relative) of the job's own files
    # Entries the job did not write ("notes/": a folder), links and special files
    # under the job's own names included: the run refuses them all (:func:`refusal`).
    others: tuple[str, ...] = ()
    settings: dict | None = None  # of the unfinished run
    links: tuple[str, ...] = ()  # entries that are symbolic links, anywhere


def _local_entries(output: str) -> tuple[list[str], list[str], list[str], bool]:
    """``(ours, others, links, temp folder there)`` of a local ``output``, no link followed.

    Names are relative with ``/``. A folder that is not the job's is one
    entry (``notes/``), not walked: all of it is someone else's.
    """
    ours, others, links = [], [], []
    temp_left = False
    pending = [("", True)]  # (relative folder, is it the top)
    while pending:
        folder, top = pending.pop()
        try:
            with os.scandir(os.path.join(output, folder)) as found:
                entries = sorted(found, key=lambda e: e.name)
        except FileNotFoundError:
            continue
        except OSError as error:
            where = paths.shown(os.path.join(output, folder))
            raise UsageError(f"--output: cannot read {where} ({error.strerror or error})") from None
        for entry in entries:
            name = f"{folder}{entry.name}"
            if entry.is_symlink():
                links.append(name)
            elif top and entry.name == metadata.TMP_DIR and entry.is_dir(follow_symlinks=False):
                temp_left = True
                pending.append((name + "/", False))
            elif not top and entry.is_dir(follow_symlinks=False):
                pending.append((name + "/", False))  # inside the temp folder: the job's
            elif not entry.is_file(follow_symlinks=False):
                others.append(name + "/" if entry.is_dir(follow_symlinks=False) else name)
            elif not top or output_files.is_ours(name):
                ours.append(name)
            else:
                others.append(name)
    return ours, others, links, temp_left


def _entries(output: str) -> tuple[list[str], list[str], list[str], bool]:
    if paths.is_local(output):
        return _local_entries(output)
    names = [path[len(output) :].lstrip("/") for path in listing.files_under(output)]
    names = [n for n in names if n]  # "": the output's own folder placeholder ("out/")
    ours = [n for n in names if output_files.is_ours(n)]
    others = [n for n in names if not output_files.is_ours(n)]
    return ours, others, [], any(n.startswith(metadata.TMP_DIR + "/") for n in names)


def _read(path: str) -> bytes | None:
    try:
        if paths.is_local(path):
            with open(path, "rb") as stream:
                return stream.read()
        with paths.filesystems().open(path) as stream:
            return stream.read()
    except (OSError, FileNotFoundError):
        return None
    except Exception:  # a remote filesystem's own "not found"
        return None


def inspect(output: str) -> Leftovers:
    """Classifies what ``output`` holds (see the module docstring)."""
    ours, others, links, temp_left = _entries(output)
    # A live run's lock is its own business (lock.py), not a leftover.
    ours = tuple(n for n in ours if n != output_files.LOCK)
    others, links = tuple(others), tuple(links)
    if not (ours or others or links):
        return Leftovers("empty")
    # A finished dataset: imagerecords.json, or a format_version 1 one's
    # imagerecords.json (in version 2 TFDS's file, written just before ours).
    if metadata.INFO_FILE in ours:
        # Its temporary folder still there: the run was stopped as it cleared it.
        kind = "published" if temp_left else "finished"
        return Leftovers(kind, ours, others, None, links)
    if metadata.V1_INFO_FILE in ours and MARKER not in ours:
        return Leftovers("finished", ours, others, None, links)
    if MARKER not in ours:
        if ours and all(n.startswith(metadata.TMP_DIR + "/") for n in ours):
            return Leftovers("unfinished", ours, others, None, links)  # killed before the marker
        return Leftovers("stray" if ours else "empty", ours, others, None, links)
    data = _read(paths.join(output, MARKER))
    try:
        recorded = json.loads(data) if data else None
    except ValueError:
        recorded = None
    if not isinstance(recorded, dict):
        recorded = None  # unreadable: the run starts over
    return Leftovers("unfinished", ours, others, recorded, links)


def _some(names: tuple[str, ...], one: str, many: str) -> str:
    """``"2 files ('a', 'b')"``: the count, and up to three names shown."""
    shown = ", ".join(paths.shown(n) for n in names[:3])
    more = f" and {len(names) - 3} more" if len(names) > 3 else ""
    return f"{len(names)} {one if len(names) == 1 else many} ({shown}{more})"


def refusal(output: str, found: Leftovers, overwrite: bool) -> str:
    """Why a run may not write into ``output`` holding ``found``; "" when it may.

    A link or an entry the job did not write is refused even with
    ``overwrite``: the run would write or delete through the link, and a
    dataset beside another's files fails its own ``--verify``.
    """
    if found.links:
        return (
            f"--output {output} holds {_some(found.links, 'symbolic link', 'symbolic links')}: "
            "the converter never writes or deletes through a link it did not make, even with "
            "--overwrite; remove the link (what it points to stays), or choose another folder"
        )
    if found.others:
        return (
            f"--output {output} holds {_some(found.others, 'entry', 'entries')} that the "
            "converter did not write: a dataset's folder holds the dataset alone, so it is "
            "refused even with --overwrite (which replaces a run's own files only); move them "
            "out, or choose another folder"
        )
    if overwrite:
        return ""
    if found.kind == "finished":
        return (
            f"--output {output} holds a finished dataset ({metadata.INFO_FILE} and "
            f"{len(found.ours) - 1} more files of a run); pass --overwrite to replace it"
        )
    if found.kind == "stray":
        return (
            f"--output {output} holds {_some(found.ours, 'file', 'files')} named as a run "
            f"names its own, but neither {metadata.INFO_FILE} nor an unfinished run's marker: "
            "pass --overwrite to replace them"
        )
    return ""


def _spill_is_for(spill_dir: str, settings: dict) -> bool:
    data = _read(os.path.join(spill_dir, spill.SETTINGS_FILE))
    try:
        return data is not None and not conflict(json.loads(data), settings)
    except (ValueError, AttributeError):  # not JSON, or not a JSON object
        return False


def check(output: str, overwrite: bool, config: JobConfig | None = None) -> Leftovers:
    """Refuses links, others' files, and a finished dataset without ``overwrite``. Reads only.

    A published dataset whose temporary folder is still there (its run was
    stopped while clearing it) is returned as such when ``config`` would
    write that very dataset (:func:`is_dataset_of`): the same command then
    finishes the clean-up (:func:`finish_clean_up`) instead of being refused.
    """
    found = inspect(output)
    problem = refusal(output, found, overwrite)
    if problem:
        raise UsageError(problem)
    if found.kind == "published" and not overwrite:
        if config is None or not is_dataset_of(output, config):
            raise UsageError(
                f"--output {output} holds a finished dataset ({metadata.INFO_FILE}) whose run "
                f"was stopped while it cleared its temporary folder {metadata.TMP_DIR}/: run "
                "that run's command again to finish, or pass --overwrite to replace it"
            )
    return found


def is_dataset_of(output: str, config: JobConfig) -> bool:
    """Whether ``output``'s imagerecords.json records every setting ``config`` records
    there (``settings.info_values``), each with the value ``config`` has: a run of
    ``config`` would publish that dataset."""
    data = _read(paths.join(output, metadata.INFO_FILE))
    try:
        info = json.loads(data) if data else None
    except (ValueError, RecursionError):
        return False
    if not isinstance(info, dict):
        return False
    wanted = json.loads(json.dumps(declared.info_values(config)))
    return _holds(info, wanted) and _indexed(info) <= {config.index_files}


def _indexed(info: dict) -> set:
    """Whether each shard has its ``.idx`` (--index_files, which the settings do not
    record): True and/or False, None for a shard list that is not one; empty
    for no shard."""
    splits = info.get("splits")
    found = set()
    for split in splits.values() if isinstance(splits, dict) else [None]:
        shards = split.get("shards") if isinstance(split, dict) else None
        for shard in shards if isinstance(shards, list) else [None]:
            found.add("index" in shard if isinstance(shard, dict) else None)
    return found


def _holds(found, wanted) -> bool:
    """Whether the mapping ``found`` has each leaf of ``wanted`` with its value (a
    value of None: absent or null)."""
    for name, value in wanted.items():
        here = found.get(name) if isinstance(found, dict) else None
        if isinstance(value, dict) and value:
            if not _holds(here, value):
                return False
        elif here != value:
            return False
    return True


def finish_clean_up(output: str) -> None:
    """Removes what a published dataset's run left in its temporary folder (but the
    live run's lock, which goes with its owner: lock.py)."""
    output_files.delete_temp_folder(output)
    if paths.is_local(output):
        output_files.remove_empty_folders(os.path.join(output, metadata.TMP_DIR))


def prepare(
    output: str,
    settings: dict,
    overwrite: bool,
    spill_dir: str | None,
    config: JobConfig | None = None,
) -> Leftovers:
    """Makes ``output`` ready for a run with ``settings``; returns what it found.

    Clears an earlier run's files with ``overwrite``; resumes an unfinished
    run of the same settings (deleting its stale final files and temp shards,
    keeping its spill files); finishes the clean-up of ``config``'s own
    published dataset (then kind "done": nothing is left to run); refuses
    anything else with a UsageError.
    """
    found = check(output, overwrite, config)
    if found.kind == "published" and not overwrite:
        finish_clean_up(output)
        return dataclasses.replace(found, kind="done")
    change = conflict(found.settings, settings) if found.settings is not None else ""
    if found.kind == "unfinished" and change and not overwrite:
        raise UsageError(
            f"--output {output} holds an unfinished run with other settings ({change}); "
            "run its command again to resume it, or pass --overwrite to start afresh"
        )
    if overwrite or found.kind != "unfinished" or found.settings is None:
        # First: the folder stops claiming to be complete.
        claims = [n for n in (metadata.INFO_FILE, metadata.V1_INFO_FILE) if n in found.ours]
        output_files.delete_ours(output, claims)
        output_files.delete_ours(output, [n for n in found.ours if n not in claims])
        output_files.delete_local_folder(spill_dir)  # a spill folder is only ever the job's own
    else:
        # Resuming: keep the spill files (and the marker); the rest is rewritten.
        spill_prefix = f"{metadata.TMP_DIR}/spill/"
        stale = [n for n in found.ours if n != MARKER and not n.startswith(spill_prefix)]
        output_files.delete_ours(output, stale)
        if spill_dir and not _spill_is_for(spill_dir, settings):
            output_files.delete_local_folder(spill_dir)  # a gs:// output's spill of another run
    if paths.is_local(output):
        output_files.remove_empty_folders(os.path.join(output, metadata.TMP_DIR))
    data = json.dumps(settings, indent=1, sort_keys=True).encode()
    output_files.write_atomically(paths.join(output, MARKER), data)
    if spill_dir:
        data = json.dumps(settings, sort_keys=True).encode()
        output_files.write_atomically(os.path.join(spill_dir, spill.SETTINGS_FILE), data)
    return found


def discard(output: str, spill_dir: str | None) -> None:
    """Removes what :func:`prepare` and a run that stopped at once left in a new output."""
    output_files.delete_local_folder(spill_dir)
    output_files.delete_temp_folder(output)
    if paths.is_local(output):
        try:
            os.rmdir(output)  # only if empty: it held nothing before this run
        except OSError:
            pass
