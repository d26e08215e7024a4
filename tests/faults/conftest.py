"""The fault-injection suite (tests/faults). Its fixture, `faults`, lives in tests/conftest.py, so a
scenario whose costly set-up belongs to another folder's tests (a trained model's checkpoints, a
finished sweep) runs on the same harness there, and its row joins the same table."""
