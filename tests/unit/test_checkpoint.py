"""Tests of the safetensors writer/reader and checkpoint directories.

Oracles: the ``safetensors`` package (numpy and torch loaders/savers) for the file format, and
PyTorch's ``load_state_dict(strict=True)`` for the weights layout.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import safetensors.numpy
import safetensors.torch
import torch
from torch import nn

from hogwild.errors import CheckpointError
from hogwild.training.checkpoint import (
    Checkpoint,
    latest_checkpoint,
    load_checkpoint,
    write_checkpoint,
)
from hogwild.training.tensorfile import load_tensors, save_tensors


def sample_tensors() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "f32": rng.standard_normal((3, 4, 5)).astype(np.float32),
        "u8_odd": rng.integers(0, 255, size=7, dtype=np.uint8),  # misaligns what follows
        "f64": rng.standard_normal((2, 3)),
        "i32": rng.integers(-100, 100, size=(4,), dtype=np.int32),
        "i64": rng.integers(-(2**40), 2**40, size=(2, 2), dtype=np.int64),
        "scalar": np.array(3.5, dtype=np.float32),
        "empty": np.zeros((0, 3), dtype=np.float32),
        "strided": np.arange(24, dtype=np.float64).reshape(4, 6)[:, ::2],
        "fortran": np.asfortranarray(np.arange(6, dtype=np.int32).reshape(2, 3)),
    }


def assert_same(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    assert sorted(got) == sorted(want)
    for name, arr in want.items():
        assert got[name].dtype == arr.dtype, name
        assert got[name].shape == arr.shape, name
        np.testing.assert_array_equal(got[name], arr, err_msg=name)


# ----------------------------------------------------------------------------- tensor files


def test_round_trip_dtypes_shapes_and_metadata(tmp_path: Path) -> None:
    tensors = sample_tensors()
    meta = {"format": "pt", "note": "héllo"}
    save_tensors(tmp_path / "t.safetensors", tensors, meta)
    got, got_meta = load_tensors(tmp_path / "t.safetensors")
    assert_same(got, tensors)
    assert got_meta == meta
    for arr in got.values():
        assert arr.flags.writeable and arr.flags.aligned
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]


def test_header_is_padded_and_buffer_contiguous(tmp_path: Path) -> None:
    save_tensors(tmp_path / "t.safetensors", sample_tensors())
    raw = (tmp_path / "t.safetensors").read_bytes()
    n = int.from_bytes(raw[:8], "little")
    assert n % 8 == 0
    header = json.loads(raw[8 : 8 + n])
    assert "__metadata__" not in header
    end = 0
    for entry in header.values():
        assert entry["data_offsets"][0] == end
        end = entry["data_offsets"][1]
    assert end == len(raw) - 8 - n


def test_our_files_load_in_safetensors(tmp_path: Path) -> None:
    tensors = sample_tensors()
    save_tensors(tmp_path / "t.safetensors", tensors, {"k": "v"})
    by_numpy = safetensors.numpy.load_file(tmp_path / "t.safetensors")
    by_torch = safetensors.torch.load_file(tmp_path / "t.safetensors")
    assert set(by_numpy) == set(tensors) == set(by_torch)
    for name, arr in tensors.items():
        assert by_numpy[name].dtype == arr.dtype and by_numpy[name].shape == arr.shape
        np.testing.assert_array_equal(by_numpy[name], arr)
        assert torch.equal(by_torch[name], torch.from_numpy(np.asarray(arr, order="C"))), name
    with safetensors.safe_open(tmp_path / "t.safetensors", framework="np") as f:
        assert f.metadata() == {"k": "v"}


def test_safetensors_files_load_in_ours(tmp_path: Path) -> None:
    tensors = {k: np.asarray(v, order="C") for k, v in sample_tensors().items()}
    tensors["bool"] = np.array([True, False, True])
    tensors["f16"] = np.linspace(0, 1, 5, dtype=np.float16)
    safetensors.numpy.save_file(tensors, tmp_path / "s.safetensors", metadata={"a": "b"})
    got, meta = load_tensors(tmp_path / "s.safetensors")
    assert meta == {"a": "b"}
    assert set(got) == set(tensors)
    for name, arr in tensors.items():
        assert got[name].dtype == arr.dtype and got[name].shape == arr.shape, name
        np.testing.assert_array_equal(got[name], arr)


def test_save_rejects_unstorable(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="complex128"):
        save_tensors(tmp_path / "t.safetensors", {"c": np.zeros(2, dtype=np.complex128)})
    with pytest.raises(ValueError, match="reserved"):
        save_tensors(tmp_path / "t.safetensors", {"__metadata__": np.zeros(2)})
    assert os.listdir(tmp_path) == []


def _write_raw(path: Path, header: bytes, body: bytes = b"") -> Path:
    path.write_bytes(len(header).to_bytes(8, "little") + header + body)
    return path


@pytest.mark.parametrize(
    ("header", "body", "message"),
    [
        (b"{not json", b"", "invalid JSON"),
        (b"[1, 2]", b"", "invalid type: sequence"),
        (b'{"a": {"dtype": "BF16", "shape": [1], "data_offsets": [0, 2]}}', b"xx", "dtype"),
        (
            b'{"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}',
            b"xxxx",
            "invalid shape",
        ),
        (
            b'{"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}',
            b"xx",
            "not fully covered",
        ),
        (
            b'{"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}',
            b"x" * 8,
            "invalid offset",
        ),
        (
            b'{"a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}}',
            b"xy",
            "not fully covered",
        ),
        (b'{"a": {"dtype": "U8", "shape": [-1], "data_offsets": [0, 1]}}', b"x", "integer `-1`"),
        (b'{"__metadata__": {"a": 1}}', b"", "expected a string"),
    ],
)
def test_load_rejects_bad_headers(tmp_path: Path, header: bytes, body: bytes, message: str) -> None:
    path = _write_raw(tmp_path / "bad.safetensors", header, body)
    with pytest.raises(CheckpointError, match=message) as info:
        load_tensors(path)
    assert str(path) in str(info.value)


def test_load_rejects_short_and_oversized_files(tmp_path: Path) -> None:
    path = tmp_path / "short.safetensors"
    path.write_bytes(b"\x01\x02\x03")
    with pytest.raises(CheckpointError, match="header too small") as info:
        load_tensors(path)
    assert str(path) in str(info.value)
    big = tmp_path / "big.safetensors"
    big.write_bytes((10**12).to_bytes(8, "little") + b"{}      ")
    with pytest.raises(CheckpointError, match="not a valid safetensors file") as info:
        load_tensors(big)
    assert str(big) in str(info.value)
    with pytest.raises(CheckpointError, match="no such file"):
        load_tensors(tmp_path / "absent.safetensors")


def test_garbage_file(tmp_path: Path) -> None:
    path = tmp_path / "garbage.safetensors"
    path.write_bytes(bytes(range(256)) * 4)
    with pytest.raises(CheckpointError) as info:
        load_tensors(path)
    assert str(path) in str(info.value)


# ----------------------------------------------------------------------------- checkpoints


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 10, 5)
        self.conv2 = nn.Conv2d(10, 20, 5)
        self.fc1 = nn.Linear(320, 400)
        self.fc2 = nn.Linear(400, 400)
        self.fc3 = nn.Linear(400, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.max_pool2d(torch.relu(self.conv1(x)), 2)
        x = torch.max_pool2d(torch.relu(self.conv2(x)), 2)
        x = torch.relu(self.fc1(x.flatten(1)))
        return self.fc3(torch.relu(self.fc2(x)))


def small_weights(seed: int = 0) -> dict[str, np.ndarray]:
    return {"w": np.full((2, 3), seed, dtype=np.float32), "b": np.arange(3, dtype=np.float32)}


def test_torch_model_loads_weights_file_strictly(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = Net()
    weights = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
    momentum = {f"{k}.momentum": np.zeros_like(v) for k, v in weights.items()}
    info = {"epoch": 3, "config": {"lr": 0.01}, "seed": 7}
    sidecar = write_checkpoint(tmp_path, 3, weights, momentum, info)
    assert sidecar == tmp_path / "epoch-0003.json"

    torch.manual_seed(1)
    fresh = Net()
    fresh.load_state_dict(safetensors.torch.load_file(tmp_path / "epoch-0003.safetensors"))
    x = torch.randn(4, 1, 28, 28)
    with torch.no_grad():
        assert torch.equal(model(x), fresh(x))

    ckpt = load_checkpoint(tmp_path)
    assert isinstance(ckpt, Checkpoint)
    assert ckpt.path == sidecar and ckpt.epoch == 3 and ckpt.info == info
    assert_same(ckpt.weights, weights)
    assert_same(ckpt.optimizer_state, momentum)
    for via in (sidecar, tmp_path / "epoch-0003.safetensors"):
        assert load_checkpoint(via).path == sidecar


def test_sidecar_is_the_commit_record(tmp_path: Path) -> None:
    write_checkpoint(tmp_path, 1, small_weights(1), {}, {"epoch": 1})
    # A crash while writing epoch 2: its weights file exists but no sidecar.
    save_tensors(tmp_path / "epoch-0002.safetensors", small_weights(2))
    assert latest_checkpoint(tmp_path) == tmp_path / "epoch-0001.json"
    assert load_checkpoint(tmp_path).epoch == 1
    with pytest.raises(CheckpointError, match="never committed"):
        load_checkpoint(tmp_path / "epoch-0002.safetensors")
    # The sidecar is written after both tensor files.
    write_checkpoint(tmp_path, 2, small_weights(2), {"m": np.ones(2)}, {})
    mtimes = {p.name: p.stat().st_mtime_ns for p in tmp_path.glob("epoch-0002*")}
    assert mtimes["epoch-0002.json"] >= max(mtimes.values())
    assert latest_checkpoint(tmp_path) == tmp_path / "epoch-0002.json"


def test_pruning_keeps_newest_and_removes_strays(tmp_path: Path) -> None:
    stray = tmp_path / ".epoch-0001.safetensors.999999999.0badcafe.tmp"
    tmp_path.mkdir(exist_ok=True)
    stray.write_bytes(b"half")
    orphan = tmp_path / "epoch-0000.optim.safetensors"
    orphan.write_bytes(b"left by a crash")
    for epoch in range(1, 6):
        write_checkpoint(tmp_path, epoch, small_weights(epoch), {"m": np.ones(1)}, {}, keep=2)
    names = sorted(os.listdir(tmp_path))
    assert names == [
        "epoch-0004.json",
        "epoch-0004.optim.safetensors",
        "epoch-0004.safetensors",
        "epoch-0005.json",
        "epoch-0005.optim.safetensors",
        "epoch-0005.safetensors",
    ]
    # Writing an older epoch never prunes the one just written.
    write_checkpoint(tmp_path, 2, small_weights(2), {}, {}, keep=1)
    assert {p.name for p in tmp_path.glob("*.json")} == {"epoch-0002.json", "epoch-0005.json"}
    assert load_checkpoint(tmp_path / "epoch-0002.json").weights["w"][0, 0] == 2


def test_rewriting_an_epoch_replaces_it(tmp_path: Path) -> None:
    write_checkpoint(tmp_path, 1, small_weights(1), {}, {"v": 1})
    write_checkpoint(tmp_path, 1, small_weights(9), {}, {"v": 2})
    ckpt = load_checkpoint(tmp_path)
    assert ckpt.info == {"v": 2} and ckpt.weights["w"][0, 0] == 9


@pytest.mark.parametrize("victim", ["epoch-0001.safetensors", "epoch-0001.optim.safetensors"])
def test_flipped_byte_fails_sha256(tmp_path: Path, victim: str) -> None:
    write_checkpoint(tmp_path, 1, small_weights(1), {"m": np.ones(4)}, {})
    path = tmp_path / victim
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="sha256") as info:
        load_checkpoint(tmp_path)
    assert victim in str(info.value)


def test_truncated_and_missing_tensor_files(tmp_path: Path) -> None:
    write_checkpoint(tmp_path, 1, small_weights(1), {}, {})
    weights = tmp_path / "epoch-0001.safetensors"
    weights.write_bytes(weights.read_bytes()[:-5])
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(tmp_path)
    assert weights.name in str(info.value)
    weights.unlink()
    with pytest.raises(CheckpointError, match="missing") as info:
        load_checkpoint(tmp_path)
    assert weights.name in str(info.value)


def test_bad_sidecar_and_empty_directory(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(tmp_path)
    assert str(tmp_path) in str(info.value)
    assert latest_checkpoint(tmp_path) is None
    assert latest_checkpoint(tmp_path / "nope") is None
    (tmp_path / "epoch-0001.json").write_text("{garbage")
    with pytest.raises(CheckpointError, match="epoch-0001.json"):
        load_checkpoint(tmp_path)
    with pytest.raises(CheckpointError, match="no such"):
        load_checkpoint(tmp_path / "nope")


def test_write_validates_before_writing(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="JSON"):
        write_checkpoint(tmp_path / "c", 1, small_weights(), {}, {"bad": object()})
    with pytest.raises(ValueError, match="keep"):
        write_checkpoint(tmp_path / "c", 1, small_weights(), {}, {}, keep=0)
    assert not (tmp_path / "c").exists()
