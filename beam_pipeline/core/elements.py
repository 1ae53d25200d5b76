"""The elements that pass between the job's steps, and the kinds of rejection.

Types only, so a step that handles an element need not import the step that makes it;
NamedTuples, so they pickle as tuples between workers and processes.
"""

from __future__ import annotations

import enum
from typing import NamedTuple


class ImageRef(NamedTuple):
    """One listed input image: the element between listing and conversion."""

    image_id: str  # path relative to the input root, POSIX separators
    path: str  # full local path or URL, for FileSystems.open
    label: int
    split: str


class SpillLocation(NamedTuple):
    """Where a local conversion process appended a framed record (see spill.py)."""

    path: str
    offset: int


class ShardEntry(NamedTuple):
    """One record on its way to a shard: what WriteShards sorts and writes."""

    key: int  # order key, unsigned 64-bit
    image_id: str
    label: int
    size: int  # bytes of the framed TFRecord
    # The framed TFRecord itself (records through the runner's shuffle), or
    # where the local pool spilled it (only a reference crosses the graph).
    data: bytes | SpillLocation
    # The source file, for a rejection --dedupe makes of this record.
    path: str = ""
    sha256: str = ""  # of the source file: duplicates are grouped by it
    # The image's near-duplicate fingerprint as the record stores it
    # (near_search.pack): the search stage pairs records by it.
    near: bytes = b""


class Converted(NamedTuple):
    """A converted image: its split and its shard entry."""

    split: str
    entry: ShardEntry


class RecordBatch(NamedTuple):
    """Records of one split: the element between ConvertImages and WriteShards.

    A batch carries up to a few MB of record bytes, or up to a few thousand
    spill references, so that the runner handles one element per batch, not
    per image.
    """

    split: str
    entries: tuple[ShardEntry, ...]


class RejectKind(enum.Enum):
    """Why an image is rejected, as the steps tell rejections apart.

    ``prefix`` is how the kind's reasons begin in rejects.jsonl (docs/format.md
    section 4); the reason's text is built from it, never parsed back.
    """

    # The bytes are not a usable image (images.Rejected): the same bytes get it again.
    BAD_IMAGE = ""
    # The file could not be read (permission denied, a network error, not there yet).
    UNREADABLE = "cannot read: "
    # Its conversion ran out of time, which depends on the machine's load.
    TIMED_OUT = "timed out: "
    # The decoder took its worker process down with it.
    CRASHED = "crashed the image decoder"
    # --dedupe dropped it: a copy of the kept image, asked for, not a bad image.
    DUPLICATE = "duplicate of "
    # --dedupe near dropped it: a near copy (resized, re-encoded, cropped) of the kept image.
    NEAR_DUPLICATE = "near duplicate of "

    @property
    def prefix(self) -> str:
        return self.value

    @property
    def transient(self) -> bool:
        """Whether the cause lies outside the file's bytes, so it may not happen again.

        A resumed run tries those images again, so that its output is what an
        uninterrupted run gives once the cause is gone; every other rejection is
        what the same bytes get again, and a resumed run reuses it.
        """
        return self in (RejectKind.UNREADABLE, RejectKind.TIMED_OUT)

    @property
    def bad(self) -> bool:
        """Whether it counts towards --max_reject_fraction.

        Exact copies --dedupe drops do not: their bytes are the kept image's.
        Near copies do: a drop is the search's judgement, and a run whose
        near drops pass the limit is one to look at before it is trusted.
        """
        return self is not RejectKind.DUPLICATE


class Rejection(NamedTuple):
    """An image that does not become a record: one line of rejects.jsonl."""

    image_id: str
    path: str
    split: str
    reason: str  # the text rejects.jsonl holds
    kind: RejectKind


class Outcome(NamedTuple):
    """What converting one image produced, with the numbers the counters need."""

    result: Converted | Rejection
    bytes_read: int
    passed_through: bool
    repaired: bool = False  # extra bytes dropped, re-encoded clean
    bad_profile: bool = False  # unusable colour profile, pixels kept
    reused: bool = False  # the record was taken from --reuse's dataset, not converted
    near_hashed: bool = False  # its fingerprint was computed here, not taken from a record


class Origin(enum.Enum):
    """How an outcome came about: the counters it adds to differ (stages/outcomes.py)."""

    CONVERTED = "converted"  # by this run's conversion step
    AHEAD = "ahead"  # while Beam loaded (local_pool.Pool.convert_ahead)
    RESUMED = "resumed"  # converted, or rejected, by an interrupted run
