"""TensorFlow's generated protobuf modules (XSpace, Example) without TensorFlow's package init.

Why: `import tensorflow.core.example.example_pb2` runs `tensorflow/__init__` first (seconds, Keras and
scikit-learn with it), though a generated module needs only protobuf: reading a profile or checking
records' Examples answers at once this way. Each module is loaded from its file under its own name, so
a later TensorFlow import reuses it and protobuf's pool sees each .proto once.
"""

from __future__ import annotations

import builtins
import importlib
import importlib.util
import sys
import types
from pathlib import Path

from stallscope.extras import missing_extra

XPLANE = "tensorflow.tsl.profiler.protobuf.xplane_pb2"
EXAMPLE = "tensorflow.core.example.example_pb2"


def tf_proto(name: str, feature: str = "reading TF's files") -> types.ModuleType:
    """The module `name` (tensorflow....*_pb2); `feature` names what needs it if TensorFlow is missing."""
    if name in sys.modules or "tensorflow" in sys.modules:
        return importlib.import_module(name)
    spec = importlib.util.find_spec("tensorflow")
    if spec is None or not spec.submodule_search_locations:
        raise missing_extra("cpu", feature, "TensorFlow")
    file = Path(list(spec.submodule_search_locations)[0]).joinpath(*name.split(".")[1:]).with_suffix(".py")
    if not file.exists():  # another layout: the ordinary import, TF's init included
        return importlib.import_module(name)
    module_spec = importlib.util.spec_from_file_location(name, file)
    module = importlib.util.module_from_spec(module_spec)
    # its own `from tensorflow.x import y_pb2` lines load those by file too (see _import)
    module.__builtins__ = {**vars(builtins), "__import__": _import}
    sys.modules[name] = module
    try:
        module_spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def _import(name, globals=None, locals=None, fromlist=(), level=0):
    """`from tensorflow.core.example import feature_pb2` inside a generated module, without TF's init."""
    if (level == 0 and name.startswith("tensorflow.") and fromlist and "tensorflow" not in sys.modules
            and all(item.endswith("_pb2") for item in fromlist)):
        return types.SimpleNamespace(**{item: tf_proto(f"{name}.{item}") for item in fromlist})
    return builtins.__import__(name, globals, locals, fromlist, level)
