"""Checkpoint directories: one committed checkpoint per epoch, written crash-safely.

A checkpoint of epoch 3 is three files in one directory::

    epoch-0003.safetensors        weights only, PyTorch names and layouts ("conv1.weight"
                                  [out, in, kh, kw], "fc1.weight" [out, in], ...), so that
                                  ``model.load_state_dict(load_file(...), strict=True)`` works
    epoch-0003.optim.safetensors  optimizer state ("conv1.weight.momentum", ...)
    epoch-0003.json               the sidecar: the caller's ``info`` (resolved config, epoch,
                                  optimizer scalars, seeds, data position, metrics), the two
                                  file names and their sha256

Invariant: **the sidecar is the commit record.** It is written last, and every file is
written atomically (:func:`hogwild.training.tensorfile.write_atomic`), so a checkpoint whose
sidecar exists had both tensor files whole on disk when it was committed; tensor files without
a sidecar are the remains of an interrupted write and are not a checkpoint. Loading verifies the
sha256 of both tensor files, so later damage is reported, never trained on.

Pruning removes a checkpoint's sidecar before its tensor files, so an interrupted prune leaves
at worst orphan tensor files, never a sidecar pointing at missing data. Rewriting an epoch that
already has a checkpoint first removes (de-commits) its old sidecar, so a crash mid-rewrite
leaves no sidecar whose hashes disagree with the files.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import psutil

from hogwild.errors import CheckpointError
from hogwild.training.tensorfile import load_tensors, save_tensors, temp_owner_pid, write_atomic

if TYPE_CHECKING:
    from hogwild.model.network import Network

__all__ = [
    "FORMAT",
    "Checkpoint",
    "checkpoint_files",
    "remove_checkpoints",
    "latest_checkpoint",
    "load_checkpoint",
    "sidecar_name",
    "write_checkpoint",
]

#: Value of the sidecar's "format" key; bump the version on incompatible changes.
FORMAT = "hogwild-checkpoint"
VERSION = 1

_SIDECAR_RE = re.compile(r"^epoch-(\d+)\.json$")
_TENSOR_RE = re.compile(r"^epoch-(\d+)(?:\.optim)?\.safetensors$")


@dataclass
class Checkpoint:
    """A loaded, verified checkpoint.

    Attributes:
        weights: Parameter name -> array, PyTorch names and layouts.
        optimizer_state: Optimizer-state name -> array (e.g. ``"conv1.weight.momentum"``).
        info: The JSON-able dict given to :func:`write_checkpoint`, unchanged.
        path: The sidecar JSON this checkpoint was loaded from.
        epoch: The epoch number recorded in the sidecar.
    """

    weights: dict[str, np.ndarray]
    optimizer_state: dict[str, np.ndarray]
    info: dict
    path: Path
    epoch: int = 0


def sidecar_name(epoch: int) -> str:
    """Return the sidecar file name of ``epoch``, e.g. ``epoch-0003.json``."""
    return f"epoch-{epoch:04d}.json"


def _weights_name(epoch: int) -> str:
    return f"epoch-{epoch:04d}.safetensors"


def _optim_name(epoch: int) -> str:
    return f"epoch-{epoch:04d}.optim.safetensors"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def _committed_epochs(directory: Path) -> list[int]:
    """Epochs that have a sidecar in ``directory``, ascending; empty if it does not exist."""
    try:
        names = os.listdir(directory)
    except (FileNotFoundError, NotADirectoryError):
        return []
    return sorted(int(m[1]) for name in names if (m := _SIDECAR_RE.match(name)))


def write_checkpoint(
    directory: Path,
    epoch: int,
    weights: Mapping[str, np.ndarray],
    optimizer_state: Mapping[str, np.ndarray],
    info: dict,
    keep: int = 2,
) -> Path:
    """Write and commit the checkpoint of ``epoch``, then prune old ones.

    Order: weights file, optimizer file, then the sidecar (the commit), each atomic. Then
    committed checkpoints older than the ``keep`` newest are removed (never the one just
    written), as are orphan tensor files of earlier epochs and temp files left by dead writers.

    Args:
        directory: Checkpoint directory; created (with parents) if missing.
        epoch: Non-negative epoch number; an existing checkpoint of it is replaced.
        weights: Parameter name -> array, PyTorch names and layouts.
        optimizer_state: Optimizer-state name -> array, kept out of the weights file.
        info: JSON-able dict (resolved config, optimizer scalars, seeds, data position,
            metrics). Checked before anything is written.
        keep: How many committed checkpoints to keep, at least 1.

    Returns:
        The sidecar path.

    Raises:
        ValueError: ``epoch`` is negative or ``keep`` is below 1.
        TypeError: ``info`` is not JSON-able, or a tensor cannot be stored.
    """
    if epoch < 0:
        raise ValueError(f"epoch must be >= 0, got {epoch}")
    if keep < 1:
        raise ValueError(f"keep must be >= 1, got {keep}")
    directory = Path(directory)
    try:
        json.dumps(info)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"checkpoint info must be JSON-able: {exc}") from exc

    directory.mkdir(parents=True, exist_ok=True)
    sidecar = directory / sidecar_name(epoch)
    if sidecar.exists():  # de-commit before touching the files it vouches for
        sidecar.unlink()
    files = {"weights": _weights_name(epoch), "optimizer": _optim_name(epoch)}
    save_tensors(
        directory / files["weights"], weights, {"format": "pt", "hogwild_epoch": str(epoch)}
    )
    save_tensors(directory / files["optimizer"], optimizer_state, {"hogwild_epoch": str(epoch)})

    record = {
        "format": FORMAT,
        "version": VERSION,
        "epoch": epoch,
        "files": {
            role: {"name": name, "sha256": _sha256(directory / name)}
            for role, name in files.items()
        },
        "info": info,
    }
    text = json.dumps(record, indent=2) + "\n"
    write_atomic(sidecar, [text.encode("utf-8")])
    _prune(directory, epoch, keep)
    return sidecar


def _prune(directory: Path, just_written: int, keep: int) -> None:
    """Remove old committed checkpoints, orphan tensor files and dead writers' temp files."""
    committed = _committed_epochs(directory)
    kept = set(committed[-keep:]) | {just_written}
    for epoch in committed:
        if epoch not in kept:
            (directory / sidecar_name(epoch)).unlink(missing_ok=True)  # de-commit first
    for name in os.listdir(directory):
        match = _TENSOR_RE.match(name)
        if match and int(match[1]) not in kept and int(match[1]) < just_written:
            (directory / name).unlink(missing_ok=True)
            continue
        pid = temp_owner_pid(name)
        if pid is not None and (pid == os.getpid() or not psutil.pid_exists(pid)):
            (directory / name).unlink(missing_ok=True)


def checkpoint_files(directory: Path) -> list[str]:
    """The names of every checkpoint file in ``directory`` (sidecars, tensor files, orphans)."""
    try:
        names = os.listdir(directory)
    except (FileNotFoundError, NotADirectoryError):
        return []
    return [n for n in names if _SIDECAR_RE.match(n) or _TENSOR_RE.match(n)]


def remove_checkpoints(directory: Path) -> None:
    """Remove every checkpoint in ``directory``: sidecars first (de-commit), then tensor files."""
    names = checkpoint_files(Path(directory))
    for name in sorted(names, key=lambda n: not _SIDECAR_RE.match(n)):
        (Path(directory) / name).unlink(missing_ok=True)


def latest_checkpoint(directory: Path) -> Path | None:
    """Return the sidecar of the highest committed epoch in ``directory``, or ``None``.

    A checkpoint is committed when its sidecar exists; tensor files alone do not count. This
    does not verify hashes; :func:`load_checkpoint` does.
    """
    epochs = _committed_epochs(Path(directory))
    return Path(directory) / sidecar_name(epochs[-1]) if epochs else None


def _resolve_sidecar(path: Path) -> Path:
    """Map a directory, sidecar or tensor-file path to a sidecar path."""
    if path.is_dir():
        found = latest_checkpoint(path)
        if found is None:
            raise CheckpointError(
                f"{path}: no complete checkpoint in this directory "
                "(expected epoch-NNNN.json with its .safetensors files)"
            )
        return found
    if path.suffix == ".json":
        if not path.exists():
            raise CheckpointError(f"{path}: no such checkpoint sidecar")
        return path
    match = _TENSOR_RE.match(path.name)
    if match:
        sidecar = path.with_name(sidecar_name(int(match[1])))
        if not sidecar.exists():
            raise CheckpointError(
                f"{path}: its sidecar {sidecar.name} is missing, so this checkpoint was never "
                "committed (interrupted write)"
            )
        return sidecar
    if not path.exists():
        raise CheckpointError(f"{path}: no such checkpoint file or directory")
    raise CheckpointError(
        f"{path}: not a checkpoint; expected a directory, an epoch-NNNN.json sidecar or an "
        "epoch-NNNN.safetensors file"
    )


def _read_sidecar(sidecar: Path) -> dict[str, Any]:
    try:
        record = json.loads(sidecar.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise CheckpointError(f"{sidecar}: unreadable checkpoint sidecar: {exc}") from None
    ok = (
        isinstance(record, dict)
        and record.get("format") == FORMAT
        and isinstance(record.get("epoch"), int)
        and isinstance(record.get("info"), dict)
        and isinstance(record.get("files"), dict)
        and all(
            isinstance(record["files"].get(role), dict)
            and isinstance(record["files"][role].get("name"), str)
            and isinstance(record["files"][role].get("sha256"), str)
            for role in ("weights", "optimizer")
        )
    )
    if not ok:
        raise CheckpointError(
            f"{sidecar}: not a {FORMAT} sidecar (expected format, epoch, info and files with "
            "weights/optimizer name and sha256)"
        )
    if record.get("version") != VERSION:
        raise CheckpointError(
            f"{sidecar}: checkpoint format version {record.get('version')!r}, "
            f"this hogwild reads version {VERSION}"
        )
    return record


def load_checkpoint(path: Path) -> Checkpoint:
    """Load and verify a checkpoint.

    Args:
        path: A checkpoint directory (its latest committed checkpoint is loaded), a sidecar
            ``epoch-NNNN.json``, or an ``epoch-NNNN[.optim].safetensors`` file (its sidecar is
            loaded). If the latest checkpoint is damaged this raises rather than falling back
            to an older one; pass that one's sidecar explicitly to use it.

    Returns:
        The checkpoint, with both tensor files' sha256 verified.

    Raises:
        CheckpointError: The path has no committed checkpoint, the sidecar is unreadable, or a
            tensor file is missing, corrupt or does not match its recorded sha256. The message
            names the file.
    """
    sidecar = _resolve_sidecar(Path(path))
    record = _read_sidecar(sidecar)
    loaded: dict[str, dict[str, np.ndarray]] = {}
    for role in ("weights", "optimizer"):
        entry = record["files"][role]
        name = entry["name"]
        if Path(name).name != name:
            raise CheckpointError(f"{sidecar}: {role} file name {name!r} must be a bare name")
        file = sidecar.parent / name
        if not file.exists():
            raise CheckpointError(f"{file}: missing; the sidecar {sidecar.name} refers to it")
        loaded[role], _ = load_tensors(file, expect_sha256=entry["sha256"])
    return Checkpoint(
        weights=loaded["weights"],
        optimizer_state=loaded["optimizer"],
        info=record["info"],
        path=sidecar,
        epoch=record["epoch"],
    )


def restore_parameters(
    network: Network, flat: np.ndarray, tensors: dict, path, suffix: str
) -> None:
    """Copy ``tensors`` (the network's parameter names plus ``suffix``) into ``flat``."""
    views = network.views(flat)
    for name, view in views.items():
        key = name + suffix
        if key not in tensors:
            raise CheckpointError(f"checkpoint {path} has no tensor {key!r} for this model")
        if tensors[key].shape != view.shape:
            raise CheckpointError(
                f"checkpoint {path}: {key} has shape {tensors[key].shape}, "
                f"the configured model needs {view.shape}"
            )
        view[...] = tensors[key]
