"""Property-based fuzzing of the live API from its OpenAPI schema: no generated request gets a 5xx."""

from __future__ import annotations

import importlib.util
import shutil
import sys

import pytest
from test_api import prebuilt_data_dir  # tests/ is on sys.path (pytest's default import mode)


@pytest.mark.slow
def test_schemathesis_finds_no_server_error(tmp_path_factory, repo_root):
    if importlib.util.find_spec("schemathesis") is None:
        pytest.skip("schemathesis is not installed (pip install schemathesis; it is in the [test] extra)")
    sys.path.insert(0, str(repo_root / "scripts"))
    try:
        import schemathesis_check
    finally:
        sys.path.remove(str(repo_root / "scripts"))
    data_dir = prebuilt_data_dir(tmp_path_factory, repo_root)
    rc = schemathesis_check.main(["--max-examples", "8", "--ingest-examples", "2", "--data-dir", data_dir])
    shutil.rmtree(data_dir, ignore_errors=True)
    assert rc == 0, "schemathesis found a 5xx answer (see its report above)"
