"""The fine-tuning workload: models, the training loop, evaluation, profiling, the emulated accelerator."""
