"""``python -m ptexec.hf script.py [args...]``: run a script with ExecuTorch's runtime names
resolving to ptexec's (:mod:`ptexec.hf.switch`)."""

import sys

from .switch import run_script

run_script(sys.argv[1:])
