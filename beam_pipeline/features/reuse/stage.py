"""``--reuse OLD``: a grown folder's dataset, converting only its new and changed images.

OLD opened and checked at launch (:func:`open_old`, :func:`refusal`), and a record taken
over (:func:`take`) or relabelled (:func:`relabel`). What is checked and trusted:
docs/reuse.md; the design: docs/architecture.md, "Growing a dataset". Pure: no Beam, no Pillow.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import os
import random
import time
from collections.abc import Sequence
from typing import NamedTuple

from beam_pipeline.core import errors, images, settings
from beam_pipeline.core.elements import ImageRef
from beam_pipeline.core.errors import OldDatasetChanged, UsageError
from beam_pipeline.features.reuse.scan import OldIndex, OldRecord, OldShard, changed, read_old
from beam_pipeline.storage import paths, reading
from imagerecords import codec, storage
from imagerecords import info as info_lib

log = logging.getLogger(__name__)


class Candidate(NamedTuple):
    """A listed image and OLD's record of the same ID (None: OLD has none)."""

    ref: ImageRef
    old: OldRecord | None


@dataclasses.dataclass(frozen=True)
class OldDataset:
    """What OLD's metadata says: where it is, how its images were made, its shards."""

    path: paths.Place  # as --reuse named it (arguments.parse_args made it a place)
    info_path: str
    image: dict  # settings.image_settings_from_info: name -> value
    created_by: str
    shards: tuple[OldShard, ...]  # every shard, split by split
    records: int  # in all its shards


def open_old(path: paths.Place, spec) -> OldDataset:
    """Reads OLD's metadata (either format version's file name) for a run of
    ``spec`` (an ImageSpec: its fingerprints' scheme) and checks that
    every shard it names is there.

    Raises:
        UsageError: OLD does not exist, is not a finished imagerecords dataset,
            misses shards, or cannot be read.
    """
    from beam_pipeline.core import images  # Pillow: only for the spec's declarations

    old = path
    if "://" in old and not storage.is_gcs(old):
        raise UsageError(f"--reuse {path}: only local folders and gs:// can be read")
    if paths.is_local(old) and not os.path.isdir(old):
        what = "is a file" if os.path.exists(old) else "does not exist"
        raise UsageError(
            f"--reuse {path} {what}: give the folder of a finished imagerecords dataset"
        )
    try:
        info_path, info = info_lib.find_info(old)
    except info_lib.DatasetNotFoundError:
        raise UsageError(_not_a_dataset(path, old)) from None
    except ValueError as error:
        raise UsageError(f"--reuse {path}: {error}") from None
    except Exception as error:  # a storage or credentials failure
        if storage.is_gcs(old):
            from beam_pipeline.storage import gcs

            found = gcs.usage_error(error, old, "read the dataset in")
            if found is not None:
                raise found from None
        raise UsageError(
            f"--reuse {path}: cannot read it ({type(error).__name__}: {error})"
        ) from None
    try:
        shards = _shards(old, info_path, info)
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        raise UsageError(
            f"--reuse {path}: {info_path} is not an imagerecords dataset's metadata "
            f"(its shard list cannot be read: {type(error).__name__}: {error}); give the "
            "folder of a finished imagerecords dataset"
        ) from None
    missing = _missing(old, shards)
    if missing:
        raise UsageError(
            f"--reuse {path} lacks {len(missing)} of the {len(shards)} shards its "
            f"{os.path.basename(info_path)} lists, or holds them cut short (e.g. "
            f"{missing[0]}): restore them, or convert without --reuse"
        )
    image = settings.image_settings_from_info(info, images.ImageSpec)
    # Fingerprints of no recorded scheme (format 2) or an earlier one than the
    # run's (spec.pixels) are made again (take()); refusal() refuses any other.
    again = _made_anew(image.get(images.SCHEME_SETTING), spec.pixels)
    return OldDataset(
        path=old,
        info_path=info_path,
        image=image,
        created_by=str(info.get("created_by", "")),
        shards=tuple(shard._replace(refingerprint=again) for shard in shards),
        records=sum(shard.num_examples for shard in shards),
    )


def _made_anew(scheme, pixels) -> bool:
    """Whether OLD's fingerprints, of ``scheme``, are made again by a run of the hook
    ``pixels``: none recorded (format 2) or an earlier scheme than the run's whose
    fingerprints differ from its own."""
    if scheme is None:
        return True
    return pixels is not None and scheme in pixels.earlier and scheme not in pixels.same


def _taken_as_is(scheme, pixels) -> bool:
    """Whether OLD's fingerprints, of ``scheme``, are the run's bit for bit, though its
    scheme's name is another (an earlier scheme that changed only the search)."""
    return pixels is not None and scheme in pixels.same


def open_again(path: paths.Place, spec) -> OldDataset:
    """:func:`open_old` inside the run, once the launch checked OLD: a failure now
    means OLD changed since.

    Raises:
        OldDatasetChanged: OLD is no longer a finished dataset with all its shards.
    """
    try:
        return open_old(path, spec)
    except UsageError as error:
        raise OldDatasetChanged(
            f"the --reuse dataset {path} changed since this run started "
            f"({error}); {errors.NOT_FINISHED}; let whatever writes to it finish, then "
            f"{errors.RESUME_HINT} (or convert without --reuse)"
        ) from None


def _not_a_dataset(path: str, old: str) -> str:
    """Why OLD holds no metadata of ours: none at all, or a file of that name that is not it."""
    found = storage.Files().read_all(storage.join(old, info_lib.INFO_FILES[0]))
    if found is not None:
        return (
            f"--reuse {path} is not an imagerecords dataset: its {info_lib.INFO_FILES[0]} "
            "holds no format_version (it is not this project's metadata); give the folder "
            "of a finished imagerecords dataset"
        )
    return (
        f"--reuse {path} is not a finished imagerecords dataset: it holds no "
        f"{' or '.join(info_lib.INFO_FILES)} (a run that did not finish cannot be reused)"
    )


def _shards(old: str, info_path: str, info: dict) -> list[OldShard]:
    """Every shard OLD's metadata names, with the size and SHA-256 it gives it."""
    shards = []
    for split in info.get("splits", {}):
        rows = info["splits"][split]["shards"]
        for shard, row in zip(
            info_lib.split_shards(old, info_path, info, split), rows, strict=True
        ):
            sha256 = row["sha256"]
            if not isinstance(sha256, str) or len(sha256) != 64:
                raise ValueError(f"shard {row['file']} has no SHA-256")
            shards.append(OldShard(shard.path, shard.num_bytes, shard.num_examples, sha256))
    return shards


def _missing(old: str, shards: Sequence[OldShard]) -> list[str]:
    """The names of the shards that are not there (locally: or are shorter than listed)."""
    if storage.is_gcs(old):
        from beam_pipeline.storage import gcs

        present = set(gcs.list_level(old)[1])
        return [os.path.basename(s.path) for s in shards if s.path not in present]
    missing = []
    for shard in shards:
        try:
            short = os.stat(shard.path).st_size < shard.num_bytes
        except OSError:
            short = True
        if short:
            missing.append(os.path.basename(shard.path))
    return missing


def refusal(old: OldDataset, output: str, spec) -> str:
    """Why a run writing ``output`` with ImageSpec ``spec`` cannot reuse ``old``; "" if it can.

    ``output`` and OLD are compared as the places they name (``paths.inside``:
    symbolic links and ``..`` resolved), so no spelling of OLD is written to.
    """
    if paths.inside(output, old.path) or paths.inside(old.path, output):
        same = paths.inside(old.path, output) and paths.inside(output, old.path)
        what = "is" if same else "lies inside" if paths.inside(output, old.path) else "holds"
        return (
            f"--output {output} {what} the --reuse dataset {old.path}: write the new "
            "dataset to another folder (the old one is only read)"
        )
    differ = []
    for name, value in settings.image_settings(spec).items():
        scheme = old.image.get(name)
        if name == images.SCHEME_SETTING and (
            _made_anew(scheme, spec.pixels) or _taken_as_is(scheme, spec.pixels)
        ):
            continue  # format 2 or an earlier scheme: take() fingerprints anew, or keeps
        if name not in old.image:
            differ.append(f"{name} not recorded -> {settings.show(value)}")
        elif old.image[name] != value:
            differ.append(f"{name} {settings.show(old.image[name])} -> {settings.show(value)}")
    if differ:
        return (
            f"--reuse {old.path} was made with other image settings ({', '.join(differ)}): "
            "its records are not what this run would write; give the same settings, "
            "or convert without --reuse"
        )
    return ""


def version_note(old: OldDataset) -> str:
    """A line when another converter made OLD's records ("" when this one did)."""
    from beam_pipeline.core import metadata

    if not old.created_by or old.created_by == metadata.CREATED_BY:
        return ""
    return (
        f"imagerecords: {old.path} was made by {old.created_by}: its records are reused as "
        "that version encoded them (a run without --reuse encodes every image anew)"
    )


def check(old: OldDataset, output: str, spec) -> None:
    """:func:`refusal` as a UsageError."""
    problem = refusal(old, output, spec)
    if problem:
        raise UsageError(problem)


# ---------------------------------------------------------- taking a record over

_files = storage.Files()  # per process (fork-safe: a child opens its own)


def read_record(old: OldRecord) -> bytes:
    """OLD's framed record, read again: the bytes the scan checked, or the run stops.

    The one read of a record of OLD (a ranged read on gs://).

    Raises:
        OldDatasetChanged: the shard is gone, shorter, or holds other bytes there
            than the scan read (OLD was rewritten during the run).
        errors.StorageUnreachable: GCS out of reach for --gcs_timeout_s.
    """
    framed = read_old(_files, old.shard, old.offset, old.offset + old.size)
    if len(framed) != old.size:
        raise changed(old.shard, f"ends before byte {old.offset + old.size}")
    if codec.frame_crc(framed[-codec.FRAME_FOOT :]) != old.crc or not codec.is_intact(framed):
        raise changed(old.shard, f"holds another record at byte {old.offset} than it did")
    return framed


class Taken(NamedTuple):
    """OLD's record as this run writes it."""

    framed: bytes
    unchanged: bool  # OLD's bytes as they are (not rebuilt)
    near: bytes  # its near-duplicate fingerprint (near_search.pack)
    near_hashed: bool  # computed here, from the stored JPEG (OldRecord.refingerprint, format 2)
    relabelled: bool  # OLD gave it another label or class name


def take(
    old: OldRecord, image_id: str, sha256: str, label: int, class_name: str, pixels
) -> Taken | None:
    """OLD's record for an image whose source has the hash ``sha256``, with this label.

    The record as it is when its ID, source hash, label and class name are
    the image's and it holds a fingerprint (``unchanged``); else rebuilt with
    the new label and class name (:func:`relabel`) and, for a record of
    format 2 or of an earlier fingerprint scheme (``old.refingerprint``: its
    fingerprint is not read), the fingerprint of its own stored JPEG (never
    of the source, which would cost a conversion): the bytes a conversion
    would write either way, read and checked here (:func:`read_record`).
    None when OLD's record is of another image or another source: the image
    is converted.

    Raises:
        OldDatasetChanged: the record is not the one the scan checked.
    """
    framed = read_record(old)
    example = codec.Example.FromString(codec.payload(framed))
    features = example.features.feature
    if _value(features, "image/filename") != image_id.encode("utf-8") or _value(
        features, "image/key/sha256"
    ) != sha256.encode("ascii"):
        return None
    near = None if old.refingerprint else codec.near_of(codec.payload(framed))
    hashed = near is None
    if hashed:
        try:
            packed = images.near_of_stored(_value(features, "image/encoded"), pixels)
        except images.Rejected:
            return None  # a stored JPEG this run cannot read: converted from the source
        near = pixels.features(packed)
    packed = b"".join(near)
    relabelled = _value(features, "image/class/label") != label or _value(
        features, "image/class/text"
    ) != class_name.encode("utf-8")
    if not hashed and not relabelled:
        return Taken(framed, True, packed, False, False)
    return Taken(_rebuilt(features, label, class_name, near), False, packed, hashed, relabelled)


def _value(features, key: str):
    """The one value of a record's feature (None when it has none)."""
    feature = features.get(key)
    kind = feature.WhichOneof("kind") if feature is not None else None
    values = getattr(feature, kind).value if kind else ()
    return values[0] if len(values) == 1 else None


def _rebuilt(features, label: int, class_name: str, near: tuple[bytes, bytes] | None) -> bytes:
    payload = codec.image_record(
        _value(features, "image/encoded"),
        _value(features, "image/height"),
        _value(features, "image/width"),
        label,
        class_name,
        _value(features, "image/filename"),
        _value(features, "image/key/sha256"),
        near,
    )
    return codec.frame_record(payload)


def relabel(framed: bytes, label: int, class_name: str) -> bytes:
    """The same record with another label and class name: the bytes a conversion
    with them would write (``codec.image_record`` builds both)."""
    data = codec.payload(framed)
    features = codec.Example.FromString(data).features.feature
    return _rebuilt(features, label, class_name, codec.near_of(data))


# ---------------------------------------------------------------------- dry run


@dataclasses.dataclass
class Forecast:
    """What a ``--reuse`` run of the listed images would do (the dry run's line)."""

    in_old: int  # listed images with a record in OLD
    new: int  # listed images without one (new, or rejected by OLD): converted
    dropped: int  # OLD's records of images no longer listed
    checked: int  # of in_old, sources read and hashed
    unchanged: int  # of checked, the same bytes: reused
    relabelled: int  # of unchanged, with another label: rewritten, not decoded
    check_cpu_s: float  # CPU seconds per image checked (source hashed, record read)
    # Of unchanged, records of format 2 or an earlier scheme: fingerprinted from
    # their stored JPEG.
    fingerprinted: int = 0

    @property
    def reused(self) -> float:
        """Expected records reused (exact when every source was checked)."""
        return self.unchanged * self.in_old / self.checked if self.checked else 0.0

    @property
    def changed(self) -> float:
        return self.in_old - self.reused

    @property
    def exact(self) -> bool:
        return self.checked == self.in_old

    def cpu_per_image(self, converting_s: float) -> float:
        """CPU per listed image of the reuse run: conversions for the new and changed
        images, a read and a hash for the reused ones."""
        total = self.in_old + self.new
        spent = (self.new + self.changed) * converting_s + self.reused * self.check_cpu_s
        return spent / total if total else 0.0

    def describe(self, old: OldDataset) -> str:
        """The dry run's line: what the run would reuse, convert and drop."""
        approx = "" if self.exact else "~"
        scale = self.in_old / self.checked if self.checked else 0.0
        relabelled = self.relabelled * scale
        fingerprinted = self.fingerprinted * scale
        text = (
            f"reuse {old.path} ({old.records:,} records): "
            f"reused {approx}{self.reused:,.0f} unchanged"
            + (f" ({approx}{relabelled:,.0f} with a new label)" if self.relabelled else "")
            + (
                f" ({approx}{fingerprinted:,.0f} of {_scheme_of(old)}, fingerprinted from "
                "their stored JPEG)"
                if self.fingerprinted
                else ""
            )
            + f"; converted {approx}{self.changed:,.0f} changed and {self.new:,} without a "
            f"record there (new, or rejected by it); dropped {self.dropped:,} no longer listed"
        )
        if not self.exact:
            text += f" (from {self.checked:,} of {self.in_old:,} sources hashed)"
        return text


def _scheme_of(old: OldDataset) -> str:
    """Why OLD's fingerprints are made again: its format, or the scheme it names."""
    scheme = old.image.get(images.SCHEME_SETTING)
    return "format 2" if scheme is None else f"scheme {settings.show(scheme)}"


def _check(ref: tuple, old: OldRecord, classes: Sequence[str], pixels) -> Taken | None:
    """OLD's record as the run would take it for one image (None: converted), as a
    conversion process decides."""
    image_id, path, label, _ = ref
    try:
        sha256, _, _ = reading.hash_source(path)
    except Exception:  # unreadable: the run rejects it (converted, in the count)
        return None
    return take(old, image_id, sha256, label, classes[label], pixels)


# Wall time the dry run spends hashing sources before it extrapolates.
FORECAST_BUDGET_S = 10.0


def forecast(
    refs: Sequence[tuple[str, str, int, str]],
    index: OldIndex,
    classes: Sequence[str],
    pixels,
    seed: int,
    budget_s: float,
    threads: int | None = None,
) -> Forecast:
    """Counts what a reuse run would do; checks the images OLD holds as the run
    would (the source hashed, OLD's record read: :func:`take`), in a seeded random
    order, until all are done or ``budget_s`` of wall time has passed (the rest
    is extrapolated)."""
    pairs = []
    for ref in refs:
        old = index.get(ref[0])
        if old is not None:
            pairs.append((ref, old))
    random.Random(seed).shuffle(pairs)
    started, cpu_started = time.monotonic(), time.process_time()
    checked = unchanged = relabelled = fingerprinted = 0
    threads = threads or os.cpu_count() or 1
    batch = 64 * threads
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        for at in range(0, len(pairs), batch):
            if at and time.monotonic() - started > budget_s:
                break
            part = pairs[at : at + batch]
            for taken in pool.map(lambda pair: _check(*pair, classes, pixels), part):
                checked += 1
                if taken is not None:
                    unchanged += 1
                    relabelled += taken.relabelled
                    fingerprinted += taken.near_hashed
    cpu = (time.process_time() - cpu_started) / max(1, checked)
    dropped = len(index) - len(pairs)  # each listed ID matches one record at most
    return Forecast(
        len(pairs),
        len(refs) - len(pairs),
        dropped,
        checked,
        unchanged,
        relabelled,
        cpu,
        fingerprinted,
    )
