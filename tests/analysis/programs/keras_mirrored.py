"""A Keras `fit` under `tf.distribute.MirroredStrategy` over two logical CPU devices, profiled with the
TensorBoard callback. Same arguments and TIMES_JSON as keras_fit.py (without steps_per_execution)."""

import sys

import tensorflow as tf

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)

import keras_fit  # noqa: E402  (the logical devices must exist before anything touches TF's context)


def main():
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    keras_fit.SCOPE = strategy.scope
    keras_fit.main()


if __name__ == "__main__":
    sys.exit(main())
