"""``python -m zyfa`` (and ``torchrun -m zyfa``): the ``zyfa`` command."""

import sys

from zyfa.cli import main

sys.exit(main())
