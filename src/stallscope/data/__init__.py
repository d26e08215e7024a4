"""Image data on disk: folder trees, ILSVRC sorting, image checks and the built-in data set."""
