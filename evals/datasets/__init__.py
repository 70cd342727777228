"""Datasets: the JSONL item format, loaders for public formats, and the built-in suites."""

from evals.datasets.loaders import FORMATS, Dataset, DatasetError, load_dataset, load_file

__all__ = ["FORMATS", "Dataset", "DatasetError", "load_dataset", "load_file"]
