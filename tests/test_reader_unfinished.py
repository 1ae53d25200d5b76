"""An interrupted conversion: the reader and ``inspect`` name it and say how to resume it.

The converter writes its marker (``.imagerecords-tmp/job.json``) first and
deletes it last, after ``imagerecords.json``. A folder with the marker and no
``imagerecords.json`` is a run that did not finish, whatever else it holds.
"""

from __future__ import annotations

import io
import subprocess
import sys
from contextlib import redirect_stderr, redirect_stdout

import pytest

import reader
from beam_pipeline.core import metadata
from beam_pipeline.stages import resume
from beam_pipeline.storage import output
from reader import info as info_lib
from reader import inspect as inspect_tool
from tests.image_factory import add_bad_files, make_class_folders


def test_the_reader_names_the_converters_marker_as_the_converter_does():
    # The reader cannot import the converter (it needs TensorFlow alone), so it
    # declares the name itself; this is where the two are held together.
    assert info_lib.CONVERTER_MARKER == output.MARKER


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    root = tmp_path_factory.mktemp("unfinished") / "images"
    make_class_folders(str(root), per_class=4, size_range=(24, 40))
    return root


@pytest.fixture
def marker_only(images, tmp_path):
    """What a run leaves when it is killed right after its start: the marker alone."""
    out = tmp_path / "marker-only"
    resume.prepare(str(out), {"input": str(images), "seed": 42}, overwrite=False, spill_dir=None)
    return out


@pytest.fixture
def failed_run(images, tmp_path):
    """A real run that failed after converting: the marker, spill files, no shards."""
    add_bad_files(str(images))
    out = tmp_path / "failed"
    result = subprocess.run(
        [sys.executable, "-m", "beam_pipeline", "--input", str(images), "--output", str(out)]
        + ["--image_size", "24", "--local_processes", "1", "--max_reject_fraction", "0"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 1 and "too many rejected images" in result.stderr, result.stderr
    assert (out / output.MARKER).exists() and not (out / metadata.INFO_FILE).exists()
    assert list((out / metadata.TMP_DIR / "spill").glob("*.spill")), "no spill files"
    assert not list(out.glob("*.tfrecord"))
    return out


@pytest.fixture(params=["marker_only", "failed_run"])
def unfinished(request, images):
    return request.getfixturevalue(request.param), images


def _says_unfinished(message: str, out, images) -> None:
    assert f"cannot read dataset at {out}: the conversion into it did not finish" in message
    assert ".imagerecords-tmp/job.json" in message
    assert "is this an imagerecords output folder" not in message
    assert (
        f"Run the converter's command again (python -m beam_pipeline --input {images} "
        f"--output {out} ..., with the same settings) to resume it"
    ) in message


@pytest.mark.e2e
def test_load_info_and_make_dataset_name_the_unfinished_conversion(unfinished):
    out, images = unfinished
    with pytest.raises(reader.IncompleteDatasetError) as error:
        reader.load_info(out)
    _says_unfinished(str(error.value), out, images)
    with pytest.raises(reader.IncompleteDatasetError) as error:
        reader.make_dataset(out, "train", 4, 24, training=False)
    _says_unfinished(str(error.value), out, images)


@pytest.mark.e2e
def test_inspect_names_the_unfinished_conversion_in_one_line(unfinished):
    out, images = unfinished
    text = io.StringIO()
    with redirect_stdout(text), redirect_stderr(text):
        status = inspect_tool.main([str(out), "--verify"])
    assert status == inspect_tool.EXIT_USAGE
    assert text.getvalue().startswith("error: ") and text.getvalue().count("\n") == 1
    _says_unfinished(text.getvalue(), out, images)


def test_a_folder_without_the_marker_is_still_not_called_unfinished(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(reader.IncompleteDatasetError, match="is this an imagerecords output"):
        reader.load_info(tmp_path / "empty")
