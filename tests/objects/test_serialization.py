"""dpool.objects._serialization: cloudpickle protocol 5 with out-of-band buffers."""

from __future__ import annotations

import pickle
import sys
import threading
import types
from pathlib import Path

import numpy as np
import pytest

try:
    import dpool.objects  # noqa: F401
except ImportError:  # running from a checkout without an installed dpool
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from dpool.errors import SerializationError
from dpool.objects._serialization import (
    DEFAULT_OOB_THRESHOLD,
    Serialized,
    deserialize,
    serialize,
)

BIG = DEFAULT_OOB_THRESHOLD  # bytes: the smallest buffer kept out-of-band


def roundtrip(obj: object, **kwargs: int) -> object:
    ser = serialize(obj, **kwargs)
    return deserialize(ser.meta, ser.buffers)


def assert_same_array(got: object, want: np.ndarray) -> None:
    assert isinstance(got, np.ndarray)
    assert got.dtype == want.dtype
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize(
    "dtype",
    ["int8", "uint16", "int32", "int64", "float16", "float32", "float64", "complex128", "bool"],
)
def test_large_array_goes_out_of_band(dtype: str) -> None:
    arr = (np.arange(BIG, dtype=np.int64) % 7).astype(dtype)
    ser = serialize(arr)
    assert len(ser.buffers) == 1
    assert ser.buffers[0].nbytes == arr.nbytes
    assert len(ser.meta) < 1024  # the data is not in the stream
    assert ser.nbytes == len(ser.meta) + arr.nbytes
    assert_same_array(deserialize(ser.meta, ser.buffers), arr)


def test_out_of_band_buffer_is_not_a_copy() -> None:
    arr = np.arange(BIG, dtype=np.float64)
    ser = serialize(arr)
    assert np.shares_memory(np.frombuffer(ser.buffers[0], dtype=np.float64), arr)


def test_small_array_stays_in_band() -> None:
    arr = np.arange(100, dtype=np.float64)
    ser = serialize(arr)
    assert ser.buffers == []
    assert_same_array(deserialize(ser.meta, []), arr)


def test_threshold_is_inclusive_and_configurable() -> None:
    arr = np.zeros(1000, dtype=np.uint8)
    assert len(serialize(arr, oob_threshold=1000).buffers) == 1
    assert serialize(arr, oob_threshold=1001).buffers == []


def test_fortran_order_array() -> None:
    arr = np.asfortranarray(np.arange(300 * 400, dtype=np.float32).reshape(300, 400))
    ser = serialize(arr)
    assert len(ser.buffers) == 1
    got = deserialize(ser.meta, ser.buffers)
    assert_same_array(got, arr)
    assert got.flags.f_contiguous


def test_non_contiguous_array_goes_out_of_band() -> None:
    base = np.arange(400 * 400, dtype=np.float64).reshape(400, 400)
    view = base[::2, 1::3]
    assert not (view.flags.c_contiguous or view.flags.f_contiguous)
    ser = serialize(view)
    assert len(ser.buffers) == 1
    assert_same_array(deserialize(ser.meta, ser.buffers), view)


def test_zero_d_and_empty_arrays() -> None:
    for arr in (np.array(3.5), np.array(7, dtype=np.int16), np.zeros((0, 5))):
        assert_same_array(roundtrip(arr, oob_threshold=0), arr)
        assert_same_array(roundtrip(arr), arr)


def test_structured_datetime_and_object_arrays() -> None:
    structured = np.zeros(BIG, dtype=[("a", "i4"), ("b", "f8")])
    structured["a"] = np.arange(BIG)
    dates = np.arange(BIG).astype("datetime64[s]")  # numpy keeps these in-band
    objects = np.array([{"k": i} for i in range(10)], dtype=object)
    assert len(serialize(structured).buffers) == 1
    assert_same_array(roundtrip(structured), structured)
    assert_same_array(roundtrip(dates), dates)
    got = roundtrip(objects)
    assert isinstance(got, np.ndarray) and list(got) == list(objects)


def test_deserialized_array_is_writable_when_buffers_are() -> None:
    arr = np.arange(BIG, dtype=np.int32)
    ser = serialize(arr)
    copies = [bytearray(b) for b in ser.buffers]
    got = deserialize(ser.meta, copies)
    got[0] = -1
    assert copies[0][:4] == (-1).to_bytes(4, sys.byteorder, signed=True)
    assert arr[0] == 0


def test_bytes_and_pickle_buffers() -> None:
    payload = bytes(range(256)) * (BIG // 256 + 1)
    assert roundtrip(payload) == payload  # plain bytes: in-band by the protocol
    assert serialize(payload).buffers == []
    ser = serialize(pickle.PickleBuffer(bytearray(payload)))
    assert len(ser.buffers) == 1
    got = deserialize(ser.meta, ser.buffers)
    assert bytes(got) == payload


def test_nested_structure_with_several_buffers() -> None:
    a = np.arange(BIG, dtype=np.float64)
    b = np.ones((256, 256), dtype=np.uint8)
    obj = {"a": a, "list": [1, "two", (3.0, b)], "small": np.arange(4), "none": None}
    ser = serialize(obj)
    assert len(ser.buffers) == 2
    got = deserialize(ser.meta, ser.buffers)
    assert_same_array(got["a"], a)
    assert_same_array(got["list"][2][1], b)
    assert_same_array(got["small"], obj["small"])
    assert got["list"][:2] == [1, "two"] and got["none"] is None


@pytest.mark.parametrize(
    "obj",
    [None, 0, -(2**70), 3.25, 1j, "héllo", b"raw", (1, "a", None), [1, 2.0], {"k": 1},
     {"nested": {"x": [1, 2]}}, set(range(5)), frozenset({"a"}), list(range(1000))],
)
def test_objects_without_buffers(obj: object) -> None:
    ser = serialize(obj)
    assert isinstance(ser, Serialized)
    assert ser.buffers == []
    assert isinstance(ser.meta, bytes)
    assert ser.nbytes == len(ser.meta)
    assert deserialize(ser.meta) == obj


def test_functions_and_closures_are_pickled_by_value() -> None:
    offset = 10

    def add(x: int) -> int:
        return x + offset

    assert roundtrip(add)(1) == 11
    assert roundtrip(lambda x: x * 2)(4) == 8


def test_what_the_stdlib_cannot_pickle_goes_to_cloudpickle_once() -> None:
    """An argument the stdlib's pickler fails on part-way (a lambda after a large array)
    is pickled again by cloudpickle: the array's buffer is out-of-band once."""

    class Local:
        def __init__(self) -> None:
            self.v = 5

    arr = np.arange(BIG // 8, dtype=np.int64)
    ser = serialize({"arr": arr, "f": lambda x: x + 1, "obj": Local()})
    assert len(ser.buffers) == 1 and ser.buffers[0].nbytes == arr.nbytes
    back = deserialize(ser.meta, ser.buffers)
    assert np.array_equal(back["arr"], arr) and back["f"](1) == 2 and back["obj"].v == 5


def test_modules_registered_by_value_go_by_value(tmp_path: Path, monkeypatch) -> None:
    import cloudpickle

    (tmp_path / "dpool_byvalue_mod.py").write_text("def h(x):\n    return x * 3\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import dpool_byvalue_mod  # type: ignore[import-not-found]

    cloudpickle.register_pickle_by_value(dpool_byvalue_mod)
    try:
        ser = serialize(dpool_byvalue_mod.h)
    finally:
        cloudpickle.unregister_pickle_by_value(dpool_byvalue_mod)
        del sys.modules["dpool_byvalue_mod"]
    monkeypatch.syspath_prepend(str(tmp_path / "elsewhere"))
    (tmp_path / "dpool_byvalue_mod.py").unlink()
    assert deserialize(ser.meta)(2) == 6  # the module is gone: by value it was


def test_unpicklable_object_raises_serialization_error() -> None:
    lock = threading.Lock()
    with pytest.raises(SerializationError) as info:
        serialize({"lock": lock})
    assert "dict" in str(info.value)
    assert "lock" in str(info.value)
    assert info.value.__cause__ is not None
    assert isinstance(info.value, TypeError)  # as pickle's own errors usually are
    with pytest.raises(SerializationError, match="_thread.lock"):
        serialize(lock)


def test_corrupt_stream_raises_serialization_error() -> None:
    with pytest.raises(SerializationError) as info:
        deserialize(b"not a pickle")
    assert info.value.__cause__ is not None
    ser = serialize(np.arange(BIG))
    with pytest.raises(SerializationError):
        deserialize(ser.meta, [])  # the out-of-band buffer is missing


def test_plain_data_fast_path_handles_sharing_and_cycles() -> None:
    shared = [1, 2]
    got = roundtrip({"a": shared, "b": shared})
    assert got == {"a": [1, 2], "b": [1, 2]} and got["a"] is got["b"]
    cyclic: list[object] = [1]
    cyclic.append(cyclic)
    back = roundtrip(cyclic)
    assert back[0] == 1 and back[1] is back


def _globals_by_dis(code: types.CodeType) -> list:
    import dis

    names = {ins.argval: None for ins in dis.get_instructions(code)
             if ins.opname in ("LOAD_GLOBAL", "STORE_GLOBAL", "DELETE_GLOBAL")}
    for const in code.co_consts:
        if type(const) is types.CodeType:
            names.update(dict.fromkeys(_globals_by_dis(const)))
    return list(names)


def test_the_global_names_of_a_function_are_what_dis_reads() -> None:
    """``_byvalue`` reads a function's globals from its bytecode without ``dis``: the same
    names in the same order, also past 256 names (EXTENDED_ARG), in nested code (a
    lambda, a comprehension, a method), with attributes and locals that share a
    global's name left out, and a global statement's stores and deletes."""
    from dpool.objects._byvalue import _global_names

    many = "\n".join(f"    v{i} = g{i}" for i in range(300))
    src = f"""
def f(x):
    global out, gone
{many}
    out = len(x) + max(x.len, 1)
    del gone
    k = lambda y: min(y, a_global)
    [z for z in range(3) if z in other]
    class C:
        def m(self):
            return in_a_method
    return x.sort, k, C
"""
    ns: dict = {}
    exec(compile(src, "<generated>", "exec"), ns)
    got = list(_global_names(ns["f"].__code__))
    assert got == _globals_by_dis(ns["f"].__code__)
    assert got[:2] == ["g0", "g1"] and got[299] == "g299" and "sort" not in got
    assert {"len", "max", "out", "gone", "min", "a_global", "range", "other",
            "in_a_method"} <= set(got)
    # and every function of a large module of the stdlib
    import email.message

    for fn in vars(email.message.Message).values():
        if isinstance(fn, types.FunctionType):
            assert list(_global_names(fn.__code__)) == _globals_by_dis(fn.__code__)


def test_the_opcode_numbers_it_knows_are_this_python_s() -> None:
    import opcode

    from dpool.objects import _byvalue

    known = _byvalue._KNOWN_OPCODES.get(sys.version_info[:2])
    if known is None:
        pytest.skip("this Python's opcodes are read from the opcode module")
    op = opcode.opmap
    assert known == (op["LOAD_GLOBAL"], op["STORE_GLOBAL"], op["DELETE_GLOBAL"],
                     op["EXTENDED_ARG"])

