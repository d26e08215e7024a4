"""The tf.data service sizing: more workers give more until the device, the link or the trainer's
receiving caps it; compression changes the bytes shipped; decoded images can cost more to ship than
to decode here."""

from __future__ import annotations

import pytest

from stallscope.analysis import service_sizing as sizing
from stallscope.errors import UsageError

BATCH = 32
DECODED = BATCH * sizing.decoded_image_bytes(224)  # 19.3 MB: a batch of 224 px float32 images


def _inputs(**changes) -> sizing.ServiceInputs:
    known = dict(cpu_ms_per_element=100.0, bytes_per_element=float(DECODED), device_elements_per_second=50.0,
                 worker_cores=2.0, trainer_cores=4.0, link_gbps=10.0, images_per_element=BATCH,
                 local_elements_per_second=15.0)
    return sizing.ServiceInputs(**{**known, **changes})


def test_more_workers_give_more_until_the_device_limits():
    plan = sizing.size_service(_inputs(link_gbps=100.0), max_workers=6)
    paces = [row.elements_per_second for row in plan.rows]
    assert paces == sorted(paces) and paces[0] < paces[1] < paces[2]
    one = plan.worker_elements_per_second  # 2 cores over 100 ms + sending 19.3 MB at 0.25 ms/MB
    assert one == pytest.approx(2 * 1000 / (100 + DECODED / 1e6 * sizing.SEND_MS_PER_MB))
    assert plan.workers_needed == 3 and plan.ceiling.bound == "device"
    assert plan.ceiling.elements_per_second == pytest.approx(50.0)
    assert plan.rows[-1].bound == "device" and plan.rows[0].bound == "workers"
    assert plan.ceiling.link_mb_per_second == pytest.approx(50 * DECODED / 1e6)
    assert plan.pays_off is True


def test_the_link_caps_the_service_below_the_device_and_no_count_of_workers_reaches_it():
    plan = sizing.size_service(_inputs(link_gbps=1.0, device_elements_per_second=500.0))
    link = 1e9 / 8 / DECODED  # 6.5 batches/s on 1 Gbit/s
    assert plan.workers_needed is None and plan.ceiling.bound == "link"
    assert plan.ceiling.elements_per_second == pytest.approx(link)
    assert plan.link_elements_per_second == pytest.approx(link)
    assert sizing.predict(_inputs(link_gbps=1.0, device_elements_per_second=500.0), 8).elements_per_second \
        == pytest.approx(link)
    assert plan.pays_off is False  # the trainer alone makes 15 batches/s: shipping decoded images costs more


def test_the_trainer_receiving_caps_the_service():
    plan = sizing.size_service(_inputs(trainer_cores=0.5, link_gbps=400.0, device_elements_per_second=1000.0))
    assert plan.ceiling.bound == "receive"
    assert plan.receive_elements_per_second == pytest.approx(0.5 * 1000 / (DECODED / 1e6 * sizing.RECEIVE_MS_PER_MB))


def test_compression_changes_the_bytes_shipped_and_the_workers_cpu():
    plain = _inputs(compression="none")
    squeezed = _inputs(compression="auto", compression_ratio=4.0)
    assert sizing.shipped_bytes(plain) == DECODED
    assert sizing.shipped_bytes(squeezed) == pytest.approx(DECODED / 4)
    assert sizing.worker_ms_per_element(squeezed) > sizing.worker_ms_per_element(plain)
    slow_link = dict(link_gbps=1.0, device_elements_per_second=500.0)
    assert sizing.size_service(_inputs(compression="auto", compression_ratio=4.0, **slow_link)).ceiling \
        .elements_per_second == pytest.approx(4 * sizing.size_service(_inputs(**slow_link)).ceiling.elements_per_second)


def test_workers_on_the_trainers_own_host_share_its_cores_with_the_receiving():
    # a local service on 4 cores: each batch costs a worker 104.8 ms and the trainer 7.7 ms to receive
    alone = _inputs(worker_cores=1.0, link_gbps=100.0, device_elements_per_second=500.0)
    shared = _inputs(worker_cores=1.0, link_gbps=100.0, device_elements_per_second=500.0, host_cores=4.0)
    per_element = sizing.worker_ms_per_element(shared) + sizing.receive_ms_per_element(shared)
    assert sizing.host_rate(shared) == pytest.approx(4 * 1000 / per_element)
    assert sizing.predict(shared, 2) == sizing.predict(alone, 2)  # two 1-core workers fit: workers-bound
    four = sizing.predict(shared, 4)
    assert four.bound == "host" and four.elements_per_second < sizing.predict(alone, 4).elements_per_second
    plan = sizing.size_service(shared)
    assert plan.ceiling.bound == "host" and plan.ceiling.workers == 4 and plan.workers_needed is None
    assert plan.host_elements_per_second == pytest.approx(sizing.host_rate(shared))
    assert sizing.size_service(alone).host_elements_per_second is None
    assert sizing.host_rate(alone) == float("inf")


def test_unknown_bytes_leave_the_link_and_receiving_unmodelled():
    plan = sizing.size_service(_inputs(bytes_per_element=None))
    assert plan.shipped_bytes_per_element is None and plan.link_elements_per_second is None
    assert plan.receive_elements_per_second is None and plan.ceiling.link_mb_per_second is None
    assert plan.ceiling.bound == "device"


@pytest.mark.parametrize("field, value", [("worker_cores", 0), ("compression", "zstd"), ("images_per_element", 0),
                                          ("bytes_per_element", -1.0), ("host_cores", 0.0)])
def test_inputs_are_validated_naming_the_field(field, value):
    with pytest.raises(UsageError, match=f"^{field}: expected"):
        _inputs(**{field: value})
