"""`dspark-ggml serve` without the [server] extra: the package imports and works, the verb is
listed, and running it says how to install what it needs. Also the verb's flag checks."""
from __future__ import annotations

import subprocess
import sys

from tests.tiny_pair import TARGET_PATH

# fastapi and uvicorn made unimportable, as in an installation without the extra
_WITHOUT_EXTRA = "import sys; sys.modules['fastapi'] = None; sys.modules['uvicorn'] = None; "


def _python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", _WITHOUT_EXTRA + code], capture_output=True, text=True,
                          timeout=120)


def test_core_works_without_the_extra():
    r = _python("import dspark_ggml, dspark_ggml.server.cli; "
                f"llm = dspark_ggml.LLM({TARGET_PATH!r}, n_threads=1); "
                "print(len(llm.generate('x', max_tokens=3).tokens))")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "3"


def test_serve_without_the_extra_says_how_to_install():
    r = _python(f"from dspark_ggml.cli import main; sys.exit(main(['serve', '-m', {TARGET_PATH!r}]))")
    assert r.returncode == 1
    assert "pip install 'dspark-ggml[server]'" in r.stderr and "fastapi" in r.stderr
    assert "Traceback" not in r.stderr


def test_help_lists_serve_without_the_extra():
    r = _python("from dspark_ggml.cli import main; sys.exit(main(['--help']))")
    assert r.returncode == 0 and "serve" in r.stdout


def test_bad_server_flags_are_refused_before_loading(capsys):
    from dspark_ggml.cli import main

    for argv in (["-np", "0"], ["--queue-size", "-1"], ["--port", "70000"], ["--max-body", "10"],
                 ["--cors-origins", "example.com"], ["--cors-origins", "http://a.example/path"],
                 ["--embeddings-ctx", "0"]):
        assert main(["serve", "-m", TARGET_PATH, *argv]) == 1
        assert "error:" in capsys.readouterr().err
