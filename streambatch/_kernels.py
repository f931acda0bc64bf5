"""The one door to the C kernels: which extensions were built, and one switch per kernel, ``"c"`` or ``"python"``.

Four optional C extensions (``setup.py`` builds them where a C compiler is
present) serve six kernels.  Each has a Python path giving the same results, so
a build without a compiler works, more slowly:

=================  =================================  ==============================================
kernel             C extension                        Python path
=================  =================================  ==============================================
``shuffle``        ``streambatch._fisher_yates``      numpy, in blocks (`streambatch.order.shuffle`)
``best_fit``       ``streambatch._best_fit``          a heap per room (`streambatch.items.pack._pack_fit`)
``mix_order``      ``streambatch._mix_order``         one step per item (`streambatch.items.mix.order`)
``packed_gather``  ``streambatch._row_gather``        numpy (`streambatch.items.pack._pack_gather`)
``window_gather``  ``streambatch._row_gather``        numpy record views (`streambatch.items.windows.gather`)
``mask_bits``      ``streambatch._row_gather``        numpy unpacking (`streambatch.model.mask`)
=================  =================================  ==============================================

Every module that runs a kernel asks `extension` for its module (None: the
Python path).  `available` says which were built, `backend` which path runs;
`use` switches one kernel inside a ``with`` block (tests compare the two paths
with it), `set_backend` for the rest of the process.  A gather made for a space
is cached per switch, so a switch takes effect on the next batch.

The C gathers pick their fastest loops by what the CPU has (AVX2, AVX-512,
POPCNT, fast short ``rep movsb``), when ``streambatch._row_gather`` is imported.
``STREAMBATCH_DISABLE_CPU_FEATURES`` (names separated by spaces or commas, any
case, or ``all``), as numpy's ``NPY_DISABLE_CPU_FEATURES``, turns those loops
off: ``STREAMBATCH_DISABLE_CPU_FEATURES="AVX2 AVX512F POPCNT"``.  The baseline
(SSE2 on x86-64) stays.  `cpu_features` says which loops run.

>>> sorted(available()) == sorted(KERNELS)
True
>>> with use("shuffle", "python"):
...     backend("shuffle")
'python'
"""

from __future__ import annotations

import os
import re
import sys
import threading
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from importlib import import_module
from typing import Any, Literal

from .errors import ConfigError

Backend = Literal["c", "python"]

EXTENSIONS = {
    "shuffle": "_fisher_yates",
    "best_fit": "_best_fit",
    "mix_order": "_mix_order",
    "packed_gather": "_row_gather",
    "window_gather": "_row_gather",
    "mask_bits": "_row_gather",
}
"""Each kernel's C extension (a module of this package)."""

KERNELS = tuple(EXTENSIONS)

DISABLE_VARIABLE = "STREAMBATCH_DISABLE_CPU_FEATURES"
CPU_FEATURES = ("AVX2", "AVX512F", "AVX512BW", "BMI2", "POPCNT", "FSRM")
"""The CPU features the C gathers dispatch on, as ``DISABLE_VARIABLE`` names them (``all``: every one)."""


def _load(name: str) -> Any:
    try:
        return import_module(f"{__package__}.{name}")
    except ImportError:  # built without a C compiler (or hidden): the Python path
        return None


_MODULES: dict[str, Any] = {name: _load(name) for name in sorted(set(EXTENSIONS.values()))}
_LOCK = threading.Lock()
_SWITCH: dict[str, Backend] = {k: "c" if _MODULES[e] is not None else "python" for k, e in EXTENSIONS.items()}


def available() -> dict[str, bool]:
    """Each kernel: whether its C extension was built (and imports)."""
    return {kernel: _MODULES[name] is not None for kernel, name in EXTENSIONS.items()}


def backend(kernel: str) -> Backend:
    """Which path *kernel* runs now: ``"c"`` (its extension) or ``"python"``."""
    return _SWITCH[_check_kernel(kernel)]


def extension(kernel: str) -> Any:
    """The C extension module that runs *kernel*, or None where the Python path runs (not built, or switched off)."""
    return _MODULES[EXTENSIONS[kernel]] if _SWITCH[kernel] == "c" else None


def cache_key(name: str, kernel: str) -> str:
    """*name* as the cache key of something made on *kernel*'s path (a space's gather): *name* while the switch says
    ``"c"``, else ``name + " (python)"``, so a cached gather follows the switch.

    >>> with use("window_gather", "python"):
    ...     cache_key("gather", "window_gather")
    'gather (python)'
    """
    return name if _SWITCH[kernel] == "c" else f"{name} (python)"


def built(kernel: str) -> Any:
    """The C extension module of *kernel* where it was built (whatever its switch says), else None."""
    return _MODULES[EXTENSIONS[_check_kernel(kernel)]]


def set_backend(kernel: str, path: str) -> Backend:
    """Run *kernel* on *path* (``"c"`` or ``"python"``) from now on; returns the path it ran on before.

    ``"c"`` where the extension was not built is a `ConfigError` saying how to build it.
    """
    kernel = _check_kernel(kernel)
    if path not in ("c", "python"):
        raise ConfigError(f"backend={path!r} for kernel {kernel!r} is not 'c' or 'python'; pass one of them")
    if path == "c" and _MODULES[EXTENSIONS[kernel]] is None:
        raise ConfigError(
            f"kernel {kernel!r} has no C extension: streambatch.{EXTENSIONS[kernel]} is not built; reinstall "
            "streambatch with a C compiler present (pip install --no-binary streambatch streambatch), or use 'python'"
        )
    with _LOCK:
        previous = _SWITCH[kernel]
        _SWITCH[kernel] = "c" if path == "c" else "python"
    return previous


@contextmanager
def use(kernel: str, path: str) -> Iterator[None]:
    """Run *kernel* on *path* inside the ``with`` block, then on what it ran on before.

    >>> with use("packed_gather", "python"):
    ...     extension("packed_gather") is None
    True
    """
    previous = set_backend(kernel, path)
    try:
        yield
    finally:
        with _LOCK:
            _SWITCH[kernel] = previous


def _check_kernel(kernel: Any) -> str:
    if kernel not in EXTENSIONS:
        raise ConfigError(f"kernel={kernel!r} is not one of {', '.join(KERNELS)}; pass one of them")
    return str(kernel)


def disabled_features(value: str | None = None) -> frozenset[str]:
    """The CPU features *value* (default: ``$STREAMBATCH_DISABLE_CPU_FEATURES``) turns off, upper case.

    >>> sorted(disabled_features("avx2, popcnt"))
    ['AVX2', 'POPCNT']
    >>> disabled_features("all") == frozenset(CPU_FEATURES)
    True
    """
    text = os.environ.get(DISABLE_VARIABLE, "") if value is None else value
    names = {name.upper() for name in re.split(r"[\s,]+", text) if name}
    return frozenset(CPU_FEATURES) if "ALL" in names else frozenset(names)


def cpu_features() -> dict[str, bool]:
    """Each CPU feature the C gathers dispatch on: True where this CPU has it and `DISABLE_VARIABLE` leaves it on
    (``{}`` without ``streambatch._row_gather``)."""
    module = _MODULES["_row_gather"]
    return {} if module is None else dict(module.cpu_features())


def describe() -> str:
    """One line for diagnostics: each kernel's path, and the CPU features the C gathers use.

    >>> describe().startswith("kernels: shuffle ")
    True
    """
    paths = ", ".join(f"{kernel} {backend(kernel)}" for kernel in KERNELS)
    features = cpu_features()
    used = " ".join(name for name, on in features.items() if on) or "none"
    return f"kernels: {paths}; CPU features: {used}" if features else f"kernels: {paths}"


def legacy_switch(module_name: str, attribute: str, kernel: str, python_word: str) -> None:
    """Keep ``module.attribute``, an old switch of *kernel* (its values ``"c"`` and *python_word*), reading and
    setting `backend` for one release, with a `DeprecationWarning` naming `use`."""
    module = sys.modules[module_name]
    old = f"{module_name}.{attribute}"

    def warn() -> None:
        warnings.warn(
            f"{old} is deprecated and goes in the next release; read streambatch._kernels.backend({kernel!r}), "
            f"switch with streambatch._kernels.use({kernel!r}, 'python') or set_backend",
            DeprecationWarning,
            stacklevel=3,
        )

    def read(_: Any) -> str:
        warn()
        return "c" if backend(kernel) == "c" else python_word

    def write(_: Any, value: str) -> None:
        warn()
        set_backend(kernel, "python" if value in (python_word, "python") else value)

    module.__class__ = type(type(module).__name__, (type(module),), {attribute: property(read, write)})


_unknown = sorted(disabled_features() - set(CPU_FEATURES))
if _unknown:
    warnings.warn(
        f"{DISABLE_VARIABLE} names {', '.join(_unknown)}, which no kernel dispatches on; "
        f"the known features are {', '.join(CPU_FEATURES)} (or all)",
        RuntimeWarning,
        stacklevel=2,
    )
