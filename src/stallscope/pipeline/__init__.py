"""The tf.data input pipeline: one config, one builder, named presets."""
