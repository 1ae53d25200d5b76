"""``reader.inspect PATH --report FILE.html``: one page to check the duplicate groups by eye.

The near-copy and identical-file groups side by side with thumbnails, the
classes per split, the reject reasons with examples and the contact sheet, in
one HTML file: every picture inline (``data:`` JPEG), no script or style from
elsewhere, nothing fetched. Each section shows at most a fixed number of
groups (in pages) and says how many it leaves out, so the page and the
thumbnails decoded stay bounded at any dataset size (``reader/report_lists.py``
reads what it shows).
"""

from __future__ import annotations

import collections
import dataclasses
import html
import json
import math
from collections.abc import Mapping, Sequence

import tensorflow as tf

from reader import info as info_lib
from reader import overview, pictures
from reader.report_lists import (
    GROUPS_SHOWN,
    MEMBERS_SHOWN,
    REASONS_SHOWN,
    SECTIONS,
    ListedGroup,
    ListedMember,
    ListSection,
    Pictures,
    Rejects,
    Shown,
    data_uri,
    find_pictures,
    is_int,
    kept_of,
    read_rejects,
    read_sections,
    reason_kind,
)

GROUPS_PER_PAGE = 10
PAIRS_SHOWN = 12
SHEET_QUALITY = 85
CLASSES_SHOWN = 1000
# A dataset string longer than this is cut (a hostile ID could be megabytes).
TEXT_SHOWN = 240


def text(value, limit: int = TEXT_SHOWN) -> str:
    """Any value from the dataset as HTML text: cut to ``limit`` characters, escaped
    (quotes too, so it is safe in an attribute), lone surrogates replaced."""
    value = value if isinstance(value, str) else json.dumps(value)
    if len(value) > limit:
        value = value[: limit - 1] + "…"
    return html.escape(value.encode("utf-8", "replace").decode("utf-8"), quote=True)


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
figure{margin:0;width:150px;border:2px solid #ccc;border-radius:4px;padding:4px;background:#fafafa}
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
td:first-child,th:first-child,td.left,th.left{text-align:left}
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


def _member_html(member: ListedMember, group: ListedGroup, rejects: Rejects, pics: Pictures) -> str:
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


def _group_html(number: int, group: ListedGroup, rejects: Rejects, pics: Pictures) -> str:
    tags = ("across splits",) * group.across_splits + ("across classes",) * group.across_classes
    head = [f"group {number}: {len(group.members)} images"]
    head += [f'<span class="tag">{t}</span>' for t in tags]
    distances = [d for _, _, d in group.pairs if d is not None]
    if distances:
        low, high = min(distances), max(distances)
        head.append(f" · distance {low}" + (f"–{high}" if high != low else ""))
    if group.digest:
        head.append(f' · SHA-256 <span class="id">{text(group.digest[:16])}…</span>')
    drops = [m.id for m in group.members if kept_of(rejects.of_shown.get(m.id)) is not None]
    dropped = len(drops)
    if dropped:
        # The copy that survived: one an identical member was dropped for may have been
        # dropped in turn as a near copy of an image outside this group.
        ids = {m.id for m in group.members}
        kept = sorted({rejects.survivor(i) for i in drops})
        names = ", ".join(
            f'<span class="id">{text(k)}</span>'
            + ("" if k in ids else " (a near copy, not in this group)")
            for k in kept[:MEMBERS_SHOWN]
        )
        head.append(f" · --dedupe kept {names}, dropped {dropped}")
    else:
        head.append(" · every member written")
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


def _count(n: int, noun: str) -> str:
    return f"{n:,} {noun}" + ("" if n == 1 else "s")


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
            f'<p class="more">{_count(item.total - len(item.groups), "more group")} not shown '
            f"(the page shows the first {len(item.groups):,})</p>"
        )
    parts.append("</section>")
    return "".join(parts)


def _overview_html(info: info_lib.DatasetInfo) -> str:
    """Records and rejects per split, and the duplicate blocks' lines as inspect prints them."""
    by_split = (info.raw.get("rejected") or {}).get("by_split")
    by_split = by_split if isinstance(by_split, Mapping) else {}
    rows = "".join(
        f"<tr><td>{text(name)}</td><td>{split.num_examples:,}</td><td>{len(split.shards):,}</td>"
        f"<td>{by_split[name]:,}</td></tr>"
        if is_int(by_split.get(name))
        else f"<tr><td>{text(name)}</td><td>{split.num_examples:,}</td>"
        f"<td>{len(split.shards):,}</td><td>-</td></tr>"
        for name, split in info.splits.items()
    )
    lines = []
    for block, describe in (
        ("near_duplicates", overview.near_lines),
        ("groups", overview.groups_lines),
    ):
        try:
            lines += describe(info.raw.get(block))
        except (TypeError, ValueError, AttributeError):  # a block the converter did not write
            lines.append(f"{block}: not readable")
    duplicates = info.raw.get("duplicates")
    if isinstance(duplicates, Mapping):
        counts = [
            f"{k.replace('_', '-')} {duplicates[k]:,}"
            for k in ("groups", "images", "cross_split", "cross_class")
            if is_int(duplicates.get(k))
        ]
        lines.insert(0, "identical files: " + ", ".join(counts))
    dedupe = (info.raw.get("config") or {}).get("dedupe")
    lines.append(
        f"--dedupe: {text(dedupe) if dedupe else 'off (every member of a group is written)'}"
    )
    items = "".join(f"<li>{text(line, 1000)}</li>" for line in lines)
    return (
        '<section id="overview"><h2>Overview</h2><table><tr><th>split</th><th>records</th>'
        f"<th>shards</th><th>rejected</th></tr>{rows}</table><ul>{items}</ul></section>"
    )


def _classes_html(info: info_lib.DatasetInfo) -> str:
    names = list(info.splits)
    head = "".join(f"<th>{text(s)}</th>" for s in names)
    rows = []
    for name in info.classes[:CLASSES_SHOWN]:
        counts = [info.class_counts(s).get(name, 0) for s in names]
        cells = "".join(f"<td>{n:,}</td>" if is_int(n) else "<td>?</td>" for n in counts)
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
        rows.append(
            f'<tr><td>{text(kind)}</td><td>{count:,}</td><td class="left">{examples}</td></tr>'
        )
    if rows:
        parts.append(
            '<table><tr><th>reason</th><th>images</th><th class="left">examples</th>'
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
        f'<img class="sheet" src="{data_uri(sheet, SHEET_QUALITY)}" width="{sheet.width}" '
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
    problems = "".join(f'<p class="problem">thumbnails: {text(p, 500)}</p>' for p in pics.problems)
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
        f"<nav>{nav}</nav></header><main>{problems}{_overview_html(info)}{summary_html}"
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
