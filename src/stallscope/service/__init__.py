"""tf.data service glue: move input preprocessing onto worker processes or other machines."""
