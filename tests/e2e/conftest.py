"""pytest setup for end-to-end tests: the reflection client lives in tools/rpc."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tools", "rpc"))
sys.path.insert(0, os.path.dirname(__file__))
