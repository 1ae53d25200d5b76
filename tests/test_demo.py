"""`make demo` (scripts/demo.py), smaller: it says why its file was rejected and what to try next."""

import importlib.util
import os

import pytest

pytestmark = pytest.mark.e2e

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_demo_explains_its_rejection_and_the_next_commands(monkeypatch, capsys, tmp_path):
    spec = importlib.util.spec_from_file_location("demo", os.path.join(ROOT, "scripts", "demo.py"))
    demo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(demo)
    monkeypatch.setattr(demo, "PER_CLASS", 20)  # 121 files: 1 rejected stays under 1%
    docs_image = os.path.join(ROOT, "docs", "img", "contact_sheet.png")
    docs_before = os.stat(docs_image).st_mtime_ns
    mine = tmp_path / "photos-records"  # the walkthrough's output: not the demo's to replace
    mine.mkdir()
    for _ in range(2):  # a second run replaces its own photos and records
        assert demo.main(["--folder", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "contact_sheet.png",
        demo.RECORDS_DIR,
        demo.PHOTOS_DIR,
        "photos-records",
    ]
    assert len(list((tmp_path / demo.PHOTOS_DIR).glob("*/*"))) == 6 * 20 + 1
    # The sheet goes to the demo's own folder; the README's picture is not rewritten.
    assert f"contact sheet of each split's images: {tmp_path / 'contact_sheet.png'}" in out
    assert os.stat(docs_image).st_mtime_ns == docs_before
    assert "demo: 1 file rejected" in out
    assert "  cat/broken.jpg: corrupt image" in out  # the reason itself, not only the file
    tail = out[out.index("demo: done") :]
    assert "-m beam_pipeline --input PHOTOS --output RECORDS\n" in tail
    assert "--dry_run" in tail and "-m reader.inspect RECORDS" in tail
    assert tail.rstrip().endswith("(README.md, section Read).")
