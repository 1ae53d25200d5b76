"""``reader.inspect --report``: one self-contained page, rendered in a real headless Chromium.

Chromium is Debian's (``apt-get install chromium``; .ci/run installs it): a test
that needs it fails without it, it does not skip. In the browser every picture
must decode and the page must ask the network for nothing (its net log is read).
"""

from __future__ import annotations

import base64
import html.parser
import importlib.util
import io
import json
import os
import re
import shutil
import subprocess

import pytest
from PIL import Image

from beam_pipeline.__main__ import main as convert
from beam_pipeline.core import elements, keys
from reader import inspect as inspect_tool
from reader import load_info, report, report_lists
from tests import near_fixtures

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# --- pure helpers -------------------------------------------------------------------


def test_the_order_key_is_the_converters():
    for seed, image_id in ((42, "cat/a.jpg"), (0, "é/ü 1.png"), (7, ""), (2**40, "a" * 300)):
        assert report_lists.order_key(seed, image_id) == keys.order_key(seed, image_id)


def test_the_drop_reasons_are_the_converters():
    assert report_lists.DROP_REASONS == (
        elements.RejectKind.DUPLICATE.prefix,
        elements.RejectKind.NEAR_DUPLICATE.prefix,
    )


@pytest.mark.parametrize(
    "reason, kind, kept",
    [
        ("near duplicate of train/a/x.jpg", "near duplicate of", "train/a/x.jpg"),
        ("duplicate of b/y: z.png", "duplicate of", "b/y: z.png"),
        ("corrupt image data: Premature end", "corrupt image data", None),
        ("not an image", "not an image", None),
        (None, "?", None),
        (["list"], "?", None),
    ],
)
def test_reason_kind_and_kept(reason, kind, kept):
    assert report_lists.reason_kind(reason) == kind
    assert report_lists.kept_of(reason) == kept


@pytest.mark.parametrize(
    "of_shown, image_id, survivor",
    [
        ({}, "a", "a"),  # not dropped
        ({"b": "duplicate of a"}, "b", "a"),
        # --dedupe kept b over c, then the near search dropped b for a
        ({"c": "duplicate of b", "b": "near duplicate of a"}, "c", "a"),
        ({"c": "duplicate of b"}, "c", "b"),  # b's reason not read: as far as known
        ({"a": "duplicate of b", "b": "near duplicate of a"}, "a", "b"),  # a hostile cycle ends
        ({"b": "corrupt image: x"}, "b", "b"),  # rejected, not for a copy
    ],
)
def test_the_survivor_follows_the_drops(of_shown, image_id, survivor):
    assert report_lists.Rejects(of_shown=of_shown).survivor(image_id) == survivor


@pytest.mark.parametrize(
    "value, shown",
    [
        ("<script>x</script>", "&lt;script&gt;x&lt;/script&gt;"),
        ('" onerror="x', "&quot; onerror=&quot;x"),
        ("a'b&c", "a&#x27;b&amp;c"),
        ("\ud800z", "?z"),
        (12, "12"),
        ({"a": 1}, "{&quot;a&quot;: 1}"),
        ("x" * 10, "xxxx…"),
    ],
)
def test_text_escapes_cuts_and_replaces(value, shown):
    assert report.text(value, limit=5 if value == "x" * 10 else 100) == shown


def test_a_report_must_be_an_html_file_in_a_folder_that_exists(tmp_path, capsys):
    with pytest.raises(inspect_tool.InspectUsageError, match="--report must name a .html file"):
        inspect_tool.parse_args(["somewhere", "--report", "page.png"])
    missing = tmp_path / "no such folder" / "page.html"
    assert inspect_tool.main([str(tmp_path), "--report", str(missing)]) == inspect_tool.EXIT_USAGE
    said = capsys.readouterr().err
    assert said == f"error: --report: the folder {missing.parent} does not exist\n"


# --- in the browser -----------------------------------------------------------------


def chromium() -> str:
    found = shutil.which("chromium")
    if found is None:  # CI installs it (.ci/run): missing is a failure, not a skip
        pytest.fail("chromium is not installed: apt-get install -y chromium")
    return found


# What the browser does on its own (time sync, account checks) has no origin as
# its initiator; what a page asks for has the page's (a file: page's is "null").
BROWSER_OWN = "not an origin"


def render(page, tmp_path, *extra) -> tuple[str, list[str]]:
    """The page's DOM once loaded in headless Chromium, and every URL it asked the network for."""
    log = tmp_path / f"net-{os.path.basename(page)}.json"
    done = subprocess.run(
        [
            chromium(),
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--disable-background-networking",
            f"--user-data-dir={tmp_path / 'chromium-profile'}",
            # Nothing resolves, so nothing could be fetched even if asked for.
            "--host-resolver-rules=MAP * ~NOTFOUND",
            f"--log-net-log={log}",
            "--virtual-time-budget=10000",
            "--dump-dom",
            *extra,
            f"file://{page}",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    text = log.read_text()
    try:
        events = json.loads(text)
    except json.JSONDecodeError:  # a log cut at its last event
        events = json.loads(text.rstrip().rstrip(",") + "]}")
    start = events["constants"]["logEventTypes"]["URL_REQUEST_START_JOB"]
    asked = [
        e["params"]["url"]
        for e in events["events"]
        if e["type"] == start
        and "url" in e.get("params", {})
        and e["params"].get("initiator") != BROWSER_OWN
    ]
    return done.stdout, asked


@pytest.mark.e2e
def test_the_net_log_check_sees_what_a_page_fetches(tmp_path):
    """The control for the check below: a page that does ask the network is caught."""
    page = tmp_path / "fetches.html"
    page.write_text(
        '<html><body><img src="http://report-test.invalid/a.png">'
        '<script src="https://cdn.invalid/x.js"></script></body></html>'
    )
    _, asked = render(page, tmp_path)
    assert sorted(asked) == ["http://report-test.invalid/a.png", "https://cdn.invalid/x.js"]


class Page(html.parser.HTMLParser):
    """The parts of a report the tests look at: every URL-like attribute, the
    images (with their alt text), the figures' text by member ID, the sections."""

    def __init__(self, text: str):
        super().__init__()
        self.urls, self.images, self.scripts = [], [], 0
        self.figures: dict[str, list[str]] = {}  # id -> the figure's text
        self.sections: dict[str, str] = {}  # id -> the section's text
        self.groups: dict[str, list[dict]] = {}  # section id -> its groups
        self._figure = self._section = self._group = None
        self._depth = 0
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        for name in ("src", "href", "srcset", "action", "poster", "data", "formaction"):
            if name in attrs:
                self.urls.append(attrs[name])
        if tag == "script":
            self.scripts += 1
        if tag == "section":
            self._section = attrs.get("id")
            self.sections[self._section] = ""
            self.groups[self._section] = []
        if tag == "div" and attrs.get("class") == "group":
            self._group = {"page": attrs.get("data-page"), "figures": []}
            self.groups[self._section].append(self._group)
        if tag == "figure":
            self._figure = {"class": attrs.get("class"), "id": attrs.get("data-id")}
            self._figure |= {"text": "", "img": None}
            self._group["figures"].append(self._figure)
        if tag == "img":
            self.images.append(attrs)
            if self._figure is not None:
                self._figure["img"] = attrs

    def handle_endtag(self, tag):
        if tag == "figure":
            self._figure = None
        if tag == "section":
            self._section = None

    def handle_data(self, data):
        if self._figure is not None:
            self._figure["text"] += data + "\n"
        if self._section is not None:
            self.sections[self._section] += data


def members(page: Page, section: str) -> list[list[dict]]:
    """Per group of a section, its figures: ``id``, ``class``, ``img``, ``text``."""
    return [group["figures"] for group in page.groups[section]]


def check_in_browser(html_file, tmp_path) -> Page:
    """Every picture decodes, nothing is fetched, and the page references nothing
    outside itself; returns the parsed page."""
    text = open(html_file, encoding="utf-8").read()
    page = Page(text)
    assert page.images and page.scripts == 1
    assert all(u.startswith("data:image/jpeg;base64,") for u in page.urls if not u.startswith("#"))
    assert not re.search(r"url\(|@import", text)  # no picture or sheet from CSS
    dom, asked = render(html_file, tmp_path)
    assert asked == []
    decoded = re.search(r'<body[^>]* data-images-decoded="(\d+) of (\d+)"', dom)
    assert decoded, dom[:500]
    assert decoded.group(1) == decoded.group(2) == str(len(page.images))
    return page


def _demo_module():
    spec = importlib.util.spec_from_file_location("demo", os.path.join(ROOT, "scripts", "demo.py"))
    demo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(demo)
    return demo


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """The demo's photos, 8 a class and its broken file, with one cat photo also
    filed as coffee (identical files in two classes)."""
    work = tmp_path_factory.mktemp("report-demo")
    module = _demo_module()
    module.PER_CLASS = 8
    module.build_sample(str(work / "photos"))
    shutil.copy(work / "photos" / "cat" / "cat_001.jpg", work / "photos" / "coffee" / "cat.jpg")
    out = work / "records"
    argv = ["--input", str(work / "photos"), "--output", str(out), "--image_size", "96"]
    argv += ["--min_shards", "3"]  # the finder searches across shards
    assert convert([*argv, "--quiet", "--max_reject_fraction", "0.5"]) == 0
    return out


# The fixture drops most of its near copies, and near drops count towards
# --max_reject_fraction.
NEAR_DROPS_OK = ("--max_reject_fraction", "0.6")


@pytest.fixture(scope="module")
def grouped(tmp_path_factory):
    """Near copies across the pre-split layout's splits, one photo also as identical
    files in two classes and splits, converted with --dedupe near."""
    work = tmp_path_factory.mktemp("report-grouped")
    folder = near_fixtures.near_folder(str(work / "images"))
    shutil.copy(work / "images/train/a/coffee.jpg", work / "images/train/b/coffee_again.jpg")
    shutil.copy(work / "images/train/a/coffee.jpg", work / "images/val/b/coffee_val.jpg")
    out = work / "records"
    assert (
        convert(
            ["--input", folder, "--output", str(out), "--dedupe", "near", "--quiet", *NEAR_DROPS_OK]
        )
        == 0
    )
    return work


def _inspect(*argv) -> int:
    return inspect_tool.main([str(a) for a in argv])


def _rejects(out) -> dict[str, str]:
    with open(os.path.join(out, "rejects.jsonl")) as f:
        return {r["id"]: r["reason"] for r in map(json.loads, f)}


@pytest.mark.e2e
def test_the_demos_report_renders_every_picture_and_fetches_nothing(demo, tmp_path, capsys):
    page_file = tmp_path / "report.html"
    assert _inspect(demo, "--report", page_file, "--no_shuffle_check") == 0
    assert f"-> {page_file}" in capsys.readouterr().out
    page = check_in_browser(page_file, tmp_path)
    # The cat photo filed as coffee too: both classes, both pictures.
    [conflict] = members(page, "identical-across-classes")
    assert sorted(f["id"] for f in conflict) == ["cat/cat_001.jpg", "coffee/cat.jpg"]
    assert all(f["img"] and f["img"]["alt"] == f["id"] for f in conflict)
    # Every class with its counts, the broken file under its reason, the sheet.
    info = load_info(str(demo))
    assert all(name in page.sections["classes"] for name in info.classes)
    reason = _rejects(demo)["cat/broken.jpg"]
    assert (
        f"{report_lists.reason_kind(reason)}1cat/broken.jpg (train): {reason}"
        in page.sections["rejects"]
    )
    sheets = [i for i in page.images if i.get("alt") == "contact sheet"]
    assert len(sheets) == 1
    # Without --dedupe every member of every group is written and pictured.
    shown = [f for s in page.groups for g in members(page, s) for f in g]
    assert shown and all(f["class"] == "kept" and f["img"] for f in shown)


def _thumb(uri: str) -> Image.Image:
    data = base64.b64decode(uri.split(",", 1)[1])
    return Image.open(io.BytesIO(data)).convert("L").resize((8, 8))


def _photo(image_id: str) -> str:
    """The photo a file of the grouped folder was made from: ``coffee`` for ``val/a/coffee_small.jpg``."""
    return os.path.basename(image_id).split(".")[0].split("_")[0]


def _distance(a: Image.Image, b: Image.Image) -> float:
    return sum(abs(x - y) for x, y in zip(a.getdata(), b.getdata(), strict=True)) / 64


@pytest.mark.e2e
def test_the_grouped_report_shows_which_member_was_kept(grouped, tmp_path):
    out = grouped / "records"
    page_file = tmp_path / "report.html"
    assert _inspect(out, "--report", page_file, "--no_shuffle_check", "--samples", "4") == 0
    page = check_in_browser(page_file, tmp_path)
    rejects = _rejects(out)
    across = members(page, "near-across-splits")
    assert [sorted(f["id"] for f in g) for g in across] == [
        g for g in near_fixtures.GROUPS if len({i.split("/")[0] for i in g}) > 1
    ]
    for group in across + members(page, "identical-across-classes"):
        for figure in group:
            reason = rejects.get(figure["id"])
            if reason is None:  # the member kept: written, and its picture shown
                assert figure["class"] == "kept" and figure["img"]["alt"] == figure["id"]
            else:  # dropped: not written, and the page names the one kept
                assert figure["class"] == "dropped" and figure["img"] is None
                assert f"dropped: {reason}" in figure["text"].replace("\n", "")
        assert sum(f["class"] == "kept" for f in group) == 1
    for group in across:
        dropped = [rejects[f["id"]] for f in group if f["id"] in rejects]
        [kept] = {report_lists.kept_of(r) for r in dropped}
        said = f"--dedupe kept {kept}, dropped {len(dropped)}"
        assert said in page.sections["near-across-splits"]
    # A thumbnail is its own photo, not another's.
    photos = {i: Image.open(grouped / "images" / i).convert("L").resize((8, 8)) for i in rejects}
    for image in page.images:
        if image["alt"] in photos or image["alt"] == "contact sheet":
            continue
        own = Image.open(grouped / "images" / image["alt"]).convert("L").resize((8, 8))
        mine = _thumb(image["src"])
        others = [
            _distance(mine, p) for i, p in photos.items() if _photo(i) != _photo(image["alt"])
        ]
        assert _distance(mine, own) < 8 < min(others)


@pytest.mark.e2e
def test_a_section_shows_its_cap_in_pages_and_says_how_many_it_leaves_out(
    grouped, tmp_path, monkeypatch
):
    info = load_info(str(grouped / "records"))
    monkeypatch.setattr(report, "GROUPS_PER_PAGE", 1)
    page_file = tmp_path / "capped.html"
    written = report.write_report(info, str(page_file), ["train"], 2, 0, groups_shown=2)
    text = page_file.read_text()
    page = Page(text)
    groups = page.groups["near-across-splits"]
    assert [g["page"] for g in groups] == ["1", "2"]
    assert (
        "1 more group not shown (the page shows the first 2)" in page.sections["near-across-splits"]
    )
    assert written.groups == sum(len(g) for g in page.groups.values())
    # Only the first page shows in the browser; the script paged it.
    dom, _ = render(page_file, tmp_path)
    section = dom[dom.index('id="near-across-splits"') :]
    section = section[: section.index("</section>")]
    assert "page 1 of 2" in section
    heads = re.findall(r'<div class="group" data-page="(\d)"( hidden="")?', section)
    assert heads == [("1", ""), ("2", ' hidden=""')]


HOSTILE_ID = '<script>document.body.dataset.pwned="1"</script>'
HOSTILE_SPLIT = '"><img src="http://evil.invalid/x.png">'
HOSTILE_LABEL = "</figure><style>body{background:red}</style>\ud800"


@pytest.mark.e2e
def test_hostile_lists_are_shown_as_text_and_open_nothing_outside(grouped, tmp_path):
    out = tmp_path / "records"
    shutil.copytree(grouped / "records", out)
    outside = tmp_path / "outside.jsonl"
    outside.write_text(json.dumps({"members": [{"id": "SECRET-1"}, {"id": "SECRET-2"}]}) + "\n")
    meta = json.loads((out / "imagerecords.json").read_text())
    meta["duplicates"]["file"] = "../outside.jsonl"
    (out / "imagerecords.json").write_text(json.dumps(meta))
    rows = [
        {
            "members": [
                {"id": HOSTILE_ID, "split": "train", "label": HOSTILE_LABEL},
                {"id": "x" * 100_000, "split": HOSTILE_SPLIT, "label": 7},
            ],
            "pairs": [{"a": HOSTILE_ID, "b": "x", "distance": "<b>2</b>"}],
        },
        "not a group",
    ]
    (out / "near_duplicates.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in rows)
        + "{not json\n"
        + "[" * 100_000  # nested past Python's recursion limit: one row that is not JSON
        + "]" * 100_000
        + "\n"
    )
    with open(out / "rejects.jsonl", "a") as f:
        f.write(json.dumps({"id": HOSTILE_ID, "reason": HOSTILE_SPLIT, "split": "train"}) + "\n")
    meta["rejected"]["count"] += 1
    (out / "imagerecords.json").write_text(json.dumps(meta))
    page_file = tmp_path / "hostile.html"
    assert _inspect(out, "--report", page_file, "--no_shuffle_check") == 0
    text = page_file.read_text()
    assert HOSTILE_ID not in text and HOSTILE_SPLIT not in text and "<style>body" not in text
    assert "&lt;script&gt;" in text and "SECRET" not in text
    assert len(text) < 2_000_000  # the 100,000-character ID is cut
    page = check_in_browser(page_file, tmp_path)
    assert "is not a file name inside the dataset" in page.sections["identical-across-classes"]
    dom, _ = render(page_file, tmp_path)
    assert "pwned" not in dom.split("<body", 1)[1].split(">", 1)[0]


@pytest.mark.e2e
def test_the_finder_finds_each_record_by_id_reading_few(demo):
    import tensorflow as tf

    info = load_info(str(demo))
    assert all(len(split.shards) >= 2 for split in info.splits.values())
    by_split = {}
    for name, split in info.splits.items():
        records = by_split[name] = {}
        for data in tf.data.TFRecordDataset(split.files).as_numpy_iterator():
            feature = tf.train.Example.FromString(data).features.feature
            image_id = feature["image/filename"].bytes_list.value[0].decode()
            records[image_id] = feature["image/encoded"].bytes_list.value[0]
        # Every record, from any shard, and nothing for an ID that is not there.
        assert report_lists.RecordFinder(info, name).find([*records, "cat/none.jpg"]) == records
    records, split = by_split["train"], info.split("train")
    some = sorted(records)[:2]
    one = report_lists.RecordFinder(info, "train")
    assert one.find(some) == {i: records[i] for i in some}
    # Two binary searches, not a walk through the split.
    assert one.reads <= 2 * (len(split.shards).bit_length() + len(records).bit_length())
    assert one.reads < len(records) == split.num_examples
