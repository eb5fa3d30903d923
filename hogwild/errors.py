"""Typed failures that hogwild raises to its users.

Every error a user can cause (a bad config, a corrupt data file, too little shared memory, a
worker that died) is one of these, with a message that names the input and what was expected.
The CLI turns them into a one-line message and a non-zero exit instead of a traceback.
"""


class HogwildError(Exception):
    """Base class of every error hogwild raises on purpose."""


class ConfigError(HogwildError):
    """The job configuration is invalid (unknown key, bad value, shapes that do not fit)."""


class DataError(HogwildError):
    """A data file or directory is missing, truncated, corrupt or of the wrong format."""


class SharedMemoryError(HogwildError):
    """A shared-memory segment cannot be created or attached."""


class WorkerDiedError(HogwildError):
    """A worker process exited while the job was running."""


class CheckpointError(HogwildError):
    """A checkpoint is missing, incomplete or does not match the model."""


class WorkerStalledError(WorkerDiedError):
    """A worker process is alive but has shown no progress for too long (stopped or stuck)."""


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived: stop as Ctrl-C does (exit status 143 from the CLI)."""


class StoppedError(HogwildError):
    """A parameter server stopped what a job trains on: a write it acknowledged failed to apply,
    so it refuses the bucket's requests until its memory is replaced. Restarting the client
    cannot help; the CLI exits with :data:`EXIT_STOPPED`, which a cluster driver does not
    restart but stops the job on, naming the server, the bucket and why."""


EXIT_STOPPED = 4  # the CLI's status for a StoppedError (2: any other HogwildError)


def cause_of(exc: BaseException | None, kind: type) -> BaseException | None:
    """``exc`` or the first of its causes (``raise ... from``, or raised while handling) that
    is a ``kind``; None if none is (a thread's error wrapped on its way out, say)."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, kind):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


class PartitionDiedError(WorkerDiedError):
    """A partition process of the replica died or failed; the replica stops."""


class RoleFailedError(WorkerDiedError):
    """A role of a cluster job (a replica, a parameter or data server) exited or cannot start."""
