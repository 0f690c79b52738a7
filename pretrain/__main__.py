"""Entry point: ``accelerate launch pretrain`` (the folder run as a script), ``python -m pretrain``,
``accelerate launch -m pretrain``. See ``pretrain.cli`` and ``--help``."""

import os
import sys

if not __package__:  # run as a path (``python pretrain``): import the package, not the folder's modules
    _here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _here]
    sys.path.insert(0, os.path.dirname(_here))

from core.errors import run_cli  # noqa: E402
from pretrain.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(run_cli(main))
