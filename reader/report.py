"""``reader.inspect PATH --report FILE.html``: one page to check the duplicate groups by eye.

The near-copy and identical-file groups side by side with thumbnails, the
classes per split, the reject reasons with examples and the contact sheet, in
one HTML file: every picture inline (``data:`` JPEG), no script or style from
elsewhere, nothing fetched. Each section shows at most a fixed number of
groups (in pages) and says how many it leaves out, so the page and the
thumbnails decoded stay bounded at any dataset size.
"""

from __future__ import annotations

import base64
import bisect
import collections
import dataclasses
import hashlib
import html
import io
import json
import math
from collections.abc import Callable, Iterator, Mapping, Sequence

import tensorflow as tf

from reader import info as info_lib
from reader import pictures, shard_file
from reader.shard_file import ShardReadError

# What one page holds, whatever the dataset's size: at most GROUPS_SHOWN groups
# of MEMBERS_SHOWN thumbnails per section (~5 kB each), in pages of
# GROUPS_PER_PAGE, so a section adds at most ~2 MB.
GROUPS_SHOWN = 50
GROUPS_PER_PAGE = 10
MEMBERS_SHOWN = 8
PAIRS_SHOWN = 12
THUMB = 112
THUMB_QUALITY = 80
SHEET_QUALITY = 85
REASONS_SHOWN = 30
EXAMPLES_PER_REASON = 5
CLASSES_SHOWN = 1000
# A dataset string longer than this is cut (a hostile ID could be megabytes).
TEXT_SHOWN = 240

# The reasons --dedupe gives the images it drops (beam_pipeline.core.elements.
# RejectKind.DUPLICATE and NEAR_DUPLICATE, which the reader cannot import: a test
# checks that the two agree). What follows is the ID of the image kept.
DROP_REASONS = ("duplicate of ", "near duplicate of ")


def order_key(seed: int, image_id: str) -> int:
    """The record's global-shuffle key (docs/format.md section 3; beam_pipeline.core.keys.
    order_key, which the reader cannot import: a test checks that the two agree)."""
    payload = f"{seed}\0order\0{image_id}".encode("utf-8", "surrogatepass")
    return int.from_bytes(hashlib.blake2b(payload, digest_size=8).digest(), "big")


def text(value, limit: int = TEXT_SHOWN) -> str:
    """Any value from the dataset as HTML text: cut to ``limit`` characters, escaped
    (quotes too, so it is safe in an attribute), lone surrogates replaced."""
    value = value if isinstance(value, str) else json.dumps(value)
    if len(value) > limit:
        value = value[: limit - 1] + "…"
    return html.escape(value.encode("utf-8", "replace").decode("utf-8"), quote=True)


def bare_file_name(name) -> str | None:
    """``name`` when it names a file directly in the dataset's folder, else None.

    A block's ``file`` is the dataset's word: ``../x``, ``/etc/x`` or ``gs://other``
    would open something outside it.
    """
    if not isinstance(name, str) or not 0 < len(name) <= 255 or name in (".", ".."):
        return None
    if any(c in name for c in "/\\\0:") or not name.isprintable():
        return None
    return name


def reason_kind(reason) -> str:
    """What a reject reason is, without its details: ``near duplicate of`` for every
    image --dedupe near dropped, the words before the first ``:`` otherwise."""
    reason = reason if isinstance(reason, str) else "?"
    for prefix in DROP_REASONS:
        if reason.startswith(prefix):
            return prefix.strip()
    return reason.split(":", 1)[0]


def kept_of(reason) -> str | None:
    """The ID a --dedupe drop names as kept, or None for any other reason."""
    if isinstance(reason, str):
        for prefix in DROP_REASONS:
            if reason.startswith(prefix):
                return reason[len(prefix) :]
    return None


def _str(value) -> str:
    return value if isinstance(value, str) else json.dumps(value)


@dataclasses.dataclass(frozen=True)
class Member:
    id: str
    split: str
    label: str


@dataclasses.dataclass(frozen=True)
class Group:
    """One line of a list: its members and, for near copies, the pairs' distances."""

    members: tuple[Member, ...]
    pairs: tuple[tuple[str, str, int | None], ...] = ()
    digest: str | None = None

    @property
    def across_splits(self) -> bool:
        return len({m.split for m in self.members}) > 1

    @property
    def across_classes(self) -> bool:
        return len({m.label for m in self.members}) > 1


def group_of(row) -> Group | None:
    """A group from a row of ``near_duplicates.jsonl`` or ``duplicates.jsonl``, or None
    for a row that is not one (each value is taken as text; nothing is trusted)."""
    if not isinstance(row, dict) or not isinstance(row.get("members"), list):
        return None
    members = tuple(
        Member(_str(m.get("id")), _str(m.get("split")), _str(m.get("label")))
        for m in row["members"]
        if isinstance(m, dict)
    )
    pairs = tuple(
        (_str(p.get("a")), _str(p.get("b")), p["distance"] if _is_int(p.get("distance")) else None)
        for p in row.get("pairs") or ()
        if isinstance(p, dict)
    )
    digest = row.get("sha256")
    return Group(members, pairs, digest if isinstance(digest, str) else None)


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclasses.dataclass(frozen=True)
class ListSection:
    """A section of groups read from one of the dataset's lists.

    ``block`` is the imagerecords.json block whose ``file`` names the list,
    ``keep`` which of its groups the section shows. A new list (label
    conflicts, say) is one more entry in :data:`SECTIONS`.
    """

    key: str  # the HTML id: letters and -, never the dataset's
    title: str
    about: str
    block: str
    keep: Callable[[Group], bool]
    parse: Callable[[object], Group | None] = group_of


SECTIONS = (
    ListSection(
        "near-across-splits",
        "Near copies across splits",
        "Groups of near copies (resized, re-encoded, lightly cropped or brightened) with "
        "members in more than one split: a model would be evaluated on pictures it trained on.",
        "near_duplicates",
        lambda g: g.across_splits,
    ),
    ListSection(
        "identical-across-classes",
        "Identical files in more than one class",
        "The same bytes under two or more class names: at most one label is right.",
        "duplicates",
        lambda g: g.across_classes,
    ),
    ListSection(
        "identical",
        "Other identical files",
        "The same bytes more than once, within one class.",
        "duplicates",
        lambda g: not g.across_classes,
    ),
    ListSection(
        "near-within-split",
        "Near copies within one split",
        "Groups of near copies whose members all lie in one split.",
        "near_duplicates",
        lambda g: not g.across_splits,
    ),
)


@dataclasses.dataclass
class Shown:
    """What a section shows: its first groups, and how many it has in all."""

    section: ListSection
    groups: list[Group] = dataclasses.field(default_factory=list)
    total: int = 0
    problem: str | None = None  # why the list could not be read, in words


def list_rows(info: info_lib.DatasetInfo, block: str) -> Iterator[object]:
    """The rows of the list a block names (JSON values, or None for a line that is not
    JSON), read line by line. Raises ValueError naming why the list cannot be read."""
    entry = info.raw.get(block)
    if not isinstance(entry, Mapping):
        raise ValueError(f"this dataset has no {block} block")
    name = bare_file_name(entry.get("file"))
    if name is None:
        raise ValueError(f"its {block}.file {text(entry.get('file'))} is not a file of the dataset")
    path = info_lib.join_path(info.path, name)
    if not tf.io.gfile.exists(path):
        raise ValueError(f"{text(name)} is missing")
    with tf.io.gfile.GFile(path, "rb") as f:
        for line in f:
            if line.strip():
                try:
                    yield json.loads(line.decode("utf-8", "replace"))
                except json.JSONDecodeError:
                    yield None


def read_sections(
    info: info_lib.DatasetInfo, sections: Sequence[ListSection], shown: int
) -> list[Shown]:
    """Each section's first ``shown`` groups and its total, one pass over each list."""
    out = [Shown(s) for s in sections]
    by_block = collections.defaultdict(list)
    for item in out:
        by_block[item.section.block].append(item)
    for block, items in by_block.items():
        try:
            for row in list_rows(info, block):
                for item in items:
                    group = item.section.parse(row)
                    if group is not None and len(group.members) > 1 and item.section.keep(group):
                        item.total += 1
                        if len(item.groups) < shown:
                            item.groups.append(group)
        except (ValueError, tf.errors.OpError, OSError) as error:
            why = error.message if isinstance(error, tf.errors.OpError) else str(error)
            for item in items:
                item.problem = why
    return out


@dataclasses.dataclass
class Rejects:
    """One pass over the rejects list: counts per kind of reason, examples, and the
    reason of each image the page shows."""

    kinds: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    examples: dict = dataclasses.field(default_factory=dict)
    of_shown: dict = dataclasses.field(default_factory=dict)
    problem: str | None = None


def read_rejects(info: info_lib.DatasetInfo, shown_ids: set[str]) -> Rejects:
    out = Rejects()
    if not info.rejected_count:
        return out
    try:
        for row in list_rows(info, "rejected"):
            if not isinstance(row, dict):
                continue
            reason, image_id = _str(row.get("reason")), _str(row.get("id") or row.get("path"))
            kind = reason_kind(reason)
            out.kinds[kind] += 1
            examples = out.examples.setdefault(kind, [])
            if len(examples) < EXAMPLES_PER_REASON and len(out.examples) <= REASONS_SHOWN * 2:
                examples.append((image_id, _str(row.get("split")), reason))
            if image_id in shown_ids:
                out.of_shown[image_id] = reason
    except (ValueError, tf.errors.OpError, OSError) as error:
        out.problem = error.message if isinstance(error, tf.errors.OpError) else str(error)
    return out


class RecordFinder:
    """Finds records of a split by ID: a split's records, shard after shard, are in
    increasing order key (docs/format.md section 3), so a binary search over the
    records' positions reads about log2(records) of them per ID, sharing the
    first probes between IDs. A record whose ID differs is not the one asked for."""

    def __init__(self, info: info_lib.DatasetInfo, split: str):
        self.seed = info.seed
        self.shards = info.split(split).shards
        self.starts, total = [], 0
        for shard in self.shards:
            self.starts.append(total)
            total += shard.num_examples if _is_int(shard.num_examples) else 0
        self.total = total
        self.probed: dict[int, tuple[int, str, bytes]] = {}

    def usable(self) -> bool:
        counts = [s.num_examples for s in self.shards]
        return _is_int(self.seed) and all(_is_int(n) and n >= 0 for n in counts)

    def _record(self, index: int) -> tuple[int, str, bytes]:
        if index not in self.probed:
            shard = bisect.bisect_right(self.starts, index) - 1
            local, example = index - self.starts[shard], None
            try:
                for at, data in shard_file.walk_records(self.shards[shard].path, {local}):
                    example = shard_file.parse_example(data, f"record {at}")
                if example is None:
                    raise ShardReadError(f"it has no record {local:,}")
            except ShardReadError as error:
                raise ShardReadError(f"{self.shards[shard].file}: {error}") from None
            name = shard_file.feature(example, "image/filename")
            jpeg = shard_file.feature(example, "image/encoded")
            image_id = name.decode("utf-8", "replace") if isinstance(name, bytes) else ""
            key = order_key(self.seed, image_id)
            self.probed[index] = (key, image_id, jpeg if isinstance(jpeg, bytes) else b"")
        return self.probed[index]

    def find(self, ids: Sequence[str]) -> dict[str, bytes]:
        """The stored JPEG of each ID found."""
        found: dict[str, bytes] = {}
        if not self.usable():
            return found
        targets = sorted((order_key(self.seed, i), i) for i in set(ids))
        stack = [(0, self.total, targets)]
        while stack:
            lo, hi, wanted = stack.pop()
            if not wanted or lo >= hi:
                continue
            mid = (lo + hi) // 2
            key, image_id, jpeg = self._record(mid)
            found.update({i: jpeg for k, i in wanted if k == key and i == image_id})
            stack.append((lo, mid, [t for t in wanted if t[0] < key]))
            stack.append((mid + 1, hi, [t for t in wanted if t[0] > key]))
        return found


def thumbnail(jpeg: bytes, size: int = THUMB) -> tuple[str, int, int] | None:
    """A ``data:`` URI of the image shrunk to fit ``size`` px, with its width and
    height; None when it does not decode (a record's bytes are the dataset's word)."""
    Image, _, _ = pictures.pillow()
    try:
        with Image.open(io.BytesIO(jpeg)) as image:
            image.draft("RGB", (size * 2, size * 2))  # decode at 1/2..1/8 scale when JPEG
            small = image.convert("RGB")
            small.thumbnail((size, size), Image.Resampling.BICUBIC)
    except Exception:  # noqa: BLE001 - Pillow raises many kinds on hostile bytes
        return None
    return _data_uri(small, THUMB_QUALITY), small.width, small.height


def _data_uri(image, quality: int) -> str:
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG", quality=quality)
    return "data:image/jpeg;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


@dataclasses.dataclass
class Pictures:
    """The thumbnails of the members shown (by ID), and why some have none."""

    by_split: dict = dataclasses.field(default_factory=dict)  # split -> id -> (uri, w, h)
    problems: list = dataclasses.field(default_factory=list)


def find_pictures(info: info_lib.DatasetInfo, wanted: Mapping[str, set[str]]) -> Pictures:
    out = Pictures()
    for split, ids in sorted(wanted.items()):
        if split not in info.splits or not ids:
            continue
        finder = RecordFinder(info, split)
        if not finder.usable():
            out.problems.append(f"{text(split)}: no seed or shard counts, records not looked up")
            continue
        try:
            found = finder.find(sorted(ids))
        except (ShardReadError, tf.errors.OpError, OSError) as error:
            why = error.message if isinstance(error, tf.errors.OpError) else str(error)
            out.problems.append(f"{text(split)}: {text(why, 500)}")
            continue
        out.by_split[split] = {i: thumbnail(jpeg) for i, jpeg in found.items()}
    return out


# The page's look and its only script. The script reads no dataset value: it
# pages through the groups by the numbers this module wrote into data-page,
# and, once the page has loaded, writes how many images decoded on <body>
# (data-images-decoded="N of M"), which the test reads from the rendered page.
STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:0;background:#f6f6f8;color:#222}
header{background:#1f2430;color:#eee;padding:12px 20px}
header h1{font-size:20px;margin:0 0 4px}
header nav a{color:#9cf;margin-right:14px}
main{padding:0 20px 40px}
section{background:#fff;border:1px solid #ddd;border-radius:6px;margin:16px 0;padding:10px 16px}
h2{font-size:17px;margin:6px 0}
.about,.more,.problem{color:#555;margin:4px 0}
.problem{color:#a40}
.group{border-top:1px solid #eee;padding:8px 0}
.group-head{font-size:13px;color:#444;margin-bottom:6px}
.tag{display:inline-block;background:#fde8c8;color:#7a4a00;border-radius:3px;padding:0 5px;
margin-left:6px;font-size:12px}
.members{display:flex;flex-wrap:wrap;gap:10px}
figure{margin:0;width:132px;border:2px solid #ccc;border-radius:4px;padding:4px;background:#fafafa}
figure.kept{border-color:#2a8a4a}
figure.dropped{border-color:#c44;opacity:.85}
figure .pic{height:112px;display:flex;align-items:center;justify-content:center;background:#eee}
figure .none{font-size:12px;color:#777;text-align:center;padding:4px}
figcaption{font-size:12px;word-break:break-all;margin-top:4px}
.id{font-family:ui-monospace,monospace}
.split{font-weight:600}
.status{color:#2a8a4a}
.dropped .status{color:#c44}
.pairs{font-size:12px;color:#555;margin-top:4px}
.pager button{margin:0 6px}
table{border-collapse:collapse;font-size:13px}
td,th{border:1px solid #ddd;padding:2px 8px;text-align:right}
td:first-child,th:first-child{text-align:left}
pre{font-size:12px;overflow-x:auto;background:#f3f3f3;padding:8px}
img.sheet{max-width:100%}
"""
SCRIPT = """
document.querySelectorAll("section[data-pages]").forEach(function (section) {
  var pages = Number(section.dataset.pages), now = 1;
  var groups = section.querySelectorAll(".group"), pager = section.querySelector(".pager");
  function show(page) {
    now = page;
    groups.forEach(function (g) { g.hidden = Number(g.dataset.page) !== page; });
    pager.querySelector("span").textContent = "page " + page + " of " + pages;
  }
  pager.querySelector(".previous").onclick = function () { if (now > 1) show(now - 1); };
  pager.querySelector(".next").onclick = function () { if (now < pages) show(now + 1); };
  pager.hidden = false;
  show(1);
});
window.addEventListener("load", function () {
  var images = document.images, decoded = 0;
  for (var i = 0; i < images.length; i++) {
    if (images[i].complete && images[i].naturalWidth > 0) decoded++;
  }
  document.body.setAttribute("data-images-decoded", decoded + " of " + images.length);
});
"""
# Nothing but this page's own inline style and script, and data: pictures.
POLICY = "default-src 'none'; img-src data:; style-src 'unsafe-inline'; script-src 'unsafe-inline'"


def _member_html(member: Member, group: Group, rejects: Rejects, pics: Pictures) -> str:
    reason = rejects.of_shown.get(member.id)
    kept = kept_of(reason)
    picture = pics.by_split.get(member.split, {}).get(member.id)
    if picture:
        uri, width, height = picture
        pic = f'<img src="{uri}" width="{width}" height="{height}" alt="{text(member.id)}">'
    elif reason is not None:
        pic = '<div class="none">not written</div>'
    else:
        pic = '<div class="none">no record found</div>'
    if kept is not None:
        css, status = "dropped", f"dropped: {text(reason_kind(reason))} {text(kept)}"
    elif reason is not None:
        css, status = "dropped", f"rejected: {text(reason)}"
    else:
        css, status = "kept", "written"
    distances = [d for a, b, d in group.pairs if member.id in (a, b) and d is not None]
    near = f" · distance {min(distances)}" if distances else ""
    return (
        f'<figure class="{css}" data-id="{text(member.id)}"><div class="pic">{pic}</div>'
        "<figcaption>"
        f'<div class="id">{text(member.id)}</div>'
        f'<span class="split">{text(member.split)}</span> · {text(member.label)}{near}'
        f'<div class="status">{status}</div></figcaption></figure>'
    )


def _group_html(number: int, group: Group, rejects: Rejects, pics: Pictures) -> str:
    tags = ("across splits",) * group.across_splits + ("across classes",) * group.across_classes
    head = [f"group {number}: {len(group.members)} images"]
    head += [f'<span class="tag">{t}</span>' for t in tags]
    distances = [d for _, _, d in group.pairs if d is not None]
    if distances:
        low, high = min(distances), max(distances)
        head.append(f" · distance {low}" + (f"–{high}" if high != low else ""))
    if group.digest:
        head.append(f' · SHA-256 <span class="id">{text(group.digest[:16])}…</span>')
    dropped = [m for m in group.members if kept_of(rejects.of_shown.get(m.id)) is not None]
    head.append(f" · {len(dropped)} dropped by --dedupe" if dropped else " · every member written")
    members = "".join(_member_html(m, group, rejects, pics) for m in group.members[:MEMBERS_SHOWN])
    if len(group.members) > MEMBERS_SHOWN:
        members += f'<p class="more">{len(group.members) - MEMBERS_SHOWN:,} more not shown</p>'
    pairs = ""
    if group.pairs:
        listed = ", ".join(
            f"{text(a, 60)} ↔ {text(b, 60)}: {d if d is not None else '?'}"
            for a, b, d in group.pairs[:PAIRS_SHOWN]
        )
        more = len(group.pairs) - PAIRS_SHOWN
        pairs = f'<div class="pairs">pairs: {listed}' + (f", {more:,} more" if more > 0 else "")
        pairs += "</div>"
    page = (number - 1) // GROUPS_PER_PAGE + 1
    return (
        f'<div class="group" data-page="{page}"><div class="group-head">{"".join(head)}</div>'
        f'<div class="members">{members}</div>{pairs}</div>'
    )


def _section_html(item: Shown, rejects: Rejects, pics: Pictures) -> str:
    section = item.section
    pages = math.ceil(len(item.groups) / GROUPS_PER_PAGE)
    paged = f' data-pages="{pages}"' if pages > 1 else ""
    parts = [f'<section id="{section.key}"{paged}><h2>{section.title} ({item.total:,})</h2>']
    parts.append(f'<p class="about">{section.about}</p>')
    if item.problem:
        parts.append(f'<p class="problem">not read: {text(item.problem, 500)}</p>')
    elif not item.total:
        parts.append('<p class="more">none</p>')
    if pages > 1:
        parts.append(
            '<div class="pager" hidden><button class="previous">previous</button>'
            '<span></span><button class="next">next</button></div>'
        )
    parts += [_group_html(n, g, rejects, pics) for n, g in enumerate(item.groups, 1)]
    if item.total > len(item.groups):
        parts.append(
            f'<p class="more">{item.total - len(item.groups):,} more groups not shown '
            f"(the page shows the first {len(item.groups):,})</p>"
        )
    parts.append("</section>")
    return "".join(parts)


def _classes_html(info: info_lib.DatasetInfo) -> str:
    names = list(info.splits)
    head = "".join(f"<th>{text(s)}</th>" for s in names)
    rows = []
    for name in info.classes[:CLASSES_SHOWN]:
        counts = [info.class_counts(s).get(name, 0) for s in names]
        cells = "".join(f"<td>{n:,}</td>" if _is_int(n) else "<td>?</td>" for n in counts)
        rows.append(f"<tr><td>{text(name)}</td>{cells}</tr>")
    totals = "".join(f"<td>{info.num_examples(s):,}</td>" for s in names)
    more = len(info.classes) - CLASSES_SHOWN
    note = f'<p class="more">{more:,} more classes not shown</p>' if more > 0 else ""
    return (
        f'<section id="classes"><h2>Classes per split ({info.num_classes:,} classes)</h2>'
        f"<table><tr><th>class</th>{head}</tr>{''.join(rows)}"
        f"<tr><th>all</th>{totals}</tr></table>{note}</section>"
    )


def _rejects_html(info: info_lib.DatasetInfo, rejects: Rejects) -> str:
    parts = [f'<section id="rejects"><h2>Rejected images ({info.rejected_count:,})</h2>']
    if rejects.problem:
        parts.append(f'<p class="problem">not read: {text(rejects.problem, 500)}</p>')
    elif not info.rejected_count:
        parts.append('<p class="more">none</p>')
    rows = []
    for kind, count in rejects.kinds.most_common(REASONS_SHOWN):
        examples = "<br>".join(
            f'<span class="id">{text(i)}</span> ({text(s)}): {text(r)}'
            for i, s, r in rejects.examples.get(kind, ())
        )
        rows.append(f"<tr><td>{text(kind)}</td><td>{count:,}</td><td>{examples}</td></tr>")
    if rows:
        parts.append(
            '<table><tr><th>reason</th><th>images</th><th style="text-align:left">examples</th>'
            f"</tr>{''.join(rows)}</table>"
        )
    more = len(rejects.kinds) - REASONS_SHOWN
    if more > 0:
        parts.append(f'<p class="more">{more:,} more reasons not shown</p>')
    parts.append("</section>")
    return "".join(parts)


def _sheet_html(info, splits: Sequence[str], samples: int, seed: int) -> tuple[str, int]:
    """The contact sheet as ``reader.inspect --contact_sheet`` draws it, inline."""
    sheet, tiles = pictures.draw_contact_sheet(info, splits, samples, seed)
    return (
        f'<section id="contact-sheet"><h2>Contact sheet</h2><p class="about">{len(tiles)} '
        f"random images of {text(', '.join(splits))} (seed {seed}), as "
        "<code>--contact_sheet</code> draws them.</p>"
        f'<img class="sheet" src="{_data_uri(sheet, SHEET_QUALITY)}" width="{sheet.width}" '
        f'height="{sheet.height}" alt="contact sheet"></section>'
    ), len(tiles)


@dataclasses.dataclass(frozen=True)
class Written:
    """What :func:`write_report` put on the page, for the command's line."""

    groups: int
    thumbnails: int
    bytes: int


def write_report(
    info: info_lib.DatasetInfo,
    out_file: str,
    splits: Sequence[str],
    samples: int,
    seed: int,
    summary: str = "",
    sections: Sequence[ListSection] = SECTIONS,
    groups_shown: int = GROUPS_SHOWN,
) -> Written:
    """Writes the page to ``out_file`` (local or ``gs://``).

    Reads each list once, the rejects once, and of the shards only the records
    it shows (found by :class:`RecordFinder`) and the contact sheet's.
    """
    shown = read_sections(info, sections, groups_shown)
    members = [m for item in shown for g in item.groups for m in g.members[:MEMBERS_SHOWN]]
    rejects = read_rejects(info, {m.id for m in members})
    wanted = collections.defaultdict(set)
    for m in members:
        if m.id not in rejects.of_shown:  # a rejected image has no record
            wanted[m.split].add(m.id)
    pics = find_pictures(info, wanted)
    sheet, _ = _sheet_html(info, splits, samples, seed)
    nav = "".join(f'<a href="#{item.section.key}">{item.section.title}</a>' for item in shown)
    nav += "".join(
        f'<a href="#{key}">{title}</a>'
        for key, title in (
            ("classes", "Classes"),
            ("rejects", "Rejects"),
            ("contact-sheet", "Contact sheet"),
        )
    )
    problems = "".join(f'<p class="problem">thumbnails: {p}</p>' for p in pics.problems)
    summary_html = (
        f'<section id="summary"><details><summary>reader.inspect\'s summary</summary>'
        f"<pre>{text(summary, 200_000)}</pre></details></section>"
        if summary
        else ""
    )
    page = (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{POLICY}">'
        f"<title>imagerecords report: {text(info.path)}</title><style>{STYLE}</style></head>"
        f'<body><header><h1>imagerecords report</h1><div class="id">{text(info.path)}</div>'
        f"<nav>{nav}</nav></header><main>{problems}{summary_html}"
        + "".join(_section_html(item, rejects, pics) for item in shown)
        + _classes_html(info)
        + _rejects_html(info, rejects)
        + sheet
        + f"</main><script>{SCRIPT}</script></body></html>\n"
    )
    data = page.encode("utf-8")
    with tf.io.gfile.GFile(out_file, "wb") as f:
        f.write(data)
    thumbs = sum(1 for found in pics.by_split.values() for p in found.values() if p)
    return Written(sum(len(item.groups) for item in shown), thumbs, len(data))
