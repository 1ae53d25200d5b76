"""`make demo`: build a small image folder from real photos, convert it, read it back.

The photos are the ones scikit-image ships (astronaut, Chelsea the cat, coffee,
a rocket, a motorcycle, the Hubble deep field). Each class gets 50 random
crops, flips and rescales of its photo, a few saved as PNG or greyscale, plus
one deliberately broken file to show the rejects output.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import time

from PIL import Image, ImageOps

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # keep the demo output readable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

PHOTOS = {
    "astronaut": "astronaut.png",
    "cat": "chelsea.png",
    "coffee": "coffee.png",
    "motorcycle": "motorcycle_left.png",
    "rocket": "rocket.jpg",
    "space": "hubble_deep_field.jpg",
}
PER_CLASS = 50


def build_sample(folder: str, seed: int = 0) -> int:
    import skimage

    data_dir = os.path.join(os.path.dirname(skimage.__file__), "data")
    rng = random.Random(seed)
    count = 0
    for name, filename in PHOTOS.items():
        photo = Image.open(os.path.join(data_dir, filename)).convert("RGB")
        os.makedirs(os.path.join(folder, name), exist_ok=True)
        for i in range(PER_CLASS):
            w, h = photo.size
            cw, ch = int(w * rng.uniform(0.5, 1.0)), int(h * rng.uniform(0.5, 1.0))
            x, y = rng.randint(0, w - cw), rng.randint(0, h - ch)
            image = photo.crop((x, y, x + cw, y + ch))
            scale = rng.uniform(0.6, 1.6)
            image = image.resize((max(32, int(cw * scale)), max(32, int(ch * scale))))
            if rng.random() < 0.5:
                image = ImageOps.mirror(image)
            if rng.random() < 0.1:
                image = image.convert("L")
            ext = "png" if i % 10 == 9 else "jpg"
            image.save(os.path.join(folder, name, f"{name}_{i:03d}.{ext}"))
            count += 1
    with open(os.path.join(folder, "cat", "broken.jpg"), "wb") as f:
        f.write(b"\xff\xd8\xff\xe0 this is not really a JPEG")
    return count + 1


# Where `make demo` leaves its photos and its records, for the README's
# walkthrough to run on as pasted (`cd .demo`; git ignores the folder).
DEMO_DIR = os.path.join(ROOT, ".demo")
PHOTOS_DIR, RECORDS_DIR = "photos", "demo-records"

# The README's picture; only `scripts/demo.py --docs-image` rewrites it, so that
# running the demo never changes a file git tracks.
DOCS_CONTACT_SHEET = os.path.join(ROOT, "docs", "img", "contact_sheet.png")


def draw_contact_sheet(info, path: str) -> str:
    """8 random images of each split, as `reader.inspect --contact_sheet` draws them."""
    from reader import pictures

    os.makedirs(os.path.dirname(path), exist_ok=True)
    pictures.contact_sheet(info, path, list(info.splits), samples=8, seed=0, tile=96)
    # 256 colours keep the committed picture small (~4x smaller than full colour).
    Image.open(path).quantize(256).save(path, optimize=True)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="make demo: sample photos -> records -> reader")
    parser.add_argument(
        "--docs-image",
        action="store_true",
        help=f"also redraw the README's picture ({os.path.relpath(DOCS_CONTACT_SHEET, ROOT)})",
    )
    parser.add_argument(
        "--folder",
        default=DEMO_DIR,
        help=f"where the photos ({PHOTOS_DIR}/) and the records ({RECORDS_DIR}/) go; "
        "those two are replaced (default: %(default)s)",
    )
    args = parser.parse_args(argv)
    work = args.folder
    images, output = os.path.join(work, PHOTOS_DIR), os.path.join(work, RECORDS_DIR)
    # Only the demo's own two folders are replaced: anything else there (the
    # walkthrough's ./photos-records, say) is the user's.
    for folder in (images, output):
        shutil.rmtree(folder, ignore_errors=True)
    count = build_sample(images)
    print(f"demo: wrote {count} images in {len(PHOTOS)} classes to {images}")

    from beam_pipeline.__main__ import main as convert

    # On Beam's DirectRunner, as the job runs at scale; without --runner the same
    # command runs on the local engine (no Beam, the same bytes, ~2 s sooner).
    argv = [
        "--input",
        images,
        "--output",
        output,
        "--image_size",
        "160",
        "--runner",
        "DirectRunner",
    ]
    status = convert(argv)
    if status:
        return status
    rejects = os.path.join(output, "rejects.jsonl")
    with open(rejects, encoding="utf-8") as stream:
        rows = [json.loads(line) for line in stream]
    print(f"\ndemo: {len(rows)} file rejected, listed in {rejects}:")
    for row in rows:
        print(f"  {row['id']}: {row['reason']}")

    import tensorflow as tf

    import reader

    info = reader.load_info(output)
    print(f"\ndemo: reading back with the reader: {info.num_classes} classes {info.classes}")
    for split in info.splits:
        started = time.perf_counter()
        seen, shape = 0, None
        for images_batch, labels in reader.make_dataset(
            output, split=split, batch_size=32, image_size=128, training=False
        ):
            seen += int(tf.shape(labels)[0])
            shape = tuple(images_batch.shape)
        seconds = time.perf_counter() - started
        print(
            f"  {split:<6} {seen:>4} images (imagerecords.json says {info.num_examples(split)}), "
            f"last batch {shape}, {seen / seconds:.0f} images/s"
        )
    images_batch, labels = next(
        iter(reader.make_dataset(output, "train", batch_size=16, image_size=128, training=True))
    )
    print(
        f"  train (augmented) batch: images {images_batch.shape} {images_batch.dtype}, labels {labels.numpy().tolist()}"
    )
    sheet = draw_contact_sheet(info, os.path.join(work, "contact_sheet.png"))
    print(f"  contact sheet of each split's images: {sheet}")
    if args.docs_image:
        print(f"  and for the README: {draw_contact_sheet(info, DOCS_CONTACT_SHEET)}")
    print(f"\ndemo: done. Output kept in {output}")
    # The README's one way: the venv activated, where `python` is the venv's.
    venv = "/.venv/" in sys.executable
    python = "python" if venv else sys.executable
    if venv:
        print("\nThe commands below run in the venv: source .venv/bin/activate")
    if os.path.abspath(work) == DEMO_DIR:
        print("The README's walkthrough runs on these photos as pasted, in: cd .demo")
    print(
        "\nNext, on your own images (one folder per class: PHOTOS/<class>/<image>):\n"
        f"  {python} -m beam_pipeline --input PHOTOS --output RECORDS --dry_run"
        "   # what it would do; writes nothing\n"
        f"  {python} -m beam_pipeline --input PHOTOS --output RECORDS\n"
        f"  {python} -m beam_pipeline --input PHOTOS --output RECORDS "
        "--image_size 224 --resize crop --splits train=0.9,val=0.1\n"
        f"  {python} -m reader.inspect RECORDS"
        "   # what it made\n"
        f"  {python} -m beam_pipeline --help\n"
        "then read RECORDS with reader.make_dataset (README.md, section Read)."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
