"""Sandboxed execution of Python unit tests against untrusted programs (see runner.py)."""

from evals.scorers.sandbox.runner import SandboxLimits, SandboxResult, UnitTest, UnitTestResult, run_tests

__all__ = ["SandboxLimits", "SandboxResult", "UnitTest", "UnitTestResult", "run_tests"]
