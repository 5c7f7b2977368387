"""One `--help` style for every subcommand: what a flag takes, its default, and where else to set it.

A person reading `kafka-scorer submit --help` should find the same three facts, written the same way,
as in `kafka-scorer worker --help`: the allowed values or the unit in the metavar (`{json,msgpack}`,
`SECONDS`, `N`), `(default: ...)` at the end of the help, and `env: KAFKA_SCORER_...` when the flag
overrides a setting that the command also reads from the environment. Commands build their flags with
these helpers and the parser uses `HelpFormatter`, so a flag added later gets the style without effort.

Light at import (no torch, no aiokafka): `kafka-scorer --help` imports it.
"""

from __future__ import annotations

import argparse
import typing

from pydantic.fields import FieldInfo

from kafka_scorer.config import DType, Settings, choices


def shown_default(default: object) -> str:
    """A default as a person writes it: `unset` (nothing: None, "", {} or []), `on`/`off`, a
    comma-separated list, `KEY=VALUE,...` for a mapping; docs/configuration.md words them the same."""
    if isinstance(default, dict):
        default = ",".join(f"{key}={value}" for key, value in default.items())
    if isinstance(default, list | tuple):
        default = ",".join(map(str, default))
    if default is None or default == "":
        return "unset"
    if isinstance(default, bool):
        return "on" if default else "off"
    return str(default)


def env_name(name: str) -> str:
    return f"KAFKA_SCORER_{name.upper()}"


def flag_name(name: str) -> str:
    return "--" + name.replace("_", "-")


def setting_help(name: str, field: FieldInfo) -> str:
    """The setting's description, then its default and environment variable: the same facts for every
    setting, so `--help` answers "what is it now and where else can I set it"."""
    description = (field.description or "").rstrip(".")
    default = shown_default(field.get_default(call_default_factory=True))
    return f"{description} (default: {default}; env: {env_name(name)})".replace("%", "%%")


def setting_metavar(name: str, field: FieldInfo) -> str:
    """What kind of value a flag takes, at a glance: its choices, or its unit, or the field's own
    (`json_schema_extra={"metavar": ...}`) where the type alone says too little."""
    extra = field.json_schema_extra
    if isinstance(extra, dict) and isinstance(extra.get("metavar"), str):
        return str(extra["metavar"])
    allowed = choices(field.annotation)
    if allowed:
        return "{" + ",".join(allowed) + "}"
    kinds = set(typing.get_args(field.annotation)) | {field.annotation}
    if name.endswith("_ms"):
        return "MS"
    if name.endswith("_s"):
        return "SECONDS"
    if name.endswith(("_file", "cafile", "certfile", "keyfile")):
        return "PATH"
    if name.endswith("_url"):
        return "URL"
    if int in kinds:
        return "N"
    if float in kinds:
        return "NUMBER"
    if any(typing.get_origin(k) is list for k in kinds):
        return "A,B,..."
    return "TEXT"


def add_setting_flag(parser: argparse.ArgumentParser, name: str) -> None:
    """A flag for the `Settings` field `name`; not given, it leaves the environment's value alone."""
    field = Settings.model_fields[name]
    args = typing.get_args(field.annotation)
    if field.annotation is bool or (bool in args and type(None) in args):
        parser.add_argument(
            flag_name(name),
            dest=name,
            action=argparse.BooleanOptionalAction,
            default=argparse.SUPPRESS,
            help=setting_help(name, field),
        )
        return
    parser.add_argument(
        flag_name(name),
        dest=name,
        default=argparse.SUPPRESS,
        metavar=setting_metavar(name, field),
        help=setting_help(name, field),
    )


def add_env_file(parser: argparse.ArgumentParser) -> None:
    """`--env-file`, for every command that reads `Settings` (flags > environment > this file)."""
    parser.add_argument(
        "--env-file",
        default=".env",
        metavar="PATH",
        help="settings file read under the KAFKA_SCORER_* environment; a missing file is skipped",
    )


class HelpFormatter(argparse.HelpFormatter):
    """Appends `(default: ...)` to every flag whose help does not state its default itself."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "(default" in text or action.default is argparse.SUPPRESS or not action.option_strings:
            return text
        if isinstance(action, argparse._HelpAction | argparse._VersionAction):
            return text
        return f"{text} (default: {shown_default(action.default).replace('%', '%%')})"


def add_device_arguments(parser: argparse.ArgumentParser) -> None:
    """--device/--dtype for commands that load a model themselves (the worker reads them from Settings)."""
    parser.add_argument(
        "--device", default="auto", metavar="DEVICE", help="torch device: auto, cpu, cuda, cuda:1 ..."
    )
    parser.add_argument(
        "--dtype",
        default="auto",
        choices=choices(DType),
        help="weights and activations dtype; auto: bfloat16 on CUDA, float32 on CPU",
    )
