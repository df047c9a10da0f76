"""The lab's tests run offline on one or two threads, as the product's do (tests/conftest.py sets the same)."""
from __future__ import annotations

import os
import tempfile

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
# the tokenised-data cache of a test session lives in its own folder, never in the user's ~/.cache
os.environ.setdefault("SUITE_CACHE_DIR", tempfile.mkdtemp(prefix="suite-lab-test-cache-"))
torch.set_num_threads(min(2, torch.get_num_threads()))
