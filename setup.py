"""Build configuration beyond pyproject.toml: the shuffle's and the mixture's optional C extensions.

Optional: where they cannot be compiled, the install still succeeds and
`streambatch.shuffle` falls back to numpy (see ``streambatch.shuffle.BACKEND``),
the mixture order to exact Python (``streambatch.stages._mix_order.BACKEND``).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension("streambatch._fisher_yates", sources=["streambatch/_fisher_yates.c"], optional=True),
        Extension("streambatch._mix_order", sources=["streambatch/_mix_order.c"], optional=True),
    ]
)
