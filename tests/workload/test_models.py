"""Model families, the head, fine-tuning modes, local weight files and the input range adapter."""

import numpy as np
import pytest

from stallscope.errors import UsageError
from stallscope.workload.models import ModelSpec, _adapter_transform, build_model, parse_fine_tune, parse_weights


def tiny_spec(**changes):
    values = dict(model="mobilenet", alpha=0.25, image_size=32, num_classes=3)
    values.update(changes)
    return ModelSpec(**values)


def test_head_is_softmax_over_the_classes_and_base_frozen():
    model, base = build_model(tiny_spec())
    probabilities = model(np.zeros((2, 32, 32, 3), np.float32)).numpy()
    assert probabilities.shape == (2, 3)
    assert np.allclose(probabilities.sum(axis=1), 1.0, atol=1e-5)
    assert not base.trainable
    assert {v.path for v in model.trainable_variables} == {"predictions/kernel", "predictions/bias"}


def test_fine_tune_full_and_last_n():
    full, base = build_model(tiny_spec(fine_tune="full"))
    assert len(full.trainable_variables) > 10
    last, base = build_model(tiny_spec(fine_tune="last:3"))
    trainable_layers = [layer for layer in base.layers if layer.trainable]
    assert trainable_layers == base.layers[-3:]
    assert 2 < len(last.trainable_variables) < len(full.trainable_variables)


@pytest.mark.filterwarnings("ignore:Skipping nested container:UserWarning")  # Keras' note on functional bases
def test_weights_from_a_local_file(tmp_path):
    _, source_base = build_model(tiny_spec())
    path = tmp_path / "base.weights.h5"
    source_base.save_weights(path)
    _, loaded = build_model(tiny_spec(weights=str(path)))
    for ours, theirs in zip(loaded.weights, source_base.weights):
        np.testing.assert_array_equal(ours.numpy(), theirs.numpy())
    with pytest.raises(UsageError, match="--weights"):
        build_model(tiny_spec(weights=str(path), alpha=0.5))  # another width: shapes differ


@pytest.mark.parametrize("changes, match", [
    ({"model": "inception_v3", "image_size": 32, "alpha": 1.0}, "at least 75"),
    ({"alpha": 0.3}, "alpha"),
    ({"model": "resnet50", "alpha": 0.25}, "width multiplier"),
    ({"model": "vgg"}, "model"),
    ({"fine_tune": "some"}, "fine-tune"),
])
def test_spec_rejects(changes, match):
    with pytest.raises(UsageError, match=match):
        tiny_spec(**changes)


def test_parse_weights_and_fine_tune(tmp_path):
    assert parse_weights("ImageNet") == "imagenet" and parse_weights("none") == "none"
    with pytest.raises(UsageError, match="--weights"):
        parse_weights(str(tmp_path / "missing.h5"))
    assert parse_fine_tune("last:12") == "last:12"
    with pytest.raises(UsageError):
        parse_fine_tune("last:0")


@pytest.mark.parametrize("input_range, expects, low, high", [
    ("minus_one_one", "minus_one_one", -1.0, 1.0), ("zero_one", "minus_one_one", -1.0, 1.0),
    ("minus_one_one", "none", 0.0, 255.0), ("none", "caffe", 0.0, 255.0),
])
def test_adapter_maps_the_pipeline_range_to_the_base_range(input_range, expects, low, high):
    scale, offset, _ = _adapter_transform(input_range, expects)
    source_low, source_high = {"minus_one_one": (-1, 1), "zero_one": (0, 1), "none": (0, 255)}[input_range]
    assert source_low * scale + offset == pytest.approx(low)
    assert source_high * scale + offset == pytest.approx(high)


def test_spec_round_trips_through_model_json(tmp_path):
    spec = tiny_spec(labels=("a", "b", "c"), fine_tune="last:4")
    spec.save(tmp_path)
    assert ModelSpec.load(tmp_path) == spec


@pytest.mark.parametrize("name", ["mobilenet_v2", "inception_v3", "resnet50", "efficientnet_b0"])
def test_every_family_builds_and_predicts_at_its_smallest_size(name):
    from stallscope.workload.models import MODELS

    size = MODELS[name].min_image_size
    alpha = 0.35 if name == "mobilenet_v2" else 1.0
    model, base = build_model(ModelSpec(model=name, alpha=alpha, image_size=size, num_classes=4))
    probabilities = model(np.random.default_rng(0).uniform(-1, 1, (2, size, size, 3)).astype(np.float32)).numpy()
    assert probabilities.shape == (2, 4)
    assert np.allclose(probabilities.sum(axis=1), 1.0, atol=1e-4)
    assert not base.trainable
