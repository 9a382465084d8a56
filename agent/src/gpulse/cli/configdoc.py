"""``docs/configuration.md``, generated from the code: every command's flags, every setting, every variable.

The command flags come from each command's own argparse parser (the one ``gpulse <command>``
builds), the agent settings from :mod:`gpulse.agent.config`, the connection settings from
:mod:`gpulse.agent.connection_config`, and the list of ``GPULSE_*`` environment variables from the package's
source, so a flag or variable added anywhere shows up here at the next ``make generate``; a test
fails while the checked-in file differs.

Run: ``python -m gpulse.cli.configdoc > docs/configuration.md``.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from gpulse.agent import config
from gpulse.cli import exit_codes
from gpulse.cli import main as cli

_ENV_RE = re.compile(r"\bGPULSE_[A-Z][A-Z0-9_]*\b")
PACKAGE = Path(__file__).resolve().parents[1]

#: What the variables that are not a flag's twin mean (the others are described by their flag).
ENV_DOCS = {
    "GPULSE_TOKEN": "the API token itself (v2), or `user:password` (v1); prefer `GPULSE_TOKEN_FILE`",
    "GPULSE_TOKEN_FILE": "file holding the token (same as `--token-file`)",
    "GPULSE_CONFIG": "the TOML file of every command that talks to a database (same as `--config`)",
    "GPULSE_SOCKET": "the agent: same as `--socket`; training processes and `gpulse status`: the agent socket to talk to",
    "GPULSE_SOCKET_GROUP": "the agent: same as `--socket-group`; training processes and `gpulse status`: also trust an agent socket of this group",
    "GPULSE_RUN_ID": "training processes: the run id shared by every rank (else TORCHELASTIC_RUN_ID, SLURM_JOB_ID, or rank 0's)",
    "GPULSE_PEAK_FLOPS": "training processes: peak FLOP/s per device for MFU, overriding the built-in table",
    "GPULSE_PROFILE": "training processes: `0` turns off the automatic profiler window (same as `Run(profile=False)`)",
    "GPULSE_GRAFANA_URL": "`gpulse demo`: the Grafana its printed links point to",
    "GPULSE_GRAFANA_PORT": "`gpulse demo` without `GPULSE_GRAFANA_URL`: Grafana's port on 127.0.0.1 (`.env`)",
    "GPULSE_ALERT_KIND": "the stack's Grafana (`.env`): `webhook` or `slack`, the kind of the gpulse-team alert contact point",
    "GPULSE_ALERT_WEBHOOK_URL_FILE": "the stack's Grafana (`.env`): a file holding the gpulse-team contact point's "
    "Slack or webhook URL (mounted into Grafana; the alert-log service when unset)",
}
#: The compose stack's settings file (read by `make up` and docker compose, not by gpulse itself).
ENV_EXAMPLE = PACKAGE.parents[2] / ".env.example"


def _md(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def command_parser(name: str) -> argparse.ArgumentParser:
    """The parser ``gpulse <name>`` uses (:func:`gpulse.cli.main.command_parser`)."""
    return cli.command_parser(name)


def _help(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    if not action.help or action.help == argparse.SUPPRESS:
        return ""
    params = {**vars(action), "prog": parser.prog}
    for k, v in list(params.items()):
        if isinstance(v, (list, tuple)):
            params[k] = ", ".join(map(str, v))
    try:
        return action.help % params
    except (KeyError, TypeError, ValueError):
        return action.help


def _flag_rows(parser: argparse.ArgumentParser) -> list[str]:
    rows = ["| flag | value | default | meaning |", "| --- | --- | --- | --- |"]
    for a in parser._actions:
        if isinstance(a, argparse._HelpAction) or a.help == argparse.SUPPRESS:
            continue
        if a.option_strings:
            flag = ", ".join(f"`{o}`" for o in a.option_strings)
        else:
            flag = f"`{a.metavar or a.dest}` (positional)"
        if a.nargs == 0:
            value = ""
        elif a.choices:
            value = " \\| ".join(f"`{c}`" for c in a.choices)
        else:
            value = f"`{a.metavar or a.dest.upper()}`"
        default = (
            ""
            if a.default is None or a.default is False or a.default == argparse.SUPPRESS or a.default == []
            else f"`{a.default}`"
        )
        rows.append(f"| {flag} | {value} | {default} | {_md(_help(parser, a))} |")
    return rows


def env_variables() -> dict[str, list[str]]:
    """Every ``GPULSE_*`` name the package's source mentions -> the modules that mention it."""
    found: dict[str, list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "configdoc.py":
            continue
        rel = path.relative_to(PACKAGE.parent).as_posix()
        for name in sorted(set(_ENV_RE.findall(path.read_text(encoding="utf-8")))):
            found.setdefault(name, []).append(rel)
    for setting in config.setting_names():
        found.setdefault(config.env_name(setting), ["gpulse/config.py"])
    for key in config.CONNECTION_KEYS:
        found.setdefault(f"GPULSE_{key.upper()}", ["gpulse/agent/connection_config.py"])
    return dict(sorted(found.items()))


def _stack_settings() -> list[str]:
    """The keys of ``.env.example`` with the comment above each group: what `make up` writes to ``.env``."""
    if not ENV_EXAMPLE.is_file():  # an installed package without the repository
        return []
    out = [
        "",
        "## The compose stack (`.env`, written by `make up` from `.env.example`)",
        "",
        "| setting | default | meaning |",
        "| --- | --- | --- |",
    ]
    comment: list[str] = []
    told = False  # the group's comment was shown on its first key
    for raw in ENV_EXAMPLE.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if line.startswith("#"):
            comment.append(line.lstrip("# "))
            told = False
        elif "=" in line:
            key, value = line.split("=", 1)
            meaning = "(the group above)" if told else _md(" ".join(comment))
            out.append(f"| `{key}` | `{value}` | {meaning} |")
            told = True
        else:
            comment = []
    return out


def _tenants() -> list[str]:
    """``[tenants]``: the example, summary and keys of :mod:`gpulse.agent.tenants_config`."""
    from gpulse.agent import tenants_config
    from gpulse.sinks import routing

    measurements = ", ".join(f"`{m}`" for m in sorted(routing.JOB_MEASUREMENTS))
    return [
        "",
        "## Tenants (`[tenants]` in the agent's TOML file)",
        "",
        _md(tenants_config.SUMMARY),
        "",
        "```toml",
        *tenants_config.EXAMPLE.splitlines(),
        "```",
        "",
        f"Routed to a tenant: {measurements}, of a job whose `account` or `namespace` a route names (a training "
        "rank's account is read by the agent from its process's cgroup and initial environment, as slurmstepd "
        "sets them); everything else, the points of a job no route names included, stays in the fleet's bucket.",
        "",
        "| key | meaning |",
        "| --- | --- |",
        "| `secrets_dir` | where `tenants/NAME/influx-write-token` is (default `secrets`) |",
        *(f"| `[[tenants.route]]` `{k}` | {tenants_config.ROUTE_DOCS[k]} |" for k in tenants_config.ROUTE_KEYS),
    ]


def render() -> str:
    out = [
        "# gpulse configuration reference",
        "",
        "Generated from the code by `python -m gpulse.cli.configdoc` (`make generate`); a test fails when this file differs.",
        "",
        "Every setting can come from three places, with one rule for every command: **flags > environment "
        "(`GPULSE_*`) > config file (`--config gpulse.toml` or `GPULSE_CONFIG`) > defaults**. Every command that "
        "talks to a database takes `--config`, and a command gpulse advises names the file again "
        "(`gpulse setup --config gpulse.toml ...`). The token is read only from a file "
        "(`--token-file`, `token_file`, `GPULSE_TOKEN_FILE`) or from `GPULSE_TOKEN`: never from a flag value and "
        "never from the TOML file, and it is never logged.",
        "",
        "## Database connection (every command that talks to InfluxDB)",
        "",
        "| flag | environment | TOML `[connection]` |",
        "| --- | --- | --- |",
    ]
    for key in config.CONNECTION_KEYS:
        out.append(f"| `--{key.replace('_', '-')}` | `GPULSE_{key.upper()}` | `{key}` |")
    out += [
        "| (none: never on a command line) | `GPULSE_TOKEN` | (refused) |",
        "",
        "With `--api v1` the bucket is `database` or `database/retention-policy` and the token is `user:password`.",
        "",
        "## Agent settings (`gpulse agent`)",
        "",
        "| TOML `[agent]` key | environment | flag |",
        "| --- | --- | --- |",
    ]
    for name in config.setting_names():
        out.append(f"| `{name}` | `{config.env_name(name)}` | `--{name.replace('_', '-')}` |")
    out += _tenants()
    out += ["", "## Environment variables", "", "| variable | meaning | read by |", "| --- | --- | --- |"]
    flag_of = {config.env_name(n): f"same as `--{n.replace('_', '-')}`" for n in config.setting_names()}
    flag_of.update({f"GPULSE_{k.upper()}": f"same as `--{k.replace('_', '-')}`" for k in config.CONNECTION_KEYS})
    for name, modules in env_variables().items():
        meaning = ENV_DOCS.get(name) or flag_of.get(name) or "see the module"
        out.append(f"| `{name}` | {meaning} | {', '.join(f'`{m}`' for m in modules)} |")
    out += _stack_settings()
    out += ["", "## Commands", ""]
    for name in cli.COMMANDS:
        parser = command_parser(name)
        out += [f"### `gpulse {name}`", "", _md(cli.COMMANDS[name][1]) + ".", ""]
        if parser.description and parser.description != cli.COMMANDS[name][1]:
            out += [_md(parser.description), ""]
        out += _flag_rows(parser) + [""]
        out += exit_codes.markdown(cli.command_module(name).EXIT_CODES)
        out += [""]
    return "\n".join(out).rstrip("\n") + "\n"


if __name__ == "__main__":
    import sys

    sys.stdout.write(render())
