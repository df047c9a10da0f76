"""The method check's public import path, `suite.testing` (it lives in `suite.api.testing`)."""
from suite.api.testing import *  # noqa: F401,F403
