"""Build configuration beyond pyproject.toml: the optional C extensions (shuffle, best-fit packing).

Optional: where it cannot be compiled, the install still succeeds and
`streambatch.shuffle` and the packing stage fall back to numpy (see their ``BACKEND``).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension("streambatch._fisher_yates", sources=["streambatch/_fisher_yates.c"], optional=True),
        Extension("streambatch._best_fit", sources=["streambatch/_best_fit.c"], optional=True),
    ]
)
