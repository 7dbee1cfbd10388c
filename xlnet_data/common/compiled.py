"""The compiled loops' decorator (`@compiled.jit()`) and numba's on-disk cache, keyed on the package's code.

numba checks a cached function only against its own file, but a function that calls compiled functions of
other files (loop._write_steps inlines records.put_record, masking.sample_mask, the rng draws, ...) or reads
their constants (vocab.CLS_ID) has their code built in: after those files change, the cache would go on
running their old code. So the cache lives in a folder named after a hash of numba's version and of every
file of the package that compiled code is in or imports, followed import by import (wherever compiled code is
moved, its code is in the key; an edit to the trainers or the commands, which compiled code never imports, keeps
the cache: a first run compiles for minutes on a busy 2-core machine), under
NUMBA_CACHE_DIR, or else the user's cache folder (~/.cache/xlnet-data/numba/<hash>). numba reads its
CACHE_DIR setting when a function is decorated: it is set for that moment only, and the process's (a
caller's own numba functions) is left as it was.
"""

import hashlib
import os
import re

import numba

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_NAME = os.path.basename(_PACKAGE)


def _module_file(module: str):
    """The package file of a dotted module name (a module or a package's __init__), or None."""
    parts = module.split(".")
    if parts[0] != _NAME:
        return None
    base = os.path.join(_PACKAGE, *parts[1:])
    for path in (base + ".py", os.path.join(base, "__init__.py")):
        if os.path.isfile(path):
            return path
    return None


# A module-level import of the package (the only ones compiled code can see): `import xlnet_data.x[ as y]` or
# `from xlnet_data.x import a, b` (in brackets over several lines, too).
_IMPORT = re.compile(rb"^(?:import\s+(%s[\w.]*)|from\s+(%s[\w.]*)\s+import\s+(\([^)]*\)|[^\n]*))" % ((_NAME.encode(),) * 2),
                     re.MULTILINE)


def _imported_files(source: bytes) -> set:
    """The package files a source file imports at module level."""
    found = set()
    for module, package, names in _IMPORT.findall(source):
        if module:
            found.add(_module_file(module.decode()))
            continue
        found.add(_module_file(package.decode()))
        for name in re.sub(rb"#[^\n]*", b"", names).strip(b"()").split(b","):
            if name.split():
                found.add(_module_file(f"{package.decode()}.{name.split()[0].decode()}"))
    return found - {None}


def _source_files():
    """The package's .py files that hold compiled code (they import this module) and every package file they
    import, directly or not, relative to the package, sorted."""
    sources = {}
    for folder, dirs, names in os.walk(_PACKAGE):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for name in names:
            if name.endswith(".py"):
                with open(os.path.join(folder, name), "rb") as f:
                    sources[os.path.join(folder, name)] = f.read()
    todo = [path for path, source in sources.items() if b"compiled.jit(" in source]
    todo.append(os.path.join(_PACKAGE, "common", "compiled.py"))
    seen = set(todo)
    while todo:
        for path in _imported_files(sources[todo.pop()]) - seen:
            seen.add(path)
            todo.append(path)
    return sorted(os.path.relpath(path, _PACKAGE) for path in seen)


def _cache_dir():
    digest = hashlib.sha256(numba.__version__.encode())
    for name in _source_files():
        with open(os.path.join(_PACKAGE, name), "rb") as f:
            digest.update(name.encode() + b"\0" + f.read() + b"\0")
    base = os.environ.get("NUMBA_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "xlnet-data", "numba")
    return os.path.join(base, digest.hexdigest()[:16])


CACHE_DIR = _cache_dir()


def jit(**options):
    """numba.njit with the on-disk cache in CACHE_DIR."""
    def decorate(function):
        before = numba.config.CACHE_DIR
        numba.config.CACHE_DIR = CACHE_DIR  # numba's cache locator reads it now, for this function
        try:
            return numba.njit(cache=True, **options)(function)
        finally:
            numba.config.CACHE_DIR = before
    return decorate


def element_pointer(context, builder, array_type, array, index, pointee):
    """In a numba intrinsic's codegen: the address of array[index] (`array` a value of the numba type
    `array_type`, `index` an LLVM integer; no bounds check) as a pointer to the LLVM type `pointee`, for one load,
    store or call of any width at any alignment."""
    data = context.make_array(array_type)(context, builder, array).data
    return builder.bitcast(builder.gep(data, [index]), pointee.as_pointer())
