"""Examples given as numpy arrays (``hogwild.data.arrays``): shapes, types, classes, and the
clear refusal of what the engine cannot train on."""

from __future__ import annotations

import numpy as np
import pytest

from hogwild.data.arrays import array_data, input_normalisation
from hogwild.errors import DataError


def test_layouts_types_and_classes():
    x = np.zeros((6, 3, 4, 5), dtype=np.float64)
    data = array_data((x, [0, 1, 2, 3, 4, 5]), (x[:2], np.array([6, 0])))
    assert data.shape == (3, 4, 5) and data.n_classes == 7  # the largest label, test included
    assert data.train_images.shape == (6, 60) and data.train_images.dtype == np.float32
    assert data.train_labels.dtype == np.int32 and data.floats
    pixels = array_data((np.zeros((2, 7, 9), dtype=np.uint8), np.array([1, 0])))
    assert pixels.shape == (1, 7, 9) and not pixels.floats and len(pixels.test_labels) == 0
    assert array_data((np.ones((3, 11)), np.array([0.0, 1.0, 2.0]))).shape == (1, 1, 11)


def test_channels_then_rows_then_columns_as_pytorch_lays_them_out():
    x = np.arange(2 * 2 * 3 * 3, dtype=np.float32).reshape(2, 2, 3, 3)
    data = array_data((x, np.array([0, 1])))
    np.testing.assert_array_equal(data.train_images[1], x[1].ravel())


def test_floats_are_used_as_given_and_pixels_scaled():
    assert input_normalisation(np.uint8, 0.1307, 0.3081) == (0.1307, 0.3081)
    mean, std = input_normalisation(np.float32, 0.1307, 0.3081)
    # the load kernel computes x / (255 std) - mean / std: exactly x
    x = np.float32(-1.2345678)
    assert np.float32(x * (1.0 / (255.0 * std)) - mean / std) == x


@pytest.mark.parametrize(
    ("data", "words"),
    [
        (([[1.0, 2.0], [3.0]], [0, 1]), "ragged"),
        ((np.array([[1.0, np.nan], [0.0, 1.0]]), [0, 1]), "NaN or infinite features .* example 0"),
        ((np.array([[1.0, 2.0], [0.0, np.inf]]), [0, 1]), "example 1"),
        ((np.zeros((2, 3), dtype=np.int64), [0, 1]), "int64: give uint8 pixels .* or floats"),
        ((np.zeros((2, 3)), [0, -1]), r"class indices must be 0 \.\. classes - 1, found -1"),
        ((np.zeros((2, 3)), [0.5, 1]), "integer class indices"),
        ((np.zeros((2, 3)), [0, 1, 2]), r"one class index per example \(2\)"),
        ((np.zeros((2, 1, 1, 2, 3)), [0, 1]), "examples must be"),
        ((np.zeros((0, 3)), []), "at least one example"),
        (np.zeros((2, 3)), "pair"),
    ],
)
def test_bad_arrays_are_refused_naming_what_is_wrong(data, words):
    with pytest.raises(DataError, match=words):
        array_data(data)


def test_test_data_must_match_the_training_examples():
    x = np.zeros((2, 3), dtype=np.float32)
    with pytest.raises(DataError, match="test_data X has examples of shape"):
        array_data((x, [0, 1]), (np.zeros((2, 4)), [0, 1]))
    with pytest.raises(DataError, match="give both as uint8 pixels or both as floats"):
        array_data((x, [0, 1]), (np.zeros((2, 3), dtype=np.uint8), [0, 1]))


def test_csv_rows_become_features_and_a_label_column(tmp_path):
    from hogwild.data.tables import read_table

    path = tmp_path / "iris.csv"
    rows = "".join(f"{i * 0.5},{i % 3},{-i}\n" for i in range(10))
    path.write_text("width,species,depth\n" + rows)
    (x, y), held = read_table(path, "species", 0.2, seed=1)
    (x2, y2), held2 = read_table(path, "species", 0.2, seed=1)
    assert x.shape == (8, 2) and len(held[1]) == 2  # a fifth held back
    np.testing.assert_array_equal(x, x2)  # the same split for the same seed
    everything, labels = np.concatenate([x, held[0]]), np.concatenate([y, held[1]])
    assert sorted(everything[:, 0]) == [i * 0.5 for i in range(10)]
    for features, label in zip(everything, labels, strict=True):
        assert label == int(features[0] * 2) % 3 and features[1] == -features[0] * 2
    data = array_data((x, y), held)
    assert data.shape == (1, 1, 2) and data.n_classes == 3 and data.floats


@pytest.mark.parametrize(
    ("text", "target", "words"),
    [
        ("a,b\n1,2\n", "c", "no column 'c'; the columns are a, b"),
        ("a,b\n1,x\n", "b", "line 2: 'x' is not a number"),
        ("a,b\n1,2,3\n", "b", "line 2: 3 values, the header has 2"),
        ("a,b\n", "b", "a header row and at least one example"),
        ("a,b\n1,2\n", None, "needs the name of its label column"),
    ],
)
def test_bad_csv_files_are_refused_naming_the_line(tmp_path, text, target, words):
    from hogwild.data.tables import read_table

    path = tmp_path / "t.csv"
    path.write_text(text)
    with pytest.raises(DataError, match=words):
        read_table(path, target, 0.2, seed=1)


def test_npz_in_keras_layout_or_x_and_y(tmp_path):
    from hogwild.data.tables import read_table

    x = np.arange(40, dtype=np.uint8).reshape(10, 2, 2)
    y = np.arange(10) % 2
    np.savez(tmp_path / "four.npz", x_train=x[:7], y_train=y[:7], x_test=x[7:], y_test=y[7:])
    (train_x, _), (test_x, _) = read_table(tmp_path / "four.npz", None, 0.2, seed=0)
    np.testing.assert_array_equal(test_x, x[7:])
    np.savez(tmp_path / "two.npz", x=x, y=y)
    (train_x, train_y), held = read_table(tmp_path / "two.npz", None, 0.3, seed=0)
    assert len(train_x) == 7 and len(held[0]) == 3 and train_x.dtype == np.uint8
    np.savez(tmp_path / "other.npz", images=x)
    with pytest.raises(DataError, match="holds images; expected x_train"):
        read_table(tmp_path / "other.npz", None, 0.2, seed=0)
