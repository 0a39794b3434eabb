"""The service suites on a CUDA machine use the integration suites' helpers (ServerProcess, the corpus,
the batch builders, the start_server fixture): loaded from tests/integration/conftest.py under a name of
their own, so that `from conftest import ...` in these tests finds them here."""
import importlib.util
import os
import sys

_path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "integration", "conftest.py")
_spec = importlib.util.spec_from_file_location("tigon_integration_conftest", _path)
_integration = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = _integration
_spec.loader.exec_module(_integration)

from tigon_integration_conftest import *  # noqa: E402,F401,F403  (helpers and fixtures)
from tigon_integration_conftest import ServerProcess, byte_batches, CORPUS  # noqa: E402,F401
