"""Prepare image data for stallscope, as a `{label}/*` or `{split}/{label}/*` tree of JPEGs.

  imagenet-val  sort the ILSVRC2012 validation images (the original tar, read in order, or a
                folder of its JPEGs) into one folder per synset, as seed-000's setup.sh does
  imagenet-train
                unpack the ILSVRC2012 training images (the 138 GB tar of 1,000 class archives,
                read in order, or a folder of the class archives) into one folder per synset
  synthetic     make the built-in data set: photo-like JPEGs from the photographs scikit-image
                and scikit-learn ship, ImageNet-sized, train/validation splits, no download

examples:
  stallscope prepare imagenet-val ILSVRC2012_img_val.tar --output images
  stallscope prepare imagenet-val extracted/ --output images --link
  stallscope prepare imagenet-train ILSVRC2012_img_train.tar --output imagenet/train
  stallscope prepare synthetic --output data --classes 10 --images-per-class 60
"""

from __future__ import annotations

import argparse
from pathlib import Path

from stallscope.cli import flags
from stallscope.cli.progress import ProgressBar
from stallscope.errors import DataError

_MAX_LISTED = 10  # unplaced files listed on screen; prepare.json lists every one


def add_parser(parser: argparse.ArgumentParser) -> None:
    kinds = parser.add_subparsers(dest="kind", metavar="KIND", required=True, parser_class=type(parser))
    _add_imagenet_val(kinds)
    _add_imagenet_train(kinds)
    _add_synthetic(kinds)


def _add_imagenet_val(kinds) -> None:
    parser = kinds.add_parser(
        "imagenet-val",
        help="sort the ILSVRC2012 validation images into 1,000 synset folders",
        description=(
            "Sorts ILSVRC2012_val_NNNNNNNN.JPEG files into DIR/{synset}/ using the ground truth that "
            "tensorflow-datasets ships (datasets/imagenet2012/validation_labels.txt) or --labels FILE. "
            "Idempotent: a second run keeps the finished files. Writes DIR/prepare.json."
        ),
    )
    parser.add_argument("source", metavar="SOURCE", type=Path,
                        help="ILSVRC2012_img_val.tar (read in order, not extracted first) or a folder of its JPEGs")
    flags.add_flag(parser, "output", "-o", type=Path, required=True, metavar="DIR",
                   help="where the {synset}/ folders go (seed-000 calls it `images`)")
    flags.add_flag(parser, "labels", type=Path, metavar="FILE",
                   help="ground truth: one synset per line, line i for image i (default: the one tensorflow-datasets ships)")
    how = parser.add_mutually_exclusive_group()
    how.add_argument("--copy", dest="mode", action="store_const", const="copy",
                     help="copy the files of a SOURCE folder (the default)")
    how.add_argument("--link", dest="mode", action="store_const", const="link",
                     help="hard-link the files of a SOURCE folder (symbolic link across file systems); saves the space")
    parser.set_defaults(mode="copy", kind_run=_run_imagenet_val)
    flags.add_storage_flag(parser)
    flags.add_common_flags(parser)


def _add_imagenet_train(kinds) -> None:
    parser = kinds.add_parser(
        "imagenet-train",
        help="unpack the ILSVRC2012 training images into 1,000 synset folders",
        description=(
            "Unpacks ILSVRC2012_img_train.tar, a tar of one archive per class (n01440764.tar ...), into "
            "DIR/{synset}/, reading both levels in order from the one file: no unpacked copy of the class "
            "archives first, memory flat in the images. The class archive's name is the label. Files whose bytes are not a "
            "JPEG are placed and named in the report (convert repairs or reports them). Idempotent: a "
            "second run keeps the finished files, passing over them without reading them. Writes DIR/prepare.json."
        ),
    )
    parser.add_argument("source", metavar="SOURCE", type=Path,
                        help="ILSVRC2012_img_train.tar (read in order, never unpacked twice) or a folder of its class archives")
    flags.add_flag(parser, "output", "-o", type=Path, required=True, metavar="DIR",
                   help="where the {synset}/ folders go (e.g. imagenet/train, beside imagenet/validation)")
    parser.set_defaults(kind_run=_run_imagenet_train)
    flags.add_storage_flag(parser)
    flags.add_common_flags(parser)


def _add_synthetic(kinds) -> None:
    parser = kinds.add_parser(
        "synthetic",
        help="make the built-in data set (no download)",
        description=(
            "Makes DIR/{train,validation}/{label}/*.jpg: photo-like JPEGs cropped, scaled, flipped, "
            "rotated and recoloured from the photographs scikit-image and scikit-learn ship, one source "
            "photograph (and colour family) per class, ImageNet-like sizes (about 500x375, 50-150 KB). "
            "The same --seed gives the same bytes; a second run with the same flags does nothing."
        ),
    )
    flags.add_flag(parser, "output", "-o", type=Path, required=True, metavar="DIR", help="where the data set goes")
    flags.add_flag(parser, "classes", type=flags.positive_int, default=10, metavar="N",
                   help="number of classes (default: 10, one per shipped photograph)")
    flags.add_flag(parser, "images_per_class", type=flags.positive_int, default=60, metavar="M",
                   help="images per class over both splits (default: 60)")
    flags.add_flag(parser, "validation_fraction", type=_fraction, default=0.2, metavar="F",
                   help="share of each class in the validation split, in [0, 1) (default: 0.2)")
    flags.add_flag(parser, "seed", type=flags.non_negative_int, default=0, help="random seed (default: 0)")
    flags.add_flag(parser, "quality", type=_int_range, default=(75, 95), metavar="LOW-HIGH",
                   help="JPEG quality range, each image drawing one value (default: 75-95)")
    flags.add_flag(parser, "long_side", type=_int_range, default=(400, 600), metavar="LOW-HIGH",
                   help="range of each image's longer side in pixels (default: 400-600, as ImageNet)")
    flags.add_flag(parser, "workers", type=flags.positive_int, default=None, metavar="N",
                   help="processes rendering images (default: every core)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace a synthetic data set made with other parameters in DIR")
    parser.set_defaults(kind_run=_run_synthetic)
    flags.add_storage_flag(parser)
    flags.add_common_flags(parser)


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1), got {text!r}") from None
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1), got {text!r}")
    return value


def _int_range(text: str) -> tuple[int, int]:
    """'75-95' or a single value '85' (then low = high)."""
    parts = text.split("-")
    try:
        values = [int(p) for p in parts]
    except ValueError:
        values = []
    if len(values) not in (1, 2) or values[0] <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer N or a range LOW-HIGH, got {text!r}")
    if values[0] > values[-1]:
        raise argparse.ArgumentTypeError(f"expected a range LOW-HIGH with LOW <= HIGH, got {text!r}")
    return values[0], values[-1]


def run(args: argparse.Namespace) -> int:
    return args.kind_run(args)


def _print_files(sections: dict, report_path: Path) -> None:
    """Each non-empty list of (name, reason) files, the first few on screen, then where all of them are."""
    for title, items in sections.items():
        if not items:
            continue
        print(f"  {title:<13} {len(items)}")
        for item in items[:_MAX_LISTED]:
            print(f"    {item.name}: {item.reason}")
        if len(items) > _MAX_LISTED:
            print(f"    ... and {len(items) - _MAX_LISTED} more (see {report_path.name})")
    print(f"  report        {report_path}")


def _run_imagenet_val(args: argparse.Namespace) -> int:
    from stallscope.data.imagenet import ImagenetValOptions, REPORT_NAME, prepare_imagenet_val

    options = ImagenetValOptions(labels_file=args.labels, mode=args.mode)
    with ProgressBar("sorting") as bar:
        report = prepare_imagenet_val(args.source, args.output, options, progress=bar)
    rate = (report.placed + report.in_place) / report.seconds if report.seconds > 0 else 0.0
    how = {"extract": "tar stream", "copy": "folder, copied", "link": "folder, linked"}[report.mode]
    print(f"ILSVRC2012 validation images sorted into {report.output}/{{synset}}/")
    print(f"  source        {report.source} ({how})")
    print(f"  ground truth  {report.ground_truth} ({report.ground_truth_classes} classes)")
    print(f"  tree          {report.images} images in {report.classes} classes, "
          f"{report.min_per_class}-{report.max_per_class} per class")
    line = f"  this run      {report.placed} placed, {report.in_place} already in place"
    if report.symlinked:
        line += f" ({report.symlinked} as symbolic links: no hard link possible)"
    print(line + f", {report.seconds:.1f} s ({rate:.0f} files/s)")
    _print_files({"not placed": report.unplaced, "removed": report.removed}, report.output / REPORT_NAME)
    if report.archive_error:
        raise DataError(f"{report.archive_error}; what came before is in place, run again with a whole archive to finish")
    return 0


def _run_imagenet_train(args: argparse.Namespace) -> int:
    from stallscope.data.imagenet import REPORT_NAME
    from stallscope.data.imagenet_train import TRAIN_CLASSES, TRAIN_IMAGES, prepare_imagenet_train

    with ProgressBar("unpacking") as bar:
        report = prepare_imagenet_train(args.source, args.output, progress=bar)
    rate = (report.placed + report.in_place) / report.seconds if report.seconds > 0 else 0.0
    how = "tar of class archives" if report.source_kind == "tar" else "folder of class archives"
    whole = ("the whole ILSVRC2012 train set" if report.is_whole_ilsvrc2012_train
             else f"ILSVRC2012 train has {TRAIN_IMAGES:,} in {TRAIN_CLASSES:,}")
    print(f"ILSVRC2012 training images unpacked into {report.output}/{{synset}}/")
    print(f"  source        {report.source} ({how})")
    print(f"  tree          {report.images:,} images in {report.classes:,} classes, "
          f"{report.min_per_class}-{report.max_per_class} per class ({whole})")
    print(f"  this run      {report.placed:,} placed, {report.in_place:,} already in place, "
          f"{report.seconds:.1f} s ({rate:.0f} files/s)")
    _print_files({"damaged": report.damaged, "not placed": report.unplaced, "not JPEG": report.not_jpeg},
                 report.output / REPORT_NAME)
    if report.archive_error:
        raise DataError(f"{report.archive_error}; what came before is in place, run again with a whole archive to finish")
    if report.damaged:
        raise DataError(f"{len(report.damaged)} class archive(s) damaged, e.g. {report.damaged[0].name}: "
                        f"{report.damaged[0].reason}; replace them and run again to finish")
    return 0


def _run_synthetic(args: argparse.Namespace) -> int:
    from stallscope.data.synthetic import INDEX_NAME, SyntheticOptions, make_synthetic

    options = SyntheticOptions(
        classes=args.classes, images_per_class=args.images_per_class,
        validation_fraction=args.validation_fraction, seed=args.seed, quality=args.quality,
        long_side=args.long_side, workers=args.workers,
    )
    with ProgressBar("rendering") as bar:
        report = make_synthetic(args.output, options, overwrite=args.overwrite, progress=bar)
    splits = ", ".join(f"{split} {count}" for split, count in report.images_per_split.items())
    smallest, mean, largest = report.file_bytes
    print(f"synthetic data set in {report.output}/{{split}}/{{label}}/")
    print(f"  classes       {len(report.labels)}: {', '.join(report.labels[:10])}{' ...' if len(report.labels) > 10 else ''}")
    print(f"  images        {report.images} ({splits})")
    print(f"  size          {report.bytes_total / 1e6:.1f} MB; files {smallest / 1e3:.0f}-{largest / 1e3:.0f} KB, "
          f"mean {mean / 1e3:.0f} KB; long side {report.long_side[0]}-{report.long_side[1]} px")
    if report.reused:
        print(f"  this run      nothing to do: the same data set (seed {options.seed}) is already there")
    else:
        print(f"  this run      {report.written} images made, {report.kept} kept, "
              f"{report.seconds:.1f} s ({report.images_per_second:.0f} images/s)")
    print(f"  index         {report.output / INDEX_NAME}")
    return 0
