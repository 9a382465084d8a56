"""docs/configuration.md is generated from the code and must say what the code does."""

from __future__ import annotations

import re
from pathlib import Path

from gpulse.cli import configdoc
from gpulse.cli import main as cli


def test_the_checked_in_configuration_reference_equals_the_generator_output(repo_root: Path) -> None:
    assert (repo_root / "docs/configuration.md").read_text(encoding="utf-8") == configdoc.render(), (
        "docs/configuration.md is out of date: run `make generate`"
    )


def test_every_flag_of_every_command_and_every_gpulse_variable_is_documented() -> None:
    text = configdoc.render()
    for name in cli.COMMANDS:
        assert f"### `gpulse {name}`" in text
        for action in configdoc.command_parser(name)._actions:
            for flag in action.option_strings:
                if flag not in ("-h", "--help"):
                    assert f"`{flag}`" in text, (name, flag)
    source = "".join(p.read_text(encoding="utf-8") for p in configdoc.PACKAGE.rglob("*.py"))
    for var in set(re.findall(r"\bGPULSE_[A-Z][A-Z0-9_]*\b", source)):
        assert f"| `{var}` |" in text, var
    assert "see the module" not in text, "a variable without a description: add it to configdoc.ENV_DOCS"
