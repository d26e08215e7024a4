"""TFRecord shards: schema, shard planning, the writer and the verifier."""
