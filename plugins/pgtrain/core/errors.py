"""Errors pgtrain raises for conditions a user can fix. Each message says what is wrong and what to do."""


class PgtrainError(Exception):
    """Base class: a problem with input, configuration or state that the user can act on."""


class ConfigError(PgtrainError):
    """A parameter or setting is invalid."""


class SourceError(PgtrainError):
    """The source table, its columns or its rows cannot be trained on."""


class TrainingFailed(PgtrainError):
    """The Horovod job failed; the message carries the trainer's verdict or the tail of its output."""


class TrainingInputError(TrainingFailed):
    """A rank refused its input (rows changed since planning, a wrong world size): a retry cannot fix it.

    Launchers raise it when the run's recorded verdict is ``refused`` (pgtrain.runs.record), never from log text.
    """


class CommitRejected(PgtrainError):
    """The staged parameters may not become a model version (incomplete, non-finite, or gated)."""


class LockTimeout(PgtrainError):
    """A lock could not be taken in time; ``holder``: the lock that kept it (its name, token, owner, acquired_at,
    expires_at), when one was held."""

    def __init__(self, message: str, holder: dict | None = None) -> None:
        super().__init__(message)
        self.holder = holder


class StaleLockToken(PgtrainError):
    """A write carried a fencing token older than the newest one seen: the writer lost its lease."""


class ClaimLost(TrainingFailed):
    """The job's training claim was lost while it trained, so its job was stopped (``superseded``: False) or, when a
    new try of the same run took the claim over and watches the job now, left to that try (``superseded``: True;
    that try's outcome is the run's, so this one records nothing)."""

    def __init__(self, message: str, *, superseded: bool = False) -> None:
        super().__init__(message)
        self.superseded = superseded


class TrainingBusy(PgtrainError):
    """Another run of the model is training: this one launches nothing beside it (not retried)."""
