"""The consumer's two C extensions (everything else is in pyproject.toml).

Both are optional: without a C compiler the install succeeds and analytics/ingest/copy_text.py and
analytics/ingest/kafka_records.py do the same work in Python.
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
        Extension(
            "analytics.ingest._kafkarec",
            ["analytics/ingest/_kafkarec.c"],
            extra_compile_args=["-O2"],
            optional=True,
        ),
    ]
)
