"""The consumer's two C extensions (everything else is in pyproject.toml).

Both are optional: without a C compiler the install succeeds and analytics/bulk.py and
analytics/kafka_records.py do the same work in Python.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension("analytics._copyfmt", ["analytics/_copyfmt.c"], extra_compile_args=["-O2"], optional=True),
        Extension(
            "analytics._kafkarec", ["analytics/_kafkarec.c"], extra_compile_args=["-O2"], optional=True
        ),
    ]
)
