"""The hooks a feature plugs into (stages/hooks.py): a step in each engine's STEPS and
the blocks Finalize publishes, run through the real command line on both engines."""

from __future__ import annotations

import io
import json
import pickle

import apache_beam as beam
import pytest
from apache_beam.pvalue import AsSingleton, TaggedOutput

from beam_pipeline.__main__ import main
from beam_pipeline.cli import arguments
from beam_pipeline.core import images, settings
from beam_pipeline.core.elements import RecordBatch, Rejection, RejectKind
from beam_pipeline.engines import local_engine, pipeline
from beam_pipeline.features.near.feature import PIXELS
from beam_pipeline.stages import finalize, hooks
from tests.image_factory import make_class_folders, photo

NAME = "threes"
REASON = "dropped by the threes step"


def _drop_threes(batch: RecordBatch) -> tuple[RecordBatch, list[Rejection]]:
    """The toy feature's rule: a record whose ID ends in 3.jpg is dropped."""
    dropped = [e for e in batch.entries if e.image_id.endswith("3.jpg")]
    kept = tuple(e for e in batch.entries if e not in dropped)
    rejections = [
        Rejection(e.image_id, e.path, batch.split, REASON, RejectKind.BAD_IMAGE) for e in dropped
    ]
    return batch._replace(entries=kept), rejections


def _run_local(config, batches, counted):
    kept, rejected = [], []
    for batch in batches:
        batch, rejections = _drop_threes(batch)
        kept.append(batch)
        rejected += rejections
    return kept, rejected, sum(len(b.entries) for b in kept)


def _blocks(config, results):
    kept = results[NAME]
    return [hooks.fixed("threes", {"kept": kept}, (("threes.txt", f"{kept}\n".encode()),))]


class _DropFn(beam.DoFn):
    def process(self, batch):
        batch, rejections = _drop_threes(batch)
        for rejection in rejections:
            yield TaggedOutput("rejected", rejection)
        yield batch


class _DropThrees(beam.PTransform):
    def expand(self, batches):
        out = batches | "Drop" >> beam.ParDo(_DropFn()).with_outputs("rejected", main="batches")
        kept = (
            out.batches
            | "Sizes" >> beam.Map(lambda b: len(b.entries))
            | "Kept" >> beam.CombineGlobally(sum)
        )
        return {"batches": out.batches, "rejected": out.rejected, "kept": kept}


def _transform(config) -> _DropThrees:
    return _DropThrees()


LOCAL = hooks.LocalStep(NAME, _run_local, _blocks)
BEAM = hooks.BeamStep(NAME, _transform, "kept", AsSingleton, _blocks)


@pytest.mark.parametrize(
    "given",
    [
        ["reuse", "near_duplicates", "groups", "duplicates", "label_conflicts"],
        ["threes", "label_conflicts", "duplicates"],
        ["duplicates", "groups", "near_duplicates", "label_conflicts", "reuse", "threes"],
    ],
)
def test_blocks_take_the_formats_order_whatever_order_they_come_in(given):
    order = ("duplicates", "groups", "near_duplicates", "label_conflicts", "reuse", "threes")
    blocks = sorted((hooks.fixed(name, {}) for name in given), key=finalize._rank)
    assert [b.name for b in blocks] == [name for name in order if name in given]


@pytest.mark.parametrize("runner", [[], ["--runner", "DirectRunner"]])
def test_a_new_step_is_one_entry_in_each_engines_steps(tmp_path, monkeypatch, runner):
    """A step added to STEPS drops records and publishes its block and file, on both
    engines, after the blocks the format names."""
    make_class_folders(str(tmp_path / "in"), classes=("cat", "dog"), per_class=8)
    monkeypatch.setattr(local_engine, "STEPS", (*local_engine.STEPS, LOCAL))
    monkeypatch.setattr(pipeline, "STEPS", (*pipeline.STEPS, BEAM))
    output = tmp_path / "out"
    argv = ["--input", str(tmp_path / "in"), "--output", str(output), "--image_size", "32"]
    assert main([*argv, "--max_reject_fraction", "0.5", "--quiet", *runner]) == 0
    info = json.loads((output / "imagerecords.json").read_text())
    written = sum(split["num_examples"] for split in info["splits"].values())
    rejected = [json.loads(line) for line in (output / "rejects.jsonl").read_text().splitlines()]
    dropped = sorted(r["id"] for r in rejected if r["reason"] == REASON)
    assert dropped == ["cat/batch1/cat_0003.jpg", "dog/batch1/dog_0003.jpg"]
    assert list(info)[-1] == "threes" and info["threes"] == {"kept": written} and written == 14
    assert (output / "threes.txt").read_text() == "14\n"


# ------------------------------------------------------------ the pixel hook


def _jpeg(side: int) -> bytes:
    buffer = io.BytesIO()
    photo(side, side, seed=3).save(buffer, "JPEG", quality=90)
    return buffer.getvalue()


@pytest.mark.parametrize("size", [256, 48])  # passed through; re-encoded
def test_the_pixel_hook_travels_pickled_and_gives_the_same_fingerprint(size):
    """A pool process or a Beam worker gets the spec pickled: the hook's functions
    arrive by name and fingerprint as in the launching process."""
    spec = images.ImageSpec(size=size, pixels=PIXELS)
    travelled = pickle.loads(pickle.dumps(spec))
    assert travelled == spec and travelled.near_scheme == PIXELS.scheme
    here, there = images.convert(_jpeg(128), spec), images.convert(_jpeg(128), travelled)
    assert here.passed_through is (size == 256)
    assert there == here and len(here.near) == sum(map(len, here.near_features)) > 0


def test_without_the_hook_convert_makes_no_fingerprint():
    stored = images.convert(_jpeg(128), images.ImageSpec(size=256))
    assert stored.passed_through and stored.near == b"" and stored.near_features is None
    assert settings.image_settings(images.ImageSpec())[images.SCHEME_SETTING] is None


def test_every_run_gets_the_hook_from_the_command_line():
    command = arguments.parse_args(["--input", "in", "--output", "out"])
    assert command.config.image.pixels == PIXELS
    recorded = settings.image_settings(command.config.image)
    assert recorded[images.SCHEME_SETTING] == PIXELS.scheme
