"""stallscope.diagnose on datasets shaped as users' own are: dicts of features, several inputs, no labels."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import stallscope
from stallscope.errors import UsageError
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


def test_a_python_generator_source_is_advised_as_one_not_as_files_to_read_in_parallel():
    """from_generator runs Python one element at a time: a slow one gets the generator's fix, never
    'read files in parallel' (there are none)."""
    import time

    def slow():
        while True:
            time.sleep(0.005)  # waits, as a generator reading a remote API does: no core works
            yield np.zeros((16, 16, 3), np.float32), 1

    signature = (tf.TensorSpec((16, 16, 3), tf.float32), tf.TensorSpec((), tf.int32))
    diagnosis = stallscope.diagnose(tf.data.Dataset.from_generator(slow, output_signature=signature).batch(4), steps=6)
    keys = [a.key for a in diagnosis.advice]
    assert diagnosis.verdict == "highly" and "parallel_generator" in keys, keys
    assert "parallel_interleave" not in keys and "outer_parallelism" not in keys
    # priced, as every fix is: N generators on a pool of their own overlap the 5 ms waits (measured by hand:
    # 21 -> 3.5 ms a step with N = 6, which AUTOTUNE on the shared pool would hold to about 2 in flight)
    generators = next(a for a in diagnosis.advice if a.key == "parallel_generator")
    assert generators.predicted_gain >= 1.0, generators.gain_basis
    assert "generators at once overlap" in generators.gain_basis
    assert "N = " in generators.code and "num_parallel_calls=N" in generators.code
    assert "Generator" in diagnosis.text()


def test_the_profile_of_a_diagnosis_is_kept_in_the_work_dir_given(tmp_path):
    dataset = tf.data.Dataset.from_tensor_slices(_features()).repeat().batch(8).prefetch(2)
    stallscope.diagnose(dataset, steps=4, work_dir=tmp_path / "work")
    stallscope.diagnose(dataset, steps=4, work_dir=tmp_path / "work")
    kept = sorted((tmp_path / "work").iterdir())
    assert len(kept) == 2  # one folder each call: the second does not overwrite the first
    assert all(list(folder.glob("plugins/profile/*/*.xplane.pb")) for folder in kept)
    (tmp_path / "a_file").write_text("x")
    with pytest.raises(UsageError, match="work_dir: expected a folder to write into"):
        stallscope.diagnose(dataset, steps=4, work_dir=tmp_path / "a_file")


def test_a_dataset_without_a_batch_stage_is_named_in_a_note():
    """Elements of one image each: the first dimension (a height) would be read as a batch size."""
    unbatched = tf.data.Dataset.from_tensor_slices(_features()["image"]).repeat()
    notes = stallscope.diagnose(unbatched, steps=4).notes
    assert any("has no batch stage" in note and ".batch(BATCH_SIZE)" in note for note in notes), notes
    batched = stallscope.diagnose(unbatched.batch(8), steps=4).notes
    assert not any("has no batch stage" in note for note in batched)


def test_when_the_probe_and_the_profiled_steps_disagree_a_note_says_which_is_the_verdict():
    from types import SimpleNamespace

    from stallscope.analysis.dataset_diagnosis import _verdicts_differ_note

    probe = SimpleNamespace(input_share=0.057, verdict="moderately", step_ms=4.4)
    profiled = SimpleNamespace(input_share=0.011, verdict="not")
    note = _verdicts_differ_note(probe, profiled)
    assert note.startswith("the profiled steps say 1.1% (not input-bound), the end-to-end probe 5.7% (moderately)")
    assert "steps of 4.4 ms" in note
    assert "steps of" not in _verdicts_differ_note(SimpleNamespace(**{**vars(probe), "step_ms": 40.0}), profiled)


def test_a_model_built_under_a_mirrored_strategy_is_probed_on_its_distributed_dataset():
    """A MirroredStrategy program's model: the compute probe ran its train_step outside the strategy
    (RuntimeError: Need to be inside "with strategy.scope()"); it runs on every replica, as fit would."""
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.Input((16, 16, 3)), tf.keras.layers.Conv2D(4, 3),
                                     tf.keras.layers.GlobalAveragePooling2D(), tf.keras.layers.Dense(3)])
        model.compile("adam", tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    dataset = tf.data.Dataset.from_tensor_slices((_features()["image"], np.arange(EXAMPLES) % 3)).repeat().batch(8)
    diagnosis = stallscope.diagnose(dataset, model=model, steps=6)
    assert diagnosis.verdict in ("not", "moderately", "highly") and 0.0 <= diagnosis.input_share <= 1.0
    end_to_end = diagnosis.phases[0].end_to_end
    # every step took one whole batch of 8, counted across the replicas' shares
    assert end_to_end.images_per_second == pytest.approx(8000.0 / end_to_end.step_ms, rel=0.01)
