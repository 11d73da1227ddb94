"""The parts of benchmarks/accelerator.py, a module each (that script's docstring lists them).

shared.py holds what every part uses (sizes, model configs, timing, JSON lines); a part's
module imports it and nothing of another part's. The entry script starts the process
(common.start) before importing any of them; a part imported alone (by a test) gets this
codebase's XLA:CPU flags here.
"""
import common  # benchmarks/common.py: the repository on sys.path

common.start(__name__)
