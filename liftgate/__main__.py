"""``python -m liftgate ...`` is the ``liftgate`` command (used for child processes of ``liftgate up``)."""

from liftgate.cli import main

if __name__ == "__main__":
    main()
