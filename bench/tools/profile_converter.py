"""Where the converter's time goes: ``python -m bench.tools.profile_converter [--set web] [--quick]``.

Three views, written to ``bench/results/raw/profile/`` (gitignored) and printed:

1. **Per-image stages**, in one process without Beam: read, decode (with
   ``draft``), resize, convert/orient, encode, SHA-256, Example
   serialisation, TFRecord framing, keys; plus the converter's whole
   ``images.convert`` and the codec floor's ``convert_bytes`` on the same
   files. This is the work imagerecords cannot avoid; everything above it in
   the Beam run is framework.
2. **py-spy** (if installed) on the real default run (``multi_processing``,
   one SDK worker per core), with ``--subprocesses``: on-CPU samples per
   process kind and per category (codec, Beam runner, coders/pickling,
   gRPC, ...), and the hottest leaf lines.
3. **cProfile** of the job with ``--direct_running_mode=in_memory`` (one
   process, so cProfile sees everything), totals per category.

Profiling may import the converter's code (``beam_pipeline``); the benchmark
itself never does.
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import hashlib
import io
import pstats
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from PIL import Image

from beam_pipeline.core.orientation import UPRIGHT_TRANSPOSE
from bench.common.data import ensure_image_set, list_images
from bench.common.settings import CACHE_DIR, FULL, QUICK, RESULTS_DIR, TARGET_SHORTER_SIDE
from bench.convert import imageops

PROFILE_DIR = RESULTS_DIR / "raw" / "profile"

# Categories of a sampled stack. Tier 1 names the work itself and wins if *any*
# frame of the stack matches (Pillow's encoder called from a Beam DoFn is
# encoding); tier 2 is where code lives and is decided by the frame nearest the
# leaf. "waiting" catches leaf frames that are blocked in a lock or select: py-spy
# does not always recognise those as idle.
TIER1 = [
    (
        "waiting (lock/select/poll)",
        r"^(Condition\.wait|_PollLikeSelector\.select|SemLock\.__enter__|"
        r"Event\.wait|Thread\._wait_for_tstate_lock|select \(selectors)",
    ),
    ("pillow decode", r"\bImageFile\.load \(|\bload \(.*PIL/ImageFile\.py|\bdraft \(.*PIL/"),
    ("pillow resize", r"\b(Image\.)?(resize|reduce) \(.*PIL/Image\.py"),
    ("pillow encode", r"_encode_tile|\b_save \(.*PIL/|\b(Image\.)?save \(.*PIL/Image\.py"),
    ("pillow convert/orient", r"\b(Image\.)?(convert|transpose|paste) \(.*PIL/|exif_transpose"),
    ("sha256 of source", r"hashlib|sha256\("),
    ("protobuf Example", r"make_example|google/protobuf"),
    ("TFRecord framing/CRC", r"frame_record|masked_crc|_crc32c|google_crc32c"),
    ("file I/O", r"read_bytes|apache_beam/io/(filesystem|localfilesystem)"),
    ("multiprocessing pool IPC", r"multiprocessing/(connection|pool|queues|reduction|synchronize)"),
    ("beam coders/pickling", r"apache_beam/coders|pickle|dill"),
    ("grpc / data channel", r"grpc|data_plane"),
]
TIER2 = [
    ("pillow open/headers", r"PIL/"),
    ("beam_pipeline other", r"beam_pipeline/"),
    ("beam runner/worker", r"apache_beam/"),
]
CATEGORIES = TIER1 + TIER2


def categorize(frames: list[str]) -> str:
    """The category of one stack (frames leaf first), see ``TIER1`` and ``TIER2``."""
    if frames and re.search(TIER1[0][1], frames[0]):
        return TIER1[0][0]
    for name, pattern in TIER1[1:]:
        if any(re.search(pattern, frame) for frame in frames):
            return name
    for frame in frames:
        for name, pattern in TIER2:
            if re.search(pattern, frame):
                return name
    return "other (interpreter, imports, stdlib)"


# ----------------------------------------------------------------- 1. stages


def stage_costs(files: list[Path]) -> dict[str, float]:
    """Milliseconds per image of each step, measured one step at a time."""
    from beam_pipeline.core import images, keys
    from imagerecords import codec

    totals: collections.Counter[str] = collections.Counter()
    spec = images.ImageSpec()
    for path in files:
        t0 = time.perf_counter()
        data = path.read_bytes()
        t1 = time.perf_counter()
        image = Image.open(io.BytesIO(data))
        orientation = image.getexif().get(0x0112, 1)
        target = imageops.shorter_side_size(image.width, image.height, TARGET_SHORTER_SIDE)
        if image.format == "JPEG" and target != image.size:
            image.draft(image.mode, target)
        t2 = time.perf_counter()
        image.load()
        t3 = time.perf_counter()
        target = imageops.shorter_side_size(image.width, image.height, TARGET_SHORTER_SIDE)
        small = image.resize(target, Image.Resampling.BICUBIC, reducing_gap=3.0)
        t4 = time.perf_counter()
        small = imageops.to_rgb(small)
        if orientation in UPRIGHT_TRANSPOSE:
            small = small.transpose(UPRIGHT_TRANSPOSE[orientation])
        t5 = time.perf_counter()
        buffer = io.BytesIO()
        small.save(buffer, format="JPEG", quality=90)
        jpeg = buffer.getvalue()
        t6 = time.perf_counter()
        digest = hashlib.sha256(data).hexdigest()
        t7 = time.perf_counter()
        payload = codec.make_example(
            {
                "image/encoded": jpeg,
                "image/format": b"jpeg",
                "image/height": small.height,
                "image/width": small.width,
                "image/channels": 3,
                "image/class/label": 1,
                "image/class/text": "class",
                "image/filename": str(path),
                "image/key/sha256": digest,
            }
        )
        t8 = time.perf_counter()
        codec.frame_record(payload)
        t9 = time.perf_counter()
        keys.order_key(42, str(path))
        t10 = time.perf_counter()
        images.convert(data, spec)
        t11 = time.perf_counter()
        imageops.convert_bytes(data)
        t12 = time.perf_counter()
        for name, dt in (
            ("read file", t1 - t0),
            ("open + EXIF + draft", t2 - t1),
            ("decode (load)", t3 - t2),
            ("resize", t4 - t3),
            ("to RGB + orient", t5 - t4),
            ("JPEG encode", t6 - t5),
            ("sha256 of source", t7 - t6),
            ("make_example (protobuf)", t8 - t7),
            ("frame_record (CRC32C)", t9 - t8),
            ("order_key (blake2b)", t10 - t9),
            ("= beam_pipeline.core.images.convert, whole", t11 - t10),
            ("= codec floor convert_bytes, whole", t12 - t11),
        ):
            totals[name] += dt
    return {name: 1000 * total / len(files) for name, total in totals.items()}


# ----------------------------------------------------------------- 2. py-spy


def _job_cmd(image_dir: Path, out_dir: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        *("-m", "beam_pipeline", "--input", str(image_dir), "--output", str(out_dir)),
        "--overwrite",
        *extra,
    ]


def pyspy_profile(image_dir: Path, out_dir: Path, raw_path: Path) -> str:
    """Runs the default job under ``py-spy record --subprocesses``; returns a summary."""
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(py_spy).exists():
        return "py-spy not installed (pip install py-spy): skipped\n"
    cmd = [py_spy, "record", "--subprocesses", "-r", "100", "-f", "raw", "-o", str(raw_path)]
    start = time.perf_counter()
    proc = subprocess.run(
        cmd + ["--", *_job_cmd(image_dir, out_dir)], capture_output=True, text=True
    )
    wall = time.perf_counter() - start
    if proc.returncode != 0 or not raw_path.exists():
        return f"py-spy run failed ({proc.returncode}): {proc.stderr[-500:]}\n"
    by_process: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    leaves: collections.Counter[str] = collections.Counter()
    for line in raw_path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        process = frames[0] if frames[0].startswith("process ") else "process ?"
        kind = _process_kind(process)
        frames = [f for f in frames if not f.startswith(("process ", "thread "))]
        frames.reverse()  # leaf first
        if frames:
            frames[0] = _leaf_line(frames)  # with the source text, e.g. "hashlib.sha256(...)"
        by_process[kind][categorize(frames)] += int(count)
        leaves[frames[0] if frames else "?"] += int(count)
    lines = [f"py-spy, default run (wall {wall:.1f} s under py-spy, 100 Hz, on-CPU samples)"]
    total = sum(sum(c.values()) for c in by_process.values())
    for kind, counter in sorted(by_process.items()):
        n = sum(counter.values())
        lines.append(f"  {kind}: {n} samples ({100 * n / total:.0f}% of all)")
        for name, count in counter.most_common():
            lines.append(f"    {100 * count / n:5.1f}%  {name}")
    lines.append("  hottest leaf frames (all processes):")
    for leaf, count in leaves.most_common(25):
        lines.append(f"    {100 * count / total:5.1f}%  {leaf}")
    return "\n".join(lines) + "\n"


def _process_kind(process_frame: str) -> str:
    """A readable name for py-spy's ``process PID:"command line"`` root frame."""
    match = re.match(r'process (\d+):"(.*)"', process_frame)
    if not match:
        return process_frame
    pid, cmd = match.groups()
    if "sdk_worker" in cmd or "worker_main" in cmd:
        role = "Beam SDK worker"
    elif "forkserver" in cmd or "multiprocessing" in cmd:
        role = "pool worker"
    elif "-m beam_pipeline" in cmd:
        role = "launcher (or a forked child of it)"
    else:
        role = "other"
    return f"pid {pid} {role}"


def _leaf_line(frames: list[str]) -> str:
    if not frames:
        return "?"
    leaf = frames[0]
    match = re.search(r"\((.*):(\d+)\)", leaf)
    if match and "beam_pipeline/" in match.group(1):
        try:
            text = Path(match.group(1)).read_text().splitlines()[int(match.group(2)) - 1]
            return f"{leaf}  `{text.strip()[:60]}`"
        except (OSError, IndexError):
            pass
    return leaf


# --------------------------------------------------------------- 3. cProfile


def cprofile_in_memory(image_dir: Path, out_dir: Path, stats_path: Path) -> str:
    """The job in one process (``in_memory``) under cProfile; returns a category summary."""
    from beam_pipeline import __main__ as job

    profiler = cProfile.Profile()
    argv = [
        *("--input", str(image_dir), "--output", str(out_dir), "--overwrite"),
        *("--direct_running_mode=in_memory", "--quiet"),
    ]
    start = time.perf_counter()
    profiler.enable()
    job.run(argv)
    profiler.disable()
    wall = time.perf_counter() - start
    profiler.dump_stats(str(stats_path))
    stats = pstats.Stats(profiler)
    totals: collections.Counter[str] = collections.Counter()
    for (filename, line, func), (_, _, tottime, _, callers) in stats.stats.items():
        frame = f"{func} ({filename}:{line})"
        if filename == "~":  # a C function: categorise by its callers' frames
            callers_frames = [f"{c[2]} ({c[0]}:{c[1]})" for c in callers]
            frame = func + " " + " ".join(callers_frames)
        totals[_cprofile_category(frame)] += tottime
    all_time = sum(totals.values())
    lines = [f"cProfile, --direct_running_mode=in_memory (wall {wall:.1f} s with profiling)"]
    for name, seconds in totals.most_common():
        lines.append(f"  {100 * seconds / all_time:5.1f}%  {seconds:7.2f} s  {name}")
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(25)
    return "\n".join(lines) + "\n\nTop 25 functions by own time:\n" + text.getvalue()


def _cprofile_category(frame: str) -> str:
    # C builtins first: their names say what they are.
    builtin = [
        ("pillow decode", r"'decode' of 'ImagingDecoder'"),
        ("pillow resize", r"'(resize|reduce)' of 'ImagingCore'"),
        ("pillow encode", r"'encode(_to_file)?' of 'ImagingEncoder'"),
        ("pillow convert/orient", r"'(convert|transpose|paste)' of 'ImagingCore'"),
        ("sha256 of source", r"_hashlib|'hexdigest'|openssl_sha256"),
        ("beam coders/pickling", r"pickle|'dumps'|'loads'"),
    ]
    for name, pattern in builtin:
        if re.search(pattern, frame):
            return name
    return categorize([frame])


def main(argv: list[str] | None = None) -> None:
    """Runs the three profiles on one image set and writes/prints the summaries."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.tools.profile_converter", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--set", choices=("web", "phone"), default="web")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--cache-dir", type=Path, default=CACHE_DIR, help="the benchmark's cache")
    parser.add_argument("--stage-images", type=int, default=300, help="images for view 1")
    parser.add_argument(
        "--skip", action="append", default=[], choices=("stages", "pyspy", "cprofile")
    )
    args = parser.parse_args(argv)
    sizes = QUICK if args.quick else FULL
    count = sizes.web_images if args.set == "web" else sizes.phone_images
    image_set = ensure_image_set(args.set, count, args.cache_dir, sizes.name)
    PROFILE_DIR.mkdir(parents=True, exist_ok=True)
    out_dir = args.cache_dir / "out" / "profile" / args.set
    report = [f"# converter profile, {args.set} set ({image_set.num_images} images)\n"]

    if "stages" not in args.skip:
        files = list_images(image_set.path)
        step = max(1, len(files) // args.stage_images)
        costs = stage_costs(files[::step])
        report.append(f"Per-image stages, one process, {len(files[::step])} images (ms/image):")
        report += [f"  {ms:8.2f}  {name}" for name, ms in costs.items()]
        report.append("")
    if "pyspy" not in args.skip:
        report.append(pyspy_profile(image_set.path, out_dir, PROFILE_DIR / f"pyspy-{args.set}.txt"))
    if "cprofile" not in args.skip:
        report.append(
            cprofile_in_memory(image_set.path, out_dir, PROFILE_DIR / f"cprofile-{args.set}.prof")
        )
    text = "\n".join(report)
    (PROFILE_DIR / f"converter-{args.set}.txt").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
