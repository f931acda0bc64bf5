"""Build configuration beyond pyproject.toml: the optional C extensions (shuffle, best-fit packing, packed and window gathers, mixture order).

Optional: where they cannot be compiled, the install still succeeds and each
kernel runs its numpy or exact Python path instead, with the same results.
``streambatch._kernels`` is the one door to them: ``available()`` says which were
built, ``use(kernel, "python")`` / ``set_backend`` switch one kernel, and
``STREAMBATCH_DISABLE_CPU_FEATURES`` turns off the gathers' AVX2, AVX-512,
POPCNT and FSRM loops.  ``streambatch._row_gather`` is one extension compiled
from four files (``ROW_GATHER``) sharing ``_gather.h``.
"""

from setuptools import Extension, setup

try:  # the packed gather makes its batch's numpy arrays itself (numpy's C API)
    import numpy

    NUMPY_INCLUDE = [numpy.get_include()]
except ImportError:  # no numpy at build time: that extension fails to build and numpy gathers instead
    NUMPY_INCLUDE = []

HEADERS = ["streambatch/_buffers.h"]  # the buffer checks every kernel shares (also shipped as package data)
ROW_GATHER = ["_row_gather.c", "_gather_packed.c", "_gather_windows.c", "_mask_bits.c"]  # the module first

setup(
    ext_modules=[
        Extension("streambatch._fisher_yates", sources=["streambatch/_fisher_yates.c"], depends=HEADERS, optional=True),
        Extension("streambatch._best_fit", sources=["streambatch/_best_fit.c"], depends=HEADERS, optional=True),
        Extension("streambatch._mix_order", sources=["streambatch/_mix_order.c"], depends=HEADERS, optional=True),
        Extension(
            "streambatch._row_gather",
            sources=[f"streambatch/{name}" for name in ROW_GATHER],
            depends=[*HEADERS, "streambatch/_gather.h"],
            include_dirs=NUMPY_INCLUDE,
            optional=True,
        ),
    ]
)
