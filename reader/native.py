"""The reader's one native op, compiled on first use against the installed TensorFlow.

``ImagerecordsResizeCrops`` (``native/resize_crops.cc``) flips and resizes a batch of
crops straight into the float32 batch, bit for bit the stock ops' result; where it
cannot be built the reader uses stock ops. ``python -m reader.native`` prebuilds it.
Environment: ``IMAGERECORDS_NATIVE_OPS``, ``IMAGERECORDS_CACHE_DIR``, ``CXX``
(docs/reader.md, "The native resize op").
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import shlex
import shutil
import subprocess
import tempfile
from pathlib import Path

import tensorflow as tf

try:
    import fcntl
except ImportError:  # Windows: no flock, and TensorFlow's flags there are not GCC's.
    fcntl = None

_LOG = logging.getLogger(__name__)

SOURCE = Path(__file__).parent / "native" / "resize_crops.cc"
ENV_DISABLE = "IMAGERECORDS_NATIVE_OPS"
ENV_CACHE_DIR = "IMAGERECORDS_CACHE_DIR"
# -O3 without -march: the library may sit in a home directory shared by machines
# with different CPUs; the op picks its AVX2 code at run time where the CPU has it.
# -ffp-contract=off: no fused multiply-adds (aarch64 GCC emits them by default),
# which would round differently from TensorFlow's own kernel.
_OPT_FLAGS = ("-O3", "-ffp-contract=off", "-fPIC", "-shared", "-w")
_BUILD_TIMEOUT_S = 600


class NativeOpsError(RuntimeError):
    """The native op could not be built or loaded (the message says why)."""


def cache_dir() -> Path:
    """Where built libraries are kept (``IMAGERECORDS_CACHE_DIR`` overrides)."""
    if os.environ.get(ENV_CACHE_DIR):
        return Path(os.environ[ENV_CACHE_DIR])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "imagerecords"


def disabled_by_environment() -> bool:
    return os.environ.get(ENV_DISABLE, "").strip().lower() in ("0", "false", "no", "off")


def _compiler() -> list[str]:
    """The compiler command: ``$CXX`` (which may carry arguments, e.g. ``ccache g++``) or c++."""
    words = shlex.split(os.environ.get("CXX") or "c++")
    found = shutil.which(words[0]) if words else None
    if not found:
        name = words[0] if words else os.environ.get("CXX")
        raise NativeOpsError(f"no C++ compiler: {name!r} is not on PATH (set CXX to one)")
    return [found, *words[1:]]


def _build_command(compiler: list[str], output: Path) -> list[str]:
    return [
        *compiler,
        *_OPT_FLAGS,
        str(SOURCE),
        "-o",
        str(output),
        *tf.sysconfig.get_compile_flags(),
        *tf.sysconfig.get_link_flags(),
    ]


def library_path(compiler: list[str]) -> Path:
    """The cached library for this source, TensorFlow build and compiler."""
    key = hashlib.sha256()
    key.update(SOURCE.read_bytes())
    key.update(tf.__version__.encode())
    key.update(os.path.dirname(tf.__file__).encode())
    key.update(" ".join(_build_command(compiler, Path("x"))).encode())
    return cache_dir() / f"resize_crops-tf{tf.__version__}-{key.hexdigest()[:16]}.so"


def build(force: bool = False) -> Path:
    """Compiles the op if its library is not cached yet; returns the library's path.

    Safe to call from several processes at once (pytest-xdist workers, one
    process per GPU): a file lock makes one of them compile and the others wait;
    the library appears under its final name only once complete.

    Raises:
        NativeOpsError: no compiler, an unwritable cache directory, or a failed
            compile (with the compiler's last lines).
    """
    if fcntl is None:
        raise NativeOpsError("building the native op needs a POSIX system (Linux, macOS)")
    compiler = _compiler()
    target = library_path(compiler)
    if target.exists() and not force:
        return target
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        lock = open(target.with_suffix(".lock"), "w")  # noqa: SIM115 (held across the build)
    except OSError as e:
        raise NativeOpsError(
            f"cannot write to the cache directory {target.parent} ({e}); "
            f"set {ENV_CACHE_DIR} to a writable one"
        ) from e
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if target.exists() and not force:
            return target  # another process built it while this one waited
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".build-", suffix=".so")
        os.close(fd)
        command = _build_command(compiler, Path(tmp))
        # A warning, so the one-time pause of a first make_dataset has a visible cause.
        _LOG.warning(
            "Compiling the reader's native resize op for TensorFlow %s (once; a few "
            "seconds) into %s",
            tf.__version__,
            target.parent,
        )
        try:
            done = subprocess.run(
                command, capture_output=True, text=True, timeout=_BUILD_TIMEOUT_S, check=False
            )
            if done.returncode != 0:
                tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-15:])
                raise NativeOpsError(
                    f"compiling {SOURCE.name} failed (exit {done.returncode}):\n"
                    f"{shlex.join(command)}\n{tail}"
                )
            # mkstemp made it 0600; a library prebuilt by root in a container image
            # or put in a shared cache must stay loadable by everyone.
            os.chmod(tmp, 0o755)
            os.replace(tmp, target)
        except subprocess.TimeoutExpired as e:
            raise NativeOpsError(f"compiling {SOURCE.name} took over {_BUILD_TIMEOUT_S} s") from e
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    return target


@functools.cache
def _load():
    """``(module, None)`` or ``(None, why not)``; built and loaded once per process."""
    if disabled_by_environment():
        return None, f"{ENV_DISABLE}={os.environ[ENV_DISABLE]} turns the native op off"
    try:
        library = build()
    except NativeOpsError as e:
        return None, str(e)
    except OSError as e:  # the source, the cache directory or the lock file
        return None, f"building the native op failed: {e}"
    try:
        return tf.load_op_library(str(library)), None
    except (tf.errors.OpError, OSError) as e:  # a library that does not load
        return None, f"loading the native op from {library} failed: {e}"


def ops():
    """The loaded op module, or ``None`` when it cannot be built here."""
    return _load()[0]


def unavailable_reason() -> str | None:
    """Why :func:`ops` is ``None`` (``None`` when the op is available)."""
    return _load()[1]


def _required_ops():
    """The loaded op library; NativeOpsError (saying why) where it cannot be had."""
    module = ops()
    if module is None:
        raise NativeOpsError(unavailable_reason())
    return module


def resize_crops(
    pixels: tf.Tensor, shapes: tf.Tensor, flips: tf.Tensor, size, dtype: tf.DType = tf.float32
) -> tf.Tensor:
    """Bilinear resize of a batch of crops into one batch (see the module docstring).

    Args:
        pixels: uint8 ``[N]``, every crop's ``[h, w, 3]`` bytes one after the other;
            or ``[B, L]``, crop ``i``'s bytes at the start of row ``i`` (what
            ``padded_batch`` makes of flattened crops).
        shapes: int32 ``[B, 2]``, each crop's ``(h, w)``.
        flips: bool ``[B]``, mirror that image left-right.
        size: ``(height, width)`` of the output.
        dtype: ``tf.float32``, or ``tf.uint8`` for the same values rounded (half to
            even) and saturated: ``tf.saturate_cast(tf.round(float32 result), tf.uint8)``.

    Returns:
        ``dtype`` ``[B, height, width, 3]`` in 0..255.

    Raises:
        NativeOpsError: the op is not available here.
    """
    return _required_ops().imagerecords_resize_crops(
        pixels, shapes, flips, size=list(size), T=dtype
    )


def resize_crop_list(
    crops: tf.Tensor, shapes: tf.Tensor, flips: tf.Tensor, size, dtype: tf.DType = tf.float32
) -> tf.Tensor:
    """:func:`resize_crops` reading the crops from a ``TensorList`` (no concatenation).

    Args:
        crops: variant scalar, a ``TensorList`` of ``B`` uint8 tensors, crop ``i``'s
            ``[h, w, 3]`` bytes (any shape of that many values) in element ``i``: the
            ``flow`` of a ``tf.TensorArray`` written in a ``tf.while_loop`` inside a
            ``tf.function`` (control flow v2).
        shapes, flips, size, dtype: as for :func:`resize_crops`.

    Raises:
        NativeOpsError: the op is not available here.
    """
    return _required_ops().imagerecords_resize_crop_list(
        crops, shapes, flips, size=list(size), T=dtype
    )


def flip_draws(seeds: tf.Tensor) -> tf.Tensor:
    """``decode.flip_draw`` of each row of ``seeds`` (int64 ``[B, 2]``) in one op: bool ``[B]``.

    The same draws (``stateless_uniform([], seed) < 0.5``, Philox as on the
    CPU), without ~6 ops per image inside the decode loop.

    Raises:
        NativeOpsError: the op is not available here.
    """
    return _required_ops().imagerecords_flip_draws(seeds)


def main() -> int:
    """``python -m reader.native``: build (or find) the op's library and load it."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    module, why = _load()
    if module is None:
        print(f"reader.native: not available: {why}")
        return 1
    print(build())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
