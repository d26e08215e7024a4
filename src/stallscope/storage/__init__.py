"""Where the data lives: local disk, object stores (gs://, s3://) and the storage emulator."""
