"""Control messages between a job's roles: small JSON commands over the transport.

The bulk of a job moves as raw arrays (pushes, pulls, batches); what its roles say to each other
besides (the driver telling a replica to train a share, asking how far it got, telling it to
stop) is a ``CONTROL`` request carrying one UTF-8 JSON object with an ``"op"`` string, answered
by a ``JSON`` reply. :class:`ControlServer` serves such requests with a function of
``(op, body)``; :class:`ControlClient` sends them, with the transport's timeouts and bounded
retries (a role that does not answer is a
:class:`~hogwild.net.channel.PeerUnreachableError` naming it).

Nothing received is trusted: a request over :data:`MAX_JSON_BYTES`, not JSON, not an object,
without a string ``op``, or for another job gets an ``ERROR`` reply naming what was wrong; the
function's own :class:`ControlRefused` (an unknown op, a bad field) becomes one too; the server
goes on serving. Each field of a body is the receiver's to check (:func:`field`).
"""

from __future__ import annotations

import json
import math
import secrets
from collections.abc import Callable

from hogwild.errors import HogwildError
from hogwild.net.address import parse_address
from hogwild.net.channel import Peers, ProtocolError
from hogwild.net.router import Incoming, Reply, Router, error_reply, json_reply
from hogwild.net.wire import DType, ErrorCode, Header, MsgType, WireError, frame_array, job_id

MAX_JSON_BYTES = 1 << 20


class ControlRefused(HogwildError):
    """A control request the server will not act on (the message goes back to the client)."""


def field(
    body: dict,
    name: str,
    kind: type | tuple,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
):
    """``body[name]`` if it is of ``kind`` (and within ``minimum``..``maximum``), else
    ControlRefused. A number from the network always has a range: give both bounds."""
    value = body.get(name)
    if isinstance(value, bool) and kind is not bool:
        value = None
    not_finite = isinstance(value, float) and not math.isfinite(value)
    if (
        not isinstance(value, kind)
        or not_finite
        or (minimum is not None and value < minimum)
        or (maximum is not None and value > maximum)
    ):
        want = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
        more = f" >= {minimum}" if minimum is not None else ""
        more += f" and <= {maximum:.6g}" if maximum is not None else ""
        shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:40] + "..."
        raise ControlRefused(f"field {name!r}: expected {want}{more}, got {shown}")
    return value


def _json_frame(data: dict) -> bytes:
    return json.dumps(data, separators=(",", ":")).encode("utf-8")


def _refuse_constant(name: str):
    raise ValueError(f"{name} is not a number this protocol takes")


def decode_json(frame, what: str) -> dict:
    """A JSON object from one frame, checked: size, encoding, syntax, an object at the top."""
    raw = memoryview(frame)
    if raw.nbytes > MAX_JSON_BYTES:
        raise WireError(f"{what}: {raw.nbytes} bytes of JSON, at most {MAX_JSON_BYTES}")
    try:
        data = json.loads(bytes(raw), parse_constant=_refuse_constant)
    except (UnicodeDecodeError, json.JSONDecodeError, ValueError) as exc:
        raise WireError(f"{what}: not JSON: {exc}", ErrorCode.BAD_FRAMES) from None
    except RecursionError:  # json's decoder recurses once per level: a bracket bomb
        raise WireError(f"{what}: JSON nested too deeply", ErrorCode.BAD_FRAMES) from None
    if not isinstance(data, dict):
        raise WireError(f"{what}: JSON {type(data).__name__}, expected an object")
    return data


def read_control(request: Incoming) -> tuple[str, dict]:
    """A ``CONTROL`` request's ``op`` and body, checked (one UTF-8 JSON frame holding an object
    with a string ``op``); a :class:`WireError` naming what is wrong otherwise."""
    header = request.header
    if header.frames != 1 or header.dtype != DType.UINT8 or len(request.frames) != 1:
        raise WireError("CONTROL carries one UTF-8 JSON frame", ErrorCode.BAD_FRAMES)
    frame_array(request.frames[0], DType.UINT8, header.shape, "the JSON frame")
    body = decode_json(request.frames[0], "the JSON frame")
    op = body.get("op")
    if not isinstance(op, str):
        raise WireError(f"a control request needs a string 'op', got {op!r}", ErrorCode.BAD_VALUE)
    return op, body


class _Handler:
    dedup_types = frozenset()  # a repeated command is answered again, from the current state
    receives_into_buffers = False

    def __init__(self, job: int, act: Callable[[str, dict], dict]) -> None:
        self.job, self.act = job, act

    def buffers(self, header: Header):
        return None

    def release(self, buffers) -> None:
        pass

    def tick(self, now: float) -> None:
        pass

    def handle(self, request: Incoming) -> Reply:
        header = request.header
        if header.type != MsgType.CONTROL:
            raise WireError(
                f"a {header.type.name} request: this role takes CONTROL", ErrorCode.UNEXPECTED
            )
        if header.job not in (self.job, 0):  # 0: any job, for a status question alone
            raise WireError(f"job {header.job:#x} is not this role's job", ErrorCode.WRONG_JOB)
        op, body = read_control(request)
        if header.job == 0:  # anyone's: alive, and nothing more (no job name, no figures)
            if op != "status":
                raise WireError(
                    f"{op!r} needs the job's id (only 'status' is for any job)",
                    ErrorCode.WRONG_JOB,
                )
            return json_reply(header, {})
        try:
            answer = self.act(op, body)
        except ControlRefused as exc:
            return error_reply(header, ErrorCode.BAD_VALUE, f"{op}: {exc}")
        return json_reply(header, answer)


class ControlServer:
    """Serves control requests of ``job`` on ``address`` with ``act(op, body) -> dict``.

    ``act`` runs on the network thread: it must be quick (record the command, answer; the work
    happens elsewhere). Beyond loopback ``keys`` are required (:mod:`hogwild.net.auth`).
    """

    def __init__(self, address: str, job: str, act, keys: str | None = None) -> None:
        self.router = Router(parse_address(address), _Handler(job_id(job), act), keys=keys)
        self.address: str | None = None

    def start(self) -> str:
        bound = self.router.start()
        self.address = f"{bound.host}:{bound.port}"
        return self.address

    def stop(self) -> None:
        self.router.stop()
        self.router.close()

    def __enter__(self) -> ControlServer:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


class ControlClient:
    """Sends control requests of ``job`` to one role at ``address`` (None: ``status`` only)."""

    def __init__(
        self,
        address: str,
        job: str | None,
        *,
        timeout_s: float = 5.0,
        retries: int = 3,
        keys: str | None = None,
        alive: Callable[[], bool] | None = None,
    ) -> None:
        self.address, self.job = address, job_id(job) if job else 0  # 0: alive, nothing more
        self.peers = Peers([address], sender=secrets.randbits(31), timeout_s=timeout_s,
                           retries=retries, keys=keys, alive=alive)  # fmt: skip

    def call(self, op: str, **body) -> dict:
        """Send ``op`` with ``body``; the reply's JSON object.

        Raises:
            PeerUnreachableError: No answer after every retry.
            ControlRefused: The role refused the request (its message, with its address).
        """
        text = _json_frame({"op": op, **body})
        header = Header(MsgType.CONTROL, job=self.job, dtype=DType.UINT8, shape=(len(text),),
                        frames=1)  # fmt: skip
        reply, frames = self.peers.request(0, header, [text])
        if reply.type == MsgType.ERROR:
            said = bytes(memoryview(frames[0])).decode("utf-8", "replace") if frames else ""
            raise ControlRefused(f"{self.address}: {said}")
        if reply.type != MsgType.JSON or len(frames) != 1:
            raise ProtocolError(f"{self.address}: no JSON reply to {op!r}")
        try:
            return decode_json(frames[0], f"{self.address}'s reply to {op!r}")
        except WireError as exc:
            raise ProtocolError(str(exc)) from None

    def close(self) -> None:
        self.peers.close()

    def __enter__(self) -> ControlClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
