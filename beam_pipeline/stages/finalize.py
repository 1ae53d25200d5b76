"""The job's last step: the lists, the books, the shards renamed, imagerecords.json.

Pure of Beam: the local engine calls :class:`Finalizer` directly; the Beam
graph runs it inside ``pipeline.Finalize`` with everything else as side inputs.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence

from beam_pipeline.core import books, errors, keys, metadata, settings, tfds_metadata
from beam_pipeline.core import groups as split_groups
from beam_pipeline.core.errors import BooksDoNotBalance
from beam_pipeline.stages.hooks import Block
from beam_pipeline.stages.job_config import JobConfig, output_path
from beam_pipeline.stages.shards import WrittenShard, check_shards, place_shards
from beam_pipeline.storage import listing
from beam_pipeline.storage import output as output_files


class Finalizer:
    """Publishes the dataset once every shard is written: lists, books, renames, imagerecords.json.

    Idempotent, so a retried Finalize completes what the first try began.
    """

    def __init__(self, config: JobConfig):
        self._config = config

    def run(self, shards, rejects, plans, skipped, blocks: Sequence[Block] = ()) -> str:
        """Everything the job produced -> a JSON line of records per split.

        ``blocks``: what the listing and the features publish beside the records
        (``hooks.Block``), put in imagerecords.json in ``metadata.BLOCK_ORDER``.

        Raises:
            BooksDoNotBalance: see :meth:`_check_books`.
        """
        plans = dict(plans)
        skipped = list(skipped) + [
            listing.Skipped(path, listing.NOT_IN_CLASS_FOLDER)
            for path in self._config.layout.loose_files
        ]
        blocks = sorted(blocks, key=_rank)
        # The lists first: a run that fails its books still leaves them to read.
        self._write_lists(rejects, skipped, blocks)
        kept = self._check_books(plans, list(shards), rejects)
        placed = place_shards(kept, self._config.output)
        info, splits = self._info(placed, rejects, skipped)
        for block in blocks:
            value = block.info(splits)
            if value is not None:  # only then: a dataset without one is what it was before
                info[block.name] = value
        self._publish(info)
        return json.dumps({s: split["num_examples"] for s, split in info["splits"].items()})

    def _write_lists(self, rejects, skipped, blocks: Sequence[Block]) -> None:
        """rejects.jsonl, labels.txt, skipped.jsonl and the blocks' files."""
        config = self._config
        output_files.write_atomically(
            output_path(config.output, metadata.REJECTS_FILE),
            metadata.rejects_jsonl(
                {"path": r.path, "id": r.image_id, "split": r.split, "reason": r.reason}
                for r in rejects
            ),
        )
        output_files.write_atomically(
            output_path(config.output, metadata.LABELS_FILE),
            metadata.labels_text(config.layout.classes),
        )
        output_files.write_atomically(
            output_path(config.output, metadata.SKIPPED_FILE),
            metadata.skipped_jsonl({"path": s.path, "reason": s.reason} for s in skipped),
        )
        for block in blocks:
            for name, data in block.files:
                output_files.write_atomically(output_path(config.output, name), data)

    def _check_books(self, plans, shards, rejects) -> list[WrittenShard]:
        """The shards to keep, one per planned shard.

        Raises:
            BooksDoNotBalance: A record is lost or doubled, a shard is not as
                planned, or more images are bad than --max_reject_fraction allows.
        """
        config = self._config
        kept, shard_problems = check_shards(plans, shards)
        failure = books.check_books(
            list(plans.values()),
            written=sum(s.num_examples for s in kept),
            rejected=len(rejects),
            shard_problems=shard_problems,
            names_of=lambda wanted: _names_of(config, wanted),
        )
        if failure:
            raise BooksDoNotBalance(failure)
        total_listed = sum(plan.listed for plan in plans.values())
        # Exact copies dropped by --dedupe are not bad images; near copies count
        # (RejectKind.bad).
        bad = [r.reason for r in rejects if r.kind.bad]
        if len(bad) / total_listed > config.max_reject_fraction:
            raise errors.too_many_rejects(
                bad,
                total_listed,
                config.max_reject_fraction,
                output_path(config.output, metadata.REJECTS_FILE),
            )
        return kept

    def _info(self, placed, rejects, skipped) -> tuple[dict, list[str]]:
        """The imagerecords.json object (docs/format.md section 7) but for the blocks,
        and its splits in order.

        The settings in it are those the config declares (settings.info_values).
        """
        config = self._config
        rejected_by_split = Counter(r.split for r in rejects)
        splits = metadata.split_order(
            config.split_names, [row["split"] for row in placed] + list(rejected_by_split)
        )
        declared = settings.info_values(config)
        info = metadata.build_info(
            source=declared["source"],
            seed=declared["seed"],
            classes=declared["classes"],
            image={**declared["image"], **metadata.IMAGE_FACTS},
            splits=splits,
            shards=placed,
            rejected_by_split=rejected_by_split,
            skipped_reasons=[s.reason for s in skipped],
            config=declared["config"],
        )
        return info, splits

    def _publish(self, info: dict) -> None:
        """Deletes the temporary files, writes TFDS's files and imagerecords.json, then
        drops the marker."""
        config = self._config
        output = config.output
        output_files.delete_local_folder(config.spill_directory)
        output_files.delete_temp_files(output, keep=[output_files.MARKER])
        # TFDS's metadata (tfds.builder_from_directory reads the same shards).
        tfds = tfds_metadata.tfds_files(info, name=config.tfds_name, version=config.tfds_version)
        for name, data in tfds.items():
            output_files.write_atomically(output_path(output, name), data)
        # Written last: its presence means the dataset is complete.
        output_files.write_atomically(output_path(output, metadata.INFO_FILE), metadata.dumps(info))
        output_files.delete_temp_folder(output)  # what is left: the job's marker


def groups_block(config: JobConfig, census: split_groups.Census) -> Block:
    """The listing's ``groups`` block: who is in which split (left out when no image is in
    a group and no --group_by was given)."""
    declared = settings.info_values(config)
    group_by, asked = declared["groups"]["group_by"], declared["config"]["splits"]

    return Block("groups", lambda splits: split_groups.info_block(census, group_by, splits, asked))


def _rank(block: Block) -> int:
    """A block's place in imagerecords.json: metadata.BLOCK_ORDER's, others after it."""
    order = metadata.BLOCK_ORDER
    return order.index(block.name) if block.name in order else len(order)


def _names_of(config: JobConfig, wanted: set[int]) -> dict[int, str]:
    """Order key -> image ID for the keys in ``wanted``, by listing the input again.

    Runs only when the books do not balance, to name the images in the message.
    """
    if not wanted:
        return {}
    layout = config.layout
    ids = (
        row[0]
        for source in layout.sources
        for row in layout.rows(source)
        if not isinstance(row, listing.Skipped)
    )
    found = {}
    for image_id in ids:
        key = keys.order_key(config.seed, image_id)
        if key in wanted:
            found[key] = image_id
    return found
