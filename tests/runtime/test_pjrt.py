"""runtime/pjrt.py: jaxlib's PJRT CPU client as the jax-free runtime uses it, tested on its own: one client per
process, an artifact's executable deserialized (``Compiled``) and run on inputs the ``Device`` places, its outputs
read back as read-only numpy views through DLPack (``Device.to_host``), or copied by jaxlib where DLPack has no code for
the dtype (bfloat16), and bytes that are not an executable refused naming their file. (``Runtime``, built on
these, is tested in tests/runtime/test_runtime.py.)"""

from __future__ import annotations

import re

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import tripy_build as tb
from tripy_build import host, jaxlib_api
from tripy_build.artifact.read import read_contents
from tripy_build.errors import ArtifactError
from tripy_build.runtime import pjrt


def tiny(x, y):
    return x * 2 + y, (x.T @ x).astype(jnp.bfloat16)


@pytest.fixture(scope="module")
def tiny_executable(tmp_path_factory):
    """A tiny function's artifact: its one executable's manifest entry, its bytes and its file's name."""
    path = tmp_path_factory.mktemp("pjrt") / "tiny"
    tb.compile(tiny, args=(tb.InputInfo((3, 4), "float32"), tb.InputInfo((4,), "float32"))).save(path)
    contents = read_contents(path)
    (entry,) = contents.manifest.executables
    return entry, contents.files[entry.file], contents.where(entry.file)


def _inputs():
    x = np.arange(12, dtype=np.float32).reshape(3, 4) / 8
    return x, np.array([1, -1, 0.5, 0], np.float32)


def test_one_client_per_process_behind_every_device():
    assert pjrt.client() is pjrt.client()
    assert pjrt.Device().client is pjrt.client()


def test_a_jaxlib_the_calls_were_not_tested_on_is_refused(monkeypatch):
    monkeypatch.setattr(host, "tested_jax", lambda: False)
    with pytest.raises(ArtifactError, match=f"tested with jaxlib {jaxlib_api.TESTED[0]}.*Use tripy_build.load instead"):
        pjrt.client()


def test_an_executable_runs_on_placed_inputs_and_its_outputs_are_read_only_views(tiny_executable):
    entry, blob, where = tiny_executable
    device = pjrt.Device()
    compiled = pjrt.Compiled(device, blob, entry, where)
    assert compiled.seconds > 0 and [a.shape for a in compiled.avals] == [(3, 4), (4,)]
    x, y = _inputs()
    outs = compiled.device_outputs([x, y])
    assert all(type(o) is device.array_type for o in outs)
    summed = device.to_host(outs[0])
    np.testing.assert_array_equal(summed, x * 2 + y)
    assert summed.dtype == np.float32 and not summed.flags.writeable
    assert summed.ctypes.data == outs[0].unsafe_buffer_pointer()  # a view of the result buffer, not a copy
    np.testing.assert_array_equal(np.from_dlpack(pjrt.DLPack(outs[0])), summed)

    assert device.put(outs[0], compiled.avals[0]) is outs[0]  # this client's own array is placed as it is
    again = compiled([outs[0], y])[0]  # an output fed back in, on the device
    np.testing.assert_array_equal(again, (x * 2 + y) * 2 + y)
    columns = np.asfortranarray(x)  # not C-contiguous: placed as a contiguous copy
    np.testing.assert_array_equal(compiled([columns, y])[0], x * 2 + y)


def test_a_bfloat16_output_is_copied_to_the_host_where_dlpack_has_no_code(tiny_executable):
    entry, blob, where = tiny_executable
    compiled = pjrt.Compiled(pjrt.Device(), blob, entry, where)
    x, y = _inputs()
    gram = compiled.device_outputs([x, y])[1]
    with pytest.raises((RuntimeError, BufferError)):  # numpy < 2.5 raised RuntimeError, 2.5 BufferError
        np.from_dlpack(pjrt.DLPack(gram))
    host_gram = pjrt.Device().to_host(gram)
    assert host_gram.dtype == np.dtype(ml_dtypes.bfloat16) and host_gram.shape == (4, 4)
    np.testing.assert_array_equal(host_gram, (x.T @ x).astype(ml_dtypes.bfloat16))
    assert compiled([x, y])[1].dtype == np.dtype(ml_dtypes.bfloat16)


def test_bytes_that_are_not_an_executable_are_refused_naming_their_file(tiny_executable):
    entry, blob, where = tiny_executable
    for bad in (b"not an executable", blob[: len(blob) // 2]):
        with pytest.raises(ArtifactError, match=rf"^{re.escape(where)}: cannot deserialize the executable \("):
            pjrt.Compiled(pjrt.Device(), bad, entry, where)
