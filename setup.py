"""Build configuration beyond pyproject.toml: the shuffle's optional C extension.

Optional: where it cannot be compiled, the install still succeeds and
`streambatch.shuffle` falls back to numpy (see ``streambatch.shuffle.BACKEND``).
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("streambatch._fisher_yates", sources=["streambatch/_fisher_yates.c"], optional=True)])
