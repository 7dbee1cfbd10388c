"""The type check of every frozen config (CreateConfig, SpmTrainConfig, TrainConfig and its parts, ...), written once.

A config built in Python (the API) can hold anything: `seq_len="128"` would fail later as a TypeError deep in a
comparison, `input_glob=[...]` as an AttributeError. Each config's __post_init__ calls check_field_types first,
which compares every field's value with its annotation and raises ConfigError, the one line the commands print.
What is plainly meant is taken and normalised instead: a path object for a str, a list for a tuple, a numpy
integer for an int (configs are written to JSON).
"""

import dataclasses
import functools
import numbers
import os
import types
import typing
from typing import Any

import numpy as np

from xlnet_data.common.errors import ConfigError

_NAMES = {bool: "True or False", int: "an integer", float: "a number", str: "a string", tuple: "a tuple"}


@functools.cache
def _field_types(cls) -> tuple:
    hints = typing.get_type_hints(cls)  # resolves string annotations (from __future__ import annotations)
    return tuple((field.name, hints[field.name]) for field in dataclasses.fields(cls))


class _Mismatch(Exception):
    pass


def _describe(kind) -> str:
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin in (typing.Union, types.UnionType):
        named = [_describe(arg) for arg in args if arg is not type(None)]
        return " or ".join(named) + (" or None" if type(None) in args else "")
    if origin is tuple:
        return f"a tuple of {_describe(args[0]).removeprefix('a ').removeprefix('an ')}s" if args else "a tuple"
    return _NAMES.get(kind, f"of type {getattr(origin or kind, '__name__', kind)}")


def _normalised(kind, value):
    """`value` as a field of type `kind` keeps it; _Mismatch where it is not of that type."""
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if kind is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        for arg in args:
            if arg is not type(None):
                try:
                    return _normalised(arg, value)
                except _Mismatch:
                    pass
        raise _Mismatch
    if kind is bool:
        if isinstance(value, (bool, np.bool_)):  # a numpy bool too, e.g. from an array of flags
            return bool(value)
    elif kind is int:
        if isinstance(value, numbers.Integral) and not isinstance(value, bool):
            return int(value)
    elif kind is float:
        if isinstance(value, numbers.Real) and not isinstance(value, bool):
            return value if isinstance(value, (int, float)) else float(value)
    elif kind is str:
        if isinstance(value, (str, os.PathLike)):
            return os.fspath(value)
    elif kind is tuple or origin is tuple:
        if isinstance(value, (tuple, list)):
            if args and args[-1] is Ellipsis:
                return tuple(_normalised(args[0], item) for item in value)
            return tuple(value)
    elif isinstance(value, origin or kind):
        return value
    raise _Mismatch


def check_field_types(config) -> None:
    """ConfigError, one line naming the config, the field and what it must be, for a field whose value is not of
    its annotated type; fields of plainly meant values are normalised in place (see the module doc)."""
    cls = type(config)
    for name, kind in _field_types(cls):
        value = getattr(config, name)
        try:
            kept = _normalised(kind, value)
        except _Mismatch:
            raise ConfigError(f"{cls.__name__}: {name}={value!r} must be {_describe(kind)}") from None
        if kept is not value:
            object.__setattr__(config, name, kept)  # frozen: __post_init__ is where a field may still be set
