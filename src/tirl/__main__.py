"""`python -m tirl ...` is `tirl ...` (and what `torchrun -m tirl` runs)."""

import sys

from tirl.cli import main

sys.exit(main())
