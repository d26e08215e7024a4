"""stallscope.diagnose on datasets shaped as users' own are: dicts of features, several inputs, no labels."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import stallscope
from stallscope.workload.accelerator import batch_examples

EXAMPLES = 32


def _features() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {"image": rng.random((EXAMPLES, 16, 16, 3), dtype=np.float32),
            "meta": rng.random((EXAMPLES, 5), dtype=np.float32)}


@pytest.mark.parametrize("shape", ["features and labels", "features only"])
def test_an_emulated_device_takes_a_dataset_of_feature_dicts(shape):
    labels = np.arange(EXAMPLES) % 3
    elements = (_features(), labels) if shape == "features and labels" else _features()
    dataset = tf.data.Dataset.from_tensor_slices(elements).repeat().batch(8).prefetch(2)
    diagnosis = stallscope.diagnose(dataset, steps=6)
    assert diagnosis.verdict in ("not", "moderately", "highly")
    assert 0.0 <= diagnosis.input_share <= 1.0


def test_a_batchs_examples_are_the_first_dimension_of_its_first_tensor():
    features = {"meta": tf.zeros([4, 5]), "image": tf.zeros([4, 16, 16, 3])}
    assert batch_examples((features, tf.zeros([4]))) == 4
    assert batch_examples(tf.zeros([7, 2])) == 7
    assert batch_examples((tf.constant(1.0), tf.zeros([3]))) == 3  # a scalar part has no examples to count
    assert batch_examples({"x": tf.constant(1.0)}) == 1             # an unbatched element: one example
