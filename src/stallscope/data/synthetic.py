"""The built-in data set: photo-like JPEGs made from the real photographs scikit-image and
scikit-learn ship, so every stallscope command runs anywhere with no download.

Each class draws from its own source photograph (and, beyond the ten photographs, its own colour
family), so a model can in principle learn the classes; each image is a different random crop,
scale, aspect, flip, rotation by 90 degrees, colour/brightness change, sensor grain and JPEG
quality. Sizes follow ImageNet's: long side 400-600 (500x375 the most common), files of roughly
50-150 KB. Every image is a pure function of (seed, class, index), so the same seed gives the same
bytes whatever the number of workers, and a killed run resumes where it stopped.

Layout: `{output}/{train,validation}/{label}/{label}_{index:05d}.jpg`, plus `synthetic.json`
(the parameters, labels and every file's size) written last.

On a network file system (NFS, SMB, a FUSE mount) every step on the output is bounded by the storage
timeout: a server that stops answering ends the run with one error naming --output, not a hang.
"""

from __future__ import annotations

import dataclasses
import functools
import io
import json
import logging
import multiprocessing
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from stallscope.config import from_dict, require_positive, to_dict, usable_cores
from stallscope.errors import DataError, UsageError
from stallscope.extras import needs_extra, require
from stallscope.jsonfile import write_json_atomic
from stallscope.storage.mounts import NetworkGuard, Ticks

log = logging.getLogger(__name__)

INDEX_NAME = "synthetic.json"
PARTIAL_NAME = ".synthetic.partial.json"  # written first: marks a run under way, for resuming
FORMAT = "stallscope-synthetic"
FORMAT_VERSION = 1
SPLITS = ("train", "validation")
WORKER_START_S = 300.0  # a spawned worker that has not started by then never will: no output to blame
_WRITTEN = None  # in a rendering worker: the pool's count of images put in place

# Colour photographs shipped inside the scikit-image and scikit-learn wheels (none downloads via
# pooch). Ordered so that the first classes are the most different from each other.
PHOTOS = (
    "astronaut", "chelsea", "coffee", "rocket", "hubble", "retina",
    "motorcycle", "china", "flower", "ihc",
)
# Colour families for classes beyond the ten photographs: class c uses photo c % 10 and family
# c // 10. Families past this list are a random colour-mixing matrix seeded by the family number.
_FAMILIES: tuple[tuple[str, np.ndarray | None], ...] = (
    ("", None),
    ("gbr", np.array([[0, 1, 0], [0, 0, 1], [1, 0, 0]], np.float32)),
    ("sepia", np.array([[0.393, 0.769, 0.189], [0.349, 0.686, 0.168], [0.272, 0.534, 0.131]], np.float32)),
    ("brg", np.array([[0, 0, 1], [1, 0, 0], [0, 1, 0]], np.float32)),
    ("gray", np.full((3, 3), 1 / 3, np.float32)),
)

# Called as progress(amount, total, unit) with the number of images just finished.
ProgressSink = Callable[[int, "int | None", str], None]


@dataclasses.dataclass(frozen=True)
class SyntheticOptions:
    """What to make. Everything but `workers` decides the bytes (and is recorded in synthetic.json).

    classes: number of classes (each a source photograph and colour family).
    images_per_class: images per class, split between train and validation.
    validation_fraction: share of each class's images in the validation split, in [0, 1).
    seed: the random seed; the same seed gives the same bytes.
    quality: (low, high) JPEG quality range, each image drawing one value.
    long_side: (low, high) range of the image's longer side in pixels (ImageNet: about 400-600).
    workers: processes rendering images; None uses every core.
    """

    classes: int = 10
    images_per_class: int = 60
    validation_fraction: float = 0.2
    seed: int = 0
    quality: tuple[int, int] = (75, 95)
    long_side: tuple[int, int] = (400, 600)
    workers: int | None = None

    def __post_init__(self) -> None:
        require_positive("classes", self.classes)
        if self.classes > 1000:
            raise UsageError(f"classes: expected at most 1000, got {self.classes!r}")
        require_positive("images_per_class", self.images_per_class)
        fraction = self.validation_fraction
        if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 <= fraction < 1:
            raise UsageError(f"validation_fraction: expected a number in [0, 1), got {fraction!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise UsageError(f"seed: expected an integer >= 0, got {self.seed!r}")
        _require_range("quality", self.quality, 1, 100)
        _require_range("long_side", self.long_side, 16, 4096)
        require_positive("workers", self.workers, allow_none=True)

    def identity(self) -> dict[str, Any]:
        """The options that decide the data set's content (not how fast it is made)."""
        values = to_dict(self)
        values.pop("workers")
        return values

    def split_sizes(self) -> dict[str, int]:
        """Images per class in each split; at least one training image, and one validation
        image whenever the fraction is above zero and the class has two images or more."""
        validation = round(self.images_per_class * self.validation_fraction)
        if self.validation_fraction > 0 and self.images_per_class >= 2:
            validation = max(validation, 1)
        validation = min(validation, self.images_per_class - 1)
        return {"train": self.images_per_class - validation, "validation": validation}


def _require_range(name: str, value: Any, low: int, high: int) -> None:
    ok = (
        isinstance(value, tuple) and len(value) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
        and low <= value[0] <= value[1] <= high
    )
    if not ok:
        raise UsageError(f"{name}: expected (low, high) integers with {low} <= low <= high <= {high}, got {value!r}")


@dataclasses.dataclass(frozen=True)
class ImageJob:
    """One image to render: where it goes and what decides its content."""

    split: str
    class_index: int
    label: str
    index: int  # within the class, over both splits

    @property
    def relpath(self) -> str:
        return f"{self.split}/{self.label}/{self.label}_{self.index:05d}.jpg"


@dataclasses.dataclass(frozen=True)
class SyntheticReport:
    """What the data set holds, and what this run did."""

    output: Path
    labels: tuple[str, ...]
    images_per_split: dict[str, int]
    bytes_total: int
    file_bytes: tuple[int, int, int]  # min, mean, max
    long_side: tuple[int, int]  # min, max of the images made
    written: int  # images rendered by this run
    kept: int  # images already in place from an earlier (killed or identical) run
    reused: bool  # the whole data set was already there with the same parameters
    seconds: float

    @property
    def images(self) -> int:
        return sum(self.images_per_split.values())

    @property
    def images_per_second(self) -> float:
        return self.written / self.seconds if self.seconds > 0 else 0.0


def class_label(class_index: int) -> str:
    """Folder name of a class: the photograph, then the colour family when not the natural one."""
    photo = PHOTOS[class_index % len(PHOTOS)]
    family = class_index // len(PHOTOS)
    if family == 0:
        return photo
    name = _FAMILIES[family][0] if family < len(_FAMILIES) else f"mix{family}"
    return f"{photo}_{name}"


def plan(options: SyntheticOptions) -> list[ImageJob]:
    """Every image of the data set, in a fixed order (a pure function of the options)."""
    sizes = options.split_sizes()
    jobs: list[ImageJob] = []
    for class_index in range(options.classes):
        label = class_label(class_index)
        for index in range(options.images_per_class):
            split = "train" if index < sizes["train"] else "validation"
            jobs.append(ImageJob(split, class_index, label, index))
    return jobs


@functools.lru_cache(maxsize=None)
def _photo(name: str):
    """A source photograph as a PIL image (loaded once per process, from the installed wheels)."""
    from PIL import Image

    if name in ("china", "flower"):
        with needs_extra("data", "the built-in data set"):
            from sklearn.datasets import load_sample_image

        array = load_sample_image(f"{name}.jpg")
    else:
        with needs_extra("data", "the built-in data set"):
            import skimage.data

        if name == "hubble":
            array = skimage.data.hubble_deep_field()
        elif name == "ihc":
            array = skimage.data.immunohistochemistry()
        elif name == "motorcycle":
            array = skimage.data.stereo_motorcycle()[0]  # the left view of the stereo pair
        else:
            array = getattr(skimage.data, name)()
    return Image.fromarray(np.ascontiguousarray(array[..., :3]))


def _family_matrix(family: int) -> np.ndarray | None:
    if family < len(_FAMILIES):
        return _FAMILIES[family][1]
    rng = np.random.default_rng(family)
    matrix = rng.uniform(0, 1, (3, 3)).astype(np.float32)
    return matrix / matrix.sum(axis=1, keepdims=True)


def _output_size(rng: np.random.Generator, long_side: tuple[int, int]) -> tuple[int, int]:
    """(width, height): ImageNet-like, mostly 4:3 landscape, some portrait and square-ish."""
    side = int(rng.integers(long_side[0], long_side[1] + 1))
    ratio = 4 / 3 if rng.random() < 0.5 else float(np.exp(rng.uniform(np.log(1.0), np.log(1.6))))
    short = max(1, round(side / ratio))
    return (side, short) if rng.random() < 0.8 else (short, side)


def render_image(options: SyntheticOptions, class_index: int, index: int) -> bytes:
    """The JPEG bytes of one image: a pure function of (seed, class, index) and the ranges."""
    from PIL import Image

    rng = np.random.default_rng(np.random.SeedSequence([options.seed, class_index, index]))
    photo = _photo(PHOTOS[class_index % len(PHOTOS)])
    rotation = int(rng.integers(0, 4))
    if rotation:
        photo = photo.transpose((Image.Transpose.ROTATE_90, Image.Transpose.ROTATE_180,
                                 Image.Transpose.ROTATE_270)[rotation - 1])
    width, height = _output_size(rng, options.long_side)
    # A crop of 35-100% of the largest window of the output's aspect, anywhere in the photo.
    src_w, src_h = photo.size
    aspect = width / height
    max_w, max_h = (src_w, src_w / aspect) if src_w / aspect <= src_h else (src_h * aspect, src_h)
    scale = float(np.sqrt(rng.uniform(0.35, 1.0)))
    crop_w, crop_h = max_w * scale, max_h * scale
    left = float(rng.uniform(0, src_w - crop_w))
    top = float(rng.uniform(0, src_h - crop_h))
    image = photo.resize((width, height), Image.Resampling.BICUBIC, box=(left, top, left + crop_w, top + crop_h))
    if rng.random() < 0.5:
        image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)

    pixels = np.asarray(image, dtype=np.float32)
    matrix = _family_matrix(class_index // len(PHOTOS))
    if matrix is not None:
        pixels = pixels @ matrix.T
    gray = pixels.mean(axis=2, keepdims=True)
    pixels = gray + (pixels - gray) * rng.uniform(0.75, 1.25)  # saturation
    mean = float(pixels.mean())
    pixels = mean + (pixels - mean) * rng.uniform(0.85, 1.15)  # contrast
    pixels = pixels * rng.uniform(0.8, 1.2) + rng.uniform(-12, 12, 3).astype(np.float32)  # brightness, cast
    grain = rng.uniform(10, 20)  # sensor noise: gives the files a photograph's size
    pixels += rng.standard_normal(pixels.shape, dtype=np.float32) * grain
    image = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))
    buffer = io.BytesIO()
    image.save(buffer, "JPEG", quality=int(rng.integers(options.quality[0], options.quality[1] + 1)))
    return buffer.getvalue()


def _render_to_file(output: Path, options: SyntheticOptions, job: ImageJob) -> tuple[str, int, int, int]:
    """Renders one image into place (temporary name, then rename): (relpath, bytes, width, height)."""
    from PIL import Image

    data = render_image(options, job.class_index, job.index)
    path = output / job.relpath
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_bytes(data)
    os.replace(tmp, path)
    if _WRITTEN is not None:
        with _WRITTEN.get_lock():
            _WRITTEN.value += 1
    with Image.open(io.BytesIO(data)) as image:
        width, height = image.size
    return job.relpath, len(data), width, height


def _render_batch(output: str, options: SyntheticOptions, jobs: list[ImageJob]) -> list[tuple[str, int, int, int]]:
    return [_render_to_file(Path(output), options, job) for job in jobs]


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DataError(f"{path}: not valid JSON ({exc}); delete it to make the data set again") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise DataError(f"{path}: not a stallscope synthetic data set index (format {data.get('format') if isinstance(data, dict) else None!r})")
    return data


def _options_from(data: dict[str, Any], where: Path) -> SyntheticOptions:
    try:
        return from_dict(SyntheticOptions, data.get("options"), source="options")
    except (TypeError, UsageError) as exc:
        raise DataError(f"{where}: unreadable options ({exc})") from None


def _is_complete(output: Path, index: dict[str, Any], ticks: Ticks) -> bool:
    files = index.get("files", {})
    for relpath, entry in files.items():
        ticks.count += 1
        try:
            if (output / relpath).stat().st_size != entry[0]:
                return False
        except OSError:
            return False
    return bool(files)


def _remove_data_set(output: Path, options: SyntheticOptions, ticks: Ticks) -> None:
    """Removes the files an earlier data set of these options made, and the folders they empty."""
    for job in plan(options):
        (output / job.relpath).unlink(missing_ok=True)
        ticks.count += 1
    for split in SPLITS:
        for folder in sorted((output / split).glob("*"), reverse=True) + [output / split]:
            if folder.is_dir() and not any(folder.iterdir()):
                folder.rmdir()
    for name in (INDEX_NAME, PARTIAL_NAME):
        (output / name).unlink(missing_ok=True)


def _remove_temporaries(output: Path) -> None:
    for split in SPLITS:
        for tmp in (output / split).glob("*/.*.jpg.tmp-*"):
            tmp.unlink(missing_ok=True)


def _prepare_output(output: Path, options: SyntheticOptions, overwrite: bool, ticks: Ticks) -> dict[str, Any] | None:
    """Checks what `output` holds and clears what must go. Returns the index of an earlier run of
    the same options (finished or not) so that its images can be kept; refuses foreign content."""
    if output.exists() and not output.is_dir():
        raise UsageError(f"--output: {str(output)!r} is a file; expected a directory for the data set")
    if not output.exists():
        return None
    wanted = options.identity()
    for name in (INDEX_NAME, PARTIAL_NAME):
        data = _read_json(output / name)
        if data is None:
            continue
        if data.get("options") == wanted:
            return data
        if not overwrite:
            raise UsageError(
                f"--output: {str(output)!r} holds a synthetic data set made with other parameters "
                f"({_difference(data.get('options', {}), wanted)}); pass --overwrite to replace it, "
                "or choose another --output"
            )
        log.info("removing the earlier data set in %s", output)
        _remove_data_set(output, _options_from(data, output / name), ticks)
        return None
    if any(output.iterdir()):
        raise UsageError(
            f"--output: {str(output)!r} is not empty and holds no {INDEX_NAME}; "
            "choose an empty or new directory for the synthetic data set"
        )
    return None


def _difference(old: dict[str, Any], new: dict[str, Any]) -> str:
    changed = [f"{key} {old.get(key)!r} there, {new[key]!r} asked" for key in new if old.get(key) != new[key]]
    return "; ".join(changed) or "unknown"


def _pillow_version() -> str:
    import PIL

    return PIL.__version__


def make_synthetic(
    output: Path | str,
    options: SyntheticOptions = SyntheticOptions(),
    *,
    overwrite: bool = False,
    progress: ProgressSink | None = None,
) -> SyntheticReport:
    """Makes the built-in data set in `output`, or reuses it when an identical one is there.

    Idempotent and resumable: each image appears under its final name only when complete, and
    `synthetic.json` is written last; a run with the same options keeps every finished image.
    """
    require("data", "the built-in data set", "sklearn", "skimage")
    output = Path(output)
    started = time.perf_counter()
    guard = NetworkGuard.of(output, "--output")
    where = repr(str(output))
    checked = Ticks()
    earlier = guard(lambda: _prepare_output(output, options, overwrite, checked), f"reading {where}", checked, "files")
    if earlier is not None and "files" in earlier and guard(lambda: _is_complete(output, earlier, checked),
                                                            f"reading {where}", checked, "files"):
        log.info("%s already holds this data set; nothing to do", output)
        return _report(output, earlier, written=0, kept=len(earlier["files"]), reused=True,
                       seconds=time.perf_counter() - started)
    known_sizes = {relpath: entry[0] for relpath, entry in (earlier or {}).get("files", {}).items()}
    guard(lambda: _begin(output, options), f"creating {where}")
    jobs = plan(options)
    measured = Ticks()
    results = guard(lambda: _finished_images(output, jobs, known_sizes, measured), f"reading the images in {where}",
                    measured, "files")
    todo = [job for job in jobs if job.relpath not in results]
    kept = len(results)
    if progress and kept:
        progress(kept, len(jobs), "img")

    def report_progress(amount: int) -> None:
        if progress:
            progress(amount, len(jobs), "img")

    results.update(_render_all(output, options, todo, report_progress, guard))
    index = {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "options": options.identity(),
        "labels": sorted({job.label for job in jobs}),
        "splits": {split: sum(1 for j in jobs if j.split == split) for split in SPLITS},
        "pillow": _pillow_version(),
        "files": {job.relpath: list(results[job.relpath]) for job in jobs},  # [bytes, width, height]
    }
    guard(lambda: _finish(output, index), f"writing {str(output / INDEX_NAME)!r}")
    return _report(output, index, written=len(todo), kept=kept, reused=False,
                   seconds=time.perf_counter() - started)


def _begin(output: Path, options: SyntheticOptions) -> None:
    """Creates `output`, clears an interrupted run's temporaries and marks this run as under way."""
    try:
        output.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"--output: cannot write {str(output)!r} ({exc.strerror or exc.__class__.__name__}); expected a writable directory") from None
    _remove_temporaries(output)
    write_json_atomic(output / PARTIAL_NAME, {"format": FORMAT, "version": FORMAT_VERSION,
                                              "options": options.identity()})


def _finished_images(output: Path, jobs: list[ImageJob], known_sizes: dict[str, int],
                     ticks: Ticks) -> dict[str, tuple[int, int, int]]:
    """The images an earlier run finished: (bytes, width, height) by relpath. An image under its final
    name is whole (it was renamed into place when complete) and was made with these options; one whose
    size disagrees with the index is made again."""
    finished = {}
    for job in jobs:
        path = output / job.relpath
        measured = _measure(path) if path.is_file() else None
        if measured and known_sizes.get(job.relpath, measured[0]) == measured[0]:
            finished[job.relpath] = measured
        ticks.count += 1
    return finished


def _finish(output: Path, index: dict[str, Any]) -> None:
    write_json_atomic(output / INDEX_NAME, index)
    (output / PARTIAL_NAME).unlink(missing_ok=True)


def _measure(path: Path) -> tuple[int, int, int] | None:
    """(bytes, width, height) of a finished image, or None when it cannot be read as an image."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as image:
            width, height = image.size
        return path.stat().st_size, width, height
    except (OSError, UnidentifiedImageError):
        return None


def _render_all(output: Path, options: SyntheticOptions, jobs: list[ImageJob], progress: Callable[[int], None],
                guard: NetworkGuard = NetworkGuard()) -> dict[str, tuple[int, int, int]]:
    """Renders `jobs` into `output`: (bytes, width, height) by relpath. In worker processes (spawned:
    safe beside a loaded TensorFlow) when worth it, and always on a network file system, where the
    workers are given up (and ended) once none has written an image for the storage timeout."""
    rendered: dict[str, tuple[int, int, int]] = {}
    workers = min(options.workers or usable_cores(), max(1, len(jobs) // 8))
    if workers <= 1 and guard.fstype is None:
        for job in jobs:
            relpath, size, width, height = _render_to_file(output, options, job)
            rendered[relpath] = (size, width, height)
            progress(1)
        return rendered
    batches = [(str(output), options, jobs[i:i + 8]) for i in range(0, len(jobs), 8)]
    context = multiprocessing.get_context("spawn")
    written = context.Value("q", 0)  # images the workers have put in place: their progress
    ready = context.Value("q", 0)

    def collect() -> None:
        for batch in pool.imap_unordered(_render_batch_args, batches):
            for relpath, size, width, height in batch:
                rendered[relpath] = (size, width, height)
            progress(len(batch))

    # Workers ignore Ctrl-C and the parent ends them at once on any interrupt: a pool left by a `with`
    # block, or a ProcessPoolExecutor's shutdown, would go on until the whole set was made.
    photos = sorted({PHOTOS[job.class_index % len(PHOTOS)] for job in jobs})
    pool = context.Pool(workers, initializer=_start_worker, initargs=(written, ready, photos))
    try:
        if guard.fstype is not None:
            _await_first_worker(ready)  # starting Python is not the output's to answer for
        guard(collect, f"writing images into {str(output)!r}", lambda: written.value, "images")
        pool.close()
    except BaseException:
        pool.terminate()
        raise
    finally:
        pool.join()
    return rendered


def _await_first_worker(ready) -> None:
    deadline = time.monotonic() + WORKER_START_S
    while not ready.value:
        if time.monotonic() > deadline:
            raise DataError(f"no rendering worker started within {WORKER_START_S:g} s; expected the spawned "
                            "Python processes to start")
        time.sleep(0.01)


def _render_batch_args(args: tuple) -> list[tuple[str, int, int, int]]:
    return _render_batch(*args)


def _start_worker(written, ready, photos: list[str]) -> None:
    """Ignores Ctrl-C (the parent ends the pool), and loads the source photographs before it says it
    is ready: their imports take seconds on a busy machine, and are no time of the output's."""
    global _WRITTEN
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _WRITTEN = written
    for name in photos:
        _photo(name)
    with ready.get_lock():
        ready.value += 1


def _report(output: Path, index: dict[str, Any], *, written: int, kept: int, reused: bool, seconds: float) -> SyntheticReport:
    entries = list(index["files"].values())
    sizes = [e[0] for e in entries]
    sides = [max(e[1], e[2]) for e in entries]
    return SyntheticReport(
        output=output,
        labels=tuple(index["labels"]),
        images_per_split={k: v for k, v in index["splits"].items() if v},
        bytes_total=sum(sizes),
        file_bytes=(min(sizes), round(sum(sizes) / len(sizes)), max(sizes)),
        long_side=(min(sides), max(sides)),
        written=written,
        kept=kept,
        reused=reused,
        seconds=seconds,
    )

