"""Build configuration beyond pyproject.toml: the optional C extensions (shuffle, best-fit packing, packed and window gathers, mixture order).

Optional: where they cannot be compiled, the install still succeeds and each
stage falls back to numpy or exact Python: see ``streambatch.order.shuffle.BACKEND``,
``streambatch.items.pack.pack.BACKEND``, ``streambatch.items.pack.rows.GATHER_BACKEND``, ``streambatch.items.windows.gather.WINDOW_BACKEND`` and ``streambatch.items.mix.order.BACKEND``.
"""

from setuptools import Extension, setup

try:  # the packed gather makes its batch's numpy arrays itself (numpy's C API)
    import numpy

    NUMPY_INCLUDE = [numpy.get_include()]
except ImportError:  # no numpy at build time: that extension fails to build and numpy gathers instead
    NUMPY_INCLUDE = []

HEADERS = ["streambatch/_buffers.h"]  # the buffer checks every kernel shares (also shipped as package data)

setup(
    ext_modules=[
        Extension("streambatch._fisher_yates", sources=["streambatch/_fisher_yates.c"], depends=HEADERS, optional=True),
        Extension("streambatch._best_fit", sources=["streambatch/_best_fit.c"], depends=HEADERS, optional=True),
        Extension("streambatch._mix_order", sources=["streambatch/_mix_order.c"], depends=HEADERS, optional=True),
        Extension(
            "streambatch._row_gather",
            sources=["streambatch/_row_gather.c"],
            depends=HEADERS,
            include_dirs=NUMPY_INCLUDE,
            optional=True,
        ),
    ]
)
