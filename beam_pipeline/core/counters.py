"""Every counter a job keeps, declared once: its name and what it counts.

Both engines count under these names (``tests/test_engine_counters.py``); no other
module spells a counter's name.
"""

from __future__ import annotations

# Beam's metrics namespace of every counter below.
NAMESPACE = "imagerecords"

LISTED = "images_listed"
CONVERTED = "images_converted"
CONVERTED_AHEAD = "images_converted_ahead"
RESUMED = "images_resumed"
REUSED = "images_reused"
OLD_DISTRUSTED = "old_records_distrusted"
REJECTED = "images_rejected"
PASSED_THROUGH = "images_passed_through"
REPAIRED = "images_repaired"
BAD_PROFILE = "images_bad_profile"
DROPPED_AS_DUPLICATES = "images_dropped_as_duplicates"
NEAR_HASHED = "images_near_hashed"
NEAR_PAIRS = "near_duplicate_pairs"
DROPPED_AS_NEAR = "images_dropped_as_near_duplicates"
BYTES_READ = "bytes_read"
RECORD_BYTES = "record_bytes"
SHARDS_WRITTEN = "shards_written"
SHARD_BYTES_WRITTEN = "shard_bytes_written"

# name -> what it counts (the table docs and tests read).
MEANING = {
    LISTED: "images listed: the books' count of what must come out",
    CONVERTED: "images decoded and encoded by this run (a record, not a rejection)",
    CONVERTED_AHEAD: "images converted or rejected while Beam loaded (Beam's pooled path only)",
    RESUMED: "records and rejections taken from an interrupted run's spill files",
    REUSED: "records taken over from --reuse's dataset, their sources unchanged",
    OLD_DISTRUSTED: "records of --reuse's dataset not taken because their shard is damaged or "
    "is not the one its metadata describes (their images are converted)",
    REJECTED: "images the conversion rejected (a bad image, a time limit, a crash)",
    PASSED_THROUGH: "converted images whose JPEG bytes were stored unchanged",
    REPAIRED: "converted images whose JPEG had stray bytes, dropped and re-encoded clean",
    BAD_PROFILE: "converted images with an unusable colour profile (pixels kept as they are)",
    DROPPED_AS_DUPLICATES: "copies --dedupe turned into rejections",
    NEAR_HASHED: "near-duplicate fingerprints computed by this run (a resume, or --reuse of "
    "a dataset of this fingerprint scheme, takes them from the records)",
    NEAR_PAIRS: "near-duplicate pairs the search verified",
    DROPPED_AS_NEAR: "near copies --dedupe near turned into rejections",
    BYTES_READ: "source bytes read by this run (to convert, or to check a reused record)",
    RECORD_BYTES: "bytes of the records converted, resumed or reused",
    SHARDS_WRITTEN: "shard files written",
    SHARD_BYTES_WRITTEN: "bytes of the shard files written",
}

# Counters that describe how one engine worked, not the dataset: the other
# engine never counts them, so the engines' counters agree without them.
ENGINE_ONLY = frozenset({CONVERTED_AHEAD})
