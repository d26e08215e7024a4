"""The two record schemas: TF's standard image keys, and seed-002's `name`/`category`/`data`.

Encoding uses `tf.train.Example` protos; parsing returns the same dict keys for both schemas
(`image`, `label`, `filename`) so the input pipeline does not care which one a shard uses.
"""

from __future__ import annotations

import dataclasses

from stallscope.config import require_choice


@dataclasses.dataclass(frozen=True)
class Schema:
    name: str
    image_key: str
    label_key: str
    filename_key: str
    # Keys only the standard schema writes: (key, kind) with kind in {"bytes", "int64"}.
    extra_keys: tuple[tuple[str, str], ...] = ()


STANDARD = Schema(
    name="standard",
    image_key="image/encoded",
    label_key="image/class/label",
    filename_key="image/filename",
    extra_keys=(
        ("image/format", "bytes"),
        ("image/class/text", "bytes"),
        ("image/height", "int64"),
        ("image/width", "int64"),
    ),
)
SEED = Schema(name="seed", image_key="data", label_key="category", filename_key="name")
SCHEMAS = {s.name: s for s in (STANDARD, SEED)}


def get_schema(name: str) -> Schema:
    require_choice("--schema", name, SCHEMAS)
    return SCHEMAS[name]


def encode_example(
    schema: Schema,
    *,
    image: bytes,
    label: int,
    filename: bytes,
    label_text: bytes = b"",
    height: int = 0,
    width: int = 0,
    image_format: bytes = b"jpeg",
) -> bytes:
    """A serialized tf.train.Example for one image."""
    import tensorflow as tf

    def _bytes(value: bytes):
        return tf.train.Feature(bytes_list=tf.train.BytesList(value=[value]))

    def _int(value: int):
        return tf.train.Feature(int64_list=tf.train.Int64List(value=[int(value)]))

    feature = {
        schema.image_key: _bytes(image),
        schema.label_key: _int(label),
        schema.filename_key: _bytes(filename),
    }
    extras = {
        "image/format": _bytes(image_format),
        "image/class/text": _bytes(label_text),
        "image/height": _int(height),
        "image/width": _int(width),
    }
    for key, _ in schema.extra_keys:
        feature[key] = extras[key]
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def feature_spec(schema: Schema) -> dict:
    """The `tf.io.parse_single_example` description for the keys the pipeline reads."""
    import tensorflow as tf

    return {
        schema.image_key: tf.io.FixedLenFeature([], tf.string),
        schema.label_key: tf.io.FixedLenFeature([], tf.int64),
        schema.filename_key: tf.io.FixedLenFeature([], tf.string, default_value=""),
    }


def parse_example(schema: Schema, serialized):
    """Graph-mode parse: {'image': encoded bytes, 'label': int64, 'filename': bytes}."""
    import tensorflow as tf

    parsed = tf.io.parse_single_example(serialized, feature_spec(schema))
    return {
        "image": parsed[schema.image_key],
        "label": parsed[schema.label_key],
        "filename": parsed[schema.filename_key],
    }


def detect_schema(serialized: bytes) -> Schema:
    """Which schema one serialized record uses, from its feature keys."""
    from stallscope.tfprotos import EXAMPLE, tf_proto

    keys = set(tf_proto(EXAMPLE, "reading TFRecords").Example.FromString(serialized).features.feature)
    for schema in (STANDARD, SEED):
        if schema.image_key in keys and schema.label_key in keys:
            return schema
    raise ValueError(f"record has neither schema's keys; found {sorted(keys)}")
