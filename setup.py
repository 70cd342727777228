"""The consumer's C extension (everything else is in pyproject.toml).

Optional: without a C compiler the install succeeds and analytics/ingest/copy_text.py does the
same work in Python.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "analytics.ingest._copyfmt",
            ["analytics/ingest/_copyfmt.c"],
            extra_compile_args=["-O2"],
            optional=True,
        ),
    ]
)
