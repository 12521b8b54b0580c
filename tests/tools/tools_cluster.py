"""Constants shared by the tools' end-to-end tests (conftest.py starts the
processes; tests import from here, not from conftest, whose module name
other test folders share)."""
import os

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
DEFAULT_MODEL = os.path.join(REPO, "models", "default")
# The scheduler's --burst_tokens: small, so that a short request spans
# several bursts.
BURST_TOKENS = 4
