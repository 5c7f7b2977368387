"""`kafka_scorer.client` is for services and scripts that never load a model: it must import, and a
client must be built, where torch and transformers cannot be imported at all."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from tests.cli.helpers import ROOT, cli_env

_WITHOUT_TORCH = textwrap.dedent(
    """
    import sys

    class NoTorch:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("torch", "transformers", "tokenizers"):
                raise ImportError(f"{name} is blocked in this test")

    sys.meta_path.insert(0, NoTorch())
    from kafka_scorer.client import ScoringClient, ScoringTimeout

    client = ScoringClient("localhost:9092", "requests", "replies", security_protocol="PLAINTEXT")
    assert (client.request_topic, client.reply_topic) == ("requests", "replies")
    assert issubclass(ScoringTimeout, TimeoutError)
    print(sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "transformers", "tokenizers")))
    """
)


def test_the_client_imports_and_builds_without_torch() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _WITHOUT_TORCH],
        cwd=ROOT,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
