"""The Keras memory facts (weights, optimizer state) from variables shaped like each Keras's own:
Keras 3 carries a dtype string, tf-keras a ``tf.DType`` that NumPy does not understand. No
framework is imported here (the real tf-keras run is ``test_tf_keras_generator_compute_bound``)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from stepscope.observe.inject import stepscope_watch_keras_memory as wk


class _TfDType:
    """Shaped like ``tf.DType``: ``str`` is "<dtype: 'float32'>", ``size`` the element's bytes."""

    def __init__(self, name: str, size: int) -> None:
        self.name, self.size = name, size

    def __str__(self) -> str:
        return f"<dtype: '{self.name}'>"


class _Var:
    def __init__(self, shape: tuple[int, ...], dtype: Any) -> None:
        self.shape, self.dtype = shape, dtype


class _CallableList(list):  # type: ignore[type-arg]
    """tf-keras's optimizer ``variables``: a list that may also be called."""

    def __call__(self) -> list[Any]:
        return list(self)


class _Rec:
    def __init__(self) -> None:
        self.facts: dict[str, Any] = {}
        self.notes: list[str] = []
        self.rss_marks = {"import": 1000, "fit": 1000 + 5000, "first_step": 1000 + 5000 + 9000}

    def fact(self, key: str, value: Any, how: str) -> None:
        self.facts[key] = value

    def note(self, source: str, text: str) -> None:
        self.notes.append(text)


class _Model:
    def __init__(self, weights: list[_Var], optimizer: Any) -> None:
        self.weights = self.trainable_weights = weights
        self.optimizer = optimizer


@pytest.mark.parametrize("legacy_optimizer", [False, True])
def test_tf_keras_variables_are_counted(legacy_optimizer: bool) -> None:
    f32, i64 = _TfDType("float32", 4), _TfDType("int64", 8)
    kernel, bias = _Var((16, 8), f32), _Var((8,), f32)
    slots = [_Var((), i64), _Var((16, 8), f32), _Var((8,), f32), _Var((16, 8), f32),
             _Var((8,), f32)]  # Adam: iterations, m and v of each weight

    class _Opt:
        variables = _CallableList(slots)

    class _LegacyOpt:
        def variables(self) -> list[_Var]:  # tf.keras.optimizers.legacy.*: a method
            return slots

    rec = _Rec()
    wk.ledger_facts(_Model([kernel, bias], _LegacyOpt() if legacy_optimizer else _Opt()),
                    rec)  # type: ignore[arg-type]
    assert rec.notes == []
    assert rec.facts["mem.weights_bytes"] == (16 * 8 + 8) * 4
    assert rec.facts["model.params"] == 16 * 8 + 8
    assert rec.facts["mem.optimizer_bytes"] == 8 + 2 * (16 * 8 + 8) * 4
    # The RSS growths have the weights and the optimizer state taken out, not counted twice.
    assert rec.facts["mem.model_objects_bytes"] == 5000 - (16 * 8 + 8) * 4
    assert rec.facts["mem.first_step_bytes"] == 9000 - (8 + 2 * (16 * 8 + 8) * 4)


@pytest.mark.parametrize(("dtype", "size"), [
    ("float32", 4), ("int64", 8), ("float16", 2), ("bfloat16", 2), ("float8_e4m3fn", 1),
    (np.dtype("float64"), 8), (_TfDType("bfloat16", 2), 2), (_TfDType("bool", 1), 1),
])
def test_itemsize_of_each_framework_dtype(dtype: Any, size: int) -> None:
    assert wk._itemsize(dtype) == size


def test_an_unknown_dtype_is_a_note_not_a_crash() -> None:
    rec = _Rec()
    wk.ledger_facts(_Model([_Var((3,), "resource")], None), rec)  # type: ignore[arg-type]
    assert rec.notes and "Keras memory facts not read" in rec.notes[0]
    assert "mem.weights_bytes" not in rec.facts
