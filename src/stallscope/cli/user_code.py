"""`module:function` flags (`--dataset-fn`, `--model-fn`): load a function from the user's own code.

`module` is a dotted module on sys.path (the current directory included, as `python -m` does) or the
path of a `.py` file; the function is called without arguments. Whatever goes wrong, from a missing
file to an exception inside the user's function, ends in one line naming the flag.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

from stallscope.errors import UsageError


def call_user_function(spec: str, flag: str) -> Any:
    """Imports MODULE from `spec` ("MODULE:FUNCTION") and returns FUNCTION()."""
    module_text, sep, name = str(spec).rpartition(":")
    if not sep or not module_text or not name.isidentifier():
        raise UsageError(f"{flag}: expected MODULE:FUNCTION (a dotted module or a .py file), got {spec!r}")
    module = _import(module_text, flag)
    function = getattr(module, name, None)
    if function is None:
        raise UsageError(f"{flag}: {module_text} has no {name!r}")
    if not callable(function):
        raise UsageError(f"{flag}: {module_text}:{name} is a {type(function).__name__}, not a function")
    try:
        return function()
    except Exception as exc:  # the user's code: any error is theirs to see in one line
        raise UsageError(f"{flag}: {spec} raised {type(exc).__name__}: {exc}") from exc


def _import(module_text: str, flag: str):
    if module_text.endswith(".py") or os.sep in module_text:
        path = Path(module_text)
        if not path.is_file():
            raise UsageError(f"{flag}: {module_text!r} is not a file")
        name = f"stallscope_user_{path.stem}"
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses and pickling look modules up by name
        _run(lambda: spec.loader.exec_module(module), module_text, flag)
        return module
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    return _run(lambda: importlib.import_module(module_text), module_text, flag)


def _run(load, module_text: str, flag: str):
    try:
        return load()
    except ModuleNotFoundError as exc:
        raise UsageError(f"{flag}: cannot import {module_text!r} ({exc})") from exc
    except Exception as exc:
        raise UsageError(f"{flag}: importing {module_text} raised {type(exc).__name__}: {exc}") from exc
